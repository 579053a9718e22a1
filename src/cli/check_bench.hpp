// kiln check and kiln bench (they need a GPU).
#pragma once

#include <cstdint>
#include <string>

namespace kiln::cli {

// Exit 0 when the selected kernel matches the reference kernel (and float64 on the CPU, for
// shapes small enough) within the dtype's bound; 7 when it does not.
int run_check(const std::string& op, const std::string& shape, uint64_t seed, const std::string& kernel, bool as_json);
int run_bench(const std::string& op, const std::string& shape, uint64_t seed, const std::string& kernel, double target_ms, bool as_json);

}  // namespace kiln::cli
