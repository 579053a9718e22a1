#include "warmup/report_json.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "kiln/error.hpp"
#include "kiln/log.hpp"
#include "kiln/platform.hpp"

namespace kiln::detail {

std::vector<std::string> parse_target_list(const std::string& text, const std::string& argument) {
  std::vector<std::string> targets;
  for (size_t at = 0; at <= text.size();) {
    const size_t comma = text.find(',', at);
    const size_t end = comma == std::string::npos ? text.size() : comma;
    if (end > at) targets.push_back(text.substr(at, end - at));
    at = end + 1;
  }
  if (targets.empty()) throw Error(ErrorCode::kInvalidArgument, argument + ": name at least one target (e.g. sm_90a)");
  const auto known = known_targets();
  for (const auto& t : targets) {
    const Platform p = platform_for_target(t);  // a wrong target fails before any manifest is read
    // An AMD GPU looks its kernels up under its full target, feature flags included (a MI300X
    // reports gfx942:sramecc+:xnack-): the bare name fills keys no GPU reads.
    if (p.vendor == Vendor::kAmd && t.find(':') == std::string::npos) {
      log(LogLevel::kWarn, fmt::format("{}: AMD GPUs look kernels up under their target with feature flags (a MI300X reports "
                                       "{}:sramecc+:xnack-); warm the name `kiln devices` prints on the node",
                                       argument, t));
    }
    // A GPU with arch-specific features reports the "a" target (an H100 is sm_90a) and looks its
    // kernels up under it: warming the plain name fills keys that GPU never reads.
    if (std::find(known.begin(), known.end(), t + "a") != known.end()) {
      log(LogLevel::kWarn, fmt::format("{}: no GPU looks kernels up as {}: the GPUs of that family report {}a (an H100 is "
                                       "sm_90a); warm {}a for them",
                                       argument, t, t, t));
    }
  }
  return targets;
}

nlohmann::json warmup_report_json(const WarmupReport& r) {
  nlohmann::json items = nlohmann::json::array();
  static const char* names[] = {"compiled", "cached", "shared", "failed", "cancelled"};
  for (const auto& i : r.items) {
    items.push_back({{"signature", i.signature},
                     {"target", i.target},
                     {"kernel", i.kernel},
                     {"reference", i.reference},
                     {"origin", i.origin},
                     {"status", names[static_cast<int>(i.status)]},
                     {"reason", i.reason},
                     {"stored", i.stored},
                     {"bytes", i.bytes},
                     {"ms", i.milliseconds}});
  }
  return {
      {"compiled", r.compiled},     {"cached", r.cached},       {"shared", r.shared}, {"failed", r.failed},   {"cancelled", r.cancelled},
      {"not_stored", r.not_stored}, {"reference", r.reference}, {"bytes", r.bytes},   {"seconds", r.seconds}, {"items", items}};
}

nlohmann::json cache_stats_json(const CacheStats& s) {
  return {{"directory", s.directory},
          {"persistent", s.persistent},
          {"degraded_reason", s.degraded_reason},
          {"seeds", s.seeds},
          {"entries", s.entries},
          {"bytes", s.bytes},
          {"max_bytes", s.max_bytes},
          {"memory_hits", s.memory_hits},
          {"disk_hits", s.disk_hits},
          {"seed_hits", s.seed_hits},
          {"misses", s.misses},
          {"compiles", s.compiles},
          {"compile_ms", s.compile_ms},
          {"bytes_written", s.bytes_written},
          {"evictions", s.evictions},
          {"bad_entries", s.bad_entries},
          {"lock_waits", s.lock_waits},
          {"remote", remote_stats_json(s.remote)}};
}

nlohmann::json remote_stats_json(const RemoteCacheStats& r) {
  return {{"url", r.url},
          {"prefix", r.prefix},
          {"state", r.state},
          {"hits", r.hits},
          {"misses", r.misses},
          {"refused", r.refused},
          {"errors", r.errors},
          {"skipped", r.skipped},
          {"bytes_read", r.bytes_read},
          {"bytes_written", r.bytes_written},
          {"publishes", r.publishes},
          {"publish_dropped", r.publish_dropped},
          {"lease_waits", r.lease_waits},
          {"lease_takeovers", r.lease_takeovers}};
}

}  // namespace kiln::detail
