#!/usr/bin/env python3
"""kiln against the kernels a user would otherwise pick, side by side in one GPU run.

kiln is called through its C ABI (ctypes) on tensors PyTorch allocated, so both sides read the
same inputs; outputs are compared. Timing: CUDA events per call, warm-up first, median of many
calls, inputs rotated across sets larger than twice the L2 cache. Work counts only unmasked
attention pairs. Prints one table of ratios last and writes JSON and one PNG per operator.

  python3 bench/side_by_side.py --lib build/lib/libkiln.so --out DIR [--quick]
"""
import argparse
import ctypes
import json
import math
import os
import re
import statistics
import sys
import time

import torch
import torch.nn.functional as F

# ---- kiln's C ABI (include/kiln/kiln.h) ----------------------------------------------------------
DTYPES = {torch.bfloat16: 1, torch.float16: 2, torch.float32: 3, torch.float8_e4m3fn: 4, torch.int32: 8, torch.int64: 9}
FP4X2, E8M0 = 6, 7


class KilnTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int32), ("ndim", ctypes.c_int32),
                ("shape", ctypes.c_int64 * 6), ("strides", ctypes.c_int64 * 6), ("device", ctypes.c_int32)]


def kt(t, dtype_code=None):
    if t is None:
        return None
    k = KilnTensor()
    k.data = t.data_ptr()
    k.dtype = dtype_code if dtype_code is not None else DTYPES[t.dtype]
    k.ndim = t.dim()
    for i, (s, st) in enumerate(zip(t.shape, t.stride())):
        k.shape[i], k.strides[i] = s, st
    k.device = t.device.index if t.is_cuda else -1
    k.owner = t  # the descriptor holds only the address: keep the tensor alive as long as it
    return k


P = ctypes.POINTER(KilnTensor)


def ref(k):
    return ctypes.pointer(k) if k is not None else None


class PrefillArgs(ctypes.Structure):
    _fields_ = [("q", P), ("k", P), ("v", P), ("out", P), ("cu_seqlens_q", P), ("cu_seqlens_k", P),
                ("max_seqlen_q", ctypes.c_int32), ("max_seqlen_k", ctypes.c_int32), ("lse", P), ("sinks", P),
                ("softmax_scale", ctypes.c_float), ("softcap", ctypes.c_float), ("causal", ctypes.c_int32),
                ("window_left", ctypes.c_int32)]


class DecodeArgs(ctypes.Structure):
    _fields_ = [("q", P), ("k_cache", P), ("v_cache", P), ("page_table", P), ("cache_seqlens", P), ("out", P),
                ("q_len", ctypes.c_int32), ("lse", P), ("sinks", P), ("softmax_scale", ctypes.c_float),
                ("softcap", ctypes.c_float), ("window_left", ctypes.c_int32), ("k_scale", ctypes.c_float),
                ("v_scale", ctypes.c_float)]


class ExtendArgs(ctypes.Structure):
    _fields_ = [("q", P), ("k_cache", P), ("v_cache", P), ("page_table", P), ("cache_seqlens", P), ("cu_seqlens_q", P), ("out", P),
                ("max_seqlen_q", ctypes.c_int32), ("lse", P), ("sinks", P), ("softmax_scale", ctypes.c_float),
                ("softcap", ctypes.c_float), ("causal", ctypes.c_int32), ("window_left", ctypes.c_int32),
                ("k_scale", ctypes.c_float), ("v_scale", ctypes.c_float)]


class AppendArgs(ctypes.Structure):
    _fields_ = [("k", P), ("v", P), ("slot_mapping", P), ("k_cache", P), ("v_cache", P), ("k_scale", ctypes.c_float),
                ("v_scale", ctypes.c_float)]


class MoeArgs(ctypes.Structure):
    _fields_ = [("x", P), ("out", P), ("router_logits", P), ("topk_ids", P), ("topk_weights", P),
                ("top_k", ctypes.c_int32), ("routing", ctypes.c_int32), ("renormalize", ctypes.c_int32),
                ("w13", P), ("w13_scale", P), ("w13_bias", P), ("w2", P), ("w2_scale", P), ("w2_bias", P),
                ("activation", ctypes.c_int32), ("gate_up_layout", ctypes.c_int32), ("activation_dtype", ctypes.c_int32)]


