// `kiln check` (numerics of the selected kernel against the reference kernel and float64) and
// `kiln bench` (CUDA-event timing with rotated inputs, FLOP/s and bytes/s of the work needed).
#include "cli/check_bench.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iostream>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "backends/backend.hpp"
#include "cli/json_output.hpp"
#include "kiln/author.hpp"
#include "kiln/kiln.hpp"
#include "tools/device_buffer.hpp"
#include "tools/problems.hpp"

namespace kiln::cli {
namespace {

// The most input sets bench rotates, asked for or not.
constexpr int kMaxInputSets = 32;

using nlohmann::json;

const Platform& gpu_platform() {
  const DeviceReport report = detect_devices();
  if (report.devices.empty() || !tools::use_first_gpu()) {
    std::string why;
    for (const auto& n : report.notes) why += "\n  " + n;
    throw Error(ErrorCode::kDriverError, "this command runs kernels and needs a GPU; none is usable:" + why);
  }
  static const Platform p = report.devices.front();
  return p;
}

// The REFERENCE kernel that runs this signature, the oracle every other kernel is checked against,
// if there is one (kv_cache_append has none: its kernels copy, and float64 says exactly what they
// must write).
std::optional<std::string> reference_kernel(const Signature& sig, const Platform& p) {
  for (const auto& c : Registry::global().explain(sig, p).candidates) {
    if (c.eligible && c.priority == Priority::kReference) return c.kernel;
  }
  return std::nullopt;
}

// Runs the problem with `kernel` forced and returns the output, poisoned beforehand.
std::vector<double> run_with(tools::Problem& problem, const OperatorId& op, const std::string& kernel) {
  Registry::global().set_override(op, kernel);
  problem.poison(0);
  problem.run(0);
  tools::synchronize();
  return problem.output(0);
}

int driver_version() { return detail::launch_backend().runtime_version(); }

}  // namespace

int run_check(const std::string& op_name, const std::string& shape_text, uint64_t seed, const std::string& kernel, bool as_json) {
  tools::ShapeArgs shape = tools::ShapeArgs::parse(shape_text);
  auto problem = tools::make_problem(op_name, shape, seed, false);  // a bad argument is reported with or without a GPU
  const Platform& platform = gpu_platform();
  problem->ensure_sets(1);
  const Signature sig = problem->signature();
  const OperatorId op = sig.op();
  const std::string selected = kernel.empty() ? Registry::global().select(sig, platform)->name : kernel;
  const std::optional<std::string> reference = reference_kernel(sig, platform);
  const std::vector<double> out = run_with(*problem, op, selected);
  const std::vector<double> ref = reference ? run_with(*problem, op, *reference) : std::vector<double>{};
  Registry::global().set_override(op, "");
  const double vs_reference = reference ? tools::relative_error(out, ref) : NAN;
  // float64 on the CPU where it takes seconds, not hours; without a reference kernel, always.
  const bool small = problem->cpu_cost() < 3e9 || !reference;
  double vs_float64 = NAN, reference_vs_float64 = NAN;
  if (small) {
    const std::vector<double> exact = problem->cpu_reference();
    vs_float64 = tools::relative_error(out, exact);
    if (reference) reference_vs_float64 = tools::relative_error(ref, exact);
  }
  const double bound = problem->tolerance();
  const bool pass =
      (!reference || vs_reference < bound) && (!small || (vs_float64 < bound && (!reference || reference_vs_float64 < bound)));
  if (as_json) {
    print_json({{"op", op_name},
                {"shape", shape.describe()},
                {"seed", seed},
                {"signature", sig.canonical()},
                {"kernel", selected},
                {"reference", reference ? json(*reference) : json(nullptr)},
                {"device", platform.device_name},
                {"target", platform.arch},
                {"error_vs_reference", reference ? json(vs_reference) : json(nullptr)},
                {"error_vs_float64", small ? json(vs_float64) : json(nullptr)},
                {"reference_error_vs_float64", small && reference ? json(reference_vs_float64) : json(nullptr)},
                {"bound", bound},
                {"pass", pass}});
  } else {
    std::cout << fmt::format("{} on {} ({}), seed {}\nshape     {}\nsignature {}\n", op_name, platform.device_name, platform.arch, seed,
                             shape.describe(), sig.canonical());
    std::cout << fmt::format("kernel    {}\nreference {}\n", selected, reference ? *reference : "none (float64 only)");
    if (reference) std::cout << fmt::format("relative error vs reference kernel  {:.3e}\n", vs_reference);
    if (small) {
      std::cout << fmt::format("relative error vs float64 (CPU)     {:.3e}\n", vs_float64);
      if (reference) std::cout << fmt::format("reference kernel vs float64         {:.3e}\n", reference_vs_float64);
    } else {
      std::cout << "float64 (CPU) comparison skipped: shape too large for the CPU\n";
    }
    std::cout << fmt::format("bound {:.0e} ({}): {}\n", bound,
                             op_name == "moe_apply"         ? "bf16"
                             : op_name == "kv_cache_append" ? "exact"
                                                            : "output dtype",
                             pass ? "PASS" : "FAIL");
  }
  return pass ? 0 : 7;
}

int run_bench(const std::string& op_name, const std::string& shape_text, uint64_t seed, const std::string& kernel, double target_ms,
              bool as_json, int input_sets) {
  if (input_sets < 0 || input_sets > kMaxInputSets)
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("--input-sets: expected 1 to {} (or 0 for enough to exceed twice the L2), got {}", kMaxInputSets, input_sets));
  tools::ShapeArgs shape = tools::ShapeArgs::parse(shape_text);
  auto problem = tools::make_problem(op_name, shape, seed, false);  // a bad argument is reported with or without a GPU
  const Platform& platform = gpu_platform();
  problem->ensure_sets(1);
  const Signature sig = problem->signature();
  if (!kernel.empty()) Registry::global().set_override(sig.op(), kernel);
  const std::string selected = Registry::global().select(sig, platform)->name;
  const CompiledKernel compiled = compile_for_target(sig, platform.arch);

