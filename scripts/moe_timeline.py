"""Per-phase timeline of the MoE streaming kernel (kernel-sources/moe/apply_stream.cuh), for finding
where a decode-sized launch spends its time.

  moe_timeline.py instrument SRC DST [--launch N]
      copies the kernel-sources tree SRC to DST with the kernel instrumented: thread 0 of every CTA
      reads %globaltimer at each phase's end (and warp 0 when its first ring stage of up and of down
      arrives, and every warp when its units of a phase are done) and, on the launch that finds N
      launches before it (default 400: past kiln bench's warm-up), prints one `TL` line per CTA.
      Run `kiln bench moe_apply ...` with KILN_KERNEL_SOURCES=DST; the stamps cost time (on an H200
      about 7 us of GPT-OSS's 38 at T = 1), so read the phases' shares, not their sum. Only the
      streaming phases are stamped (token counts below the grouped GEMMs').
  moe_timeline.py summarize LOG
      prints, from the TL lines of a run, each point's time from the first CTA's start: minimum,
      median and maximum over the CTAs.

The instrumentation is text substitution on the kernel: it stops with the anchor it could not find
when the kernel has changed (the CPU test `moe_timeline_instruments_the_kernel` compiles its output).
"""
import argparse
import os
import shutil
import statistics
import sys

KERNEL = os.path.join("moe", "apply_stream.cuh")

# (anchor, replacement): each anchor must occur exactly once in the kernel, and is replaced in full.
SUBSTITUTIONS = [
    ("namespace kiln {\n", """namespace kiln {
__device__ unsigned kiln_tl_count;
__device__ unsigned long long kiln_tl_prev_end;
__device__ unsigned long long kiln_tl_mid[1024 * 8];
__device__ __forceinline__ unsigned long long tl_now() { unsigned long long t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t; }
"""),
    # warp 0's first ring stage of each phase
    ("""      wait_copies<kStages - 1>();
""", """      wait_copies<kStages - 1>();
      if (threadIdx.x == 0 && tl_first) { kiln_tl_mid[blockIdx.x * 8 + (kUp ? 0 : 3)] = tl_now(); tl_first = false; }
"""),
    ("""  const unsigned barrier_arrival = barrier_after_first_copies ? grid_barrier_arrive() : 0u;""",
     """  bool tl_first = true;
  const unsigned barrier_arrival = barrier_after_first_copies ? grid_barrier_arrive() : 0u;"""),
    # down's grid barrier passed
    ("""  if (barrier_after_first_copies) grid_barrier_wait(barrier_arrival);
""", """  if (barrier_after_first_copies) grid_barrier_wait(barrier_arrival);
  if (threadIdx.x == 0 && !kUp) kiln_tl_mid[blockIdx.x * 8 + 2] = tl_now();
"""),
    # warp 0's units done, and the last warp's (the CTA barrier follows)
    ("""  if (kRing) wait_copies<0>();  // only empty groups remain; the ring is reused by the next phase
""", """  if (kRing) wait_copies<0>();  // only empty groups remain; the ring is reused by the next phase
  if (threadIdx.x == 0) kiln_tl_mid[blockIdx.x * 8 + (kUp ? 1 : 4)] = tl_now();
  if (lane == 0) atomicMax(&kiln_tl_mid[blockIdx.x * 8 + (kUp ? 5 : 6)], tl_now());
"""),
    # kernel entry
    ("""  constexpr int kWarps = kiln_moe_stream_warps(kFormat);
  __shared__ int pair_start""", """  constexpr int kWarps = kiln_moe_stream_warps(kFormat);
  unsigned long long tl[8];
  tl[0] = tl_now();
  const unsigned tl_launch = *reinterpret_cast<volatile unsigned*>(&kiln_tl_count);
  const unsigned long long tl_prev = *reinterpret_cast<volatile unsigned long long*>(&kiln_tl_prev_end);
  if (threadIdx.x < 8) kiln_tl_mid[blockIdx.x * 8 + threadIdx.x] = 0;
  __shared__ int pair_start"""),
    # routed
    ("""  if (local)
    __syncthreads();
  else
    grid_barrier();
""", """  if (local)
    __syncthreads();
  else
    grid_barrier();
  tl[1] = tl_now();
"""),
    # grouped
    ("""  if (!tensor_cores) {
    bf16* act16 = reinterpret_cast<bf16*>(act);""", """  tl[2] = tl_now();
  if (!tensor_cores) {
    bf16* act16 = reinterpret_cast<bf16*>(act);"""),
    # up and down done (after each phase's CTA barrier and split-tile sums)
    ("""        p, chunk_start, chunk_table, pair_start, local ? local_pairs : pairs, local, x, x_row_stride, act16, y, partials, ring, false);
""", """        p, chunk_start, chunk_table, pair_start, local ? local_pairs : pairs, local, x, x_row_stride, act16, y, partials, ring, false);
    tl[3] = tl_now();
"""),
    ("""        p, chunk_start, chunk_table, pair_start, local ? local_pairs : pairs, local, x, x_row_stride, act16, y, partials, ring, true);
  }
  grid_barrier();
""", """        p, chunk_start, chunk_table, pair_start, local ? local_pairs : pairs, local, x, x_row_stride, act16, y, partials, ring, true);
    tl[4] = tl_now();
  }
  grid_barrier();
  tl[5] = tl_now();
"""),
    # end, and the print
    ("""    for (int e = 0; e < width; ++e) out[e] = from_float<bf16>(sum[e]);
  }
}
""", """    for (int e = 0; e < width; ++e) out[e] = from_float<bf16>(sum[e]);
  }
  __syncthreads();
  tl[6] = tl_now();
  if (threadIdx.x == 0) {
    atomicMax(&kiln_tl_prev_end, tl[6]);
    if (tl_launch == KILN_TL_LAUNCHu) {
      unsigned smid;
      asm("mov.u32 %0, %%smid;" : "=r"(smid));
      const unsigned long long* m = &kiln_tl_mid[blockIdx.x * 8];
      printf("TL %d %u %llu %llu %llu %llu %llu %llu %llu %llu | %llu %llu %llu %llu %llu %llu %llu\\n", blockIdx.x, smid, tl_prev, tl[0], tl[1], tl[2], tl[3], tl[4], tl[5], tl[6],
             m[0], m[1], m[5], m[2], m[3], m[4], m[6]);
    }
    if (blockIdx.x == 0) atomicAdd(&kiln_tl_count, 1u);
  }
}
"""),
]

