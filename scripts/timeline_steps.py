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
kind of kernel's mean count and time a window, inside the graph or outside it. Copies (recorded
by tools/kernel_timeline as `[CUDA memcpy ...]`) count as kernels here.

With --totals, then the whole run's time by group (decode graph, eager) and, within each, by
kind of kernel: each entry's exclusive time (as below), summed over the run, in seconds and as
a share of the run. --after-idle-ms MS first drops everything up to the first gap of more than
MS ms between kernels (a server's warm-up before its client starts).

With --by-graph, then a table per CUDA graph that served at least 100 decode windows (a window
of one graph with at most 20 entries outside it), beside the graph ids given with --against
(e.g. a step-tuning candidate of the same shape): each kind's exclusive time, the next entry's
start minus its own (kernels overlap under programmatic dependent launch, so their durations add
up to more than the step), its mean over the windows (a kind absent from one counts 0 there, so a
column sums to the mean period), and the median period.

    scripts/timeline_steps.py TRACE.csv [--after-idle-ms MS] [--totals] [--by-graph [--against ID ...]]
"""
import argparse
import collections
import csv
import statistics

from timeline_gaps import kind  # a kernel's name without template arguments or parameters


def percentiles(values):
    values = sorted(values)
    pick = lambda q: values[min(len(values) - 1, int(q * len(values)))]
    return (f"median {statistics.median(values) / 1e3:9.1f} us  p10 {pick(0.1) / 1e3:9.1f}"
            f"  p90 {pick(0.9) / 1e3:9.1f}")


def exclusive_times(entries, key):
    """Each entry's exclusive time (the next entry's start minus its own), summed by key(entry);
    the last entry only ends the one before it."""
    sums = collections.defaultdict(float)
    for current, following in zip(entries, entries[1:]):
        sums[key(current)] += following[0] - current[0]
    return sums


def by_graph(kernels, cuts, against):
    windows = collections.defaultdict(list)
    cuts = [i for i in cuts if kernels[i][2] != 0]  # final norms replayed in a graph
    for a, b in zip(cuts, cuts[1:]):
        window = kernels[a:b + 1]  # with the next window's first entry, which ends the last
        graphs = {k[2] for k in window[:-1] if k[2] != 0}
        if len(graphs) == 1 and sum(1 for k in window[:-1] if k[2] == 0) <= 20:
            windows[graphs.pop()].append(window)
    shown = sorted(g for g, w in windows.items() if len(w) >= 100) + [
        g for g in against if g in windows]
    if not shown:
        print("by graph: no graph served 100 decode windows")
        return
    tables = []
    for graph in shown:
        exclusive = collections.defaultdict(list)
        for window in windows[graph]:
            sums = exclusive_times(window, lambda k: (k[2] != 0, k[3], k[4]))
            for key, value in sums.items():
                exclusive[key].append(value)
        tables.append({key: sum(values) / len(windows[graph]) for key, values in exclusive.items()})
    print("by graph: exclusive time a decode window (us, mean), grid in CTAs (bytes for copies)")
    print(f"  {'':7s} {'kind':44s} {'grid':10s}" + "".join(f" {'graph ' + str(g):>10s}" for g in shown))
    keys = set().union(*tables)
    for key in sorted(keys, key=lambda k: -tables[0].get(k, 0.0)):
        print(f"  {'graph' if key[0] else 'outside':7s} {key[1][:44]:44s} {key[2]:10s}" +
              "".join(f" {t.get(key, 0.0) / 1e3:10.1f}" for t in tables))
    print(f"  {'':7s} {'mean period':44s} {'':10s}" + "".join(
        f" {statistics.mean(w[-1][0] - w[0][0] for w in windows[g]) / 1e3:10.1f}" for g in shown))
    print(f"  {'':7s} {'median period':44s} {'':10s}" + "".join(
        f" {statistics.median(w[-1][0] - w[0][0] for w in windows[g]) / 1e3:10.1f}" for g in shown))
    print(f"  {'':7s} {'windows':44s} {'':10s}" + "".join(f" {len(windows[g]):10d}" for g in shown))


def print_totals(groups, run_ns):
    """The run's time by group and by kind of kernel within it (exclusive times, seconds)."""
    print(f"totals: {run_ns / 1e9:.3f} s from the first window's start to the last one's end")
    for label, windows in sorted(groups.items(), key=lambda kv: -sum(w["period"] for w in kv[1])):
        period = sum(w["period"] for w in windows)
        idle = sum(w["idle"] for w in windows)
        print(f"  {label}: {len(windows)} windows, {period / 1e9:.3f} s ({100 * period / run_ns:.1f}%),"
              f" of which the largest gap of each window {idle / 1e9:.3f} s")
        exclusive = collections.defaultdict(float)
        for w in windows:
            for key, value in exclusive_times(w["kernels"] + [w["next"]],
                                              lambda k: (k[2] != 0, k[3])).items():
                exclusive[key] += value
        for (in_graph, name), value in sorted(exclusive.items(), key=lambda kv: -kv[1])[:16]:
            print(f"    {'graph' if in_graph else 'outside':7s} {name:48s} {value / 1e9:8.3f} s"
                  f"  {100 * value / run_ns:5.1f}%")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("trace")
    parser.add_argument("--after-idle-ms", type=float, default=None)
    parser.add_argument("--totals", action="store_true")
    parser.add_argument("--by-graph", action="store_true")
    parser.add_argument("--against", type=int, nargs="*", default=[])
    args = parser.parse_args()
    kernels = []
    with open(args.trace, newline="") as f:
        for row in csv.DictReader(f):
            start = int(row["Start (ns)"])
            kernels.append((start, start + int(row["Duration (ns)"]), int(row["Graph"]),
                            kind(row["Name"]), row.get("Grid", "")))
    kernels.sort()
    if args.after_idle_ms is not None:
        end = kernels[0][1] if kernels else 0
        for index, k in enumerate(kernels[1:], start=1):
            if k[0] - end > args.after_idle_ms * 1e6:
                kernels = kernels[index:]
                break
            end = max(end, k[1])
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
                              "kernels": window, "next": kernels[b]})
    print(f"timeline_steps: {len(cuts) - 1} windows (final norm to final norm)")
    for label, windows in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        print(f"{label}: {len(windows)} windows")
        for key in ("period", "gpu", "idle"):
            print(f"  {key:6s} {percentiles([w[key] for w in windows])}")
    if args.totals:
        print_totals(groups, kernels[cuts[-1]][0] - kernels[cuts[0]][0])
    windows = groups.get("decode graph", [])
    if not windows:
        return 0
    median = statistics.median(w["period"] for w in windows)
    typical = [w for w in windows if w["period"] < 1.5 * median]
    totals = collections.defaultdict(float)
    counts = collections.defaultdict(int)
    for w in typical:
        for start, end, graph, name, _ in w["kernels"]:
            totals[(graph != 0, name)] += end - start
            counts[(graph != 0, name)] += 1
    print(f"decode graph: kernels a window (mean of {len(typical)} within 1.5x the median period)")
    for (in_graph, name), total in sorted(totals.items(), key=lambda kv: -kv[1]):
        print(f"  {'graph' if in_graph else 'outside':7s} {name:48s}"
              f" x{counts[(in_graph, name)] / len(typical):6.1f}  {total / len(typical) / 1e3:9.1f} us")
    if args.by_graph:
        by_graph(kernels, cuts, args.against)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
