// Operator problems for `kiln check` and `kiln bench`: device inputs drawn from a seed (never
// zeros), several independent input sets to rotate past the L2 cache, poisoned outputs, the
// float64 CPU reference, and the work the call must do (FLOPs and bytes actually needed).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "kiln/registry.hpp"
#include "kiln/tensor.hpp"

namespace kiln::tools {

// --shape key=value,...: typed reads with defaults; keys nobody read are an error.
class ShapeArgs {
 public:
  static ShapeArgs parse(const std::string& text);
  int64_t integer(const std::string& key, int64_t fallback);
  std::string text(const std::string& key, const std::string& fallback);
  bool flag(const std::string& key, bool fallback);
  // Throws kiln::Error naming every key that no reader asked for (a typo, most likely).
  void check_all_used(const std::string& op) const;
  std::string describe() const;  // the shape as used, defaults included

 private:
  std::map<std::string, std::string> given_;
  std::map<std::string, std::string> used_;
};

struct Work {
  double flops = 0;  // unmasked multiply-adds x 2
  double bytes = 0;  // each input read once, each output written once
};

class Problem {
 public:
  virtual ~Problem() = default;
  // Adds input sets until there are `count` (each drawn from its own seed).
  virtual void ensure_sets(int count) = 0;
  virtual int sets() const = 0;
  virtual void run(int set) = 0;     // the operator, on the default stream
  virtual void poison(int set) = 0;  // every output byte 0xFF (NaN for floats)
  virtual std::vector<double> output(int set) const = 0;
  virtual std::vector<double> cpu_reference() const = 0;  // float64, input set 0
  virtual double cpu_cost() const = 0;                    // multiply-adds of the CPU reference
  virtual Work work() const = 0;
  virtual Signature signature() const = 0;
  virtual size_t bytes_per_set() const = 0;
  virtual double tolerance() const = 0;  // relative error bound for the output dtype
};

// The problem an operator name and --shape describe, its first input set allocated and filled
// (`allocate` false: the shape read and checked only, nothing on a device, e.g. before a GPU is
// looked for, so a bad argument is reported as such on any machine).
std::unique_ptr<Problem> make_problem(const std::string& op, ShapeArgs& shape, uint64_t seed, bool allocate = true);

// A --shape text whose problem has exactly this signature (for kiln check/bench --manifest):
// modest sizes, `batch_or_tokens` sequences (attention) or tokens (MoE; at least a large batch's
// for a large_batch signature), two KV heads.
std::string shape_for(const Signature& sig, int64_t batch_or_tokens);

// ||a - b|| / ||b||; infinity when any element of `a` is not finite (unwritten or broken).
double relative_error(const std::vector<double>& a, const std::vector<double>& b);

}  // namespace kiln::tools
