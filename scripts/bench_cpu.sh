#!/usr/bin/env bash
# Runs the CPU benchmarks (`sieve bench cpu`: the default model's prefill and decode beside the
# machine's measured fp32 FMA peak, GEMM rate and read bandwidth; decode speed of the reference
# backend on random models; scheduler overhead per step) and records their output in
# bench/results/NAME.json; name that record in bench/results/headline.txt (kind cpu) to show it on
# docs/benchmarks.md.
#   scripts/bench_cpu.sh [NAME]       (needs a release build; SIEVE_BUILD=build/ci for another)
set -euo pipefail
cd "$(dirname "$0")/.."
name="${1:-$(date +%F)-cpu}"
build="${SIEVE_BUILD:-build/release}"
out=$( { "$build/sieve" bench cpu --log-level warn; "$build/bench/cpu_decode_bench";
         "$build/bench/scheduler_bench" 1000; } 2>&1 )
echo "$out"
python3 - "$name" "$out" <<'PY'
import datetime, json, os, platform, subprocess, sys
name, text = sys.argv[1], sys.argv[2]
commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
cpu = "?"
for line in open("/proc/cpuinfo"):
    if line.startswith("model name"):
        cpu = line.split(":", 1)[1].strip()
        break
record = {"name": name, "commit": commit, "recorded": datetime.date.today().isoformat(),
          "gpu": f"none (CPU: {cpu}, {os.cpu_count()} cores)",
          "command": "scripts/bench_cpu.sh (sieve bench cpu; bench/cpu_decode_bench; "
                     "bench/scheduler_bench 1000)",
          "cpu": text}
json.dump(record, open(os.path.join("bench", "results", name + ".json"), "w"), indent=1)
print("wrote bench/results/" + name + ".json")
PY
python3 scripts/render_benchmarks.py
