// kiln's operators in OpenCL C, for the OpenCL backend plugin. The program starts with the
// parameter blocks' field offsets (KILN_P_<struct>_<field>, from the installed params.h, written
// by opencl_kernels.cpp), since OpenCL C cannot take a struct of pointers as an argument: every
// kernel receives the operator's parameter block as bytes and reads fields at those offsets.
// Device pointers are shared virtual memory: the values in the block are usable as they are.
// Specialized by -D options: KILN_F16 (else bf16) for the element type, HEAD_DIM, and the MoE
// kernel's MOE_* choices. Every kernel takes (params, local scratch).

#define FIELD(type, s, f) (*(__global const type*)(P + KILN_P_##s##_##f))
#define I32(s, f) FIELD(int, s, f)
#define I64(s, f) FIELD(long, s, f)
#define F32(s, f) FIELD(float, s, f)
#define ADDR(s, f) FIELD(ulong, s, f)
#define PTR(type, s, f) ((__global type*)ADDR(s, f))

// ---- element types: bf16 by bit manipulation, f16 through vload_half / vstore_half
#ifdef KILN_F16
typedef half elem;
inline float load_elem(__global const elem* p, long i) { return vload_half(0, p + i); }
inline void store_elem(__global elem* p, long i, float v) { vstore_half_rte(v, 0, p + i); }
#else
typedef ushort elem;
inline float bf16_to_float(ushort b) { return as_float((uint)b << 16); }
inline ushort float_to_bf16(float f) {  // round to nearest even; NaN stays NaN
  uint u = as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (ushort)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (ushort)(u >> 16);
}
inline float load_elem(__global const elem* p, long i) { return bf16_to_float(p[i]); }
inline void store_elem(__global elem* p, long i, float v) { p[i] = float_to_bf16(v); }
#endif

// The KV cache's element: the queries' type, or e4m3 (KILN_CACHE_E4M3; dequantized with the
// call's k_scale and v_scale).
#ifdef KILN_CACHE_E4M3
typedef uchar cache_elem;
inline float load_cache(__global const cache_elem* p, long i) {
  const uint b = p[i], magnitude = b & 0x7Fu;
  if (magnitude == 0x7Fu) return NAN;
  const uint exponent = magnitude >> 3, mantissa = magnitude & 7u;
  const float value = exponent == 0 ? (float)mantissa * 0.001953125f : ldexp(1.0f + (float)mantissa * 0.125f, (int)exponent - 7);
  return (b & 0x80u) ? -value : value;
}
// value / scale in e4m3: nearest, ties to even, beyond 448 saturated, NaN kept (as kiln's CUDA
// kv_append and the host's encoder do).
inline uchar float_to_e4m3(float x) {
  const uchar sign = (as_uint(x) >> 24) & 0x80u;
  if (isnan(x)) return sign | 0x7Fu;
  const float a = fabs(x);
  if (a >= 448.0f) return sign | 0x7Eu;
  if (a < 0.015625f) return sign | (uchar)rint(a * 512.0f);  // subnormal steps of 2^-9; 8 steps is 2^-6, code 0x08
  const uint bits = as_uint(a), rest = bits & 0xFFFFFu;
  uint code = (((bits >> 23) - 120u) << 3) | ((bits >> 20) & 7u);  // exponent bias 127 to 7, 3 mantissa bits
  if (rest > 0x80000u || (rest == 0x80000u && (code & 1u))) ++code;   // a carry into the exponent is right too
  return sign | (uchar)min(code, 0x7Eu);
}
#else
typedef elem cache_elem;
inline float load_cache(__global const cache_elem* p, long i) { return load_elem(p, i); }
#endif

inline float softcap_score(float s, float softcap) { return softcap > 0.0f ? softcap * tanh(s / softcap) : s; }

// One query row's running softmax over keys visited one at a time (fp32).
typedef struct {
  float max_score;
  float denominator;
} SoftmaxRow;

inline float rescale_factor(const SoftmaxRow* r, float new_max) { return r->max_score == -INFINITY ? 0.0f : exp(r->max_score - new_max); }