# The TL line: CTA, SM, previous launch's end, then tl[0..6], then after '|' the mid stamps in
# print order. Points, in the order summarize prints them.
POINTS = [("routed (and x copied)", "tl", 1), ("grouped", "tl", 2), ("warp 0's first ring stage of up", "mid", 0),
          ("up: warp 0 done", "mid", 1), ("up: last warp done", "mid", 2), ("up done (CTA)", "tl", 3),
          ("down's grid barrier passed", "mid", 3), ("warp 0's first ring stage of down", "mid", 4), ("down: warp 0 done", "mid", 5),
          ("down: last warp done", "mid", 6), ("down done (CTA)", "tl", 4), ("last grid barrier passed", "tl", 5), ("end", "tl", 6)]


def instrument(src, dst, launch):
    if os.path.exists(dst):
        shutil.rmtree(dst)
    shutil.copytree(src, dst)
    path = os.path.join(dst, KERNEL)
    with open(path) as f:
        text = f.read()
    for anchor, replacement in SUBSTITUTIONS:
        found = text.count(anchor)
        if found != 1:
            sys.exit(f"moe_timeline.py: {KERNEL} holds {found} copies of the anchor (1 expected)\n{anchor}\nupdate SUBSTITUTIONS")
        text = text.replace(anchor, replacement)
    text = text.replace("KILN_TL_LAUNCHu", f"{launch}u")
    with open(path, "w") as f:
        f.write(text)
    print(f"instrumented {path} (prints launch {launch})")


def summarize(log):
    ctas = []
    with open(log) as f:
        for line in f:
            if not line.startswith("TL "):
                continue
            head, mid = line[3:].split("|")
            head, mid = [int(v) for v in head.split()], [int(v) for v in mid.split()]
            ctas.append({"tl": head[3:10], "mid": mid})
    if not ctas:
        sys.exit(f"moe_timeline.py: no TL lines in {log}")
    start = min(c["tl"][0] for c in ctas)
    print(f"{len(ctas)} CTAs; us from the first CTA's start: min / median / max over CTAs")
    for name, kind, i in POINTS:
        values = [(c[kind][i] - start) / 1e3 for c in ctas if c[kind][i] > 0]  # 0: not stamped (bf16 has no ring)
        if values:
            print(f"  {name:36} {min(values):7.2f} {statistics.median(values):7.2f} {max(values):7.2f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    a = sub.add_parser("instrument")
    a.add_argument("src")
    a.add_argument("dst")
    a.add_argument("--launch", type=int, default=400)
    s = sub.add_parser("summarize")
    s.add_argument("log")
    args = parser.parse_args()
    if args.command == "instrument":
        instrument(args.src, args.dst, args.launch)
    else:
        summarize(args.log)


if __name__ == "__main__":
    main()
