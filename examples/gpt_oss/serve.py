"""A small serving loop over GPT-OSS with random weights, on kiln or on plain PyTorch.

    python examples/gpt_oss/serve.py --out e2e            # both back ends, the 20B shape, full depth

Each back end in turn: draw the weights from the seed, prefill `--prompts` prompts of `--context`
tokens in chunks of at most `--max-batched-tokens` tokens per forward (time to first token,
prefill tokens/s), then for every batch size in `--batches` prefill that many prompts and run
`--decode-steps` greedy decode steps captured in one CUDA graph (decode tokens/s, time per output
token). Prints a summary table and writes e2e.json (plot it with plot.py).
"""
import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from backends import BACKENDS, KV_DTYPES, make_backend  # noqa: E402
from config import CONFIGS, config_named  # noqa: E402
from model import GptOss, Step  # noqa: E402
from weights import random_weights  # noqa: E402


def _positive_list(text):
    try:
        values = [int(v) for v in text.split(",") if v]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {text!r}")
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {text!r}")
    return values


def _positive(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _backends(text):
    names = [n for n in text.split(",") if n]
    bad = [n for n in names if n not in BACKENDS]
    if not names or bad:
        raise argparse.ArgumentTypeError(f"expected a comma-separated subset of {','.join(BACKENDS)}, got {text!r}")
    return names


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=sorted(CONFIGS), default="gpt-oss-20b")
    p.add_argument("--layers", type=_positive, help="run the first N layers at full width (default: all)")
    p.add_argument("--backends", type=_backends, default=list(BACKENDS), help="comma-separated: kiln,torch")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--prompts", type=_positive, default=8, help="prompts in the prefill measurement")
    p.add_argument("--context", type=_positive, default=2048, help="tokens per prompt")
    p.add_argument("--prompt-lengths", type=_positive_list,
                   help="the prefill measurement's prompts, each of its own length (replaces --prompts x --context)")
    p.add_argument("--batches", type=_positive_list, default=[1, 8, 64], help="decode batch sizes")
    p.add_argument("--decode-steps", type=_positive, default=64)
    p.add_argument("--page-size", type=_positive, default=16, help="kiln's KV page size (a power of two, <= 256)")
    p.add_argument("--moe-activations", choices=["bf16", "e4m3"], default="bf16",
                   help="kiln's expert activations: e4m3 is W4A8, quantized to MXFP8 inside the kernel")
    p.add_argument("--kv-cache", choices=list(KV_DTYPES), default="bf16",
                   help="kiln's KV cache: e4m3 holds K and V as e4m3 with one scale (--kv-scale)")
    p.add_argument("--kv-scale", type=float, default=1.0, help="the e4m3 cache's scale: stored = value / scale")
    p.add_argument("--max-batched-tokens", type=_positive, default=8192, help="prefill tokens per forward")
    p.add_argument("--no-graphs", action="store_true", help="decode eagerly instead of replaying a CUDA graph")
    p.add_argument("--profile", action="store_true", help="break one decode step down by kernel (batch 8)")
    p.add_argument("--out", help="folder for e2e.json")
    args = p.parse_args(argv)
    args.config = config_named(args.model, args.layers)
    if args.prompt_lengths:
        args.prompts = len(args.prompt_lengths)
    else:
        args.prompt_lengths = [args.context] * args.prompts
    if args.page_size & (args.page_size - 1) or args.page_size > 256:
        p.error(f"--page-size: expected a power of two up to 256, got {args.page_size}")
    if not args.kv_scale > 0:
        p.error(f"--kv-scale: expected a positive number, got {args.kv_scale}")
    return args


class Progress:
    """One status line on a terminal (plain lines otherwise), and the time since the start."""

    def __init__(self, stream=sys.stderr):
        self.stream, self.start, self.tty = stream, time.perf_counter(), stream.isatty()

    def __call__(self, text, done=False):
        line = f"[{time.perf_counter() - self.start:7.1f} s] {text}"
        if self.tty:
            self.stream.write("\r\033[K" + line + ("\n" if done else ""))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()


