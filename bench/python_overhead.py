#!/usr/bin/env python3
"""Host time per call of kiln's Python entry points, against the C call underneath and SDPA.

Tiny decode shape (batch 1, 64 cached tokens, GPT-OSS heads), so the GPU never limits the loop:
each figure is the median over rounds of (wall time of N back-to-back calls) / N, synchronized
only between rounds. Rows, fastest first:
  C ABI, prepacked      kiln_mha_decode_with_kvcache through ctypes on a buffer packed once: the
                        C++ call plus one ctypes crossing (what the C++ API costs a C++ caller)
  kiln.torch eager body the op's Python implementation, without torch's dispatcher
  torch.ops.kiln ..._out the registered out= operator, through the dispatcher
  torch.ops.kiln        the functional operator (allocates out)
  SDPA                  torch.nn.functional.scaled_dot_product_attention on the same tiny shape

  python3 bench/python_overhead.py [--calls N] [--rounds R] [--json FILE]
"""
import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F

import kiln
import kiln.torch as kt
from kiln import _capi


def per_call_us(fn, calls, rounds):
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - start) / calls * 1e6)
        torch.cuda.synchronize()
    return statistics.median(samples)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--json")
    args = ap.parse_args()
    dev = "cuda"
    hq, hkv, d, page = 64, 8, 64, 16
    q = torch.randn(1, hq, d, dtype=torch.bfloat16, device=dev)
    kc = torch.randn(8, page, hkv, d, dtype=torch.bfloat16, device=dev)
    vc = torch.randn_like(kc)
    table = torch.arange(4, dtype=torch.int32, device=dev).view(1, 4)
    lens = torch.tensor([64], dtype=torch.int32, device=dev)
    out = torch.empty_like(q)
    stream = torch.cuda.current_stream().cuda_stream
    d_ = kiln._tensors.torch_descriptor
    buf = _capi.DECODE_ARGS.pack((d_(q, "q"), d_(kc, "k"), d_(vc, "v"), d_(table, "t"), d_(lens, "l"), d_(out, "o"), 1, None, None,
                                  0.0, 0.0, -1, 1.0, 1.0))
    c_call = _capi.lib.kiln_mha_decode_with_kvcache
    qs, ks, vs = q.view(1, hq, 1, d), kc[:4].reshape(1, 64, hkv, d).transpose(1, 2), vc[:4].reshape(1, 64, hkv, d).transpose(1, 2)
    rows = [
        ("C ABI, prepacked", lambda: c_call(buf, stream)),
        ("kiln.torch eager body", lambda: kt._decode_out(q, kc, vc, table, lens, out=out)),
        ("kiln (framework-neutral)", lambda: kiln.mha_decode_with_kvcache(q, kc, vc, table, lens, out, stream=stream)),
        ("torch.ops.kiln ..._out", lambda: torch.ops.kiln.mha_decode_with_kvcache_out(q, kc, vc, table, lens, out=out)),
        ("torch.ops.kiln", lambda: torch.ops.kiln.mha_decode_with_kvcache(q, kc, vc, table, lens)),
        ("SDPA", lambda: F.scaled_dot_product_attention(qs, ks, vs, enable_gqa=True)),
    ]
    results = {name: per_call_us(fn, args.calls, args.rounds) for name, fn in rows}
    base = results["C ABI, prepacked"]
    print(f"host time per call, {torch.cuda.get_device_name()}, torch {torch.__version__}, kiln {kiln.__version__}")
    print(f"{'entry point':28s} {'us/call':>8s} {'over C':>8s}")
    for name, us in results.items():
        print(f"{name:28s} {us:8.2f} {us - base:+8.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "us_per_call": results}, f, indent=2)


if __name__ == "__main__":
    main()
