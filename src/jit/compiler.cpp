#include "jit/compiler.hpp"

#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <mutex>
#include <optional>
#include <stdexcept>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "backends/backend.hpp"
#include "cache/kernel_cache.hpp"
#include "core/env.hpp"
#include "core/file_trust.hpp"
#include "core/temporary_folder.hpp"
#include "kiln/error.hpp"

extern char** environ;

namespace kiln {
namespace {

std::mutex& settings_mutex() {
  static std::mutex m;
  return m;
}

}  // namespace

JitSettings detail::jit_settings_from_environment() {
  JitSettings s;
  if (auto mode = detail::env_string("KILN_COMPILE_ISOLATION")) {
    if (*mode == "process") {
      s.isolation = CompileIsolation::kWorkerProcess;
    } else if (*mode == "inprocess") {
      s.isolation = CompileIsolation::kInProcess;
    } else {
      throw Error(ErrorCode::kInvalidArgument, fmt::format("KILN_COMPILE_ISOLATION='{}' must be 'process' or 'inprocess'", *mode));
    }
  }
  if (auto worker = detail::env_string("KILN_COMPILE_WORKER")) s.worker_path = *worker;
  if (auto amd = detail::env_string("KILN_AMD_COMPILER")) {
    if (*amd == "auto") {
      s.amd_compiler = AmdCompiler::kAuto;
    } else if (*amd == "hiprtc") {
      s.amd_compiler = AmdCompiler::kHiprtc;
    } else if (*amd == "clang") {
      s.amd_compiler = AmdCompiler::kClang;
    } else {
      throw Error(ErrorCode::kInvalidArgument, fmt::format("KILN_AMD_COMPILER='{}' must be 'auto', 'hiprtc' or 'clang'", *amd));
    }
  }
  if (auto jit = detail::env_string("KILN_JIT")) {
    if (*jit == "on" || *jit == "1") {
      s.compile = true;
    } else if (*jit == "off" || *jit == "0") {
      s.compile = false;
    } else {
      throw Error(ErrorCode::kInvalidArgument, fmt::format("KILN_JIT='{}' must be 'on' or 'off'", *jit));
    }
  }
  if (auto timeout = detail::env_int("KILN_COMPILE_TIMEOUT_S")) {
    if (*timeout <= 0 || *timeout > detail::kMaxCompileTimeoutSeconds) {
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("KILN_COMPILE_TIMEOUT_S={} must be from 1 to {} seconds", *timeout, detail::kMaxCompileTimeoutSeconds));
    }
    s.timeout_seconds = static_cast<double>(*timeout);
  }
  return s;
}

namespace {

JitSettings& current_settings() {
  static JitSettings s = detail::jit_settings_from_environment();
  return s;
}

}  // namespace

JitSettings jit_settings() {
  std::lock_guard<std::mutex> lock(settings_mutex());
  return current_settings();
}

void set_jit_settings(const JitSettings& settings) {
  if (!(settings.timeout_seconds > 0) || settings.timeout_seconds > detail::kMaxCompileTimeoutSeconds) {
    throw Error(ErrorCode::kInvalidArgument, fmt::format("JitSettings::timeout_seconds must be > 0 and at most {}, got {}",
                                                         detail::kMaxCompileTimeoutSeconds, settings.timeout_seconds));
  }
  std::lock_guard<std::mutex> lock(settings_mutex());
  current_settings() = settings;
}

namespace detail {
namespace {

// Closes a descriptor on every path.
struct Fd {
  int fd = -1;
  explicit Fd(int f = -1) : fd(f) {}
  ~Fd() { reset(); }
  void reset() {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
};

std::string describe_status(int status) {
  if (WIFSIGNALED(status)) return fmt::format("was killed by signal {} ({})", WTERMSIG(status), strsignal(WTERMSIG(status)));
  if (WIFEXITED(status)) return fmt::format("exited with status {}", WEXITSTATUS(status));
  return "ended abnormally";
}

}  // namespace

std::string default_worker_path() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&default_worker_path), &info) == 0 || info.dli_fname == nullptr) {
    return "kiln-compile-worker";
  }
  namespace fs = std::filesystem;
  const fs::path lib_dir = fs::path(info.dli_fname).parent_path();
  return (lib_dir / ".." / "libexec" / "kiln" / "kiln-compile-worker").lexically_normal().string();
}

