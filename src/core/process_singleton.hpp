// One object of a kind per process: made on first use, made again in a child after fork() (the
// parent's connections and threads do not exist there, so its object is abandoned, never used
// or freed), and deleted at exit by the process that made it.
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <mutex>

namespace kiln::detail {

template <typename T>
class ProcessSingleton {
 public:
  // This process's object; `make` (called under the lock) returns a new one, or null for none.
  // A `make` that throws is tried again on the next call.
  template <typename Make>
  static T* get(Make&& make) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (owner_ != ::getpid()) {
      object_ = make();
      owner_ = ::getpid();
      static std::once_flag registered;
      std::call_once(registered, [] { std::atexit(&ProcessSingleton::destroy); });
    }
    return object_;
  }

 private:
  static void destroy() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (object_ != nullptr && owner_ == ::getpid()) {
      delete object_;
      object_ = nullptr;
    }
  }
  static inline std::mutex mutex_;
  static inline T* object_ = nullptr;
  static inline pid_t owner_ = 0;
};

}  // namespace kiln::detail
