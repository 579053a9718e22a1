// Layout of the split decode kernel's workspace (attention/decode_merge.cuh), shared verbatim by
// the kernel and its registration (src/kernels/attention_decode_mma_split.cpp), which sizes the
// allocation: plain C only. Only a split launch (grid (G, Hkv), G > batch) has a workspace.
//   tickets  [batch * Hkv] int, zeroed by kiln before the launch: pieces done per (sequence,
//            KV head) pair
//   states   from kiln_decode_states_offset(batch * Hkv), 256-byte aligned, G x Hkv slots (range
//            g against KV head h in slot g Hkv + h): float m[rows] (natural log), l[rows],
//            acc[rows][head_dim], where rows = q_len x group
// AMD's decode_mfma.cuh uses the same regions with grid (S, Hkv, batch): S x batch ranges, the
// pair (b, h)'s S states in slots (b Hkv + h) S + s.
#pragma once

#include "common/host_device.h"

// A split launch deals its ranges to at most this many sequences (8 per lane of one warp).
enum { kiln_decode_split_max_batch = 256 };

KILN_HOST_DEVICE constexpr long long kiln_decode_ticket_bytes(long long pairs) { return 4 * pairs; }
KILN_HOST_DEVICE constexpr long long kiln_decode_states_offset(long long pairs) { return (kiln_decode_ticket_bytes(pairs) + 255) & ~255LL; }
KILN_HOST_DEVICE constexpr long long kiln_decode_state_floats(long long rows, long long head_dim) { return rows * (head_dim + 2); }
KILN_HOST_DEVICE constexpr long long kiln_decode_workspace_bytes(long long batch, long long heads_kv, long long ranges, long long rows,
                                                                 long long head_dim) {
  return kiln_decode_states_offset(batch * heads_kv) + 4 * ranges * heads_kv * kiln_decode_state_floats(rows, head_dim);
}
