#include "backends/hip/code_object.hpp"

#include <cxxabi.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>

#include <fmt/format.h>

#include "kiln/error.hpp"

namespace kiln::detail::hip {
namespace {

constexpr uint16_t kMachineAmdgpu = 224;  // EM_AMDGPU
constexpr uint32_t kSymtab = 2, kDynsym = 11;
constexpr uint32_t kMachMask = 0xff;
// Code object v4 and newer: two bits per feature: unsupported, any, off, on.
constexpr uint32_t kXnackMask = 0x300, kXnackOff = 0x200, kXnackOn = 0x300;
constexpr uint32_t kSrameccMask = 0xc00, kSrameccOff = 0x800, kSrameccOn = 0xc00;

// EF_AMDGPU_MACH values of the targets kiln knows, plus the neighbours a mislabelled binary could
// carry (from LLVM's ELF.h).
const std::map<uint32_t, const char*>& mach_names() {
  static const std::map<uint32_t, const char*> names = {{0x2c, "gfx900"},  {0x2f, "gfx906"},  {0x30, "gfx908"},  {0x3f, "gfx90a"},
                                                        {0x40, "gfx940"},  {0x4b, "gfx941"},  {0x4c, "gfx942"},  {0x4f, "gfx950"},
                                                        {0x36, "gfx1030"}, {0x41, "gfx1100"}, {0x4e, "gfx1200"}, {0x4d, "gfx1201"}};
  return names;
}

[[noreturn]] void malformed(const std::string& why) { throw Error(ErrorCode::kInvalidArgument, "code object: " + why); }

template <typename T>
T read(const std::vector<uint8_t>& bytes, uint64_t offset) {
  if (offset > bytes.size() || bytes.size() - offset < sizeof(T)) {
    malformed(fmt::format("truncated at byte {} of {}", offset, bytes.size()));
  }
  T value;
  std::memcpy(&value, bytes.data() + offset, sizeof(T));
  return value;
}

std::string read_string(const std::vector<uint8_t>& bytes, uint64_t offset) {
  if (offset >= bytes.size()) malformed(fmt::format("string at byte {} past the end", offset));
  const auto* begin = reinterpret_cast<const char*>(bytes.data() + offset);
  const size_t max = bytes.size() - offset;
  const size_t length = strnlen(begin, max);
  if (length == max) malformed("unterminated string");
  return std::string(begin, length);
}

std::string without_spaces(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c != ' ') out += c;
  }
  return out;
}

std::string demangle(const std::string& mangled) {
  int status = 0;
  std::unique_ptr<char, decltype(&std::free)> text(abi::__cxa_demangle(mangled.c_str(), nullptr, nullptr, &status), &std::free);
  return status == 0 && text ? std::string(text.get()) : mangled;
}

// A feature flag of a target string ("sramecc+") or of a code object.
enum class Feature { kAny, kOn, kOff };
Feature feature_of(const std::string& target, const std::string& name) {
  if (target.find(":" + name + "+") != std::string::npos) return Feature::kOn;
  if (target.find(":" + name + "-") != std::string::npos) return Feature::kOff;
  return Feature::kAny;
}

}  // namespace

CodeObjectInfo read_code_object(const std::vector<uint8_t>& bytes) {
  if (bytes.size() < 64 || std::memcmp(bytes.data(),
                                       "\x7f"
                                       "ELF",
                                       4) != 0)
    malformed("not an ELF file");
  if (bytes[4] != 2 || bytes[5] != 1) malformed("not a 64-bit little-endian ELF file");
  const uint16_t machine = read<uint16_t>(bytes, 18);
  if (machine != kMachineAmdgpu) malformed(fmt::format("e_machine {} is not EM_AMDGPU ({})", machine, kMachineAmdgpu));
  const uint32_t flags = read<uint32_t>(bytes, 48);
  CodeObjectInfo info;
  const auto mach = mach_names().find(flags & kMachMask);
  info.arch = mach != mach_names().end() ? mach->second : fmt::format("gfx(mach 0x{:x})", flags & kMachMask);
  info.target = info.arch;
  if ((flags & kSrameccMask) == kSrameccOn) info.target += ":sramecc+";
  if ((flags & kSrameccMask) == kSrameccOff) info.target += ":sramecc-";
  if ((flags & kXnackMask) == kXnackOn) info.target += ":xnack+";
  if ((flags & kXnackMask) == kXnackOff) info.target += ":xnack-";

  const uint64_t section_offset = read<uint64_t>(bytes, 40);
  const uint16_t section_size = read<uint16_t>(bytes, 58);
  const uint16_t section_count = read<uint16_t>(bytes, 60);
  if (section_size < 64) malformed(fmt::format("section header size {} is below 64", section_size));
  for (uint16_t i = 0; i < section_count; ++i) {
    const uint64_t header = section_offset + uint64_t{i} * section_size;
    const uint32_t type = read<uint32_t>(bytes, header + 4);
    if (type != kSymtab && type != kDynsym) continue;
    const uint64_t offset = read<uint64_t>(bytes, header + 24);
    const uint64_t size = read<uint64_t>(bytes, header + 32);
    const uint32_t link = read<uint32_t>(bytes, header + 40);
    const uint64_t entry_size = read<uint64_t>(bytes, header + 56);
    if (entry_size < 24 || link >= section_count) malformed("bad symbol table header");
    const uint64_t strings = read<uint64_t>(bytes, section_offset + uint64_t{link} * section_size + 24);
    for (uint64_t s = 0; s + entry_size <= size; s += entry_size) {
      const std::string name = read_string(bytes, strings + read<uint32_t>(bytes, offset + s));
      if (name.size() > 3 && name.compare(name.size() - 3, 3, ".kd") == 0) {
        std::string kernel = name.substr(0, name.size() - 3);
        bool seen = false;
        for (const auto& k : info.kernels) seen = seen || k == kernel;
        if (!seen) info.kernels.push_back(std::move(kernel));
      }
    }
  }
  return info;
}

bool target_runs(const std::string& built, const std::string& wanted) {
  if (built.substr(0, built.find(':')) != wanted.substr(0, wanted.find(':'))) return false;
  for (const char* feature : {"sramecc", "xnack"}) {
    const Feature b = feature_of(built, feature), w = feature_of(wanted, feature);
    if (b != Feature::kAny && w != Feature::kAny && b != w) return false;
    if (b != Feature::kAny && w == Feature::kAny) return false;  // the device may run either way
  }
  return true;
}

std::string find_kernel(const CodeObjectInfo& info, const std::string& name_expression) {
  if (info.kernels.size() == 1) return info.kernels.front();
  const std::string wanted = without_spaces(name_expression) + "(";
  for (const auto& kernel : info.kernels) {
    std::string demangled = without_spaces(demangle(kernel));
    if (demangled.rfind("void", 0) == 0) demangled.erase(0, 4);
    if (demangled.rfind(wanted, 0) == 0) return kernel;
  }
  std::vector<std::string> names;
  for (const auto& kernel : info.kernels) names.push_back(demangle(kernel));
  throw Error(ErrorCode::kCompileFailed,
              fmt::format("the code object for {} defines no kernel named '{}' (it defines: {})", info.target, name_expression,
                          names.empty() ? std::string("none") : fmt::format("{}", fmt::join(names, "; "))));
}

}  // namespace kiln::detail::hip
