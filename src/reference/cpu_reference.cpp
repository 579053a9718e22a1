#include "reference/cpu_reference.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "core/parallel.hpp"
#include "moe/mxfp8_activations.h"

namespace kiln::reference {
namespace {

const double kNegInf = -std::numeric_limits<double>::infinity();

// Softmax attention of one query row over explicit keys; writes out[0..d) and returns the lse.
template <typename KeyAt>
double attend(const double* q, int n_keys, KeyAt key_at, int d, double scale, double softcap, const double* sink, double* out) {
  std::vector<double> scores(static_cast<size_t>(n_keys));
  double max_score = sink ? *sink : kNegInf;
  for (int j = 0; j < n_keys; ++j) {
    const auto [k, v] = key_at(j);
    (void)v;
    double s = 0;
    for (int c = 0; c < d; ++c) s += q[c] * k[c];
    s *= scale;
    if (softcap > 0) s = softcap * std::tanh(s / softcap);
    scores[static_cast<size_t>(j)] = s;
    max_score = std::max(max_score, s);
  }
  std::fill(out, out + d, 0.0);
  if (max_score == kNegInf) return kNegInf;
  double denominator = sink ? std::exp(*sink - max_score) : 0.0;
  for (int j = 0; j < n_keys; ++j) {
    const double w = std::exp(scores[static_cast<size_t>(j)] - max_score);
    denominator += w;
    const double* v = key_at(j).second;
    for (int c = 0; c < d; ++c) out[c] += w * v[c];
  }
  for (int c = 0; c < d; ++c) out[c] /= denominator;
  return max_score + std::log(denominator);
}

}  // namespace

AttentionResult prefill_reference(const PrefillProblem& p) {
  const int total_q = static_cast<int>(p.q.size() / static_cast<size_t>(p.hq * p.d));
  AttentionResult r;
  r.out.assign(p.q.size(), 0.0);
  r.lse.assign(static_cast<size_t>(total_q * p.hq), kNegInf);
  const int group = p.hq / p.hkv;
  for (size_t b = 0; b + 1 < p.cu_q.size(); ++b) {
    const int lq = p.cu_q[b + 1] - p.cu_q[b], lk = p.cu_k[b + 1] - p.cu_k[b];
    detail::for_each_index_in_parallel(static_cast<size_t>(std::max(lq, 0)), 4, [&](size_t row_in_batch) {
      const int i = static_cast<int>(row_in_batch), pos = i + lk - lq;
      int lo = 0, hi = lk;
      if (p.causal) hi = std::min(lk, pos + 1);
      if (p.window_left >= 0) lo = std::max(0, pos - p.window_left);
      for (int h = 0; h < p.hq; ++h) {
        const int row = p.cu_q[b] + i;
        const double* q = &p.q[static_cast<size_t>((row * p.hq + h) * p.d)];
        auto key_at = [&](int j) {
          const size_t at = static_cast<size_t>(((p.cu_k[b] + lo + j) * p.hkv + h / group) * p.d);
          return std::make_pair(&p.k[at], &p.v[at]);
        };
        r.lse[static_cast<size_t>(row * p.hq + h)] =
            attend(q, std::max(0, hi - lo), key_at, p.d, p.scale, p.softcap, p.sinks.empty() ? nullptr : &p.sinks[static_cast<size_t>(h)],
                   &r.out[static_cast<size_t>((row * p.hq + h) * p.d)]);
      }
    });
  }
  return r;
}

AttentionResult decode_reference(const DecodeProblem& p) {
  AttentionResult r;
  r.out.assign(p.q.size(), 0.0);
  r.lse.assign(static_cast<size_t>(p.batch * p.q_len * p.hq), kNegInf);
  const int group = p.hq / p.hkv;
  detail::for_each_index_in_parallel(static_cast<size_t>(std::max(p.batch * p.q_len, 0)), 1, [&](size_t query_row) {
    const int row = static_cast<int>(query_row), b = row / p.q_len, t = row % p.q_len;
    const int len = p.seqlens[static_cast<size_t>(b)];
    const int pos = len - p.q_len + t;
    const int hi = len > 0 ? pos + 1 : 0;
    const int lo = p.window_left >= 0 ? std::max(0, pos - p.window_left) : 0;
    for (int h = 0; h < p.hq; ++h) {
      auto key_at = [&](int j) {
        const int token = lo + j;
        const int page = p.page_table[static_cast<size_t>(b * p.max_pages + token / p.page_size)];
        const size_t at = static_cast<size_t>(((page * p.page_size + token % p.page_size) * p.hkv + h / group) * p.d);
        return std::make_pair(&p.k_cache[at], &p.v_cache[at]);
      };
      r.lse[static_cast<size_t>(row * p.hq + h)] =
          attend(&p.q[static_cast<size_t>((row * p.hq + h) * p.d)], std::max(0, hi - lo), key_at, p.d, p.scale, p.softcap,
                 p.sinks.empty() ? nullptr : &p.sinks[static_cast<size_t>(h)], &r.out[static_cast<size_t>((row * p.hq + h) * p.d)]);
    }
  });
  return r;
}

namespace {

// A row of n values (n a multiple of 32) as W4A8 uses it: each block of 32 quantized to MXFP8.
std::vector<double> mxfp8_row(const double* values, size_t n) {
  std::vector<double> out(n);
  for (size_t b = 0; b < n; b += 32) {
    float amax = 0.0f;
    for (size_t i = b; i < b + 32; ++i) amax = std::max(amax, std::fabs(static_cast<float>(values[i])));
    const int s = kiln_mxfp8_exponent(amax);
    for (size_t i = b; i < b + 32; ++i) out[i] = kiln_mxfp8_value(static_cast<float>(values[i]), s);
  }
  return out;
}

// v rounded to bf16 (to nearest, ties to even), as the kernels store act.
double round_to_bf16(double v) {
  const unsigned bits = kiln_float_bits(static_cast<float>(v));
  if ((bits & 0x7F800000u) == 0x7F800000u) return static_cast<float>(v);
  return kiln_bits_float((bits + 0x7FFFu + ((bits >> 16) & 1u)) & 0xFFFF0000u);
}

}  // namespace

std::vector<double> moe_apply_reference(const MoeProblem& p) {
  const size_t H = static_cast<size_t>(p.hidden), I = static_cast<size_t>(p.inter), E = static_cast<size_t>(p.experts);
  std::vector<double> out(static_cast<size_t>(p.tokens) * H, 0.0);
  detail::for_each_index_in_parallel(static_cast<size_t>(std::max(p.tokens, 0)), 8, [&](size_t t) {
    std::vector<int> ids(static_cast<size_t>(p.top_k));
    std::vector<double> weights(static_cast<size_t>(p.top_k));
    if (p.logits.empty()) {
      for (size_t j = 0; j < ids.size(); ++j) {
        ids[j] = p.topk_ids[t * ids.size() + j];
        weights[j] = p.topk_weights[t * ids.size() + j];
      }
    } else {
      const double* l = &p.logits[t * E];
      std::vector<int> order(E);
      std::iota(order.begin(), order.end(), 0);
      // Descending, ties and NaNs (below every number) in expert order, as the kernels rank them.
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return l[a] > l[b] || (std::isnan(l[b]) && !std::isnan(l[a])); });
      const double max_logit = l[order[0]];
      double all = 0, chosen = 0;
      for (size_t e = 0; e < E; ++e) all += std::exp(l[e] - max_logit);
      for (size_t j = 0; j < ids.size(); ++j) {
        ids[j] = order[j];
        weights[j] = std::exp(l[order[j]] - max_logit);
        chosen += weights[j];
      }
      const double norm = (p.routing == 0 || p.renormalize) ? chosen : all;
      for (auto& w : weights) w /= norm;
    }
    const std::vector<double> x_used = p.mxfp8_activations ? mxfp8_row(&p.x[t * H], H) : std::vector<double>();
    const double* x = p.mxfp8_activations ? x_used.data() : &p.x[t * H];
    for (size_t j = 0; j < ids.size(); ++j) {
      if (ids[j] < 0 || ids[j] >= p.experts) continue;  // an id outside [0, E) adds nothing, as in the kernels
      const size_t e = static_cast<size_t>(ids[j]);
      std::vector<double> act(I);
      for (size_t r = 0; r < I; ++r) {
        const size_t gate_row = p.interleaved ? 2 * r : r, up_row = p.interleaved ? 2 * r + 1 : I + r;
        double gate = 0, up = 0;
        for (size_t c = 0; c < H; ++c) {
          gate += x[c] * p.w13[(e * 2 * I + gate_row) * H + c];
          up += x[c] * p.w13[(e * 2 * I + up_row) * H + c];
        }
        if (!p.w13_bias.empty()) {
          gate += p.w13_bias[e * 2 * I + gate_row];
          up += p.w13_bias[e * 2 * I + up_row];
        }
        if (p.activation == 1) {
          gate = std::min(gate, 7.0);
          up = std::clamp(up, -7.0, 7.0);
          act[r] = gate / (1 + std::exp(-1.702 * gate)) * (up + 1);
        } else {
          act[r] = gate / (1 + std::exp(-gate)) * up;
        }
      }
      if (p.mxfp8_activations) {
        for (double& a : act) a = round_to_bf16(a);
        act = mxfp8_row(act.data(), I);
      }
      for (size_t h = 0; h < H; ++h) {
        double s = 0;
        for (size_t c = 0; c < I; ++c) s += act[c] * p.w2[(e * H + h) * I + c];
        if (!p.w2_bias.empty()) s += p.w2_bias[e * H + h];
        out[t * H + h] += weights[j] * s;
      }
    }
  });
  return out;
}

}  // namespace kiln::reference