  // Rotate among input sets that together exceed twice the L2, so no run reads a warm cache.
  const size_t free_bytes = detail::launch_backend().memory_info(platform.device_index).first;
  const size_t per_set = std::max<size_t>(problem->bytes_per_set(), 1);
  int sets = static_cast<int>(std::min<size_t>(kMaxInputSets, (2 * platform.l2_bytes + per_set - 1) / per_set));
  sets = std::max(1, std::min(sets, static_cast<int>(free_bytes / 2 / per_set)));
  if (input_sets > 0) {  // asked for: e.g. 1, to see what a warm L2 and TLB are worth
    if (static_cast<size_t>(input_sets) > free_bytes / per_set)
      throw Error(ErrorCode::kInvalidArgument, fmt::format("--input-sets: {} sets of {} MB do not fit the {} MB free on the GPU",
                                                           input_sets, per_set >> 20, free_bytes >> 20));
    sets = input_sets;
  }
  problem->ensure_sets(sets);

  // Warm-up (also compiles and loads), then size the run count from one timed call.
  const auto warm_until = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
  int i = 0;
  do {
    problem->run(i++ % sets);
    tools::synchronize();
  } while (std::chrono::steady_clock::now() < warm_until || i < 3);
  tools::Event start, stop;
  start.record();
  problem->run(i++ % sets);
  stop.record();
  stop.wait();
  const double one = std::max(1e-3f, stop.since(start));
  const int runs = static_cast<int>(std::clamp(target_ms / one, 10.0, 2000.0));
  std::vector<tools::Event> marks(static_cast<size_t>(runs + 1));
  marks[0].record();
  for (int r = 0; r < runs; ++r) {
    problem->run(i++ % sets);
    marks[static_cast<size_t>(r + 1)].record();
  }
  marks.back().wait();
  std::vector<double> times;
  for (int r = 0; r < runs; ++r) times.push_back(marks[static_cast<size_t>(r + 1)].since(marks[static_cast<size_t>(r)]));
  if (!kernel.empty()) Registry::global().set_override(sig.op(), "");
  std::sort(times.begin(), times.end());
  auto pct = [&](double p) { return times[static_cast<size_t>(p * static_cast<double>(times.size() - 1))]; };
  const double median = pct(0.5);
  const tools::Work w = problem->work();
  const double tflops = w.flops / (median * 1e-3) / 1e12, tbps = w.bytes / (median * 1e-3) / 1e12;
  if (as_json) {
    print_json({{"op", op_name},
                {"shape", shape.describe()},
                {"signature", sig.canonical()},
                {"kernel", selected},
                {"key", compiled.key},
                {"device", platform.device_name},
                {"target", platform.arch},
                {"driver", driver_version()},
                {"runs", runs},
                {"buffer_sets", sets},
                {"median_ms", median},
                {"p10_ms", pct(0.1)},
                {"p90_ms", pct(0.9)},
                {"flops", w.flops},
                {"bytes", w.bytes},
                {"tflops", tflops},
                {"tbytes_per_s", tbps}});
  } else {
    std::cout << fmt::format("{} on {} ({}, driver {})\nshape   {}\nkernel  {} (key {})\n", op_name, platform.device_name, platform.arch,
                             driver_version(), shape.describe(), selected, compiled.key);
    std::cout << fmt::format("time    median {:.4f} ms  p10 {:.4f}  p90 {:.4f}  ({} runs, {} input sets rotated)\n", median, pct(0.1),
                             pct(0.9), runs, sets);
    std::cout << fmt::format("work    {:.3f} TFLOP/s ({:.3e} FLOP), {:.3f} TB/s ({:.3e} bytes)\n", tflops, w.flops, tbps, w.bytes);
  }
  return 0;
}

int run_manifest(bool bench, const std::string& manifest_name, const std::string& op, int64_t batch, uint64_t seed, double target_ms,
                 bool as_json) {
  const Manifest manifest = load_manifest(manifest_name);
  gpu_platform();  // a clear error before anything is allocated when there is no GPU
  int worst = 0, ran = 0;
  for (const auto& sig : manifest.signatures) {
    if (!op.empty() && operator_name(sig.op()) != op) continue;
    const std::string shape = tools::shape_for(sig, batch);
    // The shape must reproduce the manifest's signature exactly, or this checks something else.
    tools::ShapeArgs args = tools::ShapeArgs::parse(shape);
    const Signature made = tools::make_problem(operator_name(sig.op()), args, seed)->signature();
    if (!(made == sig)) {
      throw Error(ErrorCode::kInternal, fmt::format("shape {} gives {}, not the manifest's {}", shape, made.canonical(), sig.canonical()));
    }
    if (!as_json) std::cout << "---\n";
    const int rc = bench ? run_bench(operator_name(sig.op()), shape, seed, "", target_ms, as_json)
                         : run_check(operator_name(sig.op()), shape, seed, "", as_json);
    worst = std::max(worst, rc);
    ++ran;
  }
  if (ran == 0)
    throw Error(ErrorCode::kInvalidArgument, fmt::format("manifest {} has no {} signature", manifest.model, op.empty() ? "" : op));
  if (!as_json) std::cout << fmt::format("--- {} signature(s) of {}: {}\n", ran, manifest.model, worst == 0 ? "all passed" : "FAILURES");
  return worst;
}

}  // namespace kiln::cli
