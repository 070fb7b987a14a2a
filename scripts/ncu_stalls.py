#!/usr/bin/env python3
"""Where one profiled kernel's warps stall, from its Nsight Compute source page: stall samples and
executed instructions summed over the stretches of SASS between the kernel's cluster barriers
(UCGABAR_WAIT; for the sampler these are its passes, in code order), and the instructions with the
most samples.

    ncu --set full --import-source yes -o REPORT ...      # one launch (--kernel-name, --launch-*)
    ncu -i REPORT.ncu-rep --page source --csv --print-source sass > SASS.csv
    scripts/ncu_stalls.py SASS.csv[.gz]
"""
import csv
import gzip
import sys


def main():
    path = sys.argv[1]
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        rows = list(csv.reader(f))
    header, data = rows[1], rows[2:]  # row 0 names the kernel
    source = header.index("Source")
    samples = header.index("Warp Stall Sampling (All Samples)")
    executed = header.index("Instructions Executed")
    total_samples = sum(int(r[samples]) for r in data)
    total_executed = sum(int(r[executed]) for r in data)
    print(f"{len(data)} SASS instructions, {total_samples} stall samples, "
          f"{total_executed} warp instructions executed")
    print("stretches between cluster barriers with 1% of the samples or more "
          "(instruction index range: share of stall samples, of instructions executed):")
    marks = [i + 1 for i, r in enumerate(data) if "UCGABAR_WAIT" in r[source]]
    for begin, end in zip([0] + marks, marks + [len(data)]):
        s = sum(int(r[samples]) for r in data[begin:end])
        e = sum(int(r[executed]) for r in data[begin:end])
        if s >= 0.01 * total_samples:
            print(f"  {begin:6d}-{end:6d}: {s / total_samples:6.1%} of samples, "
                  f"{e / total_executed:6.1%} of instructions")
    print("instructions with the most stall samples:")
    for i, r in sorted(enumerate(data), key=lambda item: -int(item[1][samples]))[:12]:
        print(f"  {i:6d} {r[source].strip()[:60]:60s} {int(r[samples]) / total_samples:5.1%} "
              f"executed {r[executed]}")


if __name__ == "__main__":
    main()