// Adds a key's score; returns the factor the accumulator is scaled by, and writes p.
inline float softmax_add(SoftmaxRow* r, float score, float* p) {
  const float new_max = fmax(r->max_score, score);
  const float rescale = rescale_factor(r, new_max);
  *p = exp(score - new_max);
  r->denominator = r->denominator * rescale + *p;
  r->max_score = new_max;
  return rescale;
}

// A sink joins the denominator and adds no value.
inline float softmax_add_sink(SoftmaxRow* r, float sink) {
  const float new_max = fmax(r->max_score, sink);
  const float rescale = rescale_factor(r, new_max);
  r->denominator = r->denominator * rescale + (new_max == -INFINITY ? 0.0f : exp(sink - new_max));
  r->max_score = new_max;
  return rescale;
}

#ifdef HEAD_DIM
// One query row's keys [lo, hi), whose rows `k_row`/`v_row` finds: the unnormalized accumulator
// `acc` and its running max and sum in `row`.
#define ATTEND_KEYS(k_row, v_row)                                                              \
  float q_values[HEAD_DIM], acc[HEAD_DIM];                                                     \
  for (int d = 0; d < HEAD_DIM; ++d) {                                                         \
    q_values[d] = load_elem(q, d);                                                             \
    acc[d] = 0.0f;                                                                             \
  }                                                                                            \
  SoftmaxRow row = {-INFINITY, 0.0f};                                                          \
  for (int j = lo; j < hi; ++j) {                                                              \
    __global const cache_elem* kr = k_row(j);                                                  \
    __global const cache_elem* vr = v_row(j);                                                  \
    float dot = 0.0f;                                                                          \
    for (int d = 0; d < HEAD_DIM; ++d) dot += q_values[d] * (load_cache(kr, d) * k_scale);      \
    float p;                                                                                   \
    const float rescale = softmax_add(&row, softcap_score(dot * scale, softcap), &p);         \
    for (int d = 0; d < HEAD_DIM; ++d) acc[d] = acc[d] * rescale + p * (load_cache(vr, d) * v_scale); \
  }

// The sink (when `sinks` is set), then the normalized row into `out` and its lse in lse_value.
#define ATTEND_FINISH                                                                  \
  if (sinks != 0) {                                                                    \
    const float rescale = softmax_add_sink(&row, sinks[head]);                         \
    for (int d = 0; d < HEAD_DIM; ++d) acc[d] *= rescale;                              \
  }                                                                                    \
  const float inv = row.denominator > 0.0f ? 1.0f / row.denominator : 0.0f;            \
  for (int d = 0; d < HEAD_DIM; ++d) store_elem(out, d, acc[d] * inv);                 \
  const float lse_value = row.denominator > 0.0f ? row.max_score + log(row.denominator) : -INFINITY;

// One query row of one head against keys [lo, hi) whose rows `k_row`/`v_row` finds; writes the
// output row and lse. Shared by prefill, extend (paged) and decode.
#define ATTEND(k_row, v_row) \
  ATTEND_KEYS(k_row, v_row)  \
  ATTEND_FINISH

// Sequence b of a prefill or extend call: its query rows [q_begin, q_begin + len_q) and len_k keys,
// contiguous from row k_begin of K and V, or in the pages of a paged cache.
#define PREFILL_SEQUENCE                                                                          \
  __global const int* page_table = PTR(const int, Prefill, page_table);                           \
  const bool paged = page_table != 0;                                                             \
  const int fixed_q_len = I32(Prefill, q_len);                                                    \
  __global const int* cu_q = PTR(const int, Prefill, cu_seqlens_q);                               \
  __global const int* cu_k = PTR(const int, Prefill, cu_seqlens_k);                               \
  const int q_begin = fixed_q_len > 0 ? b * fixed_q_len : cu_q[b];                                \
  const int len_q = fixed_q_len > 0 ? fixed_q_len : cu_q[b + 1] - q_begin;                        \
  const int k_begin = paged ? 0 : cu_k[b];                                                        \
  const int len_k = paged ? PTR(const int, Prefill, cache_seqlens)[b] : cu_k[b + 1] - k_begin;

