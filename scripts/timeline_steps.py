#!/usr/bin/env python3
"""Where a serving run's time goes step by step, from a whole-run kernel timeline.

Reads tools/kernel_timeline's CSV of a whole process (SIEVE_TIMELINE_WHOLE=1, e.g. `sieve serve`
under a few requests). Every forward pass runs the final RMSNorm once, so the trace is cut there:
a window runs from one final norm to the next, i.e. one step's lm_head and sampling, the host's
turn, and the next step's layers. Per window: its period, its largest gap between kernels (the
host's part of the step: sampling's copy back, detokenizing, streaming, planning, the next step's
upload and launch) and the GPU's part (period minus that gap). Windows are grouped as decode steps
replayed from a CUDA graph (most kernels graph nodes) and eager ones (prefill, mixed, warm-up);
printed per group: count, and the median and 10th/90th percentiles. Then, for the decode windows
within 1.5x the median period (a window that waited on a request's arrival says nothing), each
kind of kernel's mean count and time a window, inside the graph or outside it.

    scripts/timeline_steps.py TRACE.csv
"""
import collections
import csv
import statistics
import sys

from timeline_gaps import kind  # a kernel's name without template arguments or parameters


def percentiles(values):
    values = sorted(values)
    pick = lambda q: values[min(len(values) - 1, int(q * len(values)))]
    return (f"median {statistics.median(values) / 1e3:9.1f} us  p10 {pick(0.1) / 1e3:9.1f}"
            f"  p90 {pick(0.9) / 1e3:9.1f}")


def main(path):
    kernels = []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            start = int(row["Start (ns)"])
            kernels.append((start, start + int(row["Duration (ns)"]), int(row["Graph"]),
                            kind(row["Name"])))
    kernels.sort()
    cuts = [i for i, k in enumerate(kernels) if k[3].startswith("RmsNorm")]
    if len(cuts) < 2:
        print("timeline_steps: fewer than two steps in the trace")
        return 1
    groups = collections.defaultdict(list)
    for a, b in zip(cuts, cuts[1:]):
        window = kernels[a:b]
        in_graph = sum(1 for k in window if k[2] != 0)
        label = "decode graph" if in_graph > len(window) // 2 else "eager"
        idle = 0
        end = window[0][1]
        for current in window[1:] + [kernels[b]]:
            idle = max(idle, current[0] - end)
            end = max(end, current[1])
        period = kernels[b][0] - window[0][0]
        groups[label].append({"period": period, "idle": idle, "gpu": period - idle,
                              "kernels": window})
    print(f"timeline_steps: {len(cuts) - 1} windows (final norm to final norm)")
    for label, windows in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        print(f"{label}: {len(windows)} windows")
        for key in ("period", "gpu", "idle"):
            print(f"  {key:6s} {percentiles([w[key] for w in windows])}")
    windows = groups.get("decode graph", [])
    if not windows:
        return 0
    median = statistics.median(w["period"] for w in windows)
    typical = [w for w in windows if w["period"] < 1.5 * median]
    totals = collections.defaultdict(float)
    counts = collections.defaultdict(int)
    for w in typical:
        for start, end, graph, name in w["kernels"]:
            totals[(graph != 0, name)] += end - start
            counts[(graph != 0, name)] += 1
    print(f"decode graph: kernels a window (mean of {len(typical)} within 1.5x the median period)")
    for (in_graph, name), total in sorted(totals.items(), key=lambda kv: -kv[1]):
        print(f"  {'graph' if in_graph else 'outside':7s} {name:48s}"
              f" x{counts[(in_graph, name)] / len(typical):6.1f}  {total / len(typical) / 1e3:9.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
