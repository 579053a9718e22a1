// A per-key lock shared by the processes of a host: an open-file-description byte-range lock on
// <cache dir>/locks, one byte per key slot. The kernel releases it when its holder exits or is
// killed, so a crash never leaves a stale lock behind.
#pragma once

#include <string>

#include "cache/kernel_key.hpp"

namespace kiln::detail {

class KeyLock {
 public:
  // Waits at most timeout_seconds. Without a directory, or where the filesystem refuses the lock,
  // holds nothing (acquired() is false) and the caller proceeds alone.
  KeyLock(const std::string& directory, const KernelKey& key, double timeout_seconds);
  ~KeyLock();
  KeyLock(const KeyLock&) = delete;
  KeyLock& operator=(const KeyLock&) = delete;

  bool acquired() const { return acquired_; }
  bool waited() const { return waited_; }  // another process held it first

 private:
  int fd_ = -1;
  long long offset_ = 0;
  bool acquired_ = false;
  bool waited_ = false;
};

}  // namespace kiln::detail
