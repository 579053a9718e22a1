// Compile isolation: a crashing or hanging compiler costs the worker process, never the caller.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>
#include <thread>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include "backends/cuda/nvrtc.hpp"
#include "jit/compiler.hpp"
#include "jit/pipeline.hpp"
#include "jit/sources.hpp"
#include "kiln/error.hpp"
#include "kiln/registry.hpp"

namespace kiln::detail {
namespace {

CompileRequest reference_request() {
  Signature sig({kFamilyAttention, kModeDecode});
  sig.set("dtype", "bf16").set("kv_dtype", "bf16").set("head_dim", int64_t{128}).set("group", int64_t{8});
  auto spec = Registry::global().find("attention.decode.reference");
  return build_request(*spec, sig, platform_for_target("sm_90a"));
}

TEST(Isolation, WorkerCompileMatchesInProcess) {
  const CompileRequest r = reference_request();
  const CompileResult in_worker = compile_in_worker(r, default_worker_path(), 120);
  const CompileResult in_process = cuda::nvrtc_compile(r);
  EXPECT_GT(in_worker.binary.size(), 0u);
  EXPECT_EQ(in_worker.binary, in_process.binary);
  EXPECT_EQ(in_worker.lowered_name, in_process.lowered_name);
}

TEST(Isolation, CompileErrorFromWorkerKeepsTheLog) {
  CompileRequest r = reference_request();
  r.source += "\nthis is not C++;\n";
  try {
    compile_in_worker(r, default_worker_path(), 120);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kCompileFailed);
    EXPECT_NE(e.compile_log().find("error"), std::string::npos) << e.compile_log();
    EXPECT_EQ(e.compile_target(), "sm_90a");
    EXPECT_NE(std::string(e.what()).find("-arch=sm_90a"), std::string::npos) << e.what();
  }
}

TEST(Isolation, RealNvrtcCrashBecomesAnError) {
  std::ifstream in(std::string(KILN_TEST_KERNEL_SOURCES) + "/../tests/support/nvrtc_crash_wgmma.cu");
  std::stringstream text;
  text << in.rdbuf();
  CompileRequest r;
  r.kernel_name = "nvrtc-crash-repro";
  r.source_name = "crash.cu";
  r.source = text.str();
  r.target = "sm_90a";
  ASSERT_FALSE(r.source.empty());
  try {
    compile_in_worker(r, default_worker_path(), 120);
    GTEST_SKIP() << "this NVRTC no longer crashes on the wgmma input";
  } catch (const Error& e) {
    // A plain build dies by SIGSEGV; under AddressSanitizer the worker reports NVRTC's bad
    // allocation and exits. Either way the caller gets a clean error and lives on.
    EXPECT_EQ(e.code(), ErrorCode::kCompileFailed);
    EXPECT_NE(std::string(e.what()).find("the compiler crashed on this kernel"), std::string::npos) << e.what();
  }
}

TEST(Isolation, CrashingWorker) {
  try {
    compile_in_worker(reference_request(), KILN_TEST_FAKE_WORKER_CRASH, 30);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kCompileFailed);
    EXPECT_NE(std::string(e.what()).find("killed by signal 11"), std::string::npos) << e.what();
  }
}

TEST(Isolation, HangingWorkerIsKilledAtTheLimit) {
  const auto start = std::chrono::steady_clock::now();
  try {
    compile_in_worker(reference_request(), KILN_TEST_FAKE_WORKER_HANG, 1.5);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kCompileFailed);
    EXPECT_NE(std::string(e.what()).find("took longer than 1.5 s and was killed"), std::string::npos) << e.what();
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 10.0);
}

// Whatever a worker sends back, the caller gets a kiln::Error naming what was wrong: never an
// exception of another type, never an unbounded buffer.
TEST(Isolation, MisbehavingWorkerRepliesAreClearErrors) {
  const struct {
    const char* worker;
    const char* expect;
  } cases[] = {
      {.worker = "kiln-fake-worker-malformed", .expect = "malformed error reply"},
      {.worker = "kiln-fake-worker-notamap", .expect = "malformed error reply"},
      {.worker = "kiln-fake-worker-badtag", .expect = "reply of unknown kind 7"},
      {.worker = "kiln-fake-worker-oldprotocol", .expect = "speaks worker protocol 1, this kiln speaks 2"},
      {.worker = "kiln-fake-worker-oversized", .expect = "reply exceeded 268435456 bytes"},
  };
  for (const auto& c : cases) {
    const std::string path = std::string(KILN_TEST_FAKE_WORKER_DIR) + "/" + c.worker;
    try {
      compile_in_worker(reference_request(), path, 60);
      ADD_FAILURE() << c.worker << ": accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kCompileFailed) << c.worker;
      EXPECT_NE(std::string(e.what()).find(c.expect), std::string::npos) << c.worker << ": " << e.what();
    } catch (const std::exception& e) {
      ADD_FAILURE() << c.worker << ": not a kiln::Error: " << e.what();
    }
  }
}

