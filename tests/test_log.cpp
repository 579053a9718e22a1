#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kiln/log.hpp"

namespace kiln {
namespace {

TEST(Log, CallbackReceivesMessagesAtOrAboveTheLevel) {
  std::vector<std::pair<LogLevel, std::string>> seen;
  set_log_callback([&](LogLevel l, const std::string& m) { seen.emplace_back(l, m); });
  const LogLevel before = log_level();
  set_log_level(LogLevel::kInfo);
  log(LogLevel::kDebug, "hidden");
  log(LogLevel::kInfo, "shown");
  log(LogLevel::kError, "also shown");
  set_log_level(LogLevel::kOff);
  log(LogLevel::kError, "off");
  set_log_level(before);
  set_log_callback(nullptr);
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0].second, "shown");
  EXPECT_EQ(seen[1].first, LogLevel::kError);
}

}  // namespace
}  // namespace kiln
