#include "backends/hip/offline_clang.hpp"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "backends/hip/code_object.hpp"
#include "core/env.hpp"
#include "core/temporary_folder.hpp"
#include "kiln/error.hpp"

extern char** environ;

namespace kiln::detail::hip {
namespace {

namespace fs = std::filesystem;

constexpr int kMinimumClang = 20;  // first release with gfx950

struct ProcessResult {
  int status = 0;
  bool timed_out = false;
  std::string output;  // stdout and stderr together
};

// Runs argv[0] (a path) with its output in `log_path`, killing it after `timeout_seconds`.
ProcessResult run_process(const std::vector<std::string>& argv, const fs::path& log_path, double timeout_seconds) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  const int spawned = posix_spawn(&pid, argv[0].c_str(), &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (spawned != 0) {
    throw Error(ErrorCode::kCompileFailed, fmt::format("cannot start {}: {}", argv[0], strerror(spawned)));
  }
  ProcessResult result;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_seconds);
  while (true) {
    const pid_t done = waitpid(pid, &result.status, WNOHANG);
    if (done == pid) break;
    if (done < 0 && errno != EINTR) break;
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGKILL);
      while (waitpid(pid, &result.status, 0) < 0 && errno == EINTR) {
      }
      result.timed_out = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::ifstream log(log_path);
  std::stringstream text;
  text << log.rdbuf();
  result.output = text.str();
  return result;
}

// Writes `text` at `name` under `root`; a name that would leave `root` is refused.
void write_file(const fs::path& root, const std::string& name, const std::string& text) {
  const fs::path relative = fs::path(name).lexically_normal();
  if (relative.empty() || relative.is_absolute() || *relative.begin() == "..") {
    throw Error(ErrorCode::kInvalidArgument, fmt::format("source name '{}' is not a relative path inside the program", name));
  }
  const fs::path file = root / relative;
  fs::create_directories(file.parent_path());
  std::ofstream out(file, std::ios::binary);
  out << text;
  if (!out) throw Error(ErrorCode::kCompileFailed, fmt::format("cannot write {}", file.string()));
}

// `path --version` (empty when it fails), run once per path: every compile request asks which
// clang it gets, and a KILN_CLANG binary is checked each time.
std::string version_text_of(const std::string& path) {
  static std::mutex mutex;
  static std::map<std::string, std::string> texts;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = texts.find(path);
  if (it != texts.end()) return it->second;
  const TemporaryFolder folder("kiln-clang");
  const ProcessResult r = run_process({path, "--version"}, folder.path() / "version.txt", 30);
  const bool ok = !r.timed_out && WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0;
  return texts.emplace(path, ok ? r.output : std::string()).first->second;
}

std::optional<int> clang_major_version(const std::string& path, std::string* version_text) {
  const std::string text = version_text_of(path);
  if (text.empty()) return std::nullopt;
  if (version_text) *version_text = text;
  const auto at = text.find("version ");
  if (at == std::string::npos) return std::nullopt;
  return std::atoi(text.c_str() + at + 8);
}

bool executable(const std::string& path) { return ::access(path.c_str(), X_OK) == 0; }

std::vector<std::string> clang_candidates() {
  std::vector<std::string> candidates;
  std::vector<std::string> path_dirs;
  if (auto path = env_string("PATH")) {
    std::stringstream dirs(*path);
    for (std::string dir; std::getline(dirs, dir, ':');) {
      if (!dir.empty()) path_dirs.push_back(dir);
    }
  }
  for (int major = 23; major >= kMinimumClang; --major) {
    for (const auto& dir : path_dirs) candidates.push_back(fmt::format("{}/clang++-{}", dir, major));
    candidates.push_back(fmt::format("/usr/lib/llvm-{}/bin/clang++", major));
  }
  const std::string rocm = env_string("ROCM_PATH").value_or("/opt/rocm");
  candidates.push_back(rocm + "/llvm/bin/clang++");
  return candidates;
}

}  // namespace

std::optional<std::string> find_clang(std::string* why) {
  if (auto named = env_string("KILN_CLANG")) {
    const auto major = executable(*named) ? clang_major_version(*named, nullptr) : std::nullopt;
    if (!major || *major < kMinimumClang) {
      if (why) {
        *why = major ? fmt::format("KILN_CLANG={} is clang {}; kiln needs clang {} or newer for its AMD targets", *named, *major,
                                   kMinimumClang)
                     : fmt::format("KILN_CLANG={} is not an executable clang", *named);
      }
      return std::nullopt;
    }
    return named;
  }
  static const std::optional<std::string> found = []() -> std::optional<std::string> {
    for (const auto& candidate : clang_candidates()) {
      if (!executable(candidate)) continue;
      const auto major = clang_major_version(candidate, nullptr);
      if (major && *major >= kMinimumClang) return candidate;
    }
    return std::nullopt;
  }();
  if (!found && why) {
    *why = fmt::format(
        "no clang {} or newer found (looked for clang++-{}..23 on PATH and under /usr/lib/llvm-NN/bin, "
        "and ROCm's llvm/bin/clang++; KILN_CLANG names one; Debian: apt-get install clang-22 lld-22)",
        kMinimumClang, kMinimumClang);
  }
  return found;
}