// Ctrl-C during a warm-up: a worker that started after the signal never saw it; cancel_compiles()
// kills it within a moment instead of at its time limit. In a child process, since cancelling is
// for the life of the process.
TEST(Isolation, CancelledCompileStopsAHangingWorkerAtOnce) {
  const pid_t pid = fork();
  if (pid == 0) {
    std::thread canceller([] {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      cancel_compiles();
    });
    const auto start = std::chrono::steady_clock::now();
    int rc = 1;
    try {
      compile_in_worker(reference_request(), KILN_TEST_FAKE_WORKER_HANG, 60);
    } catch (const Error& e) {
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      rc = std::string(e.what()).find("cancelled") != std::string::npos && seconds < 5 ? 0 : 2;
    }
    canceller.join();
    try {  // and a compile asked for afterwards is refused at once
      compile_in_worker(reference_request(), KILN_TEST_FAKE_WORKER_HANG, 60);
      rc = 3;
    } catch (const Error& e) {
      if (std::string(e.what()).find("cancelled") == std::string::npos) rc = 4;
    }
    _exit(rc);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "1: not cancelled, 2: wrong message or too slow, 3/4: a later compile was not refused";
}

// What a worker leaves behind ends with the compile: a child holding its output does not hold the
// caller until the time limit, its temporary folder is removed, and a kill from outside is not
// called a compiler crash.
TEST(Isolation, WorkerLeavesNothingBehind) {
  const std::string dir = KILN_TEST_FAKE_WORKER_DIR;
  auto start = std::chrono::steady_clock::now();
  try {
    compile_in_worker(reference_request(), dir + "/kiln-fake-worker-orphan", 60);
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("exited with status 1"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 10.0) << "waited for the orphan";

  std::string message;
  try {
    compile_in_worker(reference_request(), dir + "/kiln-fake-worker-tmpdir", 1);
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    message = e.what();
  }
  const size_t at = message.find("TMPDIR=");
  ASSERT_NE(at, std::string::npos) << message;
  const std::string tmpdir = message.substr(at + 7, message.find('\n', at) - at - 7);
  EXPECT_NE(tmpdir.find("kiln-worker-"), std::string::npos) << tmpdir;
  EXPECT_FALSE(std::filesystem::exists(tmpdir)) << tmpdir << " was left behind";

  try {
    compile_in_worker(reference_request(), dir + "/kiln-fake-worker-selfkill", 60);
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("kiln did not kill it"), std::string::npos) << e.what();
  }
}

// Code kiln loads or runs from outside its cache gets the cache's trust rules: a plugin, a compile
// worker or a kernel-source folder that other users can write (here: a folder of mode 0777
// without the sticky bit) is refused, naming what and why.
TEST(Isolation, CodeOtherUsersCanWriteIsRefused) {
  namespace fs = std::filesystem;
  const fs::path open = fs::temp_directory_path() / ("kiln-untrusted-" + std::to_string(::getpid()));
  fs::remove_all(open);
  fs::create_directories(open / "sources");
  fs::copy_file(KILN_TEST_PLUGIN_GOOD, open / "plugin.so");
  fs::copy_file(KILN_TEST_FAKE_WORKER_CRASH, open / "worker");
  fs::permissions(open, fs::perms::all);
  fs::permissions(open / "sources", fs::perms::all);
  auto expect_refused = [](const std::function<void()>& run, const char* what) {
    try {
      run();
      ADD_FAILURE() << what << ": accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("writable by other users"), std::string::npos) << what << ": " << e.what();
    }
  };
  expect_refused([&] { load_plugin((open / "plugin.so").string()); }, "plugin");
  expect_refused([&] { compile_in_worker(reference_request(), (open / "worker").string(), 30); }, "worker");
  setenv("KILN_KERNEL_SOURCES", (open / "sources").c_str(), 1);
  expect_refused([] { read_kernel_file("common/prelude.cuh"); }, "KILN_KERNEL_SOURCES");
  unsetenv("KILN_KERNEL_SOURCES");
  fs::remove_all(open);
}

TEST(Isolation, MissingWorkerIsAClearError) {
  try {
    compile_in_worker(reference_request(), "/nonexistent/kiln-compile-worker", 10);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("KILN_COMPILE_ISOLATION=inprocess"), std::string::npos) << e.what();
  }
}

TEST(Isolation, SettingsAreValidated) {
  JitSettings s = jit_settings();
  EXPECT_EQ(s.isolation, CompileIsolation::kWorkerProcess);  // the default
  s.timeout_seconds = 0;
  EXPECT_THROW(set_jit_settings(s), Error);
  s.timeout_seconds = 9e18;  // the deadline arithmetic overflowed and every compile failed
  EXPECT_THROW(set_jit_settings(s), Error);
  setenv("KILN_COMPILE_TIMEOUT_S", "9000000000000000000", 1);
  try {
    jit_settings_from_environment();
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("KILN_COMPILE_TIMEOUT_S=9000000000000000000 must be from 1 to 604800 seconds"), std::string::npos)
        << e.what();
  }
  unsetenv("KILN_COMPILE_TIMEOUT_S");
}

}  // namespace
}  // namespace kiln::detail
