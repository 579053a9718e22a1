#include "warmup/capture.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cctype>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/env.hpp"
#include "jit/operator_call.hpp"
#include "kiln/error.hpp"
#include "kiln/log.hpp"
#include "kiln/warmup.hpp"

namespace kiln {
namespace {

struct CaptureState {
  std::mutex mutex;
  std::string path;
  bool initialized = false;
  std::set<std::string> seen;
};

CaptureState& state() {
  static CaptureState s;
  return s;
}

nlohmann::json signature_json(const Signature& sig) {
  nlohmann::json fields = nlohmann::json::object();
  for (const auto& [k, v] : sig.fields()) {
    const bool number =
        !v.empty() && v.size() < 18 && std::all_of(v.begin(), v.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
    fields[k] = number ? nlohmann::json(std::stoll(v)) : nlohmann::json(v);
  }
  return {{"op", operator_name(sig.op())}, {"signature", fields}};
}

// Read-merge-write under an exclusive lock on "<path>.lock", replacing the manifest atomically,
// so several processes can capture into one file.
void append(const std::string& path, const Signature& sig) {
  const std::string lock_path = path + ".lock";
  const int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) throw Error(ErrorCode::kInvalidArgument, fmt::format("KILN_CAPTURE: cannot open {}", lock_path));
  ::flock(fd, LOCK_EX);
  try {
    nlohmann::json doc;
    std::ifstream in(path);
    if (in) {
      std::stringstream text;
      text << in.rdbuf();
      if (!text.str().empty()) {
        parse_manifest(text.str(), path);  // refuse to extend a file that is not a valid manifest
        doc = nlohmann::json::parse(text.str());
      }
    }
    if (doc.is_null()) {
      doc = {{"kiln_manifest", kManifestFormatVersion},
             {"model", "captured"},
             {"description", "Signatures captured from running processes (KILN_CAPTURE)."},
             {"operators", nlohmann::json::array()}};
    }
    const nlohmann::json entry = signature_json(sig);
    bool present = false;
    for (const auto& e : doc["operators"]) present |= (e == entry);
    if (!present) {
      doc["operators"].push_back(entry);
      const std::string tmp = fmt::format("{}.tmp.{}", path, ::getpid());
      std::ofstream(tmp) << doc.dump(2) << "\n";
      std::filesystem::rename(tmp, path);
    }
  } catch (...) {
    ::flock(fd, LOCK_UN);
    ::close(fd);
    throw;
  }
  ::flock(fd, LOCK_UN);
  ::close(fd);
}

}  // namespace

void set_capture_file(const std::string& path) {
  CaptureState& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.path = path;
  s.initialized = true;
  s.seen.clear();
}

namespace detail {

void capture_signature(const Signature& sig) {
  CaptureState& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (!s.initialized) {
    if (auto path = env_string("KILN_CAPTURE")) s.path = *path;
    s.initialized = true;
  }
  if (s.path.empty() || !s.seen.insert(sig.canonical()).second) return;
  try {
    append(s.path, sig);
  } catch (const std::exception& e) {
    log(LogLevel::kWarn, fmt::format("kiln capture: cannot add to {}: {}; capture stops", s.path, e.what()));
    s.path.clear();
  }
}

// Shape capture watches the JIT layer's misses from the moment libkiln is loaded.
const bool kCaptureInstalled = (set_miss_observer(&capture_signature), true);

}  // namespace detail
}  // namespace kiln