namespace {

struct WorkerError {
  ErrorCode code = ErrorCode::kInternal;
  std::string message = "the compile worker failed";
  std::string log;
  std::vector<std::string> options;
};

// The worker's error map: {"protocol", "code", "message", "log", "options"}. A field of the wrong
// type, or a reply that is not a map, throws a std::exception; a code kiln does not know becomes
// kInternal.
WorkerError parse_worker_error(const std::vector<uint8_t>& body) {
  const nlohmann::json j = nlohmann::json::from_cbor(body);
  if (!j.is_object()) throw std::invalid_argument("the error reply is not a map");
  const int protocol = j.contains("protocol") ? j.at("protocol").get<int>() : 1;
  WorkerError e;
  if (auto why = worker_protocol_mismatch(protocol, "the compile worker")) {
    e.code = ErrorCode::kCompileFailed;
    e.log = *why;
    return e;
  }
  const int code = j.at("code").get<int>();
  if (code >= static_cast<int>(ErrorCode::kInvalidArgument) && code <= static_cast<int>(ErrorCode::kInternal)) {
    e.code = static_cast<ErrorCode>(code);
  }
  if (j.contains("message")) e.message = j.at("message").get<std::string>();
  if (j.contains("log")) e.log = j.at("log").get<std::string>();
  if (j.contains("options")) e.options = j.at("options").get<std::vector<std::string>>();
  if (e.code == ErrorCode::kCompileFailed && e.log.empty()) e.log = e.message;
  return e;
}

// Computing an identity loads the compiler and may compile a probe or run it (tens of ms). The
// cache remembers it per compiler file, so a warm process finds its kernels without loading the
// compiler at all.
std::string remembered_identity(const std::optional<std::string>& fingerprint, const std::function<std::string()>& compute) {
  KernelCache& cache = KernelCache::process();
  const std::string memo = fingerprint ? "compiler-identity " + *fingerprint : "";
  if (fingerprint) {
    if (auto known = cache.meta_get(memo)) return *known;
  }
  std::string computed = compute();
  if (fingerprint) cache.meta_put(memo, computed);
  return computed;
}

}  // namespace

const IdentityMemo& cache_identity_memo() {
  static const IdentityMemo memo = remembered_identity;
  return memo;
}

std::string compiler_identity(CompilerKind kind) { return backend_for(kind).compiler_identity(kind, cache_identity_memo()); }

CompilerKind compiler_for(const Platform& platform, const JitSettings& settings) {
  return backend_for(platform.vendor).compiler_for(platform, settings);
}

}  // namespace detail

std::vector<CompilerReport> available_compilers() {
  std::vector<CompilerReport> reports;
  for (detail::VendorBackend* backend : detail::backends()) {
    std::vector<std::string> targets;
    for (const auto& t : known_targets()) {
      if (platform_for_target(t).vendor == backend->vendor()) targets.push_back(t);
    }
    backend->report_compilers(targets, detail::cache_identity_memo(), reports);
  }
  return reports;
}

namespace detail {

CompileResult compile_in_this_process(const CompileRequest& request, double timeout_seconds) {
  return backend_for(request.compiler).compile(request, timeout_seconds);
}

namespace {

std::atomic<bool> compiles_cancelled{false};
static_assert(std::atomic<bool>::is_always_lock_free, "cancel_compiles() must be async-signal-safe");

Error cancelled_compile(const CompileRequest& request) {
  return Error::compile_failed(request.kernel_name, request.target, request.options, "cancelled (interrupted) before it finished");
}

}  // namespace

void cancel_compiles() noexcept { compiles_cancelled.store(true); }

CompileResult compile_in_worker(const CompileRequest& request, const std::string& worker_path, double timeout_seconds) {
  if (compiles_cancelled.load()) throw cancelled_compile(request);
  if (auto why = untrusted_code_path(worker_path, "compile worker")) throw Error(ErrorCode::kCompileFailed, *why);
  if (::access(worker_path.c_str(), X_OK) != 0) {
    throw Error(ErrorCode::kCompileFailed, fmt::format("compile worker {} is missing or not executable (set KILN_COMPILE_WORKER, or "
                                                       "KILN_COMPILE_ISOLATION=inprocess)",
                                                       worker_path));
  }
  // A socket for stdin: send() with MSG_NOSIGNAL cannot raise SIGPIPE in a host process when the
  // worker dies before reading.
  int in_pair[2], out_pipe[2], err_pipe[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, in_pair) != 0) throw Error(ErrorCode::kCompileFailed, "socketpair failed");
  Fd in_parent(in_pair[0]), in_child(in_pair[1]);
  if (pipe2(out_pipe, O_CLOEXEC) != 0) throw Error(ErrorCode::kCompileFailed, "pipe failed");
  Fd out_parent(out_pipe[0]), out_child(out_pipe[1]);
  if (pipe2(err_pipe, O_CLOEXEC) != 0) throw Error(ErrorCode::kCompileFailed, "pipe failed");
  Fd err_parent(err_pipe[0]), err_child(err_pipe[1]);

