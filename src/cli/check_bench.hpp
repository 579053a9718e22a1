// kiln check and kiln bench (they need a GPU).
#pragma once

#include <cstdint>
#include <string>

namespace kiln::cli {

// Exit 0 when the selected kernel matches the reference kernel (and float64 on the CPU, for
// shapes small enough) within the dtype's bound; 7 when it does not.
int run_check(const std::string& op, const std::string& shape, uint64_t seed, const std::string& kernel, bool as_json);
// input_sets: rotate exactly this many input sets; 0 picks enough to exceed twice the L2.
int run_bench(const std::string& op, const std::string& shape, uint64_t seed, const std::string& kernel, double target_ms, bool as_json,
              int input_sets = 0);

// Runs check (or bench) for every signature of a manifest (of operator `op`, if not empty), each
// with a shape that reproduces the signature and `batch` sequences or tokens. Exit status of the
// worst.
int run_manifest(bool bench, const std::string& manifest, const std::string& op, int64_t batch, uint64_t seed, double target_ms,
                 bool as_json);

}  // namespace kiln::cli