// Where key j of the sequence lies in K and V for head kv_head: PREFILL_K(j), PREFILL_V(j).
#define PREFILL_KEY_ROWS                                                                                          \
  __global const cache_elem* k_base = PTR(const cache_elem, Prefill, k) + kv_head * I64(Prefill, k_head_stride); \
  __global const cache_elem* v_base = PTR(const cache_elem, Prefill, v) + kv_head * I64(Prefill, v_head_stride); \
  const long k_rs = I64(Prefill, k_row_stride), v_rs = I64(Prefill, v_row_stride);                              \
  const long k_ps = I64(Prefill, k_page_stride), v_ps = I64(Prefill, v_page_stride);                             \
  const int shift = I32(Prefill, page_shift), page_mask = I32(Prefill, page_size) - 1;                          \
  __global const int* pages = paged ? page_table + b * I64(Prefill, page_table_stride) : 0;
#define PREFILL_ROW(base, rs, ps, j) \
  (paged ? base + (long)pages[(j) >> shift] * ps + ((j)&page_mask) * rs : base + (long)(k_begin + (j)) * rs)
#define PREFILL_K(j) PREFILL_ROW(k_base, k_rs, k_ps, j)
#define PREFILL_V(j) PREFILL_ROW(v_base, v_rs, v_ps, j)

// Prefill over contiguous K/V (cu_seqlens), and extend over a paged cache (page_table set).
// Global size (rows, Hq, batch): one work-item per (query row, head, sequence).
__kernel void kiln_prefill(__global const uchar* P, __local uchar* scratch) {
  const int row_in_seq = get_global_id(0), head = get_global_id(1), b = get_global_id(2);
  PREFILL_SEQUENCE
  if (row_in_seq >= len_q || head >= I32(Prefill, num_heads_q)) return;
  const int kv_head = head / (I32(Prefill, num_heads_q) / I32(Prefill, num_heads_kv));
  const float k_scale = paged ? F32(Prefill, k_scale) : 1.0f, v_scale = paged ? F32(Prefill, v_scale) : 1.0f;
  const float scale = F32(Prefill, softmax_scale), softcap = F32(Prefill, softcap);
  __global const float* sinks = PTR(const float, Prefill, sinks);

  // Visible keys [lo, hi): bottom-right aligned position of this query among the keys.
  const int position = row_in_seq + len_k - len_q;
  int lo = 0, hi = len_k;
  if (I32(Prefill, causal)) hi = min(len_k, position + 1);
  if (I32(Prefill, window_left) >= 0) lo = max(0, position - I32(Prefill, window_left));

  const long q_at = (long)(q_begin + row_in_seq);
  __global const elem* q = PTR(const elem, Prefill, q) + q_at * I64(Prefill, q_row_stride) + head * I64(Prefill, q_head_stride);
  __global elem* out = PTR(elem, Prefill, out) + q_at * I64(Prefill, out_row_stride) + head * I64(Prefill, out_head_stride);
  PREFILL_KEY_ROWS
  ATTEND(PREFILL_K, PREFILL_V)
  __global float* lse = PTR(float, Prefill, lse);
  if (lse != 0) lse[q_at * I64(Prefill, lse_row_stride) + head] = lse_value;
}