  // The worker gets a private temporary folder (TMPDIR), removed when the compile ends however it
  // ends, and its own process group, so that a time limit or a cancel also ends what it started
  // (an offline clang) instead of leaving it running with the output pipe open.
  const TemporaryFolder temp("kiln-worker");
  std::vector<std::string> environment;
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::strncmp(*e, "TMPDIR=", 7) != 0) environment.emplace_back(*e);
  }
  environment.push_back("TMPDIR=" + temp.path().string());
  std::vector<char*> envp;
  for (auto& e : environment) envp.push_back(e.data());
  envp.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, in_child.fd, 0);
  posix_spawn_file_actions_adddup2(&actions, out_child.fd, 1);
  posix_spawn_file_actions_adddup2(&actions, err_child.fd, 2);
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attributes, 0);  // a group of its own, led by the worker
  char* argv[] = {const_cast<char*>(worker_path.c_str()), nullptr};
  pid_t pid = 0;
  const int spawned = posix_spawn(&pid, worker_path.c_str(), &actions, &attributes, argv, envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attributes);
  if (spawned != 0) {
    throw Error(ErrorCode::kCompileFailed, fmt::format("cannot start compile worker {}: {}", worker_path, strerror(spawned)));
  }
  in_child.reset();
  out_child.reset();
  err_child.reset();
  bool reaped = false;  // the worker exited and was waited for
  int status = 0;

  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_seconds);
  const std::vector<uint8_t> payload = encode_request(request);
  size_t sent = 0;
  std::vector<uint8_t> out;
  std::string err;
  bool timed_out = false;
  bool oversized = false;  // the reply outgrew kMaxWorkerReplyBytes
  fcntl(in_parent.fd, F_SETFL, O_NONBLOCK);
  while (!oversized) {
    struct pollfd fds[3];
    int n = 0;
    if (out_parent.fd >= 0) fds[n++] = {out_parent.fd, POLLIN, 0};
    if (err_parent.fd >= 0) fds[n++] = {err_parent.fd, POLLIN, 0};
    const bool sending = in_parent.fd >= 0;
    if (sending) fds[n++] = {in_parent.fd, POLLOUT, 0};
    if (out_parent.fd < 0 && err_parent.fd < 0) break;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
    if (left <= 0) {
      timed_out = true;
      break;
    }
    if (compiles_cancelled.load()) break;
    // A worker that exited while something it started still holds its pipes: end that group, so
    // the pipes close now rather than at the time limit.
    if (!reaped && waitpid(pid, &status, WNOHANG) == pid) {
      reaped = true;
      kill(-pid, SIGKILL);
    }
    if (poll(fds, static_cast<nfds_t>(n), static_cast<int>(std::min<long long>(left, 100))) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    for (int i = 0; i < n; ++i) {
      if (fds[i].revents == 0) continue;
      if (fds[i].fd == in_parent.fd) {
        const ssize_t w = send(in_parent.fd, payload.data() + sent, payload.size() - sent, MSG_NOSIGNAL);
        if (w > 0) sent += static_cast<size_t>(w);
        if (w < 0 && errno != EAGAIN) in_parent.reset();  // worker gone; its status says why
        if (sent == payload.size()) {
          shutdown(in_parent.fd, SHUT_WR);
          in_parent.reset();
        }
        continue;
      }
      char buf[65536];
      const ssize_t r = read(fds[i].fd, buf, sizeof(buf));
      if (r > 0) {
        if (fds[i].fd == out_parent.fd) {
          out.insert(out.end(), buf, buf + r);
          oversized = out.size() > kMaxWorkerReplyBytes;
        } else if (err.size() < kMaxWorkerLogBytes) {  // the rest of a runaway log is dropped
          err.append(buf, std::min(static_cast<size_t>(r), kMaxWorkerLogBytes - err.size()));
        }
      } else if (r == 0 || errno != EINTR) {
        if (fds[i].fd == out_parent.fd)
          out_parent.reset();
        else
          err_parent.reset();
      }
    }
  }
  const bool cancelled = compiles_cancelled.load() && (out_parent.fd >= 0 || err_parent.fd >= 0);
  const bool killed_by_kiln = timed_out || oversized || cancelled;
  if (killed_by_kiln) kill(-pid, SIGKILL);  // the worker and everything it started
  if (!reaped) {
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
  }
  const std::vector<std::string> options = request.options;
  if (cancelled) throw cancelled_compile(request);
  if (oversized) {
    throw Error::compile_failed(request.kernel_name, request.target, options,
                                fmt::format("the compile worker's reply exceeded {} bytes; the worker was killed", kMaxWorkerReplyBytes));
  }
  if (timed_out) {
    throw Error::compile_failed(request.kernel_name, request.target, options,
                                fmt::format("the compile worker took longer than {} s and was killed\n{}", timeout_seconds, err));
  }
  if (!WIFEXITED(status) || out.empty()) {
    throw Error::compile_failed(request.kernel_name, request.target, options,
                                fmt::format("the compile worker {} {}; {}\n{}", worker_path, describe_status(status),
                                            WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL
                                                ? "kiln did not kill it: the OOM killer or another process did, not a compiler crash"
                                                : "the compiler crashed on this kernel",
                                            err));
  }
  return read_worker_reply(request, out, options, err);
}