class Engine:
    """Requests live in cache slots 0..n-1; a prefill fills them, decode steps extend them all."""

    def __init__(self, model, max_len, max_batched_tokens, device="cuda"):
        self.model, self.max_len, self.budget, self.device = model, max_len, max_batched_tokens, device

    def _prefill_step(self, prompts, chunks):
        tokens, positions, token_slots, q_lens = [], [], [], []
        for slot, start, n in chunks:
            tokens.append(prompts[slot][start:start + n])
            positions.append(torch.arange(start, start + n))
            token_slots.append(torch.full((n,), slot))
            q_lens.append(n)
        cu = torch.tensor([0] + q_lens).cumsum(0).to(torch.int32)
        to = dict(device=self.device, non_blocking=True)
        return Step(tokens=torch.cat(tokens).to(**to), positions=torch.cat(positions).to(**to),
                    token_slots=torch.cat(token_slots).to(**to), slots=torch.tensor([c[0] for c in chunks]).to(**to),
                    cu_seqlens_q=cu.to(**to), seq_lens=torch.tensor([s + n for _, s, n in chunks], dtype=torch.int32).to(**to),
                    max_q=max(q_lens), decode=False, starts=[c[1] for c in chunks], q_lens=q_lens)

    def prefill(self, prompts, progress=None):
        """Prefills prompts (host int64 tensors) into slots 0..n-1. Returns the first sampled token
        of each, the seconds to each first token, and the logits they were sampled from."""
        if any(len(p) + 1 > self.max_len for p in prompts):
            raise ValueError(f"prompts: each must leave room in max_len {self.max_len}")
        done, first, ttft, last_logits = [0] * len(prompts), [None] * len(prompts), [None] * len(prompts), [None] * len(prompts)
        torch.cuda.synchronize()
        start = time.perf_counter()
        while any(d < len(p) for d, p in zip(done, prompts)):
            chunks, budget = [], self.budget
            for slot, p in enumerate(prompts):
                if done[slot] < len(p) and budget > 0:
                    n = min(len(p) - done[slot], budget)
                    chunks.append((slot, done[slot], n))
                    budget -= n
            logits = self.model.logits(self._prefill_step(prompts, chunks))
            finished = [(j, slot) for j, (slot, s, n) in enumerate(chunks) if s + n == len(prompts[slot])]
            for j, slot in finished:
                first[slot], last_logits[slot] = logits[j].argmax(), logits[j]
            torch.cuda.synchronize()
            for j, slot in finished:
                ttft[slot] = time.perf_counter() - start
            for slot, s, n in chunks:
                done[slot] = s + n
            if progress:
                progress(f"prefill {sum(done)}/{sum(len(p) for p in prompts)} tokens")
        return torch.stack(first), ttft, torch.stack(last_logits)

    def start_decode(self, first_tokens, prompt_lens, steps, graphs=True):
        """Readies `steps` decode steps after a prefill; returns a function that runs one."""
        B = first_tokens.shape[0]
        if max(prompt_lens) + steps > self.max_len:
            raise ValueError(f"decode_steps: {steps} steps after {max(prompt_lens)} tokens exceed max_len {self.max_len}")
        dev = self.device
        self.tokens = first_tokens.to(dev, torch.int64).clone()
        self.lens = torch.tensor(prompt_lens, dtype=torch.int32, device=dev)
        self.history = torch.zeros((steps, B), dtype=torch.int64, device=dev)
        self.counter = torch.zeros(1, dtype=torch.int64, device=dev)
        self.logits_out = torch.empty((B, self.model.config.vocab), dtype=torch.bfloat16, device=dev)
        rows = torch.arange(B, device=dev)
        cu = torch.arange(B + 1, dtype=torch.int32, device=dev)

        def step():
            s = Step(tokens=self.tokens, positions=self.lens.long(), token_slots=rows, slots=rows, cu_seqlens_q=cu,
                     seq_lens=self.lens + 1, max_q=1, decode=True)
            logits = self.model.logits(s)
            self.logits_out.copy_(logits)
            nxt = logits.argmax(-1)
            self.history.index_copy_(0, self.counter, nxt[None])
            self.counter.add_(1)
            self.tokens.copy_(nxt)
            self.lens.add_(1)

        if not graphs:
            return step
        saved = (self.tokens.clone(), self.lens.clone())
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # loads every kernel the step needs; its writes are redone below
            step()
        torch.cuda.current_stream().wait_stream(side)
        self.tokens.copy_(saved[0])
        self.lens.copy_(saved[1])
        self.counter.zero_()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        self.graph = graph
        return graph.replay


def _random_prompts(config, n, length, seed):
    g = torch.Generator().manual_seed(seed + 1)
    return [torch.randint(0, config.vocab, (length,), generator=g) for _ in range(n)]


def _timed(fn, repeats):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3


def kernel_breakdown(fn, repeats=3):
    """Device time of `fn` by kernel family, from the profiler's CUDA activity."""
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        wall = _timed(fn, repeats)
    families, kernels = {}, {}
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CUDA or e.device_time <= 0:
            continue
        name = e.name
        family = _kernel_family(name)
        families[family] = families.get(family, 0.0) + e.device_time / repeats
        kernels[name] = kernels.get(name, 0.0) + e.device_time / repeats
    top = sorted(kernels.items(), key=lambda kv: -kv[1])[:8]
    return {"step_ms": wall / repeats * 1e3, "families_us": families, "top_kernels_us": dict(top)}


