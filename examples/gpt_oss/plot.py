"""Decode tokens/s by batch size for each back end, from serve.py's e2e.json, as a PNG.

    python examples/gpt_oss/plot.py e2e/e2e.json e2e/tokens_per_s.png      (needs matplotlib)
"""
import json
import sys


def plot(record, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=120)
    for r in record["results"]:
        batches = sorted(int(b) for b in r["decode"])
        ax.plot(batches, [r["decode"][str(b)]["tokens_per_s"] for b in batches], marker="o",
                label=f"{r['backend']} (prefill {r['prefill']['tokens_per_s']:.0f} tok/s)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("decode batch size (requests)")
    ax.set_ylabel("decode tokens/s")
    args = record["args"]
    ax.set_title(f"{args['model']} ({record['layers']} layers), {args['context']}-token decode contexts\n{record['device']}", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        sys.exit("usage: plot.py E2E_JSON OUT_PNG")
    with open(argv[0]) as f:
        plot(json.load(f), argv[1])


if __name__ == "__main__":
    main()