#ifdef TILE_KEYS
// Prefill and extend, tiled: a work-group of TILE_KEYS work-items takes TILE_KEYS consecutive query
// rows of one head and sequence, and walks the keys any of them sees in tiles of TILE_KEYS rows of
// K and V, which it loads once into local memory (as floats) for all its rows. Local scratch:
// 2 x TILE_KEYS x HEAD_DIM floats.
__kernel void kiln_prefill_tiled(__global const uchar* P, __local uchar* scratch) {
  const int lid = get_local_id(0), row_in_seq = get_global_id(0), head = get_global_id(1), b = get_global_id(2);
  const int first_row = get_group_id(0) * TILE_KEYS;
  __local float* k_tile = (__local float*)scratch;
  __local float* v_tile = k_tile + TILE_KEYS * HEAD_DIM;
  PREFILL_SEQUENCE
  if (first_row >= len_q) return;  // the whole work-group: no barrier is left waiting
  const int kv_head = head / (I32(Prefill, num_heads_q) / I32(Prefill, num_heads_kv));
  const float k_scale = paged ? F32(Prefill, k_scale) : 1.0f, v_scale = paged ? F32(Prefill, v_scale) : 1.0f;
  const float scale = F32(Prefill, softmax_scale), softcap = F32(Prefill, softcap);
  const int causal = I32(Prefill, causal), window = I32(Prefill, window_left);
  __global const float* sinks = PTR(const float, Prefill, sinks);

  // This row's visible keys, and the group's: from the first row's lo to the last row's hi.
  const bool active = row_in_seq < len_q;
  const int last_row = min(first_row + TILE_KEYS, len_q) - 1;
  const int position = row_in_seq + len_k - len_q;
  const int lo = window >= 0 ? max(0, position - window) : 0;
  const int hi = causal ? min(len_k, position + 1) : len_k;
  const int group_lo = window >= 0 ? max(0, first_row + len_k - len_q - window) : 0;
  const int group_hi = causal ? min(len_k, last_row + len_k - len_q + 1) : len_k;

  const long q_at = (long)(q_begin + min(row_in_seq, len_q - 1));
  __global const elem* q = PTR(const elem, Prefill, q) + q_at * I64(Prefill, q_row_stride) + head * I64(Prefill, q_head_stride);
  PREFILL_KEY_ROWS

  float q_values[HEAD_DIM], acc[HEAD_DIM];
  for (int d = 0; d < HEAD_DIM; ++d) {
    q_values[d] = load_elem(q, d);
    acc[d] = 0.0f;
  }
  SoftmaxRow row = {-INFINITY, 0.0f};
  for (int tile = group_lo; tile < group_hi; tile += TILE_KEYS) {
    const int j = tile + lid;  // the key row this work-item loads
    if (j < group_hi) {
      __global const cache_elem* kr = PREFILL_ROW(k_base, k_rs, k_ps, j);
      __global const cache_elem* vr = PREFILL_ROW(v_base, v_rs, v_ps, j);
      for (int d = 0; d < HEAD_DIM; ++d) {
        k_tile[lid * HEAD_DIM + d] = load_cache(kr, d) * k_scale;
        v_tile[lid * HEAD_DIM + d] = load_cache(vr, d) * v_scale;
      }
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    const int from = max(lo, tile), to = min(hi, min(tile + TILE_KEYS, group_hi));
    for (int jj = active ? from : to; jj < to; ++jj) {
      __local const float* kt = k_tile + (jj - tile) * HEAD_DIM;
      __local const float* vt = v_tile + (jj - tile) * HEAD_DIM;
      float dot = 0.0f;
      for (int d = 0; d < HEAD_DIM; ++d) dot += q_values[d] * kt[d];
      float p;
      const float rescale = softmax_add(&row, softcap_score(dot * scale, softcap), &p);
      for (int d = 0; d < HEAD_DIM; ++d) acc[d] = acc[d] * rescale + p * vt[d];
    }
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  if (!active) return;
  __global elem* out = PTR(elem, Prefill, out) + q_at * I64(Prefill, out_row_stride) + head * I64(Prefill, out_head_stride);
  ATTEND_FINISH
  __global float* lse = PTR(float, Prefill, lse);
  if (lse != 0) lse[q_at * I64(Prefill, lse_row_stride) + head] = lse_value;
}
#endif  // TILE_KEYS

// Where key j of sequence b lies in the paged caches for head kv_head: DECODE_K(j), DECODE_V(j).
#define DECODE_KEY_ROWS                                                                                                  \
  __global const int* pages = PTR(const int, Decode, page_table) + b * I64(Decode, page_table_stride);                \
  const int page_size = I32(Decode, page_size);                                                                       \
  __global const cache_elem* k_base = PTR(const cache_elem, Decode, k_cache) + kv_head * I64(Decode, k_head_stride); \
  __global const cache_elem* v_base = PTR(const cache_elem, Decode, v_cache) + kv_head * I64(Decode, v_head_stride); \
  const long k_ps = I64(Decode, k_page_stride), k_rs = I64(Decode, k_row_stride);                                    \
  const long v_ps = I64(Decode, v_page_stride), v_rs = I64(Decode, v_row_stride);
#define DECODE_K(j) (k_base + (long)pages[(j) / page_size] * k_ps + ((j) % page_size) * k_rs)
#define DECODE_V(j) (v_base + (long)pages[(j) / page_size] * v_ps + ((j) % page_size) * v_rs)

// Decode over a paged cache: global size (Hq, batch * q_len), one work-item per (head, new token).
__kernel void kiln_decode(__global const uchar* P, __local uchar* scratch) {
  const int head = get_global_id(0), q_row = get_global_id(1);
  const int q_len = I32(Decode, q_len);
  const int b = q_row / q_len, token = q_row % q_len;
  if (head >= I32(Decode, num_heads_q) || b >= I32(Decode, batch)) return;
  const int kv_head = head / (I32(Decode, num_heads_q) / I32(Decode, num_heads_kv));
  const int len = PTR(const int, Decode, cache_seqlens)[b];
  const int position = len - q_len + token;  // it sees keys [lo, position]
  const int hi = len > 0 ? position + 1 : 0;
  const int lo = I32(Decode, window_left) >= 0 ? max(0, position - I32(Decode, window_left)) : 0;
  const float k_scale = F32(Decode, k_scale), v_scale = F32(Decode, v_scale);
  const float scale = F32(Decode, softmax_scale), softcap = F32(Decode, softcap);
  __global const float* sinks = PTR(const float, Decode, sinks);
  __global const elem* q = PTR(const elem, Decode, q) + q_row * I64(Decode, q_row_stride) + head * I64(Decode, q_head_stride);
  __global elem* out = PTR(elem, Decode, out) + q_row * I64(Decode, out_row_stride) + head * I64(Decode, out_head_stride);
  DECODE_KEY_ROWS
  ATTEND(DECODE_K, DECODE_V)
  __global float* lse = PTR(float, Decode, lse);
  if (lse != 0) lse[q_row * I64(Decode, lse_row_stride) + head] = lse_value;
}

// Decode split over the keys: a work-group of SPLITS work-items per (head, new token), each
// taking a contiguous share of the visible keys. Partial states (max, sum, accumulator) go to the
// workspace kiln allocates for the call; after a barrier the first work-item merges them, adds the
// sink and writes the row. Workspace: per (row, head), SPLITS x (HEAD_DIM + 2) floats.
#ifdef SPLITS
__kernel void kiln_decode_split(__global const uchar* P, __local uchar* scratch) {
  const int head = get_group_id(0), q_row = get_group_id(1), split = get_local_id(0);
  const int q_len = I32(Decode, q_len), heads = I32(Decode, num_heads_q);
  const int b = q_row / q_len, token = q_row % q_len;
  const int kv_head = head / (heads / I32(Decode, num_heads_kv));
  const int len = PTR(const int, Decode, cache_seqlens)[b];
  const int position = len - q_len + token;
  const int end = len > 0 ? position + 1 : 0;
  const int begin = I32(Decode, window_left) >= 0 ? max(0, position - I32(Decode, window_left)) : 0;
  const int share = (max(end - begin, 0) + SPLITS - 1) / SPLITS;
  const int lo = begin + split * share, hi = min(end, lo + share);
  const float k_scale = F32(Decode, k_scale), v_scale = F32(Decode, v_scale);
  const float scale = F32(Decode, softmax_scale), softcap = F32(Decode, softcap);
  __global const elem* q = PTR(const elem, Decode, q) + q_row * I64(Decode, q_row_stride) + head * I64(Decode, q_head_stride);
  DECODE_KEY_ROWS
  __global float* state = PTR(float, Decode, workspace) + ((long)q_row * heads + head) * SPLITS * (HEAD_DIM + 2);
  __global float* mine = state + split * (HEAD_DIM + 2);
  ATTEND_KEYS(DECODE_K, DECODE_V)
  for (int d = 0; d < HEAD_DIM; ++d) mine[d] = acc[d];  // unnormalized, with its max and sum beside
  mine[HEAD_DIM] = row.max_score;
  mine[HEAD_DIM + 1] = row.denominator;
  barrier(CLK_GLOBAL_MEM_FENCE);
  if (split != 0) return;
  float m = -INFINITY;
  for (int s = 0; s < SPLITS; ++s) m = fmax(m, state[s * (HEAD_DIM + 2) + HEAD_DIM]);
  __global const float* sink = PTR(const float, Decode, sinks);
  if (sink != 0) m = fmax(m, sink[head]);
  float total = 0.0f;
  float merged[HEAD_DIM];
  for (int d = 0; d < HEAD_DIM; ++d) merged[d] = 0.0f;
  for (int s = 0; s < SPLITS; ++s) {
    __global const float* part = state + s * (HEAD_DIM + 2);
    const float factor = part[HEAD_DIM] == -INFINITY ? 0.0f : exp(part[HEAD_DIM] - m);
    total += part[HEAD_DIM + 1] * factor;
    for (int d = 0; d < HEAD_DIM; ++d) merged[d] += part[d] * factor;
  }
  if (sink != 0 && m != -INFINITY) total += exp(sink[head] - m);
  __global elem* result = PTR(elem, Decode, out) + q_row * I64(Decode, out_row_stride) + head * I64(Decode, out_head_stride);
  const float inv = total > 0.0f ? 1.0f / total : 0.0f;
  for (int d = 0; d < HEAD_DIM; ++d) store_elem(result, d, merged[d] * inv);
  __global float* lse = PTR(float, Decode, lse);
  if (lse != 0) lse[q_row * I64(Decode, lse_row_stride) + head] = total > 0.0f ? m + log(total) : -INFINITY;
}
#endif  // SPLITS
#endif  // HEAD_DIM

// KV-cache append: global size (tokens, Hkv). A 16-bit cache of the tokens' type takes their bits;
// an e4m3 cache (KILN_CACHE_E4M3) value / k_scale and value / v_scale.
__kernel void kiln_kv_append(__global const uchar* P, __local uchar* scratch) {
  const int t = get_global_id(0), h = get_global_id(1);
  if (t >= I32(KvAppend, tokens) || h >= I32(KvAppend, num_heads_kv)) return;
  const long slot = PTR(const long, KvAppend, slot_mapping)[t * I64(KvAppend, slot_stride)];
  if (slot < 0) return;
  const int shift = I32(KvAppend, page_shift);
  const long page = slot >> shift, row = slot & ((1L << shift) - 1);
#ifdef KILN_CACHE_E4M3
  typedef elem in_elem;
  typedef uchar out_elem;
#else
  typedef ushort in_elem;
  typedef ushort out_elem;
#endif
  __global const in_elem* k = PTR(const in_elem, KvAppend, k) + t * I64(KvAppend, k_row_stride) + h * I64(KvAppend, k_head_stride);
  __global const in_elem* v = PTR(const in_elem, KvAppend, v) + t * I64(KvAppend, v_row_stride) + h * I64(KvAppend, v_head_stride);
  __global out_elem* kc = PTR(out_elem, KvAppend, k_cache) + page * I64(KvAppend, k_cache_page_stride) +
                          row * I64(KvAppend, k_cache_row_stride) + h * I64(KvAppend, k_cache_head_stride);
  __global out_elem* vc = PTR(out_elem, KvAppend, v_cache) + page * I64(KvAppend, v_cache_page_stride) +
                          row * I64(KvAppend, v_cache_row_stride) + h * I64(KvAppend, v_cache_head_stride);
  for (int d = 0; d < I32(KvAppend, head_dim); ++d) {
#ifdef KILN_CACHE_E4M3
    kc[d] = float_to_e4m3(load_elem(k, d) / F32(KvAppend, k_scale));
    vc[d] = float_to_e4m3(load_elem(v, d) / F32(KvAppend, v_scale));
#else
    kc[d] = k[d];
    vc[d] = v[d];
#endif
  }
}

#ifdef MOE_FORMAT
#include "moe/mxfp4_prepared.h"  // from kiln's tree, handed over with the program
#include "moe/mxfp8_activations.h"

// ---- MoE: one work-group per token. MOE_FORMAT 0 bf16, 1 MXFP4, 2 MXFP4 prepared;
// MOE_ACTIVATION 0 silu_glu, 1 swiglu_clamped; MOE_INTERLEAVED; MOE_ROUTING 0 topk_softmax,
// 1 softmax_topk, 2 precomputed; MOE_LOGITS_BF16; MOE_BIAS13 / MOE_BIAS2 0 none, 1 f32, 2 bf16;
// MOE_ACT_MXFP8: W4A8, x and the bf16-rounded act quantized to MXFP8 (moe/mxfp8_activations.h).
#define MAX_TOP_K 32

// W4A8: each block of 32 of the n values quantized in place, a work-item per block; `bf16_first`
// rounds them to bf16 before (act, which kiln's other kernels store as bf16).
inline void quantize_mxfp8(__local float* values, int n, bool bf16_first) {
  for (int b = get_local_id(0); b < n / 32; b += get_local_size(0)) {
    __local float* block = values + 32 * b;
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i) {
      if (bf16_first) block[i] = bf16_to_float(float_to_bf16(block[i]));
      amax = fmax(amax, fabs(block[i]));
    }
    const int s = kiln_mxfp8_exponent(amax);
    for (int i = 0; i < 32; ++i) block[i] = kiln_mxfp8_value(block[i], s);
  }
}

inline float e2m1_to_float(uint nibble) {
  const float magnitude[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float m = magnitude[nibble & 7u];
  return (nibble & 8u) ? -m : m;
}
inline float e8m0_to_float(uchar s) { return s == 255 ? NAN : ldexp(1.0f, (int)s - 127); }

// Element k of a weight row starting `row_offset` elements (bytes for MXFP4) into `base`.
inline float moe_weight(__global const uchar* base, __global const uchar* scales, long row_offset, long scale_row_offset, int k) {
#if MOE_FORMAT == 0
  return bf16_to_float(((__global const ushort*)base)[row_offset + k]);
#else
  __global const uchar* byte = base + row_offset + k / 2;
#if MOE_FORMAT == 2  // rows start on 16-byte boundaries (moe_apply checks)
  const uint nibble = kiln_mxfp4_prepared_value(*(__global const uint*)(byte - (k / 2) % 4), k % 8);
#else
  const uint nibble = (k & 1) ? (*byte >> 4) : (*byte & 0xFu);
#endif
  return e2m1_to_float(nibble) * e8m0_to_float(scales[scale_row_offset + k / 32]);
#endif
}

inline float moe_bias(__global const uchar* bias, long offset, int kind) {
  if (kind == 1) return ((__global const float*)bias)[offset];
  if (kind == 2) return bf16_to_float(((__global const ushort*)bias)[offset]);
  return 0.0f;
}

inline float glu(float gate, float up) {
#if MOE_ACTIVATION == 1  // GPT-OSS: gate clamped above at 7, up to [-7, 7]
  gate = fmin(gate, 7.0f);
  up = fmin(fmax(up, -7.0f), 7.0f);
  return gate / (1.0f + exp(-1.702f * gate)) * (up + 1.0f);
#else
  return gate / (1.0f + exp(-gate)) * up;
#endif
}

inline float router_logit(__global const uchar* P, int token, int e) {
  const long at = token * I64(Moe, logits_row_stride) + e;
#if MOE_LOGITS_BF16
  return bf16_to_float(PTR(const ushort, Moe, router_logits)[at]);
#else
  return PTR(const float, Moe, router_logits)[at];
#endif
}

// Picks top_k experts (ties to the lower index, NaN below every number) and their weights.
inline void route_token(__global const uchar* P, int token, __local int* ids, __local float* weights) {
  const int top_k = I32(Moe, top_k), experts = I32(Moe, num_experts);
#if MOE_ROUTING == 2
  for (int j = 0; j < top_k; ++j) {
    const int id = PTR(const int, Moe, topk_ids)[token * I64(Moe, topk_row_stride) + j];
    ids[j] = id >= 0 && id < experts ? id : -1;  // outside [0, E): contributes nothing
    weights[j] = PTR(const float, Moe, topk_weights)[token * I64(Moe, topk_row_stride) + j];
  }
#else
  float max_logit = -INFINITY, total = 0.0f;
  for (int e = 0; e < experts; ++e) max_logit = fmax(max_logit, router_logit(P, token, e));
#if MOE_ROUTING == 1
  for (int e = 0; e < experts; ++e) total += exp(router_logit(P, token, e) - max_logit);
#endif
  for (int j = 0; j < top_k; ++j) {
    int best = -1;
    float best_logit = -INFINITY;
    for (int e = 0; e < experts; ++e) {
      bool taken = false;
      for (int i = 0; i < j; ++i) taken |= (ids[i] == e);
      const float l = router_logit(P, token, e);
      const bool above = l > best_logit || (best_logit != best_logit && l == l);
      if (!taken && (best < 0 || above)) {
        best = e;
        best_logit = l;
      }
    }
    ids[j] = best;
    weights[j] = exp(best_logit - max_logit);
  }
  float chosen = 0.0f;
  for (int j = 0; j < top_k; ++j) chosen += weights[j];
  const float norm = (MOE_ROUTING == 0 || I32(Moe, renormalize)) ? chosen : total;
  for (int j = 0; j < top_k; ++j) weights[j] /= norm;
#endif
}

// Local scratch: x [H], act [I], out [H] floats, then ids and weights [MAX_TOP_K].
__kernel void kiln_moe_apply(__global const uchar* P, __local uchar* scratch) {
  const int token = get_group_id(0), lid = get_local_id(0), threads = get_local_size(0);
  const int H = I32(Moe, hidden), I = I32(Moe, intermediate);
  __local float* x = (__local float*)scratch;
  __local float* act = x + H;
  __local float* out_acc = act + I;
  __local int* ids = (__local int*)(out_acc + H);
  __local float* weights = (__local float*)(ids + MAX_TOP_K);
  __global const ushort* x_row = PTR(const ushort, Moe, x) + token * I64(Moe, x_row_stride);
  for (int h = lid; h < H; h += threads) {
    x[h] = bf16_to_float(x_row[h]);
    out_acc[h] = 0.0f;
  }
  if (lid == 0) route_token(P, token, ids, weights);
  barrier(CLK_LOCAL_MEM_FENCE);
#if MOE_ACT_MXFP8
  quantize_mxfp8(x, H, false);
  barrier(CLK_LOCAL_MEM_FENCE);
#endif

  __global const uchar* w13 = PTR(const uchar, Moe, w13);
  __global const uchar* w2 = PTR(const uchar, Moe, w2);
  __global const uchar* w13_scale = PTR(const uchar, Moe, w13_scale);
  __global const uchar* w2_scale = PTR(const uchar, Moe, w2_scale);
  __global const uchar* w13_bias = PTR(const uchar, Moe, w13_bias);
  __global const uchar* w2_bias = PTR(const uchar, Moe, w2_bias);
  for (int j = 0; j < I32(Moe, top_k); ++j) {
    const int e = ids[j];
    if (e < 0) continue;  // an id outside [0, E) (route_token): nothing to add
    const float w = weights[j];
    const long base = e * I64(Moe, w13_expert_stride), scale_base = e * I64(Moe, w13_scale_expert_stride);
    for (int r = lid; r < I; r += threads) {
      const int gate_row = MOE_INTERLEAVED ? 2 * r : r, up_row = MOE_INTERLEAVED ? 2 * r + 1 : I + r;
      float gate = 0.0f, up = 0.0f;
      for (int k = 0; k < H; ++k) {
        gate += x[k] * moe_weight(w13, w13_scale, base + gate_row * I64(Moe, w13_row_stride), scale_base + gate_row * I64(Moe, w13_scale_row_stride), k);
        up += x[k] * moe_weight(w13, w13_scale, base + up_row * I64(Moe, w13_row_stride), scale_base + up_row * I64(Moe, w13_scale_row_stride), k);
      }
      gate += moe_bias(w13_bias, e * I64(Moe, w13_bias_expert_stride) + gate_row, MOE_BIAS13);
      up += moe_bias(w13_bias, e * I64(Moe, w13_bias_expert_stride) + up_row, MOE_BIAS13);
      act[r] = glu(gate, up);
    }
    barrier(CLK_LOCAL_MEM_FENCE);
#if MOE_ACT_MXFP8
    quantize_mxfp8(act, I, true);
    barrier(CLK_LOCAL_MEM_FENCE);
#endif
    for (int h = lid; h < H; h += threads) {
      float sum = 0.0f;
      for (int k = 0; k < I; ++k) {
        sum += act[k] * moe_weight(w2, w2_scale, e * I64(Moe, w2_expert_stride) + h * I64(Moe, w2_row_stride),
                                   e * I64(Moe, w2_scale_expert_stride) + h * I64(Moe, w2_scale_row_stride), k);
      }
      sum += moe_bias(w2_bias, e * I64(Moe, w2_bias_expert_stride) + h, MOE_BIAS2);
      out_acc[h] += w * sum;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  __global ushort* out_row = PTR(ushort, Moe, out) + token * I64(Moe, out_row_stride);
  for (int h = lid; h < H; h += threads) out_row[h] = float_to_bf16(out_acc[h]);
}
#endif  // MOE_FORMAT
