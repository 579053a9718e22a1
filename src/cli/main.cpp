// The `kiln` command: devices, list, explain, compile, check, bench, cache, manifests, warmup.
//
// Exit codes (scripts may rely on them):
//   0 success; 1 internal or other error; 2 bad usage or invalid argument; 3 no kernel for the
//   signature; 4 compile failed; 5 driver, device or compiler library unavailable; 6 the cache
//   cannot be used or has problems (verify); 7 kiln check found an error above the bound;
//   130 warm-up interrupted (Ctrl-C; a second Ctrl-C exits at once).
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>

#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cache/cache_directory.hpp"
#include "cache/kernel_cache.hpp"
#include "cli/check_bench.hpp"
#include "cli/json_output.hpp"
#include "core/env.hpp"
#include "jit/compiler.hpp"
#include "kiln/author.hpp"
#include "kiln/kiln.h"
#include "kiln/kiln.hpp"
#include "warmup/report_json.hpp"

namespace {

using nlohmann::json;

int exit_code(const kiln::Error& e) {
  switch (e.code()) {
    case kiln::ErrorCode::kInvalidArgument: return 2;
    case kiln::ErrorCode::kNoKernel: return 3;
    case kiln::ErrorCode::kCompileFailed: return 4;
    case kiln::ErrorCode::kDriverError: return 5;
    case kiln::ErrorCode::kCacheError: return 6;
    default: return 1;
  }
}

json platform_json(const kiln::Platform& p) {
  return {{"vendor", kiln::vendor_name(p.vendor)},
          {"arch", p.arch},
          {"arch_version", p.arch_version},
          {"name", p.device_name},
          {"index", p.device_index},
          {"multiprocessors", p.multiprocessor_count},
          {"shared_memory_per_block", p.shared_memory_per_block},
          {"l2_bytes", p.l2_bytes},
          {"warp_size", p.warp_size},
          {"features", p.features}};
}

kiln::Platform resolve_target(const std::string& target) {
  if (!target.empty()) return kiln::platform_for_target(target);
  kiln::DeviceReport report = kiln::detect_devices();
  if (report.devices.empty()) {
    std::string why;
    for (const auto& n : report.notes) why += "\n  " + n;
    throw kiln::Error(kiln::ErrorCode::kDriverError, "no usable GPU here; name a target with --target (one of " +
                                                         fmt::format("{}", fmt::join(kiln::known_targets(), ", ")) + "):" + why);
  }
  return report.devices.front();
}

json devices_json(const kiln::DeviceReport& report) {
  json devices = json::array();
  for (const auto& d : report.devices) devices.push_back(platform_json(d));
  return devices;
}

json compilers_json() {
  json compilers = json::array();
  for (const auto& c : kiln::available_compilers()) {
    compilers.push_back({{"compiler", c.compiler}, {"identity", c.identity}, {"targets", c.targets}, {"note", c.note}});
  }
  return compilers;
}

int cmd_devices(bool as_json) {
  const kiln::DeviceReport report = kiln::detect_devices();
  if (as_json) {
    kiln::cli::print_json({{"devices", devices_json(report)}, {"notes", report.notes}, {"compilers", compilers_json()}});
    return 0;
  }
  if (report.devices.empty()) std::cout << "No GPU that kiln can use was found.\n";
  for (const auto& d : report.devices) {
    std::cout << fmt::format("[{}] {}\n    features: {}\n", d.device_index, d.describe(), fmt::join(d.features, " "));
  }
  for (const auto& n : report.notes) std::cout << "note: " << n << "\n";
  std::cout << fmt::format("Offline targets (compile without a GPU): {}\n", fmt::join(kiln::known_targets(), ", "));
  std::cout << "Compilers:\n";
  for (const auto& c : kiln::available_compilers()) {
    std::cout << fmt::format(
        "  {:<7} {}\n", c.compiler,
        c.identity.empty() ? "unavailable: " + c.note
                           : fmt::format("{} -> {}{}", c.identity, fmt::join(c.targets, ", "), c.note.empty() ? "" : " (" + c.note + ")"));
  }
  return 0;
}

int cmd_list(const std::string& family, bool as_json) {
  const auto kernels = kiln::Registry::global().kernels();
  json list = json::array();
  if (!as_json) {
    std::cout << fmt::format("{:<40} {:<24} {:<12} {:<7} {:<10} {}\n", "KERNEL", "OPERATOR", "PRIORITY", "VENDOR", "ARCH", "ORIGIN");
  }
  for (const auto& k : kernels) {
    if (!family.empty() && k->family != family) continue;
    const auto& r = k->requirements;
    const std::string arch = fmt::format("{}..{}", r.min_arch, r.max_arch >= (1 << 30) ? std::string("") : std::to_string(r.max_arch));
    if (as_json) {
      list.push_back({{"name", k->name},
                      {"operator", kiln::operator_name({k->family, k->mode})},
                      {"family", k->family},
                      {"mode", k->mode},
                      {"priority", kiln::priority_name(k->priority)},
                      {"backend", kiln::backend_name(k->backend)},
                      {"vendor", kiln::vendor_name(r.vendor)},
                      {"min_arch", r.min_arch},
                      {"max_arch", r.max_arch >= (1 << 30) ? json(nullptr) : json(r.max_arch)},
                      {"features", r.features},
                      {"specificity", k->specificity},
                      {"origin", k->origin}});
    } else {
      std::cout << fmt::format("{:<40} {:<24} {:<12} {:<7} {:<10} {}\n", k->name, kiln::operator_name({k->family, k->mode}),
                               kiln::priority_name(k->priority), kiln::vendor_name(r.vendor), arch, k->origin);
    }
  }
  if (as_json) kiln::cli::print_json(list, "kernels");
  return 0;
}

int cmd_explain(const std::string& op, const std::string& sig_text, const std::string& target, bool as_json) {
  const kiln::Signature sig = kiln::Signature::parse(kiln::operator_from_name(op), sig_text);
  kiln::validate_signature(sig);
  const kiln::Explanation ex = kiln::Registry::global().explain(sig, resolve_target(target));
  if (as_json) {
    kiln::cli::print_json(json::parse(ex.to_json()));
  } else {
    std::cout << ex.to_text();
  }
  return ex.selected ? 0 : 3;
}

int cmd_compile(const std::string& op, const std::string& sig_text, const std::string& target, const std::string& output, bool as_json) {
  const kiln::Signature sig = kiln::Signature::parse(kiln::operator_from_name(op), sig_text);
  kiln::validate_signature(sig);
  const std::string arch = target.empty() ? resolve_target("").arch : target;
  const kiln::CompiledKernel k = kiln::compile_for_target(sig, arch);
  if (!output.empty()) {
    std::ofstream out(output, std::ios::binary);
    out.write(reinterpret_cast<const char*>(k.binary.data()), static_cast<std::streamsize>(k.binary.size()));
    if (!out) throw kiln::Error(kiln::ErrorCode::kInvalidArgument, "--output: cannot write " + output);
  }
  if (as_json) {
    kiln::cli::print_json({{"kernel", k.kernel},
                           {"signature", k.signature},
                           {"target", k.target},
                           {"key", k.key},
                           {"name_expression", k.name_expression},
                           {"lowered_name", k.lowered_name},
                           {"compiler", k.compiler},
                           {"binary_bytes", k.binary.size()},
                           {"compile_ms", k.compile_ms},
                           {"origin", k.origin}});
  } else {
    std::cout << fmt::format(
        "kernel   {}\nsignature {}\ntarget   {}\nkey      {}\nentry    {}\ncompiler {}\nbinary   {} bytes ({}){}\norigin   {}\ntime     "
        "{:.0f} ms (compile)\n",
        k.kernel, k.signature, k.target, k.key, k.lowered_name, k.compiler, k.binary.size(),
        k.target.rfind("gfx", 0) == 0 ? "AMD code object" : "CUBIN", output.empty() ? "" : " -> " + output, k.origin, k.compile_ms);
  }
  return 0;
}

std::string human_bytes(uint64_t b) {
  if (b >= (1ULL << 30)) return fmt::format("{:.1f} GiB", static_cast<double>(b) / (1ULL << 30));
  if (b >= (1ULL << 20)) return fmt::format("{:.1f} MiB", static_cast<double>(b) / (1ULL << 20));
  if (b >= 1024) return fmt::format("{:.1f} KiB", static_cast<double>(b) / 1024);
  return fmt::format("{} B", b);
}

// The configured remote server as reached now, or why it cannot be.
json remote_server_json() {
  try {
    const kiln::RemoteCacheProbe p = kiln::cache_remote_probe();
    json fleet = json::object();
    for (const auto& [name, value] : p.fleet) fleet[name] = value;
    return {{"url", p.url}, {"reachable", true}, {"round_trip_ms", p.round_trip_ms}, {"fleet", fleet}};
  } catch (const kiln::Error& e) {
    return {{"reachable", false}, {"error", e.message()}};
  }
}

int cmd_cache_stats(const std::string& dir, bool as_json) {
  const kiln::CacheStats s = kiln::cache_stats_of(dir);
  const bool remote = s.remote.state != "off";
  if (as_json) {
    json out = kiln::detail::cache_stats_json(s);
    if (remote) out["remote_server"] = remote_server_json();
    kiln::cli::print_json(out);
    return 0;
  }
  std::cout << fmt::format("directory  {}\nstate      {}\nentries    {}\nsize       {} of {}\nseeds      {}\n", s.directory,
                           s.persistent ? "a database" : "no database: " + s.degraded_reason, s.entries, human_bytes(s.bytes),
                           human_bytes(s.max_bytes), s.seeds.empty() ? "none" : fmt::format("{}", fmt::join(s.seeds, ", ")));
  if (!remote) {
    std::cout << "remote     none (KILN_CACHE_REMOTE is not set)\n";
    return 0;
  }
  const json server = remote_server_json();
  if (!server["reachable"].get<bool>()) {
    std::cout << fmt::format("remote     {}\n", server.contains("error") ? std::string(server["error"]) : s.remote.state);
    return 0;
  }
  std::cout << fmt::format("remote     {} (prefix {}), round trip {:.2f} ms\n", std::string(server["url"]), s.remote.prefix,
                           server["round_trip_ms"].get<double>());
  std::cout << "fleet     ";
  for (const auto& [name, value] : server["fleet"].items()) std::cout << fmt::format(" {} {}", name, value.get<uint64_t>());
  std::cout << (server["fleet"].empty() ? " no counts yet\n" : "\n");
  return 0;  // a directory that cannot be trusted or read is an error (exit 6) before this
}

int cmd_cache_push(const std::string& dir, const std::string& target, const std::string& signing_key, bool as_json) {
  const kiln::CachePushReport r = kiln::cache_push(target, dir, signing_key);
  if (as_json) {
    kiln::cli::print_json({{"pushed", r.pushed}, {"bytes", r.bytes}, {"remote", r.url}, {"signed", !signing_key.empty()}});
  } else {
    std::cout << fmt::format("pushed {} entries ({}) to {}{}\n", r.pushed, human_bytes(r.bytes), r.url,
                             signing_key.empty() ? "" : ", signed");
  }
  return 0;
}

int cmd_cache_ls(const std::string& dir, bool as_json) {
  const auto entries = kiln::cache_list(dir);
  if (as_json) {
    json list = json::array();
    for (const auto& e : entries) {
      list.push_back({{"key", e.key},
                      {"kernel", e.kernel},
                      {"operator", e.op},
                      {"signature", e.signature},
                      {"target", e.target},
                      {"backend", e.backend},
                      {"compiler", e.compiler},
                      {"size", e.size},
                      {"hits", e.hits},
                      {"created", e.created},
                      {"last_used", e.last_used},
                      {"compile_ms", e.compile_ms}});
    }
    kiln::cli::print_json(list, "entries");
    return 0;
  }
  std::cout << fmt::format("{:<30} {:<9} {:>10} {:>6} {:>12}  {}\n", "KERNEL", "TARGET", "SIZE", "HITS", "LAST USED", "SIGNATURE");
  const auto now = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  for (const auto& e : entries) {
    std::cout << fmt::format("{:<30} {:<9} {:>10} {:>6} {:>10}s ago  {}\n", e.kernel, e.target, human_bytes(e.size), e.hits,
                             now - e.last_used, e.signature);
  }
  return 0;
}

int cmd_cache_verify(const std::string& dir, bool repair, bool as_json) {
  const kiln::CacheVerifyReport r = kiln::cache_verify(repair, dir);
  if (as_json) {
    kiln::cli::print_json({{"checked", r.checked}, {"problems", r.problems}, {"removed", r.removed}});
  } else {
    for (const auto& p : r.problems) std::cout << "problem: " << p << "\n";
    std::cout << fmt::format("checked {} entries: {} problem(s){}\n", r.checked, r.problems.size(),
                             repair ? fmt::format(", {} removed", r.removed) : "");
  }
  return r.problems.empty() || r.removed == r.problems.size() ? 0 : 6;
}

std::atomic<bool> interrupted{false};

// Progress on a terminal: one line redrawn in place; otherwise one plain line per item.
void show_progress(const kiln::WarmupProgress& p, bool terminal) {
  const double rate = p.elapsed_seconds > 0 ? static_cast<double>(p.done) / p.elapsed_seconds : 0;
  const double eta = rate > 0 ? static_cast<double>(p.total - p.done) / rate : 0;
  if (terminal) {
    const int width = 30;
    const int filled = p.total ? static_cast<int>(width * p.done / p.total) : width;
    // What compiles now (the longest-running item) and for how long, cut to fit a line.
    std::string now;
    if (!p.running.empty()) {
      const auto& r = p.running.front();
      now = fmt::format("  {} {} {:.1f}s{}", r.target, r.signature.substr(0, 60), r.seconds,
                        p.running.size() > 1 ? fmt::format(" (+{})", p.running.size() - 1) : "");
    }
    std::fprintf(stderr, "\r\033[K[%s%s] %zu/%zu  compiled %zu  cached %zu  shared %zu  failed %zu  %.1f/s  ETA %.0fs%s",
                 std::string(static_cast<size_t>(filled), '#').c_str(), std::string(static_cast<size_t>(width - filled), '.').c_str(),
                 p.done, p.total, p.compiled, p.cached, p.shared, p.failed, rate, eta, now.c_str());
    if (p.done == p.total) std::fprintf(stderr, "\n");
  } else if (p.last != nullptr) {
    static const char* names[] = {"compiled", "cached", "shared", "FAILED", "cancelled"};
    std::fprintf(stderr, "[%zu/%zu] %-9s %-10s %-30s %s (%.0f ms)\n", p.done, p.total, names[static_cast<int>(p.last->status)],
                 p.last->target.c_str(), p.last->kernel.c_str(), p.last->signature.c_str(), p.last->milliseconds);
  }
  std::fflush(stderr);
}

struct WarmupCommand {
  std::string manifest, op, sig, targets;  // targets empty: the GPUs present
  int jobs = 0;
  bool check = false;   // look up only: never compile (KILN_JIT=off for this process)
  bool strict = false;  // REFERENCE kernels fail the run
};

int cmd_warmup(const WarmupCommand& c, bool as_json) {
  kiln::WarmupOptions options;
  // Cheap checks first: a wrong target fails before a large manifest is read.
  std::string targets = c.targets;
  if (targets.empty()) {  // the targets of the GPUs here, each once
    std::vector<std::string> present;
    for (const auto& d : kiln::detect_devices().devices) {
      if (std::find(present.begin(), present.end(), d.arch) == present.end()) present.push_back(d.arch);
    }
    if (present.empty()) {
      throw kiln::Error(kiln::ErrorCode::kInvalidArgument,
                        "--target: no GPU is usable here, so name the targets to warm, e.g. --target sm_90a "
                        "(kiln devices lists every offline target)");
    }
    targets = fmt::format("{}", fmt::join(present, ","));
  }
  options.targets = kiln::detail::parse_target_list(targets, "--target");
  if (c.manifest.empty() == c.op.empty()) {
    throw kiln::Error(kiln::ErrorCode::kInvalidArgument, "warmup: give --manifest, or --op with --sig (one of the two)");
  }
  if (!c.op.empty() && c.sig.empty()) throw kiln::Error(kiln::ErrorCode::kInvalidArgument, "--sig: needed with --op");
  kiln::Manifest manifest;
  if (c.op.empty()) {
    manifest = kiln::load_manifest(c.manifest);
  } else {
    manifest.source = "--op/--sig";
    manifest.model = c.op;
    manifest.signatures.push_back(kiln::Signature::parse(kiln::operator_from_name(c.op), c.sig));
    kiln::validate_signature(manifest.signatures.back());
  }
  if (c.check) {
    kiln::JitSettings settings = kiln::jit_settings();
    settings.compile = false;
    kiln::set_jit_settings(settings);
  }
  const int jobs = c.jobs;
  const bool as_check = c.check;
  options.jobs = jobs;
  options.cancel = &interrupted;
  const bool terminal = ::isatty(2) != 0;
  options.on_progress = [terminal](const kiln::WarmupProgress& p) { show_progress(p, terminal); };
  // Ctrl-C stops new compiles; what finished is in the cache, and a rerun continues from there.
  // A second Ctrl-C exits at once (an in-process compile, for one, cannot be cancelled).
  std::signal(SIGINT, [](int) {
    if (interrupted.exchange(true)) ::_exit(130);
    kiln::detail::cancel_compiles();
  });
  const kiln::WarmupReport r = kiln::warmup(manifest, options);
  const kiln::CacheStats cache = kiln::cache_stats();
  if (as_json) {
    json out = kiln::detail::warmup_report_json(r);
    out["model"] = manifest.model;
    out["targets"] = options.targets;
    out["cache"] = cache.directory;
    out["persistent"] = cache.persistent;
    kiln::cli::print_json(out);
  } else if (as_check) {
    std::cout << fmt::format("check of {} for {} against {}{}: {} signatures x {} target(s)\n", manifest.model,
                             fmt::join(options.targets, ","), cache.directory, cache.persistent ? "" : " (not persistent)",
                             manifest.signatures.size(), options.targets.size());
    for (const auto& i : r.items) {
      const bool hit = i.produced();
      std::cout << fmt::format("  {:<4} {:<6} {:<8} {:<36} {}{}\n", hit ? "hit" : "MISS", hit ? i.origin : "", i.target, i.kernel,
                               i.signature, i.reference ? "  REFERENCE kernel" : "");
    }
    const size_t misses = r.failed + r.cancelled;
    std::cout << fmt::format("  {} hit, {} missed, {} on REFERENCE kernels\n", r.items.size() - misses, misses, r.reference);
    for (const auto& i : r.items) {
      if (!i.produced()) std::cout << fmt::format("  missed: {}\n", i.reason);
    }
  } else {
    std::cout << fmt::format("warm-up of {} for {}: {} signatures x {} target(s)\n", manifest.model, fmt::join(options.targets, ","),
                             manifest.signatures.size(), options.targets.size());
    std::cout << fmt::format(
        "  compiled   {}\n  cached     {} (already in the cache)\n  shared     {} (same binary as another signature)\n  failed     {}\n",
        r.compiled, r.cached, r.shared, r.failed);
    if (r.cancelled) std::cout << fmt::format("  cancelled  {} (interrupted; run again to continue)\n", r.cancelled);
    std::cout << fmt::format("  time       {:.1f} s\n  binaries   {}\n  cache      {}{}\n", r.seconds, human_bytes(r.bytes),
                             cache.directory, cache.persistent ? "" : " (NOT persistent: " + cache.degraded_reason + ")");
    for (const auto& i : r.items) {
      if (i.status == kiln::WarmupItem::Status::kFailed)
        std::cout << fmt::format("  failed: {} on {}: {}\n", i.signature, i.target, i.reason);
    }
    if (r.not_stored) {
      std::cout << fmt::format("  NOT STORED {} (compiled, but not in the on-disk cache: {}):\n", r.not_stored,
                               cache.degraded_reason.empty() ? "see the warnings above" : cache.degraded_reason);
    }
    for (const auto& i : r.items) {
      if (i.produced() && !i.stored) std::cout << fmt::format("  not stored: {} on {}\n", i.signature, i.target);
    }
    if (r.reference) std::cout << fmt::format("  REFERENCE  {} (correct but slow kernels; --strict fails on them):\n", r.reference);
    for (const auto& i : r.items) {
      if (i.produced() && i.reference) std::cout << fmt::format("  reference: {} on {}: {}\n", i.signature, i.target, i.kernel);
    }
  }
  if (r.cancelled && !as_check) return 130;
  if (c.strict && r.reference) return 1;
  if (as_check) return r.failed || r.cancelled ? 1 : 0;
  // A cache that is not complete on disk must not be shipped as if it were.
  return r.failed || r.not_stored || !cache.persistent ? 1 : 0;
}

// Fills the local cache with a model's kernels from the remote, compiling nothing: what the remote
// lacks is listed, and the exit status is 1.
int cmd_cache_pull(const std::string& manifest_name, const std::string& target_list, int jobs, bool as_json) {
  if (target_list.empty()) throw kiln::Error(kiln::ErrorCode::kInvalidArgument, "--target: name the targets to pull, e.g. --target sm_90a");
  kiln::WarmupOptions options;
  options.targets = kiln::detail::parse_target_list(target_list, "--target");
  const kiln::Manifest manifest = kiln::load_manifest(manifest_name);
  const kiln::RemoteCacheProbe server = kiln::cache_remote_probe();  // no remote, or none reachable: exit 6
  kiln::JitSettings settings = kiln::jit_settings();
  settings.compile = false;
  kiln::set_jit_settings(settings);
  options.jobs = jobs;
  const kiln::WarmupReport r = kiln::warmup(manifest, options);
  const kiln::CacheStats cache = kiln::cache_stats();
  size_t fetched = 0, local = 0, missing = 0;
  for (const auto& i : r.items) {
    if (!i.produced()) {
      ++missing;
    } else if (i.origin == "remote") {
      ++fetched;
    } else {
      ++local;
    }
  }
  if (as_json) {
    json out = kiln::detail::warmup_report_json(r);
    out["model"] = manifest.model;
    out["remote"] = server.url;
    out["fetched"] = fetched;
    out["already_local"] = local;
    out["missing"] = missing;
    out["cache"] = cache.directory;
    kiln::cli::print_json(out);
  } else {
    std::cout << fmt::format(
        "pull of {} for {} from {} into {}\n  fetched    {}\n  local      {} (already in this cache)\n  missing    {}\n", manifest.model,
        fmt::join(options.targets, ","), server.url, cache.directory, fetched, local, missing);
    for (const auto& i : r.items) {
      if (!i.produced()) std::cout << fmt::format("  missing: {} on {}: {}\n", i.signature, i.target, i.reason);
    }
  }
  return missing || !cache.persistent ? 1 : 0;
}

// Everything a bug report needs: versions, host, devices, compilers, the cache and its policy, and
// every KILN_ variable set. Reads only: creates no cache directory or database.
int cmd_env(const std::string& cache_dir, bool as_json) {
  json j = {{"schema", 1}, {"kiln", {{"version", kiln_version()}, {"built_with", __VERSION__}}}};
  struct utsname host {};
  if (::uname(&host) == 0) j["host"] = {{"system", host.sysname}, {"release", host.release}, {"machine", host.machine}};
  const kiln::DeviceReport report = kiln::detect_devices();
  j["devices"] = devices_json(report);
  j["device_notes"] = report.notes;
  j["compilers"] = compilers_json();
  auto setting = [](auto read) -> json {
    try {
      return read();
    } catch (const kiln::Error& e) {
      return {{"error", e.message()}};
    }
  };
  j["cache"] = setting([&] { return json(kiln::detail::cache_stats_json(kiln::cache_stats_of(cache_dir))); });
  j["settings"] = {
      {"jit", kiln::jit_settings().compile ? "on" : "off"},
      {"cache_sharing",
       setting([] { return json(kiln::detail::cache_sharing() == kiln::detail::CacheSharing::kGroup ? "group" : "user"); })},
      {"trusted_keys", setting([] { return json(kiln::detail::trusted_keys_from_environment().size()); })},
      {"remote", setting([] {
         const kiln::RemoteCacheStats r = kiln::cache_stats().remote;
         if (r.state == "off") return json("off");
         json out = remote_server_json();
         out["prefix"] = r.prefix;
         return out;
       })},
  };
  j["environment"] = json::object();
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry(*e);
    if (entry.rfind("KILN_", 0) == 0) j["environment"][entry.substr(0, entry.find('='))] = entry.substr(entry.find('=') + 1);
  }
  if (as_json) {
    kiln::cli::print_json(j);
    return 0;
  }
  std::cout << fmt::format("kiln       {} (built with {})\n", kiln_version(), __VERSION__);
  if (j.contains("host")) std::cout << fmt::format("host       {} {} {}\n", host.sysname, host.release, host.machine);
  if (report.devices.empty()) std::cout << "devices    none that kiln can use\n";
  for (const auto& d : report.devices) std::cout << fmt::format("device {}   {}\n", d.device_index, d.describe());
  for (const auto& n : report.notes) std::cout << "note       " << n << "\n";
  for (const auto& c : j["compilers"]) {
    const std::string identity = c["identity"];
    std::cout << fmt::format("compiler   {:<7} {}\n", std::string(c["compiler"]),
                             identity.empty() ? "unavailable: " + std::string(c["note"]) : identity);
  }
  const json& cache = j["cache"];
  if (cache.contains("error")) {
    std::cout << "cache      " << std::string(cache["error"]) << "\n";
  } else {
    std::cout << fmt::format("cache      {} ({})\n", std::string(cache["directory"]),
                             cache["persistent"].get<bool>() ? "a database" : "no database");
  }
  for (const auto& [name, value] : j["settings"].items()) {
    const bool failed = value.is_object() && value.contains("error") && value["error"].is_string();
    std::cout << fmt::format("{:<10} {}\n", name, failed ? value["error"].get<std::string>() : value.dump());
  }
  for (const auto& [name, value] : j["environment"].items()) std::cout << fmt::format("env        {}={}\n", name, std::string(value));
  return 0;
}

