// The cache database's schema (cache/schema.sql, embedded at build time) and its version.
#pragma once

#include <cstdint>
#include <string>

namespace kiln::detail {

// You MUST bump kSchemaVersion when cache/schema.sql changes, and teach migrate() in
// kernel_cache.cpp the step from the previous version. tests/test_cache.cpp pins both.
inline constexpr int kSchemaVersion = 2;
inline constexpr int32_t kApplicationId = 0x6b696c6e;  // "kiln": PRAGMA application_id

std::string cache_schema_sql();

}  // namespace kiln::detail