def _kernel_family(name):
    lower = name.lower()
    if "kiln::" in lower or lower.startswith("kiln_"):
        if "moe" in lower:
            return "kiln moe_apply"
        return "kiln kv_cache_append" if "append" in lower else "kiln attention"
    if "flex" in lower or lower.startswith("triton_tem"):
        return "torch FlexAttention"
    if "group" in lower:
        return "torch grouped_mm"
    if any(s in lower for s in ("gemm", "gemv", "cutlass", "nvjet", "xmma", "sm90_", "cublas", "matmul")):
        return "torch GEMM (projections, lm_head, attention matmuls)"
    if "memcpy" in lower or "memset" in lower:
        return "copies"
    return "torch elementwise, norms, sort, softmax, argmax"


def run_backend(name, args, progress):
    config = args.config
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    slots = max(max(args.batches), args.prompts)
    max_len = -(-(max(args.context, *args.prompt_lengths) + args.decode_steps + 1) // 16) * 16
    progress(f"{name}: drawing {config.name} ({config.layers} layers) weights, seed {args.seed}")
    weights = random_weights(config, args.seed)
    options = {"activation_dtype": args.moe_activations, "kv_dtype": args.kv_cache, "kv_scale": args.kv_scale} if name == "kiln" else {}
    backend = make_backend(name, config, weights, slots, max_len, args.page_size, args.seed, **options)
    model = GptOss(config, weights, backend)
    engine = Engine(model, max_len, args.max_batched_tokens)
    prompts = _random_prompts(config, slots, args.context, args.seed)
    measured = [p[:n] if n <= len(p) else _random_prompts(config, 1, n, args.seed + i)[0]
                for i, (p, n) in enumerate(zip(prompts, args.prompt_lengths))]
    result = {"backend": name, **options}

    progress(f"{name}: warm-up (compiles kernels on a cold cache)")
    started = time.perf_counter()
    first, _, _ = engine.prefill(measured)  # the measured forwards' shapes, so their kernels
    step = engine.start_decode(first[:1], [args.context], 2, graphs=False)
    step()
    torch.cuda.synchronize()
    result["warmup_s"] = time.perf_counter() - started

    progress(f"{name}: prefill {args.prompts} prompts, {sum(args.prompt_lengths)} tokens")
    _, ttft, _ = engine.prefill(measured, progress=lambda t: progress(f"{name}: {t}"))
    if args.profile:  # the same prefill, its kernels by family
        try:
            result["profile_prefill"] = kernel_breakdown(lambda: engine.prefill(measured), repeats=1)
        except Exception as e:
            result["profile_prefill_error"] = str(e)
    result["prefill"] = {"prompts": args.prompts, "prompt_lengths": args.prompt_lengths, "seconds": max(ttft),
                         "tokens_per_s": sum(args.prompt_lengths) / max(ttft), "ttft_ms_mean": 1e3 * sum(ttft) / len(ttft),
                         "ttft_ms_first": 1e3 * min(ttft)}
    result["decode"] = {}
    for B in args.batches:
        progress(f"{name}: decode batch {B}: prefill {B} x {args.context}")
        first, _, _ = engine.prefill(prompts[:B], progress=lambda t: progress(f"{name}: decode batch {B}: {t}"))
        step = engine.start_decode(first, [args.context] * B, args.decode_steps, graphs=not args.no_graphs)
        progress(f"{name}: decode batch {B}: {args.decode_steps} steps")
        seconds = _timed(step, args.decode_steps)
        result["decode"][B] = {"tokens_per_s": B * args.decode_steps / seconds, "tpot_ms": 1e3 * seconds / args.decode_steps,
                               "tokens": engine.history[:, 0].tolist()[:8]}
        if args.profile and B == 8:  # an eager step: its kernels, and the host time between them
            eager = engine.start_decode(first, [args.context] * B, 3, graphs=False)
            try:
                result["profile_batch8"] = kernel_breakdown(eager)
            except Exception as e:  # the figures above stand without it
                result["profile_batch8_error"] = str(e)
    result["peak_memory_gb"] = torch.cuda.max_memory_allocated() / 2**30
    progress(f"{name}: done", done=True)
    return result


def summary(results, args):
    """The one-screen table, kiln against PyTorch."""
    lines = [f"{args.config.name}, {args.config.layers} layers, random weights (seed {args.seed}); {torch.cuda.get_device_name()}; "
             f"prefill of {args.prompts} prompts ({sum(args.prompt_lengths)} tokens), decode contexts {args.context}, "
             f"page size {args.page_size}, kiln's KV cache {args.kv_cache}, "
             f"decode {args.decode_steps} steps {'eager' if args.no_graphs else 'in a CUDA graph'}"]
    header = ["", "prefill tok/s", "TTFT ms"] + [f"decode tok/s B={b}" for b in args.batches] + \
             [f"TPOT ms B={b}" for b in args.batches] + ["peak GiB"]
    rows = []
    for r in results:
        rows.append([r["backend"], f"{r['prefill']['tokens_per_s']:.0f}", f"{r['prefill']['ttft_ms_mean']:.0f}"] +
                    [f"{r['decode'][b]['tokens_per_s']:.0f}" for b in args.batches] +
                    [f"{r['decode'][b]['tpot_ms']:.2f}" for b in args.batches] + [f"{r['peak_memory_gb']:.1f}"])
    by = {r["backend"]: r for r in results}
    if "kiln" in by and "torch" in by:
        k, t = by["kiln"], by["torch"]
        rows.append(["kiln / torch", f"{k['prefill']['tokens_per_s'] / t['prefill']['tokens_per_s']:.2f}x",
                     f"{k['prefill']['ttft_ms_mean'] / t['prefill']['ttft_ms_mean']:.2f}x"] +
                    [f"{k['decode'][b]['tokens_per_s'] / t['decode'][b]['tokens_per_s']:.2f}x" for b in args.batches] +
                    [f"{k['decode'][b]['tpot_ms'] / t['decode'][b]['tpot_ms']:.2f}x" for b in args.batches] +
                    [f"{k['peak_memory_gb'] / t['peak_memory_gb']:.2f}x"])
    widths = [max(len(str(row[i])) for row in [header] + rows) for i in range(len(header))]
    fmt = lambda row: "  ".join(str(c).rjust(w) for c, w in zip(row, widths))  # noqa: E731
    lines += [fmt(header), fmt(["-" * w for w in widths])] + [fmt(r) for r in rows]
    for r in results:
        if "profile_prefill" in r:
            p = r["profile_prefill"]
            parts = ", ".join(f"{k} {v / 1e3:.1f}" for k, v in sorted(p["families_us"].items(), key=lambda kv: -kv[1]))
            lines.append(f"{r['backend']} prefill {p['step_ms']:.0f} ms: kernels {sum(p['families_us'].values()) / 1e3:.0f} ms ({parts})")
        if "profile_batch8" in r:
            p = r["profile_batch8"]
            parts = ", ".join(f"{k} {v / 1e3:.2f}" for k, v in sorted(p["families_us"].items(), key=lambda kv: -kv[1]))
            busy = sum(p["families_us"].values()) / 1e3
            lines.append(f"{r['backend']} eager decode step B=8 {p['step_ms']:.2f} ms (graph {r['decode'][8]['tpot_ms']:.2f} ms): "
                         f"kernels {busy:.2f} ms ({parts}); host gaps {p['step_ms'] - busy:.2f} ms")
    return "\n".join(lines)


def teacher_forced_logits(backend, config, seed, prompts, forced, page_size=16, max_batched_tokens=4096, graphs=True,
                          **backend_options):
    """Logits [steps + 1, B, V] of one back end: those the prefill samples each prompt's first token
    from, then those of `steps` decode steps fed forced[i] (int64 [steps, B]) at step i."""
    steps = forced.shape[0]
    max_len = -(-(max(len(p) for p in prompts) + steps + 1) // 16) * 16
    weights = random_weights(config, seed)
    model = GptOss(config, weights, make_backend(backend, config, weights, len(prompts), max_len, page_size, seed, **backend_options))
    engine = Engine(model, max_len, max_batched_tokens)
    _, _, logits = engine.prefill(prompts)
    step = engine.start_decode(forced[0], [len(p) for p in prompts], steps, graphs)
    out = [logits]
    for i in range(steps):
        step()
        out.append(engine.logits_out.clone())
        if i + 1 < steps:
            engine.tokens.copy_(forced[i + 1])
    return torch.stack(out)


def main(argv=None):
    args = parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("serve.py: needs a CUDA GPU")
    progress = Progress()
    results = [run_backend(name, args, progress) for name in args.backends]
    table = summary(results, args)
    print(table)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        record = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "args": {
            k: v for k, v in vars(args).items() if k != "config"}, "layers": args.config.layers, "results": results}
        with open(os.path.join(args.out, "e2e.json"), "w") as f:
            json.dump(record, f, indent=1)
        with open(os.path.join(args.out, "e2e.txt"), "w") as f:
            f.write(table + "\n")


if __name__ == "__main__":
    main()
