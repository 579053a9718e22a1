// Parallel warm-up of the cache from a manifest: every signature for every target, through the
// selector and the JIT pipeline, with no GPU needed.
#include <algorithm>
#include <chrono>
#include <mutex>
#include <system_error>
#include <thread>

#include <fmt/format.h>

#include "kiln/error.hpp"
#include "kiln/jit.hpp"
#include "kiln/log.hpp"
#include "kiln/platform.hpp"
#include "kiln/registry.hpp"
#include "kiln/warmup.hpp"

namespace kiln {

WarmupReport warmup(const Manifest& manifest, const WarmupOptions& options) {
  if (options.targets.empty()) throw Error(ErrorCode::kInvalidArgument, "targets: name at least one target (e.g. sm_90a)");
  for (const auto& t : options.targets) platform_for_target(t);  // an unknown target fails before any work
  WarmupReport report;
  for (const auto& target : options.targets) {
    for (const auto& sig : manifest.signatures) {
      WarmupItem item;
      item.signature = sig.canonical();
      item.target = target;
      report.items.push_back(std::move(item));
    }
  }
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  const size_t jobs =
      std::min<size_t>(options.jobs > 0 ? static_cast<size_t>(options.jobs) : cores, std::max<size_t>(report.items.size(), 1));
  const auto start = std::chrono::steady_clock::now();
  std::mutex mutex;  // guards progress and the callback
  WarmupProgress progress;
  progress.total = report.items.size();
  std::atomic<size_t> next{0};
  const size_t per_target = manifest.signatures.size();

  std::function<void(const WarmupProgress&)> on_progress = options.on_progress;     // guarded by `mutex`
  std::vector<std::pair<size_t, std::chrono::steady_clock::time_point>> in_flight;  // guarded by `mutex`
  // Reports progress under `mutex`: the counters, and what is compiling and for how long.
  auto report_locked = [&](const WarmupItem* last) {
    const auto now = std::chrono::steady_clock::now();
    progress.elapsed_seconds = std::chrono::duration<double>(now - start).count();
    progress.last = last;
    progress.running.clear();
    for (const auto& [index, since] : in_flight) {
      progress.running.push_back(
          {report.items[index].signature, report.items[index].target, std::chrono::duration<double>(now - since).count()});
    }
    std::sort(progress.running.begin(), progress.running.end(), [](const auto& a, const auto& b) { return a.seconds > b.seconds; });
    if (!on_progress) return;
    try {
      on_progress(progress);
    } catch (...) {
      // The caller's callback must not end the process from a worker thread; it is dropped.
      on_progress = nullptr;
      log(LogLevel::kWarn, "kiln warmup: the progress callback threw; progress reports stop");
    }
  };
  auto work = [&] {
    while (true) {
      const size_t i = next.fetch_add(1);
      if (i >= report.items.size()) return;
      WarmupItem& item = report.items[i];
      const auto item_start = std::chrono::steady_clock::now();
      {
        std::lock_guard<std::mutex> lock(mutex);
        in_flight.emplace_back(i, item_start);
        report_locked(nullptr);
      }
      if (options.cancel != nullptr && options.cancel->load()) {
        item.status = WarmupItem::Status::kCancelled;
      } else {
        try {
          const CompiledKernel k = compile_for_target(manifest.signatures[i % per_target], item.target);
          item.kernel = k.kernel;
          item.origin = k.origin;
          const auto spec = Registry::global().find(k.kernel);
          item.reference = spec != nullptr && spec->priority == Priority::kReference;
          item.bytes = k.binary.size();
          item.stored = k.stored;
          item.status = k.origin == "compiled" ? WarmupItem::Status::kCompiled
                        : k.origin == "memory" ? WarmupItem::Status::kShared
                                               : WarmupItem::Status::kCached;
        } catch (const Error& e) {
          // A compile cut short by Ctrl-C (the worker got the signal too) is cancelled, not failed.
          const bool interrupted = options.cancel != nullptr && options.cancel->load();
          item.status = interrupted ? WarmupItem::Status::kCancelled : WarmupItem::Status::kFailed;
          item.reason = e.message().substr(0, e.message().find('\n'));
        } catch (const std::exception& e) {
          // No exception may leave a worker thread: it would end the process.
          item.status = WarmupItem::Status::kFailed;
          item.reason = std::string("internal error: ") + e.what();
        }
      }
      item.milliseconds = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - item_start).count();
      std::lock_guard<std::mutex> lock(mutex);
      ++progress.done;
      progress.compiled += item.status == WarmupItem::Status::kCompiled;
      progress.cached += item.status == WarmupItem::Status::kCached;
      progress.shared += item.status == WarmupItem::Status::kShared;
      progress.failed += item.status == WarmupItem::Status::kFailed;
      in_flight.erase(std::find_if(in_flight.begin(), in_flight.end(), [&](const auto& f) { return f.first == i; }));
      report_locked(&item);
    }
  };
  std::vector<std::thread> threads;
  for (size_t t = 0; t < jobs; ++t) {
    try {
      threads.emplace_back(work);
    } catch (const std::system_error& e) {
      // Fewer threads than asked (a process limit): the ones started share the work.
      log(LogLevel::kWarn, fmt::format("kiln warmup: started {} of {} worker threads ({}); continuing with those", t, jobs, e.what()));
      break;
    }
  }
  if (threads.empty()) work();
  // About once a second while items run, a report that only moves their elapsed times on.
  for (int tick = 1; !threads.empty(); ++tick) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::lock_guard<std::mutex> lock(mutex);
    if (progress.done == progress.total) break;
    if (tick % 10 == 0 && !in_flight.empty()) report_locked(nullptr);
  }
  for (auto& t : threads) t.join();

  for (const auto& item : report.items) {
    if (item.produced() && !item.stored) ++report.not_stored;
    if (item.produced() && item.reference) ++report.reference;
    switch (item.status) {
      case WarmupItem::Status::kCompiled:
        ++report.compiled;
        report.bytes += item.bytes;
        break;
      case WarmupItem::Status::kCached:
        ++report.cached;
        report.bytes += item.bytes;
        break;
      case WarmupItem::Status::kShared: ++report.shared; break;
      case WarmupItem::Status::kFailed: ++report.failed; break;
      case WarmupItem::Status::kCancelled: ++report.cancelled; break;
    }
  }
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return report;
}

}  // namespace kiln
