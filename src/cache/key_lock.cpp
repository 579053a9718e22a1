#include "cache/key_lock.hpp"
#include "cache/cache_directory.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include <fmt/format.h>

#include "kiln/log.hpp"

namespace kiln::detail {
namespace {

constexpr long long kSlots = 1LL << 20;  // distinct keys rarely share a slot; sharing only serializes

bool try_lock(int fd, long long offset, short type) {
  struct flock fl {};
  fl.l_type = type;
  fl.l_whence = SEEK_SET;
  fl.l_start = offset;
  fl.l_len = 1;
  return ::fcntl(fd, F_OFD_SETLK, &fl) == 0;
}

}  // namespace

KeyLock::KeyLock(const std::string& directory, const KernelKey& key, double timeout_seconds) {
  if (directory.empty()) return;
  const std::string path = directory + "/locks";
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK, cache_file_mode());
  struct stat st {};
  if (fd_ >= 0 && (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode))) {
    ::close(fd_);
    fd_ = -1;
    errno = EINVAL;
  }
  if (fd_ < 0) {
    // A link, a directory or a FIFO where the lock file belongs turns cross-process locking off:
    // say so once, loudly, rather than compile every key in every process.
    const int error = errno;
    if (error == ELOOP || error == EISDIR || error == EINVAL) {
      static std::atomic<bool> warned{false};
      if (!warned.exchange(true)) {
        log(LogLevel::kWarn, fmt::format("kiln cache: {} is not a regular file ({}); processes sharing this cache will each compile "
                                         "what they miss until it is removed",
                                         path,
                                         error == ELOOP    ? "a symbolic link"
                                         : error == EISDIR ? "a directory"
                                                           : "a special file"));
      }
    } else {
      log(LogLevel::kDebug,
          fmt::format("kiln cache: no lock file {} ({}); compiling without a cross-process lock", path, std::strerror(error)));
    }
    return;
  }
  offset_ = static_cast<long long>(key.low % static_cast<uint64_t>(kSlots));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_seconds);
  auto pause = std::chrono::milliseconds(1);
  while (true) {
    if (try_lock(fd_, offset_, F_WRLCK)) {
      acquired_ = true;
      return;
    }
    if (errno != EAGAIN && errno != EACCES) {
      log(LogLevel::kDebug, fmt::format("kiln cache: {} does not support locks ({}); compiling without one", path, std::strerror(errno)));
      return;
    }
    waited_ = true;
    if (std::chrono::steady_clock::now() >= deadline) {
      log(LogLevel::kWarn,
          fmt::format("kiln cache: waited {:.0f} s for another process compiling key {}; compiling here too", timeout_seconds, key.hex()));
      return;
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(50));
  }
}

KeyLock::~KeyLock() {
  if (acquired_) try_lock(fd_, offset_, F_UNLCK);
  if (fd_ >= 0) ::close(fd_);
}

}  // namespace kiln::detail
