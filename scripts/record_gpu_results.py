#!/usr/bin/env python3
"""Bundles what one scripts/gpu_check.sh run brought back into bench/results/NAME.json.

    scripts/record_gpu_results.py FILES_DIR NAME --commit SHA --command "..." [--results-dir DIR]

FILES_DIR holds the run's kernels.json, kernels_tpN.json, kernels_{none,fp8}.json,
kernels_fp8_kv_{auto,fp8}.json, sdpa.json, summary.txt, serve_*.json, prefill_*.json,
sweep_*.json and fp8_headline_*.json (any may be missing). docs/benchmarks.md is rendered from these files by scripts/render_benchmarks.py; numbers
are never typed by hand.
"""
import argparse
import datetime
import gzip
import json
import os
import re


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("files_dir")
    parser.add_argument("name")
    parser.add_argument("--commit", required=True)
    parser.add_argument("--command", required=True)
    parser.add_argument("--results-dir",
                        default=os.path.join(os.path.dirname(__file__), "..", "bench", "results"),
                        help="where NAME.json goes (default: bench/results)")
    args = parser.parse_args()
    record = {"name": args.name, "commit": args.commit, "command": args.command,
              "recorded": datetime.date.today().isoformat()}
    def load(file):
        path = os.path.join(args.files_dir, file)
        if not os.path.exists(path):
            return None
        return json.load(gzip.open(path, "rt") if file.endswith(".gz") else open(path))
    record["kernels"] = load("kernels.json")
    record["sdpa"] = load("sdpa.json")
    # scripts/gpu_check.sh tp: kernels_tpN.json, bench kernels --tensor-parallel-size N.
    for file in sorted(os.listdir(args.files_dir)):
        match = re.match(r"kernels_tp(\d+)\.json$", file)
        if match:
            record.setdefault("kernels_tp", {})[match.group(1)] = load(file)
    # scripts/gpu_check.sh fp8: kernels_none.json and kernels_fp8.json, bench kernels
    # --quantization none / fp8 in one run.
    for file in sorted(os.listdir(args.files_dir)):
        match = re.match(r"kernels_(none|fp8)\.json$", file)
        if match:
            record.setdefault("kernels_quantization", {})[match.group(1)] = load(file)
    # scripts/gpu_check.sh kv_fp8: kernels_fp8_kv_{auto,fp8}.json, bench kernels --quantization
    # fp8 --kv-cache-dtype auto / fp8 in one run.
    for file in sorted(os.listdir(args.files_dir)):
        match = re.match(r"kernels_fp8_kv_(auto|fp8)\.json$", file)
        if match:
            record.setdefault("kernels_kv_cache", {})[match.group(1)] = load(file)
    def runs(pattern):
        """{name: result} of the files matching `pattern` (its group is the name), without the
        per-token gaps of each request (summarised in the metrics; the arrays would bloat the
        repo), whether the requests are the run's or each sweep level's."""
        found = {}
        for file in sorted(os.listdir(args.files_dir)):
            match = re.match(pattern, file)
            if not match:
                continue
            result = load(file)
            for group in [result or {}] + (result or {}).get("levels", []):
                for request in group.get("requests", []):
                    request.pop("itl_ms", None)
            found[match.group(1)] = result
        return found

    collected = {
        # sieve bench serve runs: serve_NAME.json.
        "serve": runs(r"serve_(\w+)\.json$"),
        # scripts/gpu_check.sh prefill against .ab/: prefill_{tree,ab}_RUN.json, in run order.
        "prefill_runs": runs(r"prefill_(\w+)\.json$"),
        # scripts/gpu_check.sh headline: sweep_WORKLOAD_{dense,sparse}.json, WORKLOAD 4k, 16k or,
        # over several GPUs, e.g. 70b-4k-tp4.
        "sweeps": runs(r"sweep_([\w-]+)\.json$"),
        # scripts/gpu_check.sh fp8_headline: fp8_headline_WORKLOAD_RUN.json, WORKLOAD 5k or 4k, RUN
        # e.g. fp8-fp8kv-sparse; keyed WORKLOAD_RUN.
        "fp8_headline": runs(r"fp8_headline_(\w+_[\w-]+)\.json(?:\.gz)?$"),
        # scripts/gpu_check.sh prefix_cache: prefix_cache_WORKLOAD_{dense,sparse}_{on,off}[_cC].json.
        "prefix_cache": runs(r"prefix_cache_(\w+)\.json$"),
    }
    record.update({key: found for key, found in collected.items() if found})
    # Anything else a command wrote as text (e.g. a GPU test's own output).
    for file in sorted(os.listdir(args.files_dir)):
        if file.endswith(".txt") and file != "summary.txt":
            record.setdefault("outputs", {})[file] = open(os.path.join(args.files_dir, file)).read()
    summary_path = os.path.join(args.files_dir, "summary.txt")
    if os.path.exists(summary_path):
        summary = open(summary_path).read()
        record["summary"] = summary
        gpu = re.search(r"^gpu: (.*)$", summary, re.M)
        if gpu:
            record["gpu"] = gpu.group(1)
    out = os.path.join(args.results_dir, args.name + ".json")
    with open(out, "w") as f:
        json.dump(record, f, indent=1)
    print("wrote", os.path.normpath(out))


if __name__ == "__main__":
    main()