int cmd_manifests(bool as_json) {
  json list = json::array();
  if (!as_json) std::cout << fmt::format("{:<16} {:>10}  {}\n", "MODEL", "SIGNATURES", "DESCRIPTION");
  for (const auto& name : kiln::builtin_manifests()) {
    const kiln::Manifest m = kiln::load_manifest(name);
    if (as_json) {
      list.push_back({{"model", name}, {"signatures", m.signatures.size()}, {"description", m.description}});
    } else {
      std::cout << fmt::format("{:<16} {:>10}  {}\n", name, m.signatures.size(), m.description);
    }
  }
  if (as_json) kiln::cli::print_json(list, "manifests");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kiln: JIT-compiled attention and MoE kernels for NVIDIA and AMD GPUs"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("kiln ") + kiln_version());
  // Global options (--cache) may also follow the subcommand, as in git, docker and pip.
  app.fallthrough();
  bool as_json = false;

  app.footer(
      "Exit codes: 0 success; 1 internal or other error (and warmup: a signature failed or was not stored); 2 bad usage "
      "or invalid argument; 3 no kernel for the signature; 4 compile failed; 5 driver, device or compiler library "
      "unavailable; 6 the cache cannot be used or has problems; 7 kiln check found an error above the bound; 130 "
      "warm-up interrupted (Ctrl-C; a second Ctrl-C exits at once).");
  auto* devices = app.add_subcommand("devices", "Show the GPUs kiln can use and the offline targets");
  devices->add_flag("--json", as_json, "Machine-readable output");

  std::string family;
  auto* list = app.add_subcommand("list", "List registered kernels (built-in and plugins)");
  list->add_option("--family", family, "Only this operator family (attention, moe)");
  list->add_flag("--json", as_json, "Machine-readable output");

  std::string op, sig, target, output;
  const std::string ops_help = fmt::format("Operator: {}", fmt::join(kiln::operator_names(), ", "));
  auto* explain = app.add_subcommand("explain", "Show which kernel the selector picks for a signature, and why");
  explain->add_option("op", op, ops_help)->required();
  explain->add_option("--sig", sig, "Signature as key=value,... (e.g. dtype=bf16,head_dim=128,group=8,causal=1)")->required();
  explain->add_option("--target", target, "Arch to select for (default: the first GPU)");
  explain->add_flag("--json", as_json, "Machine-readable output");

  auto* compile = app.add_subcommand("compile", "Compile the selected kernel for a signature (no GPU needed with --target)");
  compile->add_option("op", op, ops_help)->required();
  compile->add_option("--sig", sig, "Signature as key=value,...")->required();
  compile->add_option("--target", target, "Arch to compile for (default: the first GPU)");
  compile->add_option("-o,--output", output, "Write the binary (CUBIN, or AMD code object) to this file");
  compile->add_flag("--json", as_json, "Machine-readable output");

  std::string cache_dir, file, kernel_filter;
  bool repair = false;
  std::string max_size_text;
  app.add_option("--cache", cache_dir, "Cache directory (default: KILN_CACHE_DIR, XDG_CACHE_HOME/kiln, ~/.cache/kiln)");
  auto* env = app.add_subcommand("env", "Versions, devices, compilers, the cache and its settings: for bug reports");
  env->add_flag("--json", as_json, "Machine-readable output");
  auto* cache = app.add_subcommand("cache", "Inspect and maintain the on-disk kernel cache");
  cache->require_subcommand(1);
  auto* cache_stats = cache->add_subcommand("stats", "Where the cache is, its state and size");
  cache_stats->add_flag("--json", as_json, "Machine-readable output");
  auto* cache_ls = cache->add_subcommand("ls", "List cached kernels (most recently used first)");
  cache_ls->add_flag("--json", as_json, "Machine-readable output");
  auto* cache_verify = cache->add_subcommand("verify", "Check the database and every entry's checksum");
  cache_verify->add_flag("--repair", repair, "Remove the entries that fail");
  cache_verify->add_flag("--json", as_json, "Machine-readable output");
  auto* cache_prune = cache->add_subcommand("prune", "Evict least-recently-used entries down to a size");
  cache_prune->add_option("--max-size", max_size_text, "Size to keep at most: bytes, or 4G, 512M (default: KILN_CACHE_MAX_BYTES or 4G)");
  cache_prune->add_flag("--json", as_json, "Machine-readable output");
  auto* cache_clear = cache->add_subcommand("clear", "Remove every entry of the cache directory's database");
  cache_clear->add_flag("--json", as_json, "Machine-readable output");
  auto* cache_export = cache->add_subcommand("export", "Write entries to a single bundle file");
  cache_export->add_option("file", file, "Bundle to create (must not exist)")->required();
  cache_export->add_option("--target", target, "Only entries for this target");
  cache_export->add_option("--kernel", kernel_filter, "Only entries of this kernel");
  std::string signing_key;
  cache_export->add_option("--sign", signing_key, "Sign every entry with this secret key file (from `kiln cache keygen`)");
  cache_export->add_flag("--json", as_json, "Machine-readable output");
  auto* cache_keygen = cache->add_subcommand("keygen", "Write a new Ed25519 key pair for signing bundles: PREFIX.key and PREFIX.pub");
  std::string key_prefix;
  cache_keygen->add_option("prefix", key_prefix, "Path prefix of the two key files (neither may exist)")->required();
  cache_keygen->add_flag("--json", as_json, "Machine-readable output");
  auto* cache_import = cache->add_subcommand("import", "Add a bundle's entries (checksums, and signatures with KILN_CACHE_TRUSTED_KEYS)");
  cache_import->add_option("file", file, "Bundle to read")->required();
  cache_import->add_flag("--json", as_json, "Machine-readable output");
  auto* cache_push = cache->add_subcommand("push", "Upload the cache's entries to the remote tier (KILN_CACHE_REMOTE)");
  cache_push->add_option("--target", target, "Only entries for this target");
  cache_push->add_option("--sign", signing_key, "Sign every entry with this secret key file (from `kiln cache keygen`)");
  cache_push->add_flag("--json", as_json, "Machine-readable output");
  auto* cache_pull =
      cache->add_subcommand("pull", "Fill the cache with a model's kernels from the remote tier, compiling nothing (KILN_CACHE_REMOTE)");
  std::string pull_manifest, pull_targets;
  int pull_jobs = 0;
  cache_pull->add_option("--manifest", pull_manifest, "A manifest file, or a built-in model name (kiln manifests)")->required();
  cache_pull->add_option("--target", pull_targets, "Comma-separated targets")->required();
  cache_pull->add_option("-j,--jobs", pull_jobs, "Parallel fetches (default: one per core)");
  cache_pull->add_flag("--json", as_json, "Machine-readable output");

  std::string shape_text, kernel_name;
  uint64_t seed = 1;
  double target_ms = 300;
  const std::string shape_help = "Sizes and properties as key=value,... (kiln prints the full shape it used)";
  std::string check_manifest;
  int64_t manifest_batch = 4;
  // check and bench take the same options; bench adds --time-ms.
  auto add_run_options = [&](CLI::App* cmd, const char* verb) {
    cmd->add_option("op", op, ops_help + " (with --manifest: only this operator's signatures)");
    cmd->add_option("--manifest", check_manifest, fmt::format("{} every signature of a manifest (file or built-in model)", verb));
    cmd->add_option("--batch", manifest_batch, "With --manifest: sequences (attention) or tokens (MoE) per problem (default 4)");
    cmd->add_option("--shape", shape_text, shape_help);
    cmd->add_option("--seed", seed, "Seed of the random inputs (default 1)");
    cmd->add_option("--kernel", kernel_name, fmt::format("{} this kernel instead of the selected one", verb));
    cmd->add_flag("--json", as_json, "Machine-readable output");
  };
  auto* check = app.add_subcommand("check", "Run the selected kernel and the reference on random inputs; compare (GPU)");
  add_run_options(check, "Check");
  auto* bench = app.add_subcommand("bench", "Time the selected kernel with CUDA events on rotated inputs (GPU)");
  add_run_options(bench, "Time");
  bench->add_option("--time-ms", target_ms, "Measure for about this long (default 300)");
  int input_sets = 0;
  bench->add_option("--input-sets", input_sets, "Rotate this many input sets (default: enough to exceed twice the L2)");

  WarmupCommand warm;
  auto* manifests = app.add_subcommand("manifests", "List the model manifests built into kiln");
  manifests->add_flag("--json", as_json, "Machine-readable output");
  auto* warmup = app.add_subcommand("warmup", "Compile every kernel a model needs into the cache (no GPU needed)");
  warmup->add_option("--manifest", warm.manifest, "A manifest file, or a built-in model name (kiln manifests)");
  warmup->add_option("--op", warm.op, "One operator's signature instead of a manifest (with --sig)");
  warmup->add_option("--sig", warm.sig, "That signature as key=value,...");
  warmup->add_option("--target", warm.targets, "Comma-separated targets (default: the GPUs present; required without one)");
  warmup->add_option("-j,--jobs", warm.jobs, "Parallel compiles (default: one per core)");
  warmup->add_flag("--check", warm.check,
                   "Compile nothing: say per signature whether the cache would serve it, from which tier and with which "
                   "kernel; exit 1 on any miss");
  warmup->add_flag("--strict", warm.strict, "Exit 1 when any signature selects a REFERENCE kernel");
  warmup->add_flag("--json", as_json, "Machine-readable summary");

  // A first word that is no option and no command is an unknown command, named as such.
  std::vector<std::string> names;
  for (const auto* sub : app.get_subcommands([](const CLI::App*) { return true; })) names.push_back(sub->get_name());
  if (argc > 1 && argv[1][0] != '-' && std::find(names.begin(), names.end(), argv[1]) == names.end()) {
    std::fprintf(stderr, "kiln: unknown command '%s' (commands: %s); kiln --help\n", argv[1],
                 fmt::format("{}", fmt::join(names, ", ")).c_str());
    return 2;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  if (!cache_dir.empty()) ::setenv("KILN_CACHE_DIR", cache_dir.c_str(), 1);
  try {
    if (*cache_stats) return cmd_cache_stats(cache_dir, as_json);
    if (*cache_ls) return cmd_cache_ls(cache_dir, as_json);
    if (*cache_verify) return cmd_cache_verify(cache_dir, repair, as_json);
    if (*cache_clear) {
      const uint64_t removed = kiln::cache_prune(0, cache_dir);
      if (as_json) {
        kiln::cli::print_json({{"removed", removed}});
      } else {
        std::cout << fmt::format("removed {} entries\n", removed);
      }
      return 0;
    }
    if (*cache_prune) {
      const int64_t max_size = max_size_text.empty() ? 0 : kiln::detail::parse_size(max_size_text, "--max-size");
      const uint64_t removed =
          kiln::cache_prune(max_size_text.empty() ? kiln::detail::default_cache_max_bytes() : static_cast<uint64_t>(max_size), cache_dir);
      if (as_json) {
        kiln::cli::print_json({{"evicted", removed}});
      } else {
        std::cout << fmt::format("evicted {} entries\n", removed);
      }
      return 0;
    }
    if (*cache_export) {
      const uint64_t exported = kiln::cache_export(file, target, kernel_filter, cache_dir, signing_key);
      if (as_json) {
        kiln::cli::print_json({{"exported", exported}, {"file", file}, {"signed", !signing_key.empty()}});
      } else {
        std::cout << fmt::format("exported {} entries to {}{}\n", exported, file, signing_key.empty() ? "" : ", signed");
      }
      return 0;
    }
    if (*cache_keygen) {
      const std::string public_key = kiln::cache_keygen(key_prefix);
      if (as_json) {
        kiln::cli::print_json(
            {{"public_key", public_key}, {"secret_key_file", key_prefix + ".key"}, {"public_key_file", key_prefix + ".pub"}});
        return 0;
      }
      std::cout << fmt::format(
          "wrote {0}.key (secret: keep it on the build box) and {0}.pub\npublic key {1}\n"
          "serving nodes trust it with KILN_CACHE_TRUSTED_KEYS={1}\n",
          key_prefix, public_key);
      return 0;
    }
    if (*cache_push) return cmd_cache_push(cache_dir, target, signing_key, as_json);
    if (*cache_pull) return cmd_cache_pull(pull_manifest, pull_targets, pull_jobs, as_json);
    if (*cache_import) {
      const kiln::CacheImportReport r = kiln::cache_import(file, cache_dir);
      if (as_json) {
        kiln::cli::print_json({{"imported", r.imported}, {"already_present", r.already_present}, {"rejected", r.rejected}});
        return r.rejected.empty() ? 0 : 6;
      }
      for (const auto& why : r.rejected) std::cout << "rejected: " << why << "\n";
      std::cout << fmt::format("imported {} entries, {} already present, {} rejected\n", r.imported, r.already_present, r.rejected.size());
      return r.rejected.empty() ? 0 : 6;
    }
    if ((*check || *bench) && !check_manifest.empty()) {
      return kiln::cli::run_manifest(static_cast<bool>(*bench), check_manifest, op, manifest_batch, seed, target_ms, as_json);
    }
    if ((*check || *bench) && op.empty()) throw kiln::Error(kiln::ErrorCode::kInvalidArgument, "op: name an operator, or give --manifest");
    if (*check) return kiln::cli::run_check(op, shape_text, seed, kernel_name, as_json);
    if (*bench) return kiln::cli::run_bench(op, shape_text, seed, kernel_name, target_ms, as_json, input_sets);
    if (*manifests) return cmd_manifests(as_json);
    if (*warmup) return cmd_warmup(warm, as_json);
    if (*devices || *env) kiln::detail::KernelCache::inspect_only_process();  // they only read
    if (*devices) return cmd_devices(as_json);
    if (*env) return cmd_env(cache_dir, as_json);
    if (*list) return cmd_list(family, as_json);
    if (*explain) return cmd_explain(op, sig, target, as_json);
    if (*compile) return cmd_compile(op, sig, target, output, as_json);
  } catch (const kiln::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return exit_code(e);
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "kiln: out of host memory\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kiln: internal error: %s\n", e.what());
    return 1;
  } catch (...) {
    std::fprintf(stderr, "kiln: internal error: unknown exception\n");
    return 1;
  }
  return 1;
}
