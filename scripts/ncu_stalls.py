"""Summarizes one Nsight Compute launch (scripts/device-ncu.sh): headline metrics, the issue-stall
reasons of the whole launch, and the SASS lines with the most warp-state samples."""
import csv
import sys


def rows(path):
    with open(path, newline="") as f:
        text = [line for line in f if not line.startswith("==")]
    return list(csv.reader(text))


def main(raw_path, source_path, label):
    raw = rows(raw_path)
    header, values = raw[0], raw[-1]
    metrics = dict(zip(header, values))
    print(f"== {label}: {metrics.get('Kernel Name', '?')[:90]}")
    for key in ("gpu__time_duration.sum", "sm__throughput.avg.pct_of_peak_sustained_elapsed",
                "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
                "dram__throughput.avg.pct_of_peak_sustained_elapsed", "launch__registers_per_thread",
                "sm__warps_active.avg.pct_of_peak_sustained_active", "smsp__average_warps_issue_stalled_per_issue_active.ratio",
                "smsp__inst_executed.sum", "sm__ctas_launched.sum", "launch__occupancy_limit_registers",
                "launch__occupancy_limit_shared_mem", "sm__sass_inst_executed_op_local_ld.sum", "sm__sass_inst_executed_op_local_st.sum"):
        if key in metrics:
            print(f"  {key} = {metrics[key]}")
    for key in sorted(metrics):  # the tensor pipes' averages over SMs, where a pipe ran at all
        if "pipe_tensor" in key and ".avg." in key and key.endswith("pct_of_peak_sustained_active") and metrics[key] not in ("0", ""):
            print(f"  {key} = {metrics[key]}")
    # Stall reasons: warps per issue slot stalled for each reason, largest first.
    stalls = []
    for key, value in metrics.items():
        if key.startswith("smsp__average_warps_issue_stalled_") and key.endswith("_per_issue_active.ratio"):
            try:
                stalls.append((float(value), key[len("smsp__average_warps_issue_stalled_"):-len("_per_issue_active.ratio")]))
            except ValueError:
                pass
    stalls.sort(reverse=True)
    print("  stalls (warps per issue):", ", ".join(f"{name} {v:.2f}" for v, name in stalls[:10] if v > 0))
    source = [r for r in rows(source_path) if r and r[0] != "Kernel Name"]
    if not source:
        return
    head = source[0]
    samples = next((i for i, h in enumerate(head) if h.startswith("Warp Stall Sampling (All")), None)
    text = next((i for i, h in enumerate(head) if h == "Source"), 1)
    if samples is None:
        print("  no sampling column in", head[:12])
        return
    stall_columns = [i for i, h in enumerate(head) if h.startswith("stall_") and not h.endswith("(Not Issued)")]
    body = []
    for r in source[1:]:
        try:
            body.append((float(r[samples] or 0), r))
        except (ValueError, IndexError):
            pass
    total = sum(s for s, _ in body) or 1.0
    # The same reasons as shares of the warp-state samples, which also count warps that were not
    # eligible to issue (waiting for instructions, for instance) in proportion to the time they wait.
    shares = {head[i]: sum(float(r[i] or 0) for _, r in body) for i in stall_columns}
    print("  stalls (share of samples):",
          ", ".join(f"{name[len('stall_'):]} {100 * v / total:.1f}%" for name, v in sorted(shares.items(), key=lambda x: -x[1])[:10] if v > 0))
    body.sort(key=lambda x: -x[0])
    print(f"  top SASS lines by samples (of {total:.0f}):")
    for s, r in body[:30]:
        reasons = sorted(((float(r[i] or 0), head[i]) for i in stall_columns if r[i] not in ("", "0")), reverse=True)[:3]
        print(f"  {100 * s / total:5.1f}%  {r[0]:>6} {r[text][:70]:70}  " + " ".join(f"{n}={v:.0f}" for v, n in reasons))


if __name__ == "__main__":
    main(*sys.argv[1:4])
