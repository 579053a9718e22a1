#include "tools/problems.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <sstream>

#include <fmt/format.h>

#include "kiln/author.hpp"
#include "kiln/error.hpp"
#include "moe/mxfp4_prepared.h"
#include "moe/stream_workspace.h"
#include "reference/cpu_reference.hpp"
#include "tools/device_buffer.hpp"

namespace kiln::tools {

ShapeArgs ShapeArgs::parse(const std::string& text) {
  ShapeArgs s;
  std::stringstream ss(text);
  for (std::string pair; std::getline(ss, pair, ',');) {
    if (pair.empty()) continue;
    const size_t eq = pair.find('=');
    if (eq == std::string::npos || eq == 0) {
      throw Error(ErrorCode::kInvalidArgument, fmt::format("--shape: '{}' is not key=value", pair));
    }
    s.given_[pair.substr(0, eq)] = pair.substr(eq + 1);
  }
  return s;
}

std::string ShapeArgs::text(const std::string& key, const std::string& fallback) {
  auto it = given_.find(key);
  used_[key] = it == given_.end() ? fallback : it->second;
  return used_[key];
}

int64_t ShapeArgs::integer(const std::string& key, int64_t fallback) {
  const std::string v = text(key, std::to_string(fallback));
  size_t used = 0;
  int64_t value = 0;
  try {
    value = std::stoll(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != v.size()) throw Error(ErrorCode::kInvalidArgument, fmt::format("--shape: {}={} is not an integer", key, v));
  return value;
}

bool ShapeArgs::flag(const std::string& key, bool fallback) { return integer(key, fallback ? 1 : 0) != 0; }

void ShapeArgs::check_all_used(const std::string& op) const {
  std::vector<std::string> unknown, known;
  for (const auto& [k, v] : given_) {
    if (!used_.count(k)) unknown.push_back(k);
  }
  for (const auto& [k, v] : used_) known.push_back(k);
  if (!unknown.empty()) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("--shape: unknown key(s) {} for {} (known: {})", fmt::join(unknown, ", "), op, fmt::join(known, ", ")));
  }
}

std::string ShapeArgs::describe() const {
  std::vector<std::string> parts;
  for (const auto& [k, v] : used_) parts.push_back(k + "=" + v);
  return fmt::format("{}", fmt::join(parts, ","));
}

