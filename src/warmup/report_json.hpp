// The JSON forms of warm-up reports and cache statistics, shared by `kiln ... --json` and the C ABI
// (which the Python package reads).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kiln/cache.hpp"
#include "kiln/warmup.hpp"

namespace kiln::detail {

// "sm_90a,sm_80" as targets, each checked against known_targets(); `argument` names the list in
// the kInvalidArgument thrown when it names none.
std::vector<std::string> parse_target_list(const std::string& text, const std::string& argument);

nlohmann::json warmup_report_json(const WarmupReport& report);
nlohmann::json cache_stats_json(const CacheStats& stats);
nlohmann::json remote_stats_json(const RemoteCacheStats& remote);

}  // namespace kiln::detail