CompileResult read_worker_reply(const CompileRequest& request, const std::vector<uint8_t>& out, const std::vector<std::string>& options,
                                const std::string& err) {
  if (out.empty()) throw Error::compile_failed(request.kernel_name, request.target, options, "the compile worker sent no reply\n" + err);
  const uint8_t tag = out.front();
  std::vector<uint8_t> body(out.begin() + 1, out.end());
  // Both kinds of reply are validated field by field: a malformed one is reported, never thrown
  // through (a CBOR parser's own exceptions, a bad_alloc from a claimed length included).
  try {
    if (tag == kWorkerOk) return decode_result(body);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& what) {
    throw Error::compile_failed(request.kernel_name, request.target, options,
                                fmt::format("the compile worker sent a malformed result ({})\n{}", what.what(), err));
  }
  if (tag != kWorkerError) {
    throw Error::compile_failed(request.kernel_name, request.target, options,
                                fmt::format("the compile worker sent a reply of unknown kind {}\n{}", tag, err));
  }
  WorkerError e;
  try {
    e = parse_worker_error(body);
  } catch (const std::exception& what) {
    throw Error::compile_failed(request.kernel_name, request.target, options,
                                fmt::format("the compile worker sent a malformed error reply ({})\n{}", what.what(), err));
  }
  if (e.code == ErrorCode::kCompileFailed) throw Error::compile_failed(request.kernel_name, request.target, e.options, e.log);
  throw Error(e.code, e.message);
}

CompileResult compile(const CompileRequest& request, const JitSettings& settings) {
  if (settings.isolation == CompileIsolation::kInProcess || !backend_for(request.compiler).compiles_in_worker()) {
    return compile_in_this_process(request, settings.timeout_seconds);
  }
  if (!settings.worker_path.empty()) return compile_in_worker(request, settings.worker_path, settings.timeout_seconds);
  // The worker where kiln installs it beside the library (for a program linked with kiln_static:
  // beside the program, as when it is installed under kiln's prefix). A program that has none
  // there compiles in its own process, once warned: what KILN_COMPILE_WORKER would give it.
  const std::string worker = default_worker_path();
  if (::access(worker.c_str(), X_OK) != 0) {
    static std::once_flag warned;
    std::call_once(warned, [&] {
      log(LogLevel::kWarn, fmt::format("kiln: no compile worker at {} (set KILN_COMPILE_WORKER to kiln's libexec/kiln/"
                                       "kiln-compile-worker); compiling in this process, where a compiler crash ends it",
                                       worker));
    });
    return compile_in_this_process(request, settings.timeout_seconds);
  }
  return compile_in_worker(request, worker, settings.timeout_seconds);
}

}  // namespace detail
}  // namespace kiln