std::optional<std::string> clang_fingerprint() {
  const auto clang = find_clang();
  if (!clang) return std::nullopt;
  std::error_code ec;
  const std::string file = fs::canonical(*clang, ec).string();
  struct stat st {};
  if (ec || ::stat(file.c_str(), &st) != 0) return std::nullopt;
  return fmt::format("{}|{}|{}|{}", file, st.st_size, static_cast<long long>(st.st_mtim.tv_sec) * 1000000000LL + st.st_mtim.tv_nsec,
                     st.st_ino);
}

const std::string& clang_identity() {
  static const std::string identity = [] {
    std::string why;
    const auto clang = find_clang(&why);
    if (!clang) throw Error(ErrorCode::kUnsupported, why);
    std::string text;
    if (!clang_major_version(*clang, &text)) throw Error(ErrorCode::kCompileFailed, fmt::format("{} --version failed", *clang));
    const std::string first_line = text.substr(0, text.find('\n'));
    const auto at = first_line.find("version ");
    const std::string version = first_line.substr(at + 8, first_line.find(' ', at + 8) - (at + 8));
    std::error_code ec;
    const auto size = fs::file_size(fs::canonical(*clang, ec), ec);
    const std::string what = fmt::format("{}|{}", text, ec ? 0 : size);
    return fmt::format("clang {} {:016x}", version, XXH3_64bits(what.data(), what.size()));
  }();
  return identity;
}

CompileResult clang_compile(const CompileRequest& r, double timeout_seconds) {
  std::string why;
  const auto clang = find_clang(&why);
  if (!clang) throw Error(ErrorCode::kUnsupported, why);
  const auto start = std::chrono::steady_clock::now();
  const TemporaryFolder folder("kiln-clang");
  for (const auto& [name, text] : r.headers) write_file(folder.path(), name, text);
  // NVRTC and hipRTC instantiate the name expression themselves; clang instantiates what the
  // program odr-uses, so the program takes the kernel's address.
  std::string source = r.source;
  if (!r.name_expression.empty()) {
    source += fmt::format("\n[[maybe_unused]] static const auto kiln_instantiation = &{};\n", r.name_expression);
  }
  write_file(folder.path(), r.source_name, source);
  const fs::path output = folder.path() / "kernel.co";
  std::vector<std::string> argv = {*clang, "-x", "hip", "--offload-arch=" + r.target, "--cuda-device-only", "--no-gpu-bundle-output",
                                   "-nogpuinc", "-nogpulib",
                                   // A fixed compilation-unit id: the default one hashes the
                                   // temporary path into the binary.
                                   "-cuid=kiln", "-I", folder.path().string()};
  argv.insert(argv.end(), r.options.begin(), r.options.end());
  argv.insert(argv.end(), {"-o", output.string(), (folder.path() / r.source_name).string()});
  std::vector<std::string> options(argv.begin() + 1, argv.end());
  const ProcessResult run = run_process(argv, folder.path() / "clang.log", timeout_seconds);
  if (run.timed_out) {
    throw Error::compile_failed(r.kernel_name, r.target, options,
                                fmt::format("clang took longer than {} s and was killed\n{}", timeout_seconds, run.output));
  }
  if (!WIFEXITED(run.status) || WEXITSTATUS(run.status) != 0) {
    throw Error::compile_failed(r.kernel_name, r.target, options, run.output);
  }
  CompileResult result;
  result.log = run.output;
  std::ifstream in(output, std::ios::binary);
  result.binary.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  if (result.binary.empty()) throw Error::compile_failed(r.kernel_name, r.target, options, "clang produced no code object\n" + run.output);
  const CodeObjectInfo info = read_code_object(result.binary);
  if (!target_runs(info.target, r.target)) {
    throw Error::compile_failed(r.kernel_name, r.target, options,
                                fmt::format("clang built a code object for {}, not {}", info.target, r.target));
  }
  if (!r.name_expression.empty()) result.lowered_name = find_kernel(info, r.name_expression);
  result.compile_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace kiln::detail::hip
