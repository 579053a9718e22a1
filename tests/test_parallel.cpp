// detail::for_each_index_in_parallel: every index runs once, on several threads when there are
// enough, and a task's exception reaches the caller.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "core/parallel.hpp"

namespace kiln::detail {
namespace {

TEST(Parallel, EveryIndexRunsExactlyOnce) {
  for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{1000}}) {
    std::vector<std::atomic<int>> runs(count);
    for_each_index_in_parallel(count, 1, [&](size_t i) { ++runs[i]; });
    for (size_t i = 0; i < count; ++i) EXPECT_EQ(runs[i].load(), 1) << "index " << i << " of " << count;
  }
}

TEST(Parallel, UsesMoreThanOneThreadWhenThereAreCoresAndWork) {
  if (std::thread::hardware_concurrency() < 2) GTEST_SKIP() << "one core";
  std::mutex mutex;
  std::set<std::thread::id> seen;
  for_each_index_in_parallel(64, 1, [&](size_t) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    std::lock_guard<std::mutex> lock(mutex);
    seen.insert(std::this_thread::get_id());
  });
  EXPECT_GE(seen.size(), 2u);
}

TEST(Parallel, FewerTasksThanTheMinimumPerThreadRunOnTheCaller) {
  std::set<std::thread::id> seen;
  for_each_index_in_parallel(7, 8, [&](size_t) { seen.insert(std::this_thread::get_id()); });
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(*seen.begin(), std::this_thread::get_id());
}

// Every task throws: each thread runs its first task and then starts no more.
TEST(Parallel, ATasksExceptionReachesTheCallerAndStopsTheRest) {
  std::atomic<size_t> ran{0};
  EXPECT_THROW(for_each_index_in_parallel(100000, 1,
                                          [&](size_t) {
                                            ++ran;
                                            throw std::runtime_error("every task throws");
                                          }),
               std::runtime_error);
  EXPECT_GE(ran.load(), 1u);
  EXPECT_LE(ran.load(), static_cast<size_t>(std::max(1u, std::thread::hardware_concurrency())));
}

}  // namespace
}  // namespace kiln::detail
