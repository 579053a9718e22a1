// Running independent tasks on every core of the host: the float64 references and the tools'
// weight generators, whose results must not depend on how many threads ran them.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace kiln::detail {

// Calls task(i) for every i in [0, count), on up to one thread per core and at most
// count / min_per_thread of them (the caller's thread is one), each thread taking the next index
// as it finishes one. The order is not defined: a task writes only what is its own. The first
// exception a task throws stops the rest from starting and is rethrown here.
template <typename Task>
void for_each_index_in_parallel(size_t count, size_t min_per_thread, const Task& task) {
  const size_t cores = std::max(1u, std::thread::hardware_concurrency());
  const size_t threads = std::min(cores, count / std::max<size_t>(1, min_per_thread));
  if (threads <= 1) {
    for (size_t i = 0; i < count; ++i) task(i);
    return;
  }
  std::atomic<size_t> next{0};
  std::mutex mutex;  // guards `error`
  std::exception_ptr error;
  auto work = [&] {
    for (size_t i = next++; i < count; i = next++) {
      try {
        task(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mutex);
        if (!error) error = std::current_exception();
        next = count;
      }
    }
  };
  std::vector<std::thread> pool;
  pool.reserve(threads - 1);
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (auto& thread : pool) thread.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace kiln::detail