double relative_error(const std::vector<double>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

namespace {

DType half_type(const std::string& name, const char* key) {
  const DType t = parse_dtype(name, key);
  if (t != DType::kBF16 && t != DType::kF16) throw Error(ErrorCode::kInvalidArgument, fmt::format("--shape: {} must be bf16 or f16", key));
  return t;
}

TensorView view(const DeviceBuffer& b, DType t, std::initializer_list<int64_t> shape) {
  return TensorView::contiguous(b.get(), t, shape, 0);
}

// Sums the visible keys of every query row: the work attention must do, masked pairs excluded.
int64_t visible(int64_t position, int64_t keys, bool causal, int64_t window) {
  int64_t lo = 0, hi = keys;
  if (causal) hi = std::min(keys, position + 1);
  if (window >= 0) lo = std::max<int64_t>(0, position - window);
  return std::max<int64_t>(0, hi - lo);
}

// The float64 reference's view of an attention problem whose `batch` sequences each hold len_q
// queries after len_k keys (bottom-right aligned), q, k and v already in `h`; returns the sinks,
// drawn from `rng` whether used or not, that the device call gets too.
std::vector<float> describe_attention(reference::PrefillProblem& h, std::mt19937& rng, int64_t batch, int64_t len_q, int64_t len_k,
                                      int64_t hq, int64_t hkv, int64_t d, bool causal, int64_t window, bool sinks, double softcap) {
  h.cu_q.push_back(0);
  h.cu_k.push_back(0);
  for (int64_t b = 0; b < batch; ++b) {
    h.cu_q.push_back(h.cu_q.back() + static_cast<int>(len_q));
    h.cu_k.push_back(h.cu_k.back() + static_cast<int>(len_k));
  }
  std::vector<float> drawn(static_cast<size_t>(hq));
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  for (auto& x : drawn) x = u(rng);
  h.hq = static_cast<int>(hq);
  h.hkv = static_cast<int>(hkv);
  h.d = static_cast<int>(d);
  h.causal = causal;
  h.window_left = static_cast<int>(window);
  if (sinks) h.sinks.assign(drawn.begin(), drawn.end());
  h.softcap = softcap;
  h.scale = 1.0 / std::sqrt(static_cast<double>(d));
  return drawn;
}

// 0 .. n - 1 in an order drawn from `rng`: pages, slots or experts scattered.
std::vector<int> shuffled_indices(size_t n, std::mt19937& rng) {
  std::vector<int> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  return order;
}

// `elems` random K values, then as many V values, as a cache stores them: e4m3 (dequantized =
// stored x scale, exact in doubles) or `dtype`; their values go into k_values and v_values.
struct RandomKv {
  bool fp8;
  std::vector<uint16_t> k16, v16;
  std::vector<uint8_t> k8, v8;
  RandomKv(std::mt19937& rng, size_t elems, bool fp8_cache, DType dtype, float scale, std::vector<double>& k_values,
           std::vector<double>& v_values)
      : fp8(fp8_cache) {
    if (fp8) {
      k8 = random_e4m3(rng, elems, scale, k_values);
      v8 = random_e4m3(rng, elems, scale, v_values);
    } else {
      k16 = random_half(rng, elems, dtype, 1.0f, k_values);
      v16 = random_half(rng, elems, dtype, 1.0f, v_values);
    }
  }
  const uint8_t* k_bytes() const { return fp8 ? k8.data() : reinterpret_cast<const uint8_t*>(k16.data()); }
  const uint8_t* v_bytes() const { return fp8 ? v8.data() : reinterpret_cast<const uint8_t*>(v16.data()); }
  DeviceBuffer k_device() const { return fp8 ? DeviceBuffer::from(k8) : DeviceBuffer::from(k16); }
  DeviceBuffer v_device() const { return fp8 ? DeviceBuffer::from(v8) : DeviceBuffer::from(v16); }
};

// What the attention problems share: input sets added on demand, each with a 16-bit `out` of q's
// shape, poisoned and read back alike.
template <typename Set>
class AttentionProblem : public Problem {
 public:
  void ensure_sets(int count) override {
    while (static_cast<int>(sets_.size()) < count) add_set();
  }
  int sets() const override { return static_cast<int>(sets_.size()); }
  void poison(int i) override { sets_[static_cast<size_t>(i)].out.fill_bytes(0xFF); }
  std::vector<double> output(int i) const override {
    return decode_half(sets_[static_cast<size_t>(i)].out.template to_host<uint16_t>(q_elems()), dtype_);
  }
  double cpu_cost() const override { return work().flops / 2; }
  double tolerance() const override { return dtype_ == DType::kBF16 ? 1e-2 : 2e-3; }

 protected:
  virtual void add_set() = 0;
  virtual size_t q_elems() const = 0;
  DType dtype_ = DType::kBF16;
  std::vector<Set> sets_;
};

// ---- mha_prefill -----------------------------------------------------------------------------
struct PrefillSet {
  DeviceBuffer q, k, v, out, cu_q, cu_k, sinks;
  MhaPrefillArgs args;
};

class PrefillProblem : public AttentionProblem<PrefillSet> {
 public:
  PrefillProblem(ShapeArgs& s, uint64_t seed) : seed_(seed) {
    batch_ = s.integer("batch", 1);
    seqlen_q_ = s.integer("seqlen_q", s.integer("seqlen", 1024));
    seqlen_k_ = s.integer("seqlen_k", seqlen_q_);
    hq_ = s.integer("heads_q", 32);
    hkv_ = s.integer("heads_kv", 8);
    d_ = s.integer("head_dim", 128);
    dtype_ = half_type(s.text("dtype", "bf16"), "dtype");
    causal_ = s.flag("causal", true);
    window_ = s.integer("window", -1);
    sinks_ = s.flag("sinks", false);
    softcap_ = static_cast<double>(s.integer("softcap", 0));
    if (batch_ < 1 || seqlen_q_ < 1 || seqlen_k_ < 1 || hq_ < 1 || hkv_ < 1 || d_ < 8) {
      throw Error(ErrorCode::kInvalidArgument, "--shape: batch, seqlen, heads and head_dim must be positive");
    }
  }
  void run(int i) override { mha_prefill(sets_[static_cast<size_t>(i)].args, nullptr); }
  std::vector<double> cpu_reference() const override { return reference::prefill_reference(host_).out; }
  Work work() const override {
    int64_t pairs = 0;
    for (int64_t i = 0; i < seqlen_q_; ++i) pairs += visible(i + seqlen_k_ - seqlen_q_, seqlen_k_, causal_, window_);
    const double elem = 2;
    return {4.0 * static_cast<double>(d_ * hq_ * batch_ * pairs),
            elem * static_cast<double>(2 * q_elems() + 2 * batch_ * seqlen_k_ * hkv_ * d_)};
  }
  Signature signature() const override { return signature_of(sets_[0].args); }
  size_t bytes_per_set() const override { return static_cast<size_t>(work().bytes); }

 private:
  size_t q_elems() const override { return static_cast<size_t>(batch_ * seqlen_q_ * hq_ * d_); }
  void add_set() override {
    std::mt19937 rng(static_cast<uint32_t>(seed_ + sets_.size() * 7919));
    const size_t kv_elems = static_cast<size_t>(batch_ * seqlen_k_ * hkv_ * d_);
    reference::PrefillProblem h;
    const auto q = random_half(rng, q_elems(), dtype_, 1.0f, h.q);
    const auto k = random_half(rng, kv_elems, dtype_, 1.0f, h.k);
    const auto v = random_half(rng, kv_elems, dtype_, 1.0f, h.v);
    const std::vector<float> sinks =
        describe_attention(h, rng, batch_, seqlen_q_, seqlen_k_, hq_, hkv_, d_, causal_, window_, sinks_, softcap_);
    PrefillSet s{DeviceBuffer::from(q),      DeviceBuffer::from(k),      DeviceBuffer::from(v),     DeviceBuffer(q.size() * 2),
                 DeviceBuffer::from(h.cu_q), DeviceBuffer::from(h.cu_k), DeviceBuffer::from(sinks), {}};
    auto& a = s.args;
    const int64_t total_q = batch_ * seqlen_q_, total_k = batch_ * seqlen_k_;
    a.q = view(s.q, dtype_, {total_q, hq_, d_});
    a.k = view(s.k, dtype_, {total_k, hkv_, d_});
    a.v = view(s.v, dtype_, {total_k, hkv_, d_});
    a.out = view(s.out, dtype_, {total_q, hq_, d_});
    a.cu_seqlens_q = view(s.cu_q, DType::kI32, {batch_ + 1});
    a.cu_seqlens_k = view(s.cu_k, DType::kI32, {batch_ + 1});
    a.max_seqlen_q = static_cast<int32_t>(seqlen_q_);
    a.max_seqlen_k = static_cast<int32_t>(seqlen_k_);
    if (sinks_) a.sinks = view(s.sinks, DType::kF32, {hq_});
    a.causal = causal_;
    a.window_left = static_cast<int32_t>(window_);
    a.softcap = static_cast<float>(softcap_);
    if (sets_.empty()) host_ = std::move(h);
    sets_.push_back(std::move(s));
  }
  uint64_t seed_;
  int64_t batch_, seqlen_q_, seqlen_k_, hq_, hkv_, d_, window_;
  bool causal_, sinks_;
  double softcap_;
  reference::PrefillProblem host_;
};

// ---- mha_decode_with_kvcache -----------------------------------------------------------------
struct DecodeSet {
  DeviceBuffer q, k, v, pages, lens, out, sinks;
  MhaDecodeArgs args;
};

class DecodeProblem : public AttentionProblem<DecodeSet> {
 public:
  DecodeProblem(ShapeArgs& s, uint64_t seed) : seed_(seed) {
    batch_ = s.integer("batch", 8);
    context_ = s.integer("context", 4096);
    q_len_ = s.integer("q_len", 1);
    hq_ = s.integer("heads_q", 32);
    hkv_ = s.integer("heads_kv", 8);
    d_ = s.integer("head_dim", 128);
    page_ = s.integer("page_size", 16);
    dtype_ = half_type(s.text("dtype", "bf16"), "dtype");
    fp8_ = s.text("kv_dtype", dtype_name(dtype_)) == "e4m3";
    window_ = s.integer("window", -1);
    sinks_ = s.flag("sinks", false);
    if (batch_ < 1 || context_ < q_len_ || q_len_ < 1 || page_ < 1) {
      throw Error(ErrorCode::kInvalidArgument, "--shape: need batch >= 1, page_size >= 1, 1 <= q_len <= context");
    }
    max_pages_ = (context_ + page_ - 1) / page_;
  }
  void run(int i) override { mha_decode_with_kvcache(sets_[static_cast<size_t>(i)].args, nullptr); }
  std::vector<double> cpu_reference() const override { return reference::decode_reference(host_).out; }
  Work work() const override {
    int64_t keys = 0;
    for (int64_t t = 0; t < q_len_; ++t) keys += visible(context_ - q_len_ + t, context_, true, window_);
    // K and V are read once per KV head for the whole GQA group and all q_len rows: the distinct
    // positions any row of a sequence sees.
    const int64_t read = std::min<int64_t>(context_, window_ >= 0 ? window_ + q_len_ : context_);
    const double kv_elem = fp8_ ? 1 : 2;
    return {4.0 * static_cast<double>(d_ * hq_ * batch_ * keys),
            static_cast<double>(batch_) * (2.0 * static_cast<double>(read * hkv_ * d_) * kv_elem) + 4.0 * static_cast<double>(q_elems())};
  }
  Signature signature() const override { return signature_of(sets_[0].args); }
  size_t bytes_per_set() const override {
    return static_cast<size_t>(2 * pages_per_set() * page_ * hkv_ * d_ * (fp8_ ? 1 : 2)) + q_elems() * 4;
  }

 private:
  size_t q_elems() const override { return static_cast<size_t>(batch_ * q_len_ * hq_ * d_); }
  int64_t pages_per_set() const { return batch_ * max_pages_; }
  void add_set() override {
    std::mt19937 rng(static_cast<uint32_t>(seed_ + sets_.size() * 104729));
    reference::DecodeProblem h;
    h.batch = static_cast<int>(batch_);
    h.q_len = static_cast<int>(q_len_);
    h.hq = static_cast<int>(hq_);
    h.hkv = static_cast<int>(hkv_);
    h.d = static_cast<int>(d_);
    h.page_size = static_cast<int>(page_);
    h.max_pages = static_cast<int>(max_pages_);
    h.window_left = static_cast<int>(window_);
    h.scale = 1.0 / std::sqrt(static_cast<double>(d_));
    h.seqlens.assign(static_cast<size_t>(batch_), static_cast<int>(context_));
    const int64_t num_pages = pages_per_set();
    h.page_table = shuffled_indices(static_cast<size_t>(num_pages), rng);  // pages scattered in memory
    const auto q = random_half(rng, q_elems(), dtype_, 1.0f, h.q);
    const size_t cache_elems = static_cast<size_t>(num_pages * page_ * hkv_ * d_);
    const float scale = 0.5f;
    const RandomKv kv(rng, cache_elems, fp8_, dtype_, scale, h.k_cache, h.v_cache);
    std::vector<float> sinks(static_cast<size_t>(hq_), 0.5f);
    if (sinks_) h.sinks.assign(sinks.begin(), sinks.end());
    DecodeSet s{DeviceBuffer::from(q),
                kv.k_device(),
                kv.v_device(),
                DeviceBuffer::from(h.page_table),
                DeviceBuffer::from(h.seqlens),
                DeviceBuffer(q.size() * 2),
                DeviceBuffer::from(sinks),
                {}};
    auto& a = s.args;
    const DType cache = fp8_ ? DType::kF8E4M3 : dtype_;
    a.q = view(s.q, dtype_, {batch_ * q_len_, hq_, d_});
    a.k_cache = view(s.k, cache, {num_pages, page_, hkv_, d_});
    a.v_cache = view(s.v, cache, {num_pages, page_, hkv_, d_});
    a.page_table = view(s.pages, DType::kI32, {batch_, max_pages_});
    a.cache_seqlens = view(s.lens, DType::kI32, {batch_});
    a.out = view(s.out, dtype_, {batch_ * q_len_, hq_, d_});
    a.q_len = static_cast<int32_t>(q_len_);
    a.window_left = static_cast<int32_t>(window_);
    if (sinks_) a.sinks = view(s.sinks, DType::kF32, {hq_});
    a.k_scale = a.v_scale = scale;
    if (sets_.empty()) host_ = std::move(h);
    sets_.push_back(std::move(s));
  }
  uint64_t seed_;
  int64_t batch_, context_, q_len_, hq_, hkv_, d_, page_, window_, max_pages_;
  bool fp8_, sinks_;
  reference::DecodeProblem host_;
};

// ---- mha_extend_with_kvcache -------------------------------------------------------------------
// `seqlen` new tokens per sequence after a `prefix` already cached, all of them in shuffled pages
// (the new tokens' rows too, as the operator expects); the reference is the same attention over
// contiguous keys, bottom-right aligned.
struct ExtendSet {
  DeviceBuffer q, k, v, pages, lens, cu_q, out, sinks;
  MhaExtendArgs args;
};

class ExtendProblem : public AttentionProblem<ExtendSet> {
 public:
  ExtendProblem(ShapeArgs& s, uint64_t seed) : seed_(seed) {
    batch_ = s.integer("batch", 1);
    prefix_ = s.integer("prefix", 1024);
    new_ = s.integer("seqlen", 512);
    hq_ = s.integer("heads_q", 32);
    hkv_ = s.integer("heads_kv", 8);
    d_ = s.integer("head_dim", 128);
    page_ = s.integer("page_size", 16);
    dtype_ = half_type(s.text("dtype", "bf16"), "dtype");
    fp8_ = s.text("kv_dtype", dtype_name(dtype_)) == "e4m3";
    causal_ = s.flag("causal", true);
    window_ = s.integer("window", -1);
    sinks_ = s.flag("sinks", false);
    softcap_ = static_cast<double>(s.integer("softcap", 0));
    if (batch_ < 1 || prefix_ < 0 || new_ < 1 || hq_ < 1 || hkv_ < 1 || d_ < 8 || page_ < 1) {
      throw Error(ErrorCode::kInvalidArgument, "--shape: need batch, seqlen, heads, head_dim and page_size >= 1, prefix >= 0");
    }
    max_pages_ = (prefix_ + new_ + page_ - 1) / page_;
  }
  void run(int i) override { mha_extend_with_kvcache(sets_[static_cast<size_t>(i)].args, nullptr); }
  std::vector<double> cpu_reference() const override { return reference::prefill_reference(host_).out; }
  Work work() const override {
    int64_t pairs = 0;
    for (int64_t i = 0; i < new_; ++i) pairs += visible(prefix_ + i, prefix_ + new_, causal_, window_);
    // The keys some row sees, read once per KV head.
    const int64_t read = std::min(prefix_ + new_, window_ >= 0 ? window_ + new_ : prefix_ + new_);
    return {4.0 * static_cast<double>(d_ * hq_ * batch_ * pairs),
            4.0 * static_cast<double>(q_elems()) + (fp8_ ? 2.0 : 4.0) * static_cast<double>(batch_ * read * hkv_ * d_)};
  }
  Signature signature() const override { return signature_of(sets_[0].args); }
  size_t bytes_per_set() const override {
    return static_cast<size_t>(2 * batch_ * max_pages_ * page_ * hkv_ * d_ * (fp8_ ? 1 : 2)) + q_elems() * 4;
  }

 private:
  size_t q_elems() const override { return static_cast<size_t>(batch_ * new_ * hq_ * d_); }
  void add_set() override {
    std::mt19937 rng(static_cast<uint32_t>(seed_ + sets_.size() * 15485863));
    const int64_t len_k = prefix_ + new_, num_pages = batch_ * max_pages_;
    const size_t row = static_cast<size_t>(hkv_ * d_), kv_elems = static_cast<size_t>(batch_ * len_k) * row;
    reference::PrefillProblem h;
    const auto q = random_half(rng, q_elems(), dtype_, 1.0f, h.q);
    const float scale = 0.5f;
    const RandomKv kv(rng, kv_elems, fp8_, dtype_, scale, h.k, h.v);
    const std::vector<int> page_table = shuffled_indices(static_cast<size_t>(num_pages), rng);  // pages scattered in memory
    // Key j of sequence b at row j % page of page page_table[b][j / page]; rows no key fills stay 0xFF.
    const size_t elem = fp8_ ? 1 : 2;
    std::vector<uint8_t> k_cache(static_cast<size_t>(num_pages * page_) * row * elem, 0xFF), v_cache(k_cache.size(), 0xFF);
    const uint8_t* k_src = kv.k_bytes();
    const uint8_t* v_src = kv.v_bytes();
    for (int64_t b = 0; b < batch_; ++b) {
      for (int64_t j = 0; j < len_k; ++j) {
        const int64_t page = page_table[static_cast<size_t>(b * max_pages_ + j / page_)];
        const size_t src = static_cast<size_t>(b * len_k + j) * row * elem,
                     dst = static_cast<size_t>(page * page_ + j % page_) * row * elem;
        std::memcpy(&k_cache[dst], k_src + src, row * elem);
        std::memcpy(&v_cache[dst], v_src + src, row * elem);
      }
    }
    const std::vector<float> sinks = describe_attention(h, rng, batch_, new_, len_k, hq_, hkv_, d_, causal_, window_, sinks_, softcap_);
    const std::vector<int> lens(static_cast<size_t>(batch_), static_cast<int>(len_k));
    ExtendSet s{DeviceBuffer::from(q),          DeviceBuffer::from(k_cache), DeviceBuffer::from(v_cache),
                DeviceBuffer::from(page_table), DeviceBuffer::from(lens),    DeviceBuffer::from(h.cu_q),
                DeviceBuffer(q.size() * 2),     DeviceBuffer::from(sinks),   {}};
    auto& a = s.args;
    const DType cache = fp8_ ? DType::kF8E4M3 : dtype_;
    a.q = view(s.q, dtype_, {batch_ * new_, hq_, d_});
    a.k_cache = view(s.k, cache, {num_pages, page_, hkv_, d_});
    a.v_cache = view(s.v, cache, {num_pages, page_, hkv_, d_});
    a.page_table = view(s.pages, DType::kI32, {batch_, max_pages_});
    a.cache_seqlens = view(s.lens, DType::kI32, {batch_});
    a.cu_seqlens_q = view(s.cu_q, DType::kI32, {batch_ + 1});
    a.max_seqlen_q = static_cast<int32_t>(new_);
    a.out = view(s.out, dtype_, {batch_ * new_, hq_, d_});
    if (sinks_) a.sinks = view(s.sinks, DType::kF32, {hq_});
    a.causal = causal_;
    a.window_left = static_cast<int32_t>(window_);
    a.softcap = static_cast<float>(softcap_);
    a.k_scale = a.v_scale = fp8_ ? scale : 1.0f;
    if (sets_.empty()) host_ = std::move(h);
    sets_.push_back(std::move(s));
  }
  uint64_t seed_;
  int64_t batch_, prefix_, new_, hq_, hkv_, d_, page_, window_, max_pages_;
  bool fp8_, causal_, sinks_;
  double softcap_;
  reference::PrefillProblem host_;
};

// ---- kv_cache_append -------------------------------------------------------------------------
// `tokens` rows of K and V into slots of a shuffled pool of pages, every seventh token skipped (a
// negative slot). The output is what landed in the slots written; the reference is the tokens'
// values, or in an e4m3 cache the host's own encoding of value / scale.
class AppendProblem : public Problem {
 public:
  AppendProblem(ShapeArgs& s, uint64_t seed) : seed_(seed) {
    tokens_ = s.integer("tokens", 300);
    hkv_ = s.integer("heads_kv", 8);
    d_ = s.integer("head_dim", 128);
    page_ = s.integer("page_size", 16);
    dtype_ = half_type(s.text("dtype", "bf16"), "dtype");
    fp8_ = s.text("kv_dtype", dtype_name(dtype_)) == "e4m3";
    if (tokens_ < 1 || hkv_ < 1 || d_ < 8 || d_ % 8 != 0 || page_ < 1) {
      throw Error(ErrorCode::kInvalidArgument, "--shape: need tokens, heads_kv and page_size >= 1, head_dim a multiple of 8");
    }
    num_pages_ = (3 * tokens_ + page_ - 1) / page_ + 1;
  }
  void ensure_sets(int count) override {
    while (static_cast<int>(sets_.size()) < count) add_set();
  }
  int sets() const override { return static_cast<int>(sets_.size()); }
  void run(int i) override { kv_cache_append(sets_[static_cast<size_t>(i)].args, nullptr); }
  void poison(int i) override {
    sets_[static_cast<size_t>(i)].k_cache.fill_bytes(0xFF);
    sets_[static_cast<size_t>(i)].v_cache.fill_bytes(0xFF);
  }
  std::vector<double> output(int i) const override {
    const Set& set = sets_[static_cast<size_t>(i)];
    const size_t cache_elems = static_cast<size_t>(num_pages_ * page_) * row();
    std::vector<double> k, v;
    if (fp8_) {
      k = decode_e4m3(set.k_cache.to_host<uint8_t>(cache_elems), kScale);
      v = decode_e4m3(set.v_cache.to_host<uint8_t>(cache_elems), kScale);
    } else {
      k = decode_half(set.k_cache.to_host<uint16_t>(cache_elems), dtype_);
      v = decode_half(set.v_cache.to_host<uint16_t>(cache_elems), dtype_);
    }
    return written_rows(k, v);
  }
  std::vector<double> cpu_reference() const override {
    std::vector<double> out;
    for (int64_t t = 0; t < tokens_; ++t) {
      if (slots_[static_cast<size_t>(t)] < 0) continue;
      for (const auto* values : {&k_values_, &v_values_}) {
        for (size_t j = 0; j < row(); ++j) {
          const double value = (*values)[static_cast<size_t>(t) * row() + j];
          out.push_back(fp8_ ? static_cast<double>(e4m3_to_float(float_to_e4m3_saturated(static_cast<float>(value) / kScale))) * kScale
                             : value);
        }
      }
    }
    return out;
  }
  double cpu_cost() const override { return static_cast<double>(tokens_) * static_cast<double>(row()); }
  Work work() const override { return {0, static_cast<double>(tokens_) * static_cast<double>(row()) * (2.0 * 2 + 2.0 * (fp8_ ? 1 : 2))}; }
  Signature signature() const override { return signature_of(sets_[0].args); }
  size_t bytes_per_set() const override {
    return static_cast<size_t>(tokens_) * row() * 4 + static_cast<size_t>(num_pages_ * page_) * row() * (fp8_ ? 2 : 4);
  }
  double tolerance() const override { return 1e-12; }  // exact: the bits, or the same rounding

 private:
  // e4m3 cache: stored = value / scale. Values of about 4 over 1/64 reach past 448 (saturated)
  // and down into the subnormals.
  static constexpr float kScale = 0.015625f;
  size_t row() const { return static_cast<size_t>(hkv_ * d_); }
  static std::vector<double> decode_e4m3(const std::vector<uint8_t>& bytes, float scale) {
    std::vector<double> out(bytes.size());
    for (size_t i = 0; i < bytes.size(); ++i) out[i] = static_cast<double>(e4m3_to_float(bytes[i])) * scale;
    return out;
  }
  // K's row then V's of every token that has a slot, in token order.
  std::vector<double> written_rows(const std::vector<double>& k, const std::vector<double>& v) const {
    std::vector<double> out;
    for (int64_t t = 0; t < tokens_; ++t) {
      const int64_t slot = slots_[static_cast<size_t>(t)];
      if (slot < 0) continue;
      for (const auto* cache : {&k, &v}) {
        out.insert(out.end(), cache->begin() + static_cast<ptrdiff_t>(static_cast<size_t>(slot) * row()),
                   cache->begin() + static_cast<ptrdiff_t>(static_cast<size_t>(slot + 1) * row()));
      }
    }
    return out;
  }
  struct Set {
    DeviceBuffer k, v, slots, k_cache, v_cache;
    KvAppendArgs args;
  };
  void add_set() {
    std::mt19937 rng(static_cast<uint32_t>(seed_ + sets_.size() * 32452843));
    std::vector<double> k_values, v_values;
    const auto k = random_half(rng, static_cast<size_t>(tokens_) * row(), dtype_, 4.0f, k_values);
    const auto v = random_half(rng, static_cast<size_t>(tokens_) * row(), dtype_, 4.0f, v_values);
    // The same slots in every set, so that output() reads each set's rows where they went.
    if (slots_.empty()) {
      const std::vector<int> pool = shuffled_indices(static_cast<size_t>(num_pages_ * page_), rng);
      for (int64_t t = 0; t < tokens_; ++t) slots_.push_back(t % 7 == 3 ? -1 : pool[static_cast<size_t>(t)]);
    }
    const size_t cache_bytes = static_cast<size_t>(num_pages_ * page_) * row() * (fp8_ ? 1 : 2);
    Set s{DeviceBuffer::from(k),     DeviceBuffer::from(v),     DeviceBuffer::from(slots_),
          DeviceBuffer(cache_bytes), DeviceBuffer(cache_bytes), {}};
    auto& a = s.args;
    const DType cache = fp8_ ? DType::kF8E4M3 : dtype_;
    a.k = view(s.k, dtype_, {tokens_, hkv_, d_});
    a.v = view(s.v, dtype_, {tokens_, hkv_, d_});
    a.slot_mapping = view(s.slots, DType::kI64, {tokens_});
    a.k_cache = view(s.k_cache, cache, {num_pages_, page_, hkv_, d_});
    a.v_cache = view(s.v_cache, cache, {num_pages_, page_, hkv_, d_});
    a.k_scale = a.v_scale = fp8_ ? kScale : 1.0f;
    if (sets_.empty()) {
      k_values_ = std::move(k_values);
      v_values_ = std::move(v_values);
    }
    sets_.push_back(std::move(s));
  }
  uint64_t seed_;
  int64_t tokens_, hkv_, d_, page_, num_pages_;
  DType dtype_;
  bool fp8_;
  std::vector<int64_t> slots_;
  std::vector<double> k_values_, v_values_;  // set 0's inputs
  std::vector<Set> sets_;
};

// ---- moe_apply -------------------------------------------------------------------------------
class MoeProblem : public Problem {
 public:
  MoeProblem(ShapeArgs& s, uint64_t seed) : seed_(seed) {
    tokens_ = s.integer("tokens", 8);
    hidden_ = s.integer("hidden", 2880);
    inter_ = s.integer("inter", 2880);
    experts_ = s.integer("experts", 128);
    top_k_ = s.integer("top_k", 4);
    const std::string weights = s.text("weights", "mxfp4");
    if (weights != "bf16" && weights != "mxfp4" && weights != "mxfp4_prepared") {
      throw Error(ErrorCode::kInvalidArgument, "--shape: weights must be bf16, mxfp4 or mxfp4_prepared");
    }
    mxfp4_ = weights != "bf16";
    prepared_ = weights == "mxfp4_prepared";
    const std::string act_dtype = s.text("act", "bf16");
    if (act_dtype != "bf16" && act_dtype != "e4m3") throw Error(ErrorCode::kInvalidArgument, "--shape: act must be bf16 or e4m3 (W4A8)");
    act_e4m3_ = act_dtype == "e4m3";
    const std::string routing = s.text("routing", "topk_softmax");
    routing_ = routing == "topk_softmax" ? 0 : routing == "softmax_topk" ? 1 : routing == "precomputed" ? 2 : -1;
    if (routing_ < 0) throw Error(ErrorCode::kInvalidArgument, "--shape: routing must be topk_softmax, softmax_topk or precomputed");
    const std::string act = s.text("activation", "swiglu_clamped");
    if (act != "silu_glu" && act != "swiglu_clamped")
      throw Error(ErrorCode::kInvalidArgument, "--shape: activation must be silu_glu or swiglu_clamped");
    swiglu_ = act == "swiglu_clamped";
    const std::string layout = s.text("layout", "interleaved");
    if (layout != "concat" && layout != "interleaved")
      throw Error(ErrorCode::kInvalidArgument, "--shape: layout must be concat or interleaved");
    interleaved_ = layout == "interleaved";
    const std::string bias = s.text("bias", "f32");
    if (bias != "none" && bias != "f32" && bias != "bf16")
      throw Error(ErrorCode::kInvalidArgument, "--shape: bias must be none, f32 or bf16");
    bias_ = bias != "none";
    bias_bf16_ = bias == "bf16";
    const std::string logits = s.text("logits", "f32");
    if (logits != "f32" && logits != "bf16") throw Error(ErrorCode::kInvalidArgument, "--shape: logits must be f32 or bf16");
    logits_bf16_ = logits == "bf16";
    renormalize_ = s.flag("renormalize", true);
    if (tokens_ < 1 || hidden_ < 32 || inter_ < 32 || experts_ < 1 || top_k_ < 1 || top_k_ > experts_) {
      throw Error(ErrorCode::kInvalidArgument, "--shape: need tokens >= 1, hidden and inter >= 32, 1 <= top_k <= experts");
    }
  }
  void ensure_sets(int count) override {
    while (static_cast<int>(sets_.size()) < count) add_set();
  }
  int sets() const override { return static_cast<int>(sets_.size()); }
  void run(int i) override { moe_apply(sets_[static_cast<size_t>(i)].args, nullptr); }
  void poison(int i) override { sets_[static_cast<size_t>(i)].out.fill_bytes(0xFF); }
  std::vector<double> output(int i) const override {
    return decode_half(sets_[static_cast<size_t>(i)].out.to_host<uint16_t>(static_cast<size_t>(tokens_ * hidden_)), DType::kBF16);
  }
  std::vector<double> cpu_reference() const override {
    reference::MoeProblem h = host_;
    const Set& s = sets_.front();
    const size_t w13_elems = static_cast<size_t>(experts_ * 2 * inter_ * hidden_),
                 w2_elems = static_cast<size_t>(experts_ * hidden_ * inter_);
    if (mxfp4_) {
      h.w13 = decode_mxfp4(standard_mxfp4(s.w13.to_host<uint8_t>(w13_elems / 2)), s.w13_scale.to_host<uint8_t>(w13_elems / 32));
      h.w2 = decode_mxfp4(standard_mxfp4(s.w2.to_host<uint8_t>(w2_elems / 2)), s.w2_scale.to_host<uint8_t>(w2_elems / 32));
    } else {
      h.w13 = decode_half(s.w13.to_host<uint16_t>(w13_elems), DType::kBF16);
      h.w2 = decode_half(s.w2.to_host<uint16_t>(w2_elems), DType::kBF16);
    }
    return reference::moe_apply_reference(h);
  }
  double cpu_cost() const override { return work().flops / 2; }
  Work work() const override {
    const double expert_bytes = static_cast<double>(3 * hidden_ * inter_) * (mxfp4_ ? 0.5 + 1.0 / 32 : 2.0);
    return {6.0 * static_cast<double>(tokens_ * top_k_ * hidden_ * inter_),
            static_cast<double>(active_experts_) * expert_bytes + 4.0 * static_cast<double>(tokens_ * hidden_)};
  }
  Signature signature() const override { return signature_of(sets_[0].args); }
  // Sets share set 0's weights and differ in tokens and routing, so rotating them reads other
  // experts each call: a set costs the experts it routes to, not all of them.
  size_t bytes_per_set() const override { return static_cast<size_t>(work().bytes); }
  double tolerance() const override { return 1e-2; }

 private:
  struct Set {
    DeviceBuffer x, out, logits, ids, weights, w13, w13_scale, w13_bias, w2, w2_scale, w2_bias;
    MoeArgs args;
  };
  void add_set() {
    std::mt19937 rng(static_cast<uint32_t>(seed_ + sets_.size() * 15485863));
    const size_t T = static_cast<size_t>(tokens_), H = static_cast<size_t>(hidden_), I = static_cast<size_t>(inter_),
                 E = static_cast<size_t>(experts_), K = static_cast<size_t>(top_k_);
    reference::MoeProblem h;
    h.tokens = static_cast<int>(T);
    h.hidden = static_cast<int>(H);
    h.inter = static_cast<int>(I);
    h.experts = static_cast<int>(E);
    h.top_k = static_cast<int>(K);
    h.routing = routing_ == 1 ? 1 : 0;
    h.activation = swiglu_ ? 1 : 0;
    h.interleaved = interleaved_;
    h.mxfp8_activations = act_e4m3_;
    const auto x = random_half(rng, T * H, DType::kBF16, 1.0f, h.x);
    std::normal_distribution<float> n01(0.0f, 1.0f);
    std::vector<float> logits, weights;
    std::vector<int> ids;
    if (routing_ == 2) {
      for (size_t t = 0; t < T; ++t) {
        const std::vector<int> order = shuffled_indices(E, rng);
        for (size_t j = 0; j < K; ++j) {
          ids.push_back(order[j]);
          weights.push_back(std::fabs(n01(rng)) / static_cast<float>(K));
        }
      }
      h.topk_ids = ids;
      h.topk_weights.assign(weights.begin(), weights.end());
    } else {
      for (size_t i = 0; i < T * E; ++i) {
        const float f = 2.0f * n01(rng);
        logits.push_back(logits_bf16_ ? bf16_to_float(float_to_bf16(f)) : f);
      }
      h.logits.assign(logits.begin(), logits.end());
      h.renormalize = renormalize_;
    }
    std::vector<uint16_t> w13, w2;
    std::vector<uint8_t> w13p, w2p, s13, s2;
    const bool first = sets_.empty();  // later sets point at its weights and biases
    // Their float64 values are decoded only when a check asks for the reference (cpu_reference):
    // 17 GB of doubles for GPT-OSS-120B's experts, which a benchmark never needs.
    if (first && mxfp4_) {
      random_mxfp4(rng, E * 2 * I, H, w13p, s13);
      random_mxfp4(rng, E * H, I, w2p, s2);
      if (prepared_) {  // as an engine would: on the host copy, before upload
        for (auto* bytes : {&w13p, &w2p}) {
          moe_prepare_weights(TensorView::contiguous(bytes->data(), DType::kF4E2M1x2, {static_cast<int64_t>(bytes->size())}, kHostDevice),
                              nullptr);
        }
      }
    } else if (first) {
      w13 = random_half(rng, E * 2 * I * H, DType::kBF16, 1.0f / std::sqrt(static_cast<float>(H)));
      w2 = random_half(rng, E * H * I, DType::kBF16, 1.0f / std::sqrt(static_cast<float>(I)));
    }
    std::vector<float> b13, b2;
    std::vector<uint16_t> b13_bits, b2_bits;
    if (bias_ && first) {
      for (size_t i = 0; i < E * 2 * I; ++i) b13.push_back(0.1f * n01(rng));
      for (size_t i = 0; i < E * H; ++i) b2.push_back(0.1f * n01(rng));
      if (bias_bf16_) {  // store bf16, and give the reference exactly the rounded values
        for (float& value : b13) {
          b13_bits.push_back(float_to_bf16(value));
          value = bf16_to_float(b13_bits.back());
        }
        for (float& value : b2) {
          b2_bits.push_back(float_to_bf16(value));
          value = bf16_to_float(b2_bits.back());
        }
      }
      h.w13_bias.assign(b13.begin(), b13.end());
      h.w2_bias.assign(b2.begin(), b2.end());
    }
    std::vector<uint16_t> logits_bits;
    if (logits_bf16_) {
      for (float f : logits) logits_bits.push_back(float_to_bf16(f));
    }
    Set s{DeviceBuffer::from(x),
          DeviceBuffer(T * H * 2),
          logits_bf16_ ? DeviceBuffer::from(logits_bits) : DeviceBuffer::from(logits),
          DeviceBuffer::from(ids),
          DeviceBuffer::from(weights),
          mxfp4_ ? DeviceBuffer::from(w13p) : DeviceBuffer::from(w13),
          DeviceBuffer::from(s13),
          bias_bf16_ ? DeviceBuffer::from(b13_bits) : DeviceBuffer::from(b13),
          mxfp4_ ? DeviceBuffer::from(w2p) : DeviceBuffer::from(w2),
          DeviceBuffer::from(s2),
          bias_bf16_ ? DeviceBuffer::from(b2_bits) : DeviceBuffer::from(b2),
          {}};
    auto& a = s.args;
    const Set& owner = first ? s : sets_.front();
    const auto t64 = tokens_, h64 = hidden_, i64 = inter_, e64 = experts_;
    a.x = view(s.x, DType::kBF16, {t64, h64});
    a.out = view(s.out, DType::kBF16, {t64, h64});
    if (routing_ == 2) {
      a.topk_ids = view(s.ids, DType::kI32, {t64, top_k_});
      a.topk_weights = view(s.weights, DType::kF32, {t64, top_k_});
    } else {
      a.router_logits = view(s.logits, logits_bf16_ ? DType::kBF16 : DType::kF32, {t64, e64});
      a.routing = routing_ == 0 ? MoeRouting::kTopkThenSoftmax : MoeRouting::kSoftmaxThenTopk;
      a.renormalize = renormalize_;
    }
    a.top_k = static_cast<int32_t>(top_k_);
    if (mxfp4_) {
      const DType format = prepared_ ? DType::kF4E2M1x2Prepared : DType::kF4E2M1x2;
      a.w13 = view(owner.w13, format, {e64, 2 * i64, h64 / 2});
      a.w13_scale = view(owner.w13_scale, DType::kE8M0, {e64, 2 * i64, h64 / 32});
      a.w2 = view(owner.w2, format, {e64, h64, i64 / 2});
      a.w2_scale = view(owner.w2_scale, DType::kE8M0, {e64, h64, i64 / 32});
    } else {
      a.w13 = view(owner.w13, DType::kBF16, {e64, 2 * i64, h64});
      a.w2 = view(owner.w2, DType::kBF16, {e64, h64, i64});
    }
    if (bias_) {
      const DType bias_type = bias_bf16_ ? DType::kBF16 : DType::kF32;
      a.w13_bias = view(owner.w13_bias, bias_type, {e64, 2 * i64});
      a.w2_bias = view(owner.w2_bias, bias_type, {e64, h64});
    }
    a.activation = swiglu_ ? MoeActivation::kSwigluClamped : MoeActivation::kSiluGlu;
    a.gate_up_layout = interleaved_ ? GateUpLayout::kInterleaved : GateUpLayout::kConcatenated;
    a.activation_dtype = act_e4m3_ ? DType::kF8E4M3 : DType::kBF16;
    if (first) {
      // Experts the routing actually chose: the weight bytes a call must read.
      std::set<int> used(ids.begin(), ids.end());
      if (routing_ != 2) {
        for (size_t t = 0; t < T; ++t) {
          std::vector<int> order(E);
          std::iota(order.begin(), order.end(), 0);
          std::stable_sort(order.begin(), order.end(), [&](int a1, int b1) { return logits[t * E + a1] > logits[t * E + b1]; });
          used.insert(order.begin(), order.begin() + static_cast<long>(K));
        }
      }
      active_experts_ = static_cast<int64_t>(used.size());
      host_ = std::move(h);
    }
    sets_.push_back(std::move(s));
  }
  uint64_t seed_;
  int64_t tokens_, hidden_, inter_, experts_, top_k_, active_experts_ = 0;
  int routing_;
  // The standard e2m1x2 bytes of weights as uploaded (prepared or not).
  std::vector<uint8_t> standard_mxfp4(std::vector<uint8_t> bytes) const {
    if (!prepared_) return bytes;
    for (size_t i = 0; i < bytes.size(); i += 4) {
      uint32_t word = 0, standard = 0;
      std::memcpy(&word, &bytes[i], 4);
      for (unsigned v = 0; v < 8; ++v) standard |= kiln_mxfp4_prepared_value(word, v) << (4 * v);
      std::memcpy(&bytes[i], &standard, 4);
    }
    return bytes;
  }
  bool mxfp4_, prepared_ = false, act_e4m3_ = false, swiglu_, interleaved_, bias_, bias_bf16_, logits_bf16_, renormalize_;
  reference::MoeProblem host_;
  std::vector<Set> sets_;
};

}  // namespace

std::string shape_for(const Signature& sig, int64_t batch_or_tokens) {
  const auto& f = sig.fields();
  auto get = [&](const char* k) { return f.at(k); };
  const std::string op = operator_name(sig.op());
  const int64_t group = f.count("group") ? sig.get_int("group") : 1;
  // A window of 64 keys is a short one (short_window, attention/window_strip.h); 200 is not.
  const int window = !f.count("window") || get("window") != "1" ? -1 : f.count("short_window") ? 64 : 200;
  if (op == "mha_prefill") {
    return fmt::format("batch={},seqlen=256,heads_kv=2,heads_q={},head_dim={},dtype={},causal={},window={},sinks={},softcap={}",
                       batch_or_tokens, 2 * group, get("head_dim"), get("dtype"), get("causal"), window, get("sinks"),
                       get("softcap") == "1" ? 30 : 0);
  }
  if (op == "mha_decode_with_kvcache") {
    return fmt::format(
        "batch={},context=1000,heads_kv=2,heads_q={},head_dim={},dtype={},kv_dtype={},page_size={},q_len={},window={},sinks={}",
        batch_or_tokens, 2 * group, get("head_dim"), get("dtype"), get("kv_dtype"), get("page_size"), get("q_len"),
        get("window") == "1" ? 100 : -1, get("sinks"));
  }
  if (op == "mha_extend_with_kvcache") {
    return fmt::format(
        "batch={},prefix=300,seqlen=200,heads_kv=2,heads_q={},head_dim={},dtype={},kv_dtype={},page_size={},causal={},window={},sinks={},"
        "softcap={}",
        batch_or_tokens, 2 * group, get("head_dim"), get("dtype"), get("kv_dtype"), get("page_size"), get("causal"), window, get("sinks"),
        get("softcap") == "1" ? 30 : 0);
  }
  if (op == "kv_cache_append") {
    return fmt::format("tokens={},heads_kv=2,head_dim=128,page_size=16,dtype={},kv_dtype={}", 16 * batch_or_tokens, get("dtype"),
                       get("kv_dtype"));
  }
  // A large-batch signature (MXFP4) needs the tokens that make one (moe/stream_workspace.h).
  const int64_t tokens = f.count("large_batch")
                             ? std::max<int64_t>(batch_or_tokens, kiln_moe_large_batch_tokens(sig.get_int("top_k"), sig.get_int("experts")))
                             : batch_or_tokens;
  std::string shape = fmt::format("tokens={},hidden={},inter={},experts={},top_k={},weights={},routing={},activation={},layout={},bias={}",
                                  tokens, get("hidden"), get("inter"), get("experts"), get("top_k"), get("weights"), get("routing"),
                                  get("activation"), get("layout"), get("w13_bias"));
  if (f.count("logits")) shape += ",logits=" + get("logits");
  if (f.count("renormalize")) shape += ",renormalize=" + get("renormalize");
  if (f.count("act_dtype")) shape += ",act=" + get("act_dtype");
  return shape;
}

std::unique_ptr<Problem> make_problem(const std::string& op, ShapeArgs& shape, uint64_t seed, bool allocate) {
  std::unique_ptr<Problem> p;
  if (op == "mha_prefill") {
    p = std::make_unique<PrefillProblem>(shape, seed);
  } else if (op == "mha_decode_with_kvcache") {
    p = std::make_unique<DecodeProblem>(shape, seed);
  } else if (op == "mha_extend_with_kvcache") {
    p = std::make_unique<ExtendProblem>(shape, seed);
  } else if (op == "kv_cache_append") {
    p = std::make_unique<AppendProblem>(shape, seed);
  } else if (op == "moe_apply") {
    p = std::make_unique<MoeProblem>(shape, seed);
  } else {
    operator_from_name(op);  // throws for an unknown name, listing the operators
    throw Error(ErrorCode::kInternal, fmt::format("kiln check and bench have no problem for {}", op));
  }
  shape.check_all_used(op);
  if (allocate) p->ensure_sets(1);
  return p;
}

}  // namespace kiln::tools
