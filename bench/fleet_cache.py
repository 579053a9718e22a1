#!/usr/bin/env python3
"""The fleet (Redis) tier on the build box, against a local redis-server it starts itself:

1. cold warm-up of models by N concurrent processes, each its own node (cache directory): with no
   remote (every node compiles everything), against an empty Redis, and against a warm one;
2. fetch latency per kernel through the remote tier (kiln_bench_remote_fetch: GET, decode, verify);
3. the hit path with the remote configured: processes served from their local cache send Redis
   no command at all (counted by the server), and take as long as without the remote.

Run: python3 bench/fleet_cache.py --build build [--processes 8] [--out DIR]
"""
import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Redis:
    def __init__(self, directory):
        self.port = free_port()
        self.proc = subprocess.Popen(["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                      "--appendonly", "no", "--dir", directory], stdout=subprocess.DEVNULL)
        for _ in range(500):
            if self.cli("PING") == "PONG":
                return
            time.sleep(0.01)
        raise SystemExit("redis-server did not start")

    def cli(self, *args):
        r = subprocess.run(["redis-cli", "-p", str(self.port), *args], capture_output=True, text=True)
        return r.stdout.strip()

    def commands_processed(self):
        for line in self.cli("INFO", "stats").splitlines():
            if line.startswith("total_commands_processed:"):
                return int(line.split(":")[1])
        raise SystemExit("no total_commands_processed in INFO")

    def stop(self):
        self.proc.kill()
        self.proc.wait()

    @property
    def url(self):
        return f"redis://127.0.0.1:{self.port}"


def run_nodes(kiln, root, n, manifests, target, env):
    """n concurrent processes, node i warming every manifest into root/node<i>; wall seconds and compiles."""
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    start = time.perf_counter()
    procs = []
    for i in range(n):
        script = " && ".join(f"{kiln} --cache {root}/node{i} warmup --manifest {m} --target {target} -j1 --json > {root}/out{i}.{m}.json"
                             for m in manifests)
        procs.append(subprocess.Popen(["bash", "-c", script], env=env, stderr=subprocess.DEVNULL))
    for p in procs:
        if p.wait() != 0:
            raise SystemExit(f"a warm-up failed (exit {p.returncode}); see {root}")
    wall = time.perf_counter() - start
    compiles = 0
    origins = {}
    for i in range(n):
        for m in manifests:
            report = json.load(open(f"{root}/out{i}.{m}.json"))
            compiles += report["compiled"]
            for item in report["items"]:
                origins[item["origin"]] = origins.get(item["origin"], 0) + 1
    return {"seconds": wall, "compiles": compiles, "origins": origins}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--processes", type=int, default=8)
    ap.add_argument("--manifests", default="gpt-oss-120b,llama-3.1-8b,qwen3-30b-a3b")
    ap.add_argument("--target", default="sm_90a")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    kiln = os.path.abspath(f"{args.build}/bin/kiln")
    fetch = os.path.abspath(f"{args.build}/bin/kiln_bench_remote_fetch")
    manifests = args.manifests.split(",")
    work = tempfile.mkdtemp(prefix="kiln-fleet-bench-")
    redis = Redis(work)
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
    remote_env = dict(base_env, KILN_CACHE_REMOTE=redis.url)
    results = {"processes": args.processes, "manifests": manifests, "target": args.target}
    try:
        results["no_remote"] = run_nodes(kiln, f"{work}/a", args.processes, manifests, args.target, base_env)
        results["empty_redis"] = run_nodes(kiln, f"{work}/b", args.processes, manifests, args.target, remote_env)
        results["warm_redis"] = run_nodes(kiln, f"{work}/c", args.processes, manifests, args.target, remote_env)

        r = subprocess.run([fetch, "50"], env=remote_env, capture_output=True, text=True, check=True)
        latency = json.loads(r.stdout)
        results["fetch"] = {k: latency[k] for k in ("entries", "fetches", "p50_ms", "p99_ms", "max_ms")}
        results["fetch"]["mean_bytes"] = statistics.mean(e["bytes"] for e in latency["per_entry"]) if latency["per_entry"] else 0

        # Local hits with the remote configured: no command reaches Redis.
        node = f"{work}/c/node0"
        sig = "dtype=bf16,head_dim=64,group=8,causal=1,window=0,sinks=1,softcap=0,lse=0"
        compile_cmd = [kiln, "--cache", node, "compile", "mha_prefill", "--target", args.target, "--sig", sig]
        subprocess.run(compile_cmd, env=remote_env, capture_output=True, check=True)  # stored locally
        times = {"with_remote": [], "without_remote": []}
        before = redis.commands_processed()
        for _ in range(20):
            for name, env in (("with_remote", remote_env), ("without_remote", base_env)):
                t = time.perf_counter()
                subprocess.run(compile_cmd, env=env, capture_output=True, check=True)
                times[name].append((time.perf_counter() - t) * 1000)
        after = redis.commands_processed()
        results["hit_path"] = {"redis_commands": after - before - 1,  # less the INFO that read `before`
                               "process_ms_with_remote": statistics.median(times["with_remote"]),
                               "process_ms_without_remote": statistics.median(times["without_remote"])}
    finally:
        redis.stop()
        shutil.rmtree(work, ignore_errors=True)

    if args.out:
        os.makedirs(args.out, exist_ok=True)
        json.dump(results, open(os.path.join(args.out, "fleet_cache.json"), "w"), indent=2)
    n = args.processes
    print(f"| {n} processes warming {', '.join(manifests)} for {args.target} | wall s | compiles (all nodes) |")
    print("|---|---|---|")
    for name, label in (("no_remote", "no remote (each node alone)"), ("empty_redis", "empty Redis"), ("warm_redis", "warm Redis")):
        print(f"| {label} | {results[name]['seconds']:.1f} | {results[name]['compiles']} |")
    f = results["fetch"]
    print(f"\nremote fetch: {f['entries']} entries (mean {f['mean_bytes'] / 1024:.0f} KiB), {f['fetches']} fetches: "
          f"p50 {f['p50_ms']:.3f} ms, p99 {f['p99_ms']:.3f} ms, max {f['max_ms']:.3f} ms")
    h = results["hit_path"]
    print(f"local hit with the remote configured: {h['redis_commands']} Redis commands in 20 processes; process "
          f"{h['process_ms_with_remote']:.1f} ms with, {h['process_ms_without_remote']:.1f} ms without (median)")


if __name__ == "__main__":
    sys.exit(main())