class Kiln:
    def __init__(self, path):
        self.lib = ctypes.CDLL(path)
        self.lib.kiln_last_error.restype = ctypes.c_char_p
        for fn, args in (("kiln_mha_prefill", PrefillArgs), ("kiln_mha_decode_with_kvcache", DecodeArgs), ("kiln_moe_apply", MoeArgs),
                         ("kiln_mha_extend_with_kvcache", ExtendArgs), ("kiln_kv_cache_append", AppendArgs)):
            getattr(self.lib, fn).argtypes = [ctypes.POINTER(args), ctypes.c_void_p]
        self.lib.kiln_moe_prepare_weights.argtypes = [P, ctypes.c_void_p]
        self.keep = []  # ctypes objects referenced by pointers must outlive the call

    def set_override(self, op, kernel):
        if self.lib.kiln_set_override(op.encode(), kernel.encode()) != 0:
            raise RuntimeError(f"--override {op}={kernel}: {self.lib.kiln_last_error().decode()}")

    def call(self, fn, args):
        status = getattr(self.lib, fn)(ctypes.byref(args), ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
        if status != 0:
            raise RuntimeError(f"{fn}: status {status}: {self.lib.kiln_last_error().decode()}")


# ---- timing ------------------------------------------------------------------------------------
CUDA_GRAPHS = False  # --cuda-graphs

# Idle seconds before each shape after the first. On an H200 a shape timed right after a heavy one
# (prefill (b) at the 700 W cap) read up to 13% slow, and so did its peer when it came first: prefill
# (c) at 4096 took 0.0532 ms right after (b), 0.0493 right after that, 0.0478 after 3 s idle and
# 0.0475 before any (bench/RESULTS.md, 2026-11-22, H200).
SETTLE_S = 3.0


def settle(rows):
    if rows:
        torch.cuda.synchronize()
        time.sleep(SETTLE_S)


def timed(fn, sets, budget_ms=400.0, min_runs=5, max_runs=500):
    """Median, p10 and p90 milliseconds of fn(i) over rotated input sets, CUDA events per call.

    With --cuda-graphs each set's call is captured once and replayed, so a callee whose host side
    is slower than its kernels (a compiled Python call) is timed on the GPU work alone."""
    for i in range(3):
        fn(i % sets)
    torch.cuda.synchronize()
    if CUDA_GRAPHS:
        graphs = []
        for i in range(sets):
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                fn(i)
            graphs.append(graph)
        torch.cuda.synchronize()
        fn = lambda i: graphs[i].replay()  # noqa: E731
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    fn(0)
    e.record()
    e.synchronize()
    runs = int(max(min_runs, min(max_runs, budget_ms / max(s.elapsed_time(e), 1e-3))))
    marks = [torch.cuda.Event(enable_timing=True) for _ in range(runs + 1)]
    marks[0].record()
    for r in range(runs):
        fn(r % sets)
        marks[r + 1].record()
    marks[-1].synchronize()
    times = sorted(marks[r].elapsed_time(marks[r + 1]) for r in range(runs))
    return {"median_ms": statistics.median(times), "p10_ms": times[len(times) // 10], "p90_ms": times[(len(times) * 9) // 10], "runs": runs}


def sets_for(bytes_per_set, l2):
    return max(1, min(16, math.ceil(2 * l2 / max(bytes_per_set, 1))))


def rel_err(a, b):
    a, b = a.double(), b.double()
    if not torch.isfinite(a).all():
        return float("inf")
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


# ---- attention ---------------------------------------------------------------------------------
def sdpa(q, k, v, causal, backend):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel([backend]):
        try:
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
        except RuntimeError:
            g = q.shape[1] // k.shape[1]  # a backend without GQA: expand the KV heads
            return F.scaled_dot_product_attention(q, k.repeat_interleave(g, 1), v.repeat_interleave(g, 1), is_causal=causal)


def prefill_case(kiln, name, B, S, Hq, Hkv, D, causal, window, sinks, l2, quick):
    pairs = sum(min(S, i + 1) - max(0, i - window) if window >= 0 else (i + 1 if causal else S) for i in range(S))
    flops = 4.0 * D * Hq * B * pairs
    per_set = 2 * (2 * B * S * Hq * D + 2 * B * S * Hkv * D)
    n = sets_for(per_set, l2)
    g = torch.Generator(device="cuda").manual_seed(7)
    sets = []
    for _ in range(n):
        q = torch.randn(B * S, Hq, D, device="cuda", dtype=torch.bfloat16, generator=g)
        k = torch.randn(B * S, Hkv, D, device="cuda", dtype=torch.bfloat16, generator=g)
        v = torch.randn(B * S, Hkv, D, device="cuda", dtype=torch.bfloat16, generator=g)
        sets.append((q, k, v, torch.full_like(q, float("nan"))))
    cu = torch.arange(0, (B + 1) * S, S, device="cuda", dtype=torch.int32)
    sink_t = torch.randn(Hq, device="cuda", dtype=torch.float32, generator=g) if sinks else None
    args = []
    for q, k, v, out in sets:
        ts = [kt(q), kt(k), kt(v), kt(out), kt(cu), kt(cu), kt(sink_t)]
        a = PrefillArgs(ref(ts[0]), ref(ts[1]), ref(ts[2]), ref(ts[3]), ref(ts[4]), ref(ts[5]), S, S, None, ref(ts[6]),
                        0.0, 0.0, 1 if causal else 0, window)
        kiln.keep.append(ts)
        args.append(a)
    row = {"op": "mha_prefill", "shape": name, "flops": flops}
    row["kiln"] = timed(lambda i: kiln.call("kiln_mha_prefill", args[i]), n, budget_ms=300 if quick else 1500, min_runs=3)
    q, k, v, out = sets[0]
    kiln.call("kiln_mha_prefill", args[0])
    as_bhsd = lambda t: t.view(B, S, t.shape[1], D).transpose(1, 2)
    from torch.nn.attention import SDPBackend
    if window < 0:
        for label, backend in (("sdpa_flash", SDPBackend.FLASH_ATTENTION), ("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION)):
            try:
                peer = [(as_bhsd(a), as_bhsd(b), as_bhsd(c)) for a, b, c, _ in sets]
                row[label] = timed(lambda i: sdpa(*peer[i], causal, backend), n)
                ref_out = sdpa(*peer[0], causal, backend).transpose(1, 2).reshape_as(out)
                row[label]["rel_err_vs_kiln"] = None if sinks else rel_err(out, ref_out)
            except Exception as e:  # a backend this build or shape does not have
                row[label] = {"error": str(e).splitlines()[0][:160]}
    else:
        try:
            from torch.nn.attention.flex_attention import create_block_mask, flex_attention
            flex = torch.compile(flex_attention)
            mask = lambda b, h, qi, ki: (qi >= ki) & (qi - ki <= window)
            bm = create_block_mask(mask, B, None, S, S, device="cuda")
            peer = [(as_bhsd(a), as_bhsd(b), as_bhsd(c)) for a, b, c, _ in sets]
            row["flex_window"] = timed(lambda i: flex(*peer[i], block_mask=bm, enable_gqa=True), n)
            ref_out = flex(*peer[0], block_mask=bm, enable_gqa=True).transpose(1, 2).reshape_as(out)
            row["flex_window"]["rel_err_vs_kiln"] = None if sinks else rel_err(out, ref_out)
            row["flex_window"]["note"] = "FlexAttention has no attention sinks: timed without them"
        except Exception as e:
            row["flex_window"] = {"error": str(e).splitlines()[0][:160]}
    return row


def extend_case(kiln, name, B, prefix, new, Hq, Hkv, D, page, window, sinks, l2, quick, fp8=False):
    """Causal extend: `new` tokens per sequence after a `prefix` already in a paged cache, against
    kiln's own contiguous prefill and SDPA on the same math (queries aligned bottom-right), both with
    K and V contiguous. fp8: kiln reads an e4m3 cache (per-tensor scales); its contiguous prefill and
    SDPA, which have no fp8 KV path, the bf16 K and V a user would otherwise keep, holding the same
    values."""
    S = prefix + new
    pairs = sum(min(S, i + 1) - max(0, i - window) if window >= 0 else i + 1 for i in range(prefix, S))
    flops = 4.0 * D * Hq * B * pairs
    pages_per_seq = (S + page - 1) // page
    n = sets_for(2 * (2 * B * new * Hq * D + 2 * B * S * Hkv * D), l2)
    g = torch.Generator(device="cuda").manual_seed(17)
    sets = []
    scale = 0.25  # fp8: the cache holds the values / scale in e4m3
    for _ in range(n):
        q = torch.randn(B * new, Hq, D, device="cuda", dtype=torch.bfloat16, generator=g)
        k = torch.randn(B * S, Hkv, D, device="cuda", dtype=torch.bfloat16, generator=g)
        v = torch.randn(B * S, Hkv, D, device="cuda", dtype=torch.bfloat16, generator=g)
        pt = torch.randperm(B * pages_per_seq, device="cuda", generator=g).to(torch.int32).view(B, pages_per_seq)
        cache_dtype = torch.float8_e4m3fn if fp8 else torch.bfloat16
        kc = torch.zeros(B * pages_per_seq * page, Hkv, D, device="cuda", dtype=cache_dtype)
        vc = torch.zeros_like(kc)
        slots = (pt.long()[:, :, None] * page + torch.arange(page, device="cuda")).view(B, -1)[:, :S].reshape(-1)
        if fp8:
            k8, v8 = (k.float() / scale).to(cache_dtype), (v.float() / scale).to(cache_dtype)
            k, v = (k8.float() * scale).to(torch.bfloat16), (v8.float() * scale).to(torch.bfloat16)  # exact
            kc[slots], vc[slots] = k8, v8
        else:
            kc[slots], vc[slots] = k, v
        sets.append((q, k, v, pt, kc.view(-1, page, Hkv, D), vc.view(-1, page, Hkv, D), torch.full_like(q, float("nan")),
                     torch.full_like(q, float("nan"))))
    cu_q = torch.arange(0, (B + 1) * new, new, device="cuda", dtype=torch.int32)
    cu_k = torch.arange(0, (B + 1) * S, S, device="cuda", dtype=torch.int32)
    lens = torch.full((B,), S, device="cuda", dtype=torch.int32)
    sink_t = torch.randn(Hq, device="cuda", dtype=torch.float32, generator=g) if sinks else None
    ext, pre = [], []
    for q, k, v, pt, kc, vc, out, out_pre in sets:
        ts = [kt(q), kt(kc), kt(vc), kt(pt), kt(lens), kt(cu_q), kt(out), kt(sink_t), kt(k), kt(v), kt(cu_k), kt(out_pre)]
        ext.append(ExtendArgs(ref(ts[0]), ref(ts[1]), ref(ts[2]), ref(ts[3]), ref(ts[4]), ref(ts[5]), ref(ts[6]), new, None, ref(ts[7]),
                              0.0, 0.0, 1, window, scale if fp8 else 1.0, scale if fp8 else 1.0))
        pre.append(PrefillArgs(ref(ts[0]), ref(ts[8]), ref(ts[9]), ref(ts[11]), ref(ts[5]), ref(ts[10]), new, S, None, ref(ts[7]),
                               0.0, 0.0, 1, window))
        kiln.keep.append(ts)
    row = {"op": "mha_extend_with_kvcache", "shape": name, "flops": flops}
    row["kiln"] = timed(lambda i: kiln.call("kiln_mha_extend_with_kvcache", ext[i]), n, budget_ms=300 if quick else 1500, min_runs=3)
    row["kiln_prefill_contiguous"] = timed(lambda i: kiln.call("kiln_mha_prefill", pre[i]), n, budget_ms=300 if quick else 1500, min_runs=3)
    kiln.call("kiln_mha_extend_with_kvcache", ext[0])
    kiln.call("kiln_mha_prefill", pre[0])
    out, out_pre = sets[0][6], sets[0][7]
    row["kiln_prefill_contiguous"]["rel_err_vs_kiln"] = rel_err(out, out_pre)
    if window < 0 and not sinks:
        from torch.nn.attention import SDPBackend
        from torch.nn.attention.bias import causal_lower_right
        bhsd = lambda t, L, H: t.view(B, L, H, D).transpose(1, 2)
        peer = [(bhsd(q, new, Hq), bhsd(k, S, Hkv), bhsd(v, S, Hkv)) for q, k, v, *_ in sets]
        for label, backend in (("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION), ("sdpa_flash", SDPBackend.FLASH_ATTENTION)):
            try:
                def run(i, backend=backend):
                    from torch.nn.attention import sdpa_kernel
                    qq, kk, vv = peer[i]
                    with sdpa_kernel([backend]):
                        if prefix == 0:
                            return F.scaled_dot_product_attention(qq, kk, vv, is_causal=True, enable_gqa=True)
                        g_ = Hq // Hkv
                        return F.scaled_dot_product_attention(qq, kk.repeat_interleave(g_, 1), vv.repeat_interleave(g_, 1),
                                                              attn_mask=causal_lower_right(new, S))
                row[label] = timed(run, n)
                row[label]["rel_err_vs_kiln"] = rel_err(out, run(0).transpose(1, 2).reshape_as(out))
                if prefix > 0:
                    row[label]["note"] = "lower-right causal bias; KV heads expanded (the bias path has no GQA)"
            except Exception as e:
                row[label] = {"error": str(e).splitlines()[0][:160]}
    return row


def append_case(kiln, name, T, Hkv, D, page, l2, quick):
    """kv_cache_append of T tokens into shuffled slots, against the device copy rate (same bytes
    read and written) and the indexed assignment a PyTorch engine writes without a kernel."""
    bytes_ = 2 * 2 * (2 * T * Hkv * D)  # K and V, read and written
    pages = 4 * T // page + 1
    n = sets_for(bytes_, l2)
    g = torch.Generator(device="cuda").manual_seed(19)
    kc = torch.zeros(pages, page, Hkv, D, device="cuda", dtype=torch.bfloat16)
    vc = torch.zeros_like(kc)
    sets = []
    for _ in range(n):
        k = torch.randn(T, Hkv, D, device="cuda", dtype=torch.bfloat16, generator=g)
        v = torch.randn(T, Hkv, D, device="cuda", dtype=torch.bfloat16, generator=g)
        slots = torch.randperm(pages * page, device="cuda", generator=g)[:T].contiguous()
        sets.append((k, v, slots))
    args = []
    for k, v, slots in sets:
        ts = [kt(k), kt(v), kt(slots), kt(kc), kt(vc)]
        args.append(AppendArgs(ref(ts[0]), ref(ts[1]), ref(ts[2]), ref(ts[3]), ref(ts[4]), 1.0, 1.0))
        kiln.keep.append(ts)
    row = {"op": "kv_cache_append", "shape": name, "bytes": bytes_}
    row["kiln"] = timed(lambda i: kiln.call("kiln_kv_cache_append", args[i]), n, budget_ms=300 if quick else 1500, min_runs=3)
    kiln.call("kiln_kv_cache_append", args[0])
    k, v, slots = sets[0]
    flat_k = kc.view(-1, Hkv, D)
    row["kiln"]["exact"] = bool(torch.equal(flat_k[slots], k))
    def indexed(i):
        k_, v_, s_ = sets[i]
        kc.view(-1, Hkv, D).index_copy_(0, s_, k_)
        vc.view(-1, Hkv, D).index_copy_(0, s_, v_)
    row["torch_index_copy"] = timed(indexed, n)
    # The device's copy rate at this size: the same bytes read and written by one copy.
    src = [torch.cat([k_.flatten(), v_.flatten()]) for k_, v_, _ in sets]
    dst = torch.empty_like(src[0])
    row["device_copy_same_bytes"] = timed(lambda i: dst.copy_(src[i]), n)
    if CUDA_GRAPHS:  # a captured copy_ is a memcpy node; an elementwise kernel is the same bytes through SMs
        row["device_copy_same_bytes"]["note"] = "a memcpy node under --cuda-graphs"
        row["elementwise_copy_same_bytes"] = timed(lambda i: torch.mul(src[i], 1, out=dst), n)
    return row


def decode_case(kiln, name, B, ctx, Hq, Hkv, D, page, l2, quick, fp8=False, q_len=1):
    """fp8: kiln reads an e4m3 cache (per-tensor scales); SDPA has no fp8 KV path, so the peers run
    the same math on the bf16 cache a user would otherwise keep. q_len > 1: speculative tokens,
    causal among themselves (the peers, without a bottom-right mask, attend to every key: the
    same bytes, slightly more work)."""
    pages_per_seq = ctx // page
    kv_bytes = 2 * B * ctx * Hkv * D * (1 if fp8 else 2)
    bytes_ = kv_bytes + 2 * 2 * B * q_len * Hq * D
    n = sets_for(kv_bytes, l2)
    g = torch.Generator(device="cuda").manual_seed(11)
    sets = []
    for _ in range(n):
        kc = torch.randn(B * pages_per_seq, page, Hkv, D, device="cuda", dtype=torch.bfloat16, generator=g)
        vc = torch.randn(B * pages_per_seq, page, Hkv, D, device="cuda", dtype=torch.bfloat16, generator=g)
        pt = torch.randperm(B * pages_per_seq, device="cuda", generator=g).to(torch.int32).view(B, pages_per_seq)
        q = torch.randn(B * q_len, Hq, D, device="cuda", dtype=torch.bfloat16, generator=g)
        sets.append((q, kc, vc, pt, torch.full_like(q, float("nan"))))
    lens = torch.full((B,), ctx, device="cuda", dtype=torch.int32)
    scale = 0.25  # e4m3 holds the bf16 values / scale; the peers see the dequantized values
    if fp8:
        sets = [(q, (kc / scale).to(torch.float8_e4m3fn), (vc / scale).to(torch.float8_e4m3fn), pt, out) for q, kc, vc, pt, out in sets]
    args = []
    for q, kc, vc, pt, out in sets:
        ts = [kt(q), kt(kc), kt(vc), kt(pt), kt(lens), kt(out)]
        args.append(DecodeArgs(ref(ts[0]), ref(ts[1]), ref(ts[2]), ref(ts[3]), ref(ts[4]), ref(ts[5]), q_len, None, None, 0.0, 0.0, -1,
                               scale if fp8 else 1.0, scale if fp8 else 1.0))
        kiln.keep.append(ts)
    row = {"op": "mha_decode_with_kvcache", "shape": name, "bytes": bytes_}
    row["kiln"] = timed(lambda i: kiln.call("kiln_mha_decode_with_kvcache", args[i]), n, budget_ms=300 if quick else 1500, min_runs=3)
    q, kc, vc, pt, out = sets[0]
    kiln.call("kiln_mha_decode_with_kvcache", args[0])
    # Peers read a contiguous cache (B, Hkv, ctx, D): the same math without paging.
    def contiguous(kc_, pt_):
        return kc_[pt_.long()].reshape(B, ctx, Hkv, D).transpose(1, 2).contiguous()
    def bf16(c):
        return c.to(torch.bfloat16) * scale if fp8 else c
    peer = [(q_.view(B, q_len, Hq, D).transpose(1, 2), contiguous(bf16(kc_), pt_), contiguous(bf16(vc_), pt_)) for q_, kc_, vc_, pt_, _ in sets]
    from torch.nn.attention import SDPBackend
    for label, backend in (("sdpa_flash", SDPBackend.FLASH_ATTENTION), ("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION)):
        try:
            row[label] = timed(lambda i: sdpa(*peer[i], False, backend), n)
            if q_len == 1:
                row[label]["rel_err_vs_kiln"] = rel_err(out, sdpa(*peer[0], False, backend).view_as(out))
        except Exception as e:
            row[label] = {"error": str(e).splitlines()[0][:160]}
    return row


# ---- MoE ---------------------------------------------------------------------------------------
MOE_FORMATS = ("bf16", "mxfp4", "mxfp4_prepared", "w4a8")
E4M3 = 4  # kiln_dtype KILN_F8_E4M3: moe_apply's activation_dtype for W4A8


class MoeWeights:
    """GPT-OSS's experts (128 for 120B, 32 for 20B; H = I = 2880) once per run: bf16 for kiln's bf16 rows and the
    peers, random MXFP4 codes (scales 2^-9 .. 2^-4) standard and prepared, fp8 copies of the bf16
    weights for _scaled_grouped_mm, and bf16 biases."""

    def __init__(self, kiln, E=128, H=2880, I=2880):
        self.E, self.H, self.I = E, H, I
        g = torch.Generator(device="cuda").manual_seed(13)
        self.w13 = torch.randn(E, 2 * I, H, device="cuda", dtype=torch.bfloat16, generator=g) / math.sqrt(H)
        self.w2 = torch.randn(E, H, I, device="cuda", dtype=torch.bfloat16, generator=g) / math.sqrt(I)
        q13 = torch.randint(0, 256, (E, 2 * I, H // 2), device="cuda", dtype=torch.uint8, generator=g)
        s13 = torch.randint(118, 124, (E, 2 * I, H // 32), device="cuda", dtype=torch.uint8, generator=g)
        q2 = torch.randint(0, 256, (E, H, I // 2), device="cuda", dtype=torch.uint8, generator=g)
        s2 = torch.randint(118, 124, (E, H, I // 32), device="cuda", dtype=torch.uint8, generator=g)
        self.views = {"bf16": [kt(self.w13), kt(self.w2), None, None],
                      "mxfp4": [kt(q13, FP4X2), kt(q2, FP4X2), kt(s13, E8M0), kt(s2, E8M0)]}
        p13, p2 = q13.clone(), q2.clone()
        prepared = [kt(p13, FP4X2), kt(p2, FP4X2), kt(s13, E8M0), kt(s2, E8M0)]
        torch.cuda.synchronize()
        start = time.perf_counter()
        for w in prepared[:2]:  # timed: the one-off cost at load time
            kiln.call("kiln_moe_prepare_weights", w)  # in place; sets w.dtype
        self.prepare = {"seconds": time.perf_counter() - start, "bytes": q13.numel() + q2.numel()}
        self.views["mxfp4_prepared"] = self.views["w4a8"] = prepared
        self.keep = (q13, s13, q2, s2, p13, p2)
        self.b13 = torch.randn(E, 2 * I, device="cuda", dtype=torch.bfloat16, generator=g) * 0.1
        self.b2 = torch.randn(E, H, device="cuda", dtype=torch.bfloat16, generator=g) * 0.1
        self.bias_views = [kt(self.b13), kt(self.b2)]
        # _scaled_grouped_mm's operands: B [E, K, N] column-major in e4m3, one scale per column.
        self.fp8 = []
        for w in (self.w13, self.w2):
            scale = w.float().abs().amax(dim=2) / 448  # [E, N]
            self.fp8.append(((w.float() / scale[:, :, None]).to(torch.float8_e4m3fn).transpose(1, 2), scale))


def moe_case(kiln, weights, T, l2, topk=4, quick=False, weights_format="bf16", bias=False):
    """weights_format: bf16; mxfp4; mxfp4_prepared (the same bytes after kiln_moe_prepare_weights);
    w4a8 (prepared MXFP4, activations quantized to MXFP8 in the kernel). bias: bf16 biases on both
    projections, as GPT-OSS ships them (the peers stay the two GEMMs alone)."""
    E, H, I = weights.E, weights.H, weights.I
    mxfp4 = weights_format != "bf16"
    g = torch.Generator(device="cuda").manual_seed(17 + T)
    w = weights.views[weights_format]
    biases = [ref(v) for v in weights.bias_views] if bias else [None, None]
    # Input sets share the weights and differ in tokens and router logits, so each call routes to
    # other experts: enough sets that the experts they read together exceed L2 twice over (at
    # T = 1 the 4 experts of one set are about an H100's L2 in MXFP4).
    expert_bytes = 3 * H * I * (0.5 + 1 / 32 if mxfp4 else 2)
    n = sets_for(min(E, T * topk) * expert_bytes, l2)
    sets, routed = [], []
    for _ in range(n):
        x = torch.randn(T, H, device="cuda", dtype=torch.bfloat16, generator=g)
        logits = torch.randn(T, E, device="cuda", dtype=torch.float32, generator=g)
        out = torch.full_like(x, float("nan"))
        ts = [kt(x), kt(out), kt(logits)]
        kiln.keep.append(ts)
        a = MoeArgs(ref(ts[0]), ref(ts[1]), ref(ts[2]), None, None, topk, 0, 1, ref(w[0]), ref(w[2]) if mxfp4 else None, biases[0],
                    ref(w[1]), ref(w[3]) if mxfp4 else None, biases[1], 1, 1, E4M3 if weights_format == "w4a8" else 0)
        sets.append(a)
        # The peers: the same routed tokens through two grouped GEMMs (weights K-major).
        ids = torch.topk(logits, topk, dim=1).indices.flatten()
        order = torch.argsort(ids, stable=True)
        counts = torch.bincount(ids, minlength=E)
        routed.append((x.repeat_interleave(topk, 0)[order], torch.cumsum(counts, 0).to(torch.int32), counts.gt(0).sum().item()))
    model = {128: "gpt-oss-120b", 32: "gpt-oss-20b"}.get(E, f"experts-{E}")
    row = {"op": "moe_apply", "shape": f"{model} {weights_format}{' bias' if bias else ''} T={T}"}
    row["kiln"] = timed(lambda i: kiln.call("kiln_moe_apply", sets[i]), n, budget_ms=300 if quick else 1500, min_runs=3)
    w13t, w2t = weights.w13.transpose(1, 2), weights.w2.transpose(1, 2)
    try:
        def two_gemms(i):
            xs, offs, _ = routed[i]
            h = torch._grouped_mm(xs, w13t, offs=offs)
            return torch._grouped_mm(h[:, :I].contiguous(), w2t, offs=offs)
        row["grouped_mm_x2"] = timed(two_gemms, n)
        row["grouped_mm_x2"]["note"] = "the two GEMMs only: no routing, activation or combine"
    except Exception as e:
        row["grouped_mm_x2"] = {"error": str(e).splitlines()[0][:160]}
    if weights_format in ("bf16", "w4a8"):  # fp8 weights and activations, per-row and per-column scales
        try:
            (b13, sb13), (b2, sb2) = weights.fp8

            def quantized(a):
                scale = a.float().abs().amax(dim=1).clamp(min=1e-12) / 448
                return (a.float() / scale[:, None]).to(torch.float8_e4m3fn), scale

            def two_fp8_gemms(i):
                xs, offs, _ = routed[i]
                xq, sx = quantized(xs)
                h = torch._scaled_grouped_mm(xq, b13, sx, sb13, offs=offs, out_dtype=torch.bfloat16)
                hq, sh = quantized(h[:, :I])
                return torch._scaled_grouped_mm(hq, b2, sh, sb2, offs=offs, out_dtype=torch.bfloat16)
            row["scaled_grouped_mm_x2"] = timed(two_fp8_gemms, n)
            row["scaled_grouped_mm_x2"]["note"] = "fp8 e4m3 x fp8 e4m3, row and column scales, the activations quantized in torch"
        except Exception as e:
            row["scaled_grouped_mm_x2"] = {"error": str(e).splitlines()[0][:160]}
    active = sum(r[2] for r in routed) / n  # experts a call reads, averaged over the sets
    row["bytes"] = active * expert_bytes + 4 * T * H
    row["flops"] = 6.0 * T * topk * H * I
    row["input_sets"] = n
    if weights_format == "mxfp4_prepared":  # moe_prepare_weights on all E experts' w13 and w2, device memory
        row["prepare_weights"] = dict(weights.prepare, gb_per_s=weights.prepare["bytes"] / weights.prepare["seconds"] / 1e9)
    return row


# ---- ceilings ----------------------------------------------------------------------------------
def ceilings():
    """Device copy bandwidth and GEMM peaks, timed per call even with --cuda-graphs: a copy captured
    in a graph becomes a memcpy node, which read 2.7 TB/s on an H200 against 4.2 for the kernel."""
    global CUDA_GRAPHS
    graphs, CUDA_GRAPHS = CUDA_GRAPHS, False
    try:
        return _ceilings()
    finally:
        CUDA_GRAPHS = graphs


def _ceilings():
    c = {}
    a = torch.empty(1 << 30, device="cuda", dtype=torch.uint8).random_()
    b = torch.empty_like(a)
    t = timed(lambda i: b.copy_(a), 1)
    c["copy_tbps"] = 2 * a.numel() / (t["median_ms"] * 1e-3) / 1e12
    n = 8192
    x = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    t = timed(lambda i: x @ y, 1)
    c["bf16_gemm_tflops"] = 2 * n ** 3 / (t["median_ms"] * 1e-3) / 1e12
    try:
        x8, y8 = x.to(torch.float8_e4m3fn), y.t().contiguous().to(torch.float8_e4m3fn).t()
        one = torch.tensor(1.0, device="cuda")
        t = timed(lambda i: torch._scaled_mm(x8, y8, one, one, out_dtype=torch.bfloat16), 1)
        c["fp8_gemm_tflops"] = 2 * n ** 3 / (t["median_ms"] * 1e-3) / 1e12
    except Exception as e:
        c["fp8_gemm_error"] = str(e).splitlines()[0][:160]
    return c


def plot(rows, op, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    mine = [r for r in rows if r["op"] == op]
    if not mine:
        return
    peers = sorted({k for r in mine for k, v in r.items() if isinstance(v, dict) and "median_ms" in v})
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(mine)), 4))
    width = 0.8 / len(peers)
    for j, p in enumerate(peers):
        ax.bar([i + j * width for i in range(len(mine))], [r[p]["median_ms"] if "median_ms" in r.get(p, {}) else 0 for r in mine], width, label=p)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(mine))])
    ax.set_xticklabels([r["shape"] for r in mine], rotation=20, ha="right", fontsize=7)
    ax.set_yscale("log")
    ax.set_ylabel("median ms (log)")
    ax.set_title(f"{op}: kiln and the kernels users would otherwise pick")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def plot_moe_ratios(rows, path):
    """moe_apply per weight format (and biases) against the token count: the bf16 grouped GEMMs'
    time over kiln's (above 1, kiln is faster), one line per format."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker
    series = {}
    for r in rows:
        m = re.match(r"\S+ (\S+)( bias)? T=(\d+)$", r.get("shape", ""))
        if r["op"] != "moe_apply" or not m or "median_ms" not in r.get("grouped_mm_x2", {}):
            continue
        label = m.group(1) + (", biases" if m.group(2) else "")
        series.setdefault(label, []).append((int(m.group(3)), r["grouped_mm_x2"]["median_ms"] / r["kiln"]["median_ms"]))
    if not series:
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, points in sorted(series.items()):
        points.sort()
        ax.plot([t for t, _ in points], [v for _, v in points], marker="o", label=label)
    ax.axhline(1.0, color="gray", linestyle="--", linewidth=1)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    tokens = sorted({t for points in series.values() for t, _ in points})
    ax.set_xticks(tokens, [str(t) for t in tokens])
    ratios = [v for points in series.values() for _, v in points]
    ticks = [2.0 ** e for e in range(-6, 7) if min(ratios) / 2 <= 2.0 ** e <= max(ratios) * 2]
    ax.set_yticks(ticks, [f"{t:g}x" for t in ticks])
    ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlabel("tokens (T)")
    ax.set_ylabel("kiln speed: grouped_mm ms / kiln ms")
    ax.set_title("moe_apply against two torch._grouped_mm on bf16 weights")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def plot_all(rows, out):
    for op in ("mha_prefill", "mha_decode_with_kvcache", "mha_extend_with_kvcache", "kv_cache_append", "moe_apply"):
        plot(rows, op, os.path.join(out, f"{op}.png"))
    plot_moe_ratios(rows, os.path.join(out, "moe_apply-ratios.png"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", help="libkiln.so (required unless --replot)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--replot", help="draw the plots of a side_by_side.json from an earlier run into --out, and stop (no GPU needed)")
    ap.add_argument("--quick", action="store_true", help="fewer runs on the slow reference kernels")
    ap.add_argument("--only", choices=["prefill", "decode", "moe", "extend", "append"], help="one operator family")
    ap.add_argument("--prefill-cases", help="only the prefill shapes with these letters (a: GPT-OSS d64, b: head_dim 128, c: sliding window, d: head_dim 256), e.g. c or ab")
    ap.add_argument("--extend-shapes", help="only the extend shapes whose name contains one of these, comma-separated (e.g. window)")
    ap.add_argument("--override", action="append", default=[], metavar="OP=KERNEL",
                    help="run kiln's OP on KERNEL instead of the selected one (an A/B of two kernels), e.g. "
                         "mha_extend_with_kvcache=attention.extend.mma_window; repeatable")
    ap.add_argument("--decode-shapes", help="only the decode shapes whose name starts with one of these, comma-separated (e.g. B8,B1)")
    ap.add_argument("--moe-weights", help="only the MoE rows of these weight formats, in this order, comma-separated (bf16, mxfp4, mxfp4_prepared, w4a8)")
    ap.add_argument("--moe-experts", type=int, default=128,
                    help="experts of the MoE layer: 128 (GPT-OSS-120B, the default) or 32 (GPT-OSS-20B), top-4 either way")
    ap.add_argument("--moe-tokens", help="only the MoE rows of these token counts, comma-separated (e.g. 1,8)")
    ap.add_argument("--moe-bias", choices=["both", "on", "off"], default="both",
                    help="MoE rows with bf16 biases on both projections (as GPT-OSS ships them), without, or both (default)")
    ap.add_argument("--cuda-graphs", action="store_true", help="time every call as a replayed CUDA graph (GPU time only)")
    args = ap.parse_args()
    if args.moe_experts < 4:
        ap.error(f"--moe-experts: expected at least top_k = 4 experts, got {args.moe_experts}")
    if args.replot:
        os.makedirs(args.out, exist_ok=True)
        with open(args.replot) as f:
            plot_all(json.load(f)["rows"], args.out)
        return
    if not args.lib:
        ap.error("--lib is required (or --replot)")
    global CUDA_GRAPHS
    CUDA_GRAPHS = args.cuda_graphs
    torch.cuda.init()
    kiln = Kiln(args.lib)
    for spec in args.override:
        op, _, kernel = spec.partition("=")
        if not kernel:
            ap.error(f"--override: expected OP=KERNEL, got {spec!r}")
        kiln.set_override(op, kernel)
    props = torch.cuda.get_device_properties(0)
    l2 = props.L2_cache_size
    rows = []
    cases = [
        ("(a) gpt-oss S=4096", 1, 4096, 64, 8, 64, True, -1, False),
        ("(a) gpt-oss S=16384", 1, 16384, 64, 8, 64, True, -1, False),
        ("(b) B=4 S=4096 causal", 4, 4096, 32, 8, 128, True, -1, False),
        ("(b) B=4 S=4096", 4, 4096, 32, 8, 128, False, -1, False),
        ("(b) B=1 S=16384 causal", 1, 16384, 32, 8, 128, True, -1, False),
        ("(c) window 128 S=4096", 1, 4096, 64, 8, 64, True, 128, True),
        ("(c) window 128 S=16384", 1, 16384, 64, 8, 64, True, 128, True),
        ("(d) gemma-3 d256 S=4096", 1, 4096, 16, 8, 256, True, -1, False),
        ("(d) gemma-3 d256 S=16384", 1, 16384, 16, 8, 256, True, -1, False),
    ]
    for c in cases if args.only in (None, "prefill") else []:
        if args.prefill_cases and c[0][1] not in args.prefill_cases:
            continue
        settle(rows)
        rows.append(prefill_case(kiln, *c, l2=l2, quick=args.quick))
        print(json.dumps(rows[-1]), flush=True)
    for name, B, ctx, Hq, Hkv, D in (("B64 ctx4096 64/8 d64", 64, 4096, 64, 8, 64), ("B128 ctx2048 32/8 d128", 128, 2048, 32, 8, 128),
                                     ("B8 ctx32768 32/8 d128", 8, 32768, 32, 8, 128), ("B1 ctx131072 64/8 d64", 1, 131072, 64, 8, 64),
                                     ("B64 ctx4096 16/8 d256", 64, 4096, 16, 8, 256), ("B4 ctx32768 16/8 d256", 4, 32768, 16, 8, 256)) if args.only in (None, "decode") else ():
        if args.decode_shapes and not any(name.startswith(f"{s} ") for s in args.decode_shapes.split(",")):
            continue
        for page in (1, 16, 64):
            settle(rows)
            rows.append(decode_case(kiln, f"{name} p{page}", B, ctx, Hq, Hkv, D, page, l2, args.quick))
            print(json.dumps(rows[-1]), flush=True)
        settle(rows)
        rows.append(decode_case(kiln, f"{name} p16 fp8", B, ctx, Hq, Hkv, D, 16, l2, args.quick, fp8=True))
        print(json.dumps(rows[-1]), flush=True)
    # Speculative verification: several tokens per sequence against one (the rows above), and the
    # first with an e4m3 cache. kiln's split kernels take up to 32 query rows a KV head with a
    # 16-bit cache (16 at head_dim 256) and 64 with e4m3 (32), its paged prefill kernel more.
    spec_shapes = (("B64 ctx4096 64/8 d64", 64, 4096, 64, 8, 64, (4, 16)), ("B4 ctx32768 64/8 d64", 4, 32768, 64, 8, 64, (4, 8)),
                   ("B8 ctx32768 32/8 d128", 8, 32768, 32, 8, 128, (4, 8)), ("B4 ctx32768 16/8 d256", 4, 32768, 16, 8, 256, (8, 16)))
    for name, B, ctx, Hq, Hkv, D, q_lens in spec_shapes if args.only in (None, "decode") else ():
        if args.decode_shapes and not any(name.startswith(f"{s} ") for s in args.decode_shapes.split(",")):
            continue
        for q_len, fp8 in [(q, False) for q in q_lens] + [(q_lens[0], True)]:
            settle(rows)
            label = f"{name} p16 q_len{q_len}" + (" fp8" if fp8 else "")
            rows.append(decode_case(kiln, label, B, ctx, Hq, Hkv, D, 16, l2, args.quick, fp8=fp8, q_len=q_len))
            print(json.dumps(rows[-1]), flush=True)
    extend_cases = [
        ("gpt-oss prefix 0 +4096 p64", 1, 0, 4096, 64, 8, 64, 64, -1, False),
        ("gpt-oss prefix 4096 +4096 p64", 1, 4096, 4096, 64, 8, 64, 64, -1, False),
        ("d128 prefix 0 +4096 p64", 1, 0, 4096, 32, 8, 128, 64, -1, False),
        ("d128 prefix 4096 +4096 p64", 1, 4096, 4096, 32, 8, 128, 64, -1, False),
        ("gpt-oss window 128 prefix 4096 +4096 p64", 1, 4096, 4096, 64, 8, 64, 64, 128, True),
        ("gpt-oss window 128 prefix 4100 +4096 p16", 1, 4100, 4096, 64, 8, 64, 16, 128, True),
        ("d128 prefix 4096 +4096 p16", 1, 4096, 4096, 32, 8, 128, 16, -1, False),
        ("gemma-3 d256 prefix 4096 +4096 p16", 1, 4096, 4096, 16, 8, 256, 16, -1, False),
        ("d128 prefix 4096 +4096 p16 fp8", 1, 4096, 4096, 32, 8, 128, 16, -1, False, True),
        ("gpt-oss prefix 4096 +4096 p64 fp8", 1, 4096, 4096, 64, 8, 64, 64, -1, False, True),
    ]
    for c in extend_cases if args.only in (None, "extend") else ():
        if args.extend_shapes and not any(part in c[0] for part in args.extend_shapes.split(",")):
            continue
        settle(rows)
        rows.append(extend_case(kiln, *c[:10], l2=l2, quick=args.quick, fp8=len(c) > 10 and c[10]))
        print(json.dumps(rows[-1]), flush=True)
    for name, T, Hkv, D, page in (("T4096 8x128 p16", 4096, 8, 128, 16), ("T4096 8x64 p1", 4096, 8, 64, 1),
                                  ("T4096 8x128 p64", 4096, 8, 128, 64)) if args.only in (None, "append") else ():
        settle(rows)
        rows.append(append_case(kiln, name, T, Hkv, D, page, l2, args.quick))
        print(json.dumps(rows[-1]), flush=True)
    moe_tokens = {int(t) for t in args.moe_tokens.split(",")} if args.moe_tokens else None
    # In the order --moe-weights lists the formats (to alternate which one runs first).
    moe_formats = args.moe_weights.split(",") if args.moe_weights else list(MOE_FORMATS)
    for f in moe_formats:
        if f not in MOE_FORMATS:
            ap.error(f"--moe-weights: '{f}' is not one of {', '.join(MOE_FORMATS)}")
    bias_modes = {"both": (False, True), "on": (True,), "off": (False,)}[args.moe_bias]
    # Every format at every batch size, with and without biases: prefill runs MXFP4 experts at
    # thousands of tokens too.
    moe_rows = [(T, w, b) for b in bias_modes for w in moe_formats for T in (1, 8, 64, 512, 4096, 8192)]
    moe_weights = MoeWeights(kiln, E=args.moe_experts) if args.only in (None, "moe") else None
    for T, weights_format, bias in moe_rows if moe_weights else ():
        if moe_tokens and T not in moe_tokens:
            continue
        settle(rows)
        rows.append(moe_case(kiln, moe_weights, T, l2, quick=args.quick, weights_format=weights_format, bias=bias))
        print(json.dumps(rows[-1]), flush=True)
        kiln.keep.clear()  # this row's inputs
    ceil = ceilings()
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "side_by_side.json"), "w") as f:
        json.dump({"device": props.name, "torch": torch.__version__, "ceilings": ceil, "rows": rows}, f, indent=1)
    plot_all(rows, args.out)
    # The table: per shape, kiln's time and each peer's time as a speed ratio (peer ms / kiln ms).
    print(f"\ndevice {props.name}, torch {torch.__version__}; ceilings: copy {ceil['copy_tbps']:.2f} TB/s, "
          f"bf16 GEMM {ceil['bf16_gemm_tflops']:.0f} TFLOP/s, fp8 GEMM {ceil.get('fp8_gemm_tflops', float('nan')):.0f} TFLOP/s")
    print(f"{'operator':<10} {'shape':<40} {'kiln ms':>10} {'rate':>14}  peers: ms (kiln speed = peer ms / kiln ms)")
    for r in rows:
        k = r["kiln"]["median_ms"]
        rate = f"{r['flops'] / k / 1e9:.1f} TFLOP/s" if "flops" in r and r["op"] != "moe_apply" else f"{r['bytes'] / k / 1e9:.3f} TB/s"
        peers = "  ".join(f"{p} {v['median_ms']:.3f} ({v['median_ms'] / k:.3g}x)" for p, v in r.items()
                          if isinstance(v, dict) and p != "kiln" and "median_ms" in v)
        errs = "  ".join(f"{p} n/a: {v['error'][:50]}" for p, v in r.items() if isinstance(v, dict) and "error" in v)
        print(f"{r['op'][:10]:<10} {r['shape']:<40} {k:>10.3f} {rate:>14}  {peers} {errs}")


if __name__ == "__main__":
    sys.exit(main())
