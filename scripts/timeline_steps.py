#!/usr/bin/env python3
"""Where a serving run's time goes step by step, from a whole-run kernel timeline.

Reads tools/kernel_timeline's CSV of a whole process (SIEVE_TIMELINE_WHOLE=1, e.g. `sieve serve`
under a few requests). A step starts with its embedding kernel. For each step: its kernels, the
GPU span from its first kernel's start to its last kernel's end, and the idle time from there to
the next step's first kernel (the host's part of the step: sampling's copy back, detokenizing,
streaming, planning, the next step's upload and launch). Steps are grouped as decode steps replayed
from a CUDA graph (every forward kernel a graph node) and eager steps (prefill, mixed); decode steps
further by their kernel count. Prints per group the count and the median and 10th/90th percentiles
of the period (start to next start), span and idle; then, for the largest group of decode steps,
each kind of kernel's mean time a step, and the same for the kernels outside the graph.

    scripts/timeline_steps.py TRACE.csv
"""
import collections
import csv
import re
import statistics
import sys


def kind(name):
    name = name.replace("(anonymous namespace)::", "")
    name = re.sub(r"<.*", "", name)
    name = re.sub(r"\(.*", "", name)
    name = name.replace("void ", "").strip()
    return name.split("::")[-1][:48]


def percentiles(values):
    values = sorted(values)
    pick = lambda q: values[min(len(values) - 1, int(q * len(values)))]
    return f"median {statistics.median(values) / 1e3:9.1f} us  p10 {pick(0.1) / 1e3:9.1f}  p90 {pick(0.9) / 1e3:9.1f}"


def main(path):
    kernels = []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            start = int(row["Start (ns)"])
            kernels.append((start, start + int(row["Duration (ns)"]), int(row["Graph"]), kind(row["Name"])))
    kernels.sort()
    starts = [i for i, k in enumerate(kernels) if k[3].startswith("Embedding")]
    if len(starts) < 2:
        print("timeline_steps: fewer than two steps in the trace")
        return 1
    groups = collections.defaultdict(list)
    for a, b in zip(starts, starts[1:]):
        step = kernels[a:b]
        in_graph = sum(1 for k in step if k[2] != 0)
        # Decode steps replay a graph: all but the sampling kernels after it are graph nodes.
        label = f"decode graph, {in_graph} graph kernels" if in_graph > len(step) // 2 else "eager"
        last_end = max(k[1] for k in step)
        groups[label].append({
            "period": kernels[b][0] - step[0][0],
            "span": last_end - step[0][0],
            "idle": kernels[b][0] - last_end,
            "kernels": step,
        })
    print(f"timeline_steps: {len(starts) - 1} steps")
    for label, steps in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        print(f"{label}: {len(steps)} steps")
        for key in ("period", "span", "idle"):
            print(f"  {key:6s} {percentiles([s[key] for s in steps])}")
    decode = [(label, steps) for label, steps in groups.items() if label.startswith("decode")]
    if not decode:
        return 0
    label, steps = max(decode, key=lambda kv: len(kv[1]))
    # Steps close to the median period: a step that waited on a request's arrival says nothing.
    median = statistics.median(s["period"] for s in steps)
    typical = [s for s in steps if s["period"] < 1.5 * median]
    totals = collections.defaultdict(float)
    counts = collections.defaultdict(int)
    for s in typical:
        for start, end, graph, name in s["kernels"]:
            key = (graph != 0, name)
            totals[key] += end - start
            counts[key] += 1
    print(f"{label}: kernels a step (mean of {len(typical)} steps within 1.5x the median period)")
    for (in_graph, name), total in sorted(totals.items(), key=lambda kv: -kv[1]):
        where = "graph" if in_graph else "outside"
        print(f"  {where:7s} {name:48s} x{counts[(in_graph, name)] / len(typical):6.1f}"
              f"  {total / len(typical) / 1e3:9.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
