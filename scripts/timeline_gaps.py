#!/usr/bin/env python3
"""Where a decode step's time goes between kernels, from an Nsight Systems GPU trace.

Reads the CSV of `nsys stats --report cuda_gpu_trace --format csv` (graph nodes traced with
--cuda-graph-trace=node), or tools/kernel_timeline's CSV in the same columns. Prints each step's
span; then, for the middle step of three or more (else the whole trace): its span, the kernels'
summed duration, the idle time between consecutive kernels (negative where a PDL launch
overlapped its predecessor), per kind of kernel its count and mean duration, per transition
(kind -> next kind) the count and mean gap, and a stretch of about two layers kernel by kernel.
A kind is the kernel's name without template arguments or parameters.

    scripts/timeline_gaps.py TRACE.csv
"""
import collections
import csv
import re
import sys


def kind(name):
    name = name.replace("(anonymous namespace)::", "")
    name = re.sub(r"<.*", "", name)  # template arguments and everything after
    name = re.sub(r"\(.*", "", name)  # parameters
    name = name.replace("void ", "").strip()
    name = name.split("::")[-1]
    return name[:48]


def main(path):
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    start_key = next(k for k in rows[0] if k.startswith("Start"))
    duration_key = next(k for k in rows[0] if k.startswith("Duration"))
    kernels = []
    for row in rows:
        name = row.get("Name", "")
        if "memcpy" in name.lower() or "memset" in name.lower():
            continue
        start = float(row[start_key])
        kernels.append((start, start + float(row[duration_key]), kind(name)))
    kernels.sort()
    # Several steps back to back (--profile-step): each starts with its embedding kernel. Print
    # every step's span, then look at the middle step only, which has a step before and after it.
    starts = [i for i, k in enumerate(kernels) if k[2].startswith("Embedding")]
    if len(starts) >= 2:
        for a, b in zip(starts, starts[1:]):
            print(f"timeline step: {(kernels[b][0] - kernels[a][0]) / 1e6:.3f} ms start to next start")
    if len(starts) >= 3:
        middle = (len(starts) - 1) // 2
        kernels = kernels[starts[middle]:starts[middle + 1] + 1]
        print("timeline: the middle step, and the next step's first kernel")
    if len(kernels) < 2:
        print("timeline: fewer than two kernels in the trace")
        return 1
    span = kernels[-1][1] - kernels[0][0]
    busy = sum(end - start for start, end, _ in kernels)
    durations = collections.defaultdict(list)
    gaps = collections.defaultdict(list)
    for start, end, name in kernels:
        durations[name].append(end - start)
    for (_, prev_end, prev), (start, _, name) in zip(kernels, kernels[1:]):
        gaps[(prev, name)].append(start - prev_end)
    total_gap = sum(sum(g) for g in gaps.values())
    print(f"timeline: {len(kernels)} kernels, span {span / 1e6:.3f} ms, kernels {busy / 1e6:.3f} ms,"
          f" gaps {total_gap / 1e6:.3f} ms (mean {total_gap / (len(kernels) - 1) / 1e3:.2f} us)")
    for name, values in sorted(durations.items(), key=lambda kv: -sum(kv[1])):
        print(f"timeline kernel {name:48s} x{len(values):4d}  mean {sum(values) / len(values) / 1e3:7.2f} us"
              f"  total {sum(values) / 1e6:.3f} ms")
    for (prev, name), values in sorted(gaps.items(), key=lambda kv: -abs(sum(kv[1]))):
        print(f"timeline gap {prev[:30]:30s} -> {name[:30]:30s} x{len(values):4d}"
              f"  mean {sum(values) / len(values) / 1e3:6.2f} us  total {sum(values) / 1e6:.3f} ms")
    # A stretch in the middle of the step, kernel by kernel: two or three whole layers.
    first = len(kernels) // 2
    for (start, end, name), (next_start, _, _) in zip(kernels[first:first + 20], kernels[first + 1:]):
        print(f"timeline seq {name[:40]:40s} {(end - start) / 1e3:7.2f} us, then gap"
              f" {(next_start - end) / 1e3:6.2f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
