// The JSON forms of warm-up reports and cache statistics, shared by `kiln ... --json` and the C ABI
// (which the Python package reads).
#pragma once

#include <nlohmann/json.hpp>

#include "kiln/cache.hpp"
#include "kiln/warmup.hpp"

namespace kiln::detail {

nlohmann::json warmup_report_json(const WarmupReport& report);
nlohmann::json cache_stats_json(const CacheStats& stats);

}  // namespace kiln::detail
