#!/usr/bin/env python3
"""Sums the per-kernel durations of an `ncu --csv --metrics gpu__time_duration.sum` log by kernel
name: where a profiled decode step spends its time (each kernel measured alone, caches flushed).

    scripts/ncu_summary.py ncu.csv
"""
import collections
import csv
import re
import sys

SCALE = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}


def short(name):
    name = re.sub(r"\(.*", "", name)  # arguments
    depth, out = 0, []
    for ch in name:  # drop template arguments, keep the last path component
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif depth == 0:
            out.append(ch)
    return "".join(out).split("::")[-1].strip() or name[:60]


def main(path):
    lines = [l for l in open(path, errors="replace") if l.startswith('"')]
    totals = collections.defaultdict(float)
    counts = collections.Counter()
    for row in csv.DictReader(lines):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        value = float(row["Metric Value"].replace(",", ""))
        us = value * SCALE.get(row.get("Metric Unit", "nsecond"), 1e-3)
        name = short(row["Kernel Name"])
        totals[name] += us
        counts[name] += 1
    total = sum(totals.values())
    print(f"{len(counts)} kernel names, "
          f"{sum(counts.values())} launches, {total / 1e3:.3f} ms summed (each alone, caches cold)")
    for name, us in sorted(totals.items(), key=lambda item: -item[1]):
        print(f"{us / 1e3:9.3f} ms {100 * us / total:5.1f}%  {counts[name]:5d} x {us / counts[name]:8.2f} us  {name}")


if __name__ == "__main__":
    main(sys.argv[1])
