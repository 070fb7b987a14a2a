#!/usr/bin/env bash
# Runs the CUDA comparison tests under compute-sanitizer: memcheck (out-of-bounds and misaligned
# accesses, leaks) and racecheck (shared-memory hazards). Needs a built build/gpu and a GPU
# machine where compute-sanitizer can attach (Firecracker runtime; see the device notes).
#   scripts/sanitize_gpu_tests.sh [LOG_DIR] [GTEST_FILTER]
set -uo pipefail
cd "$(dirname "$0")/.."
logs="${1:-/tmp/sanitize}"
filter="${2:-*}"
mkdir -p "$logs"
binary=build/gpu/backend/cuda/cuda_test
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
status=0
# racecheck tracks every shared-memory access: it gets the smallest cases and a time limit.
race_filter="${3:-*mha_d64*:*b7_gqa8x2_d64*:*mixed_b5_gqa8x2_d64*:*WindowScoresMatchCpu*:*SelectKeptEqualsCpuOnIdenticalScores*:*RmsNorm*}"
for tool in memcheck racecheck; do
  extra=()
  run_filter="$filter"
  [ "$tool" = memcheck ] && extra=(--leak-check full)
  [ "$tool" = racecheck ] && run_filter="$race_filter"
  timeout 200 "$sanitizer" --tool "$tool" "${extra[@]}" --error-exitcode 3 \
    "$binary" --gtest_filter="$run_filter" > "$logs/$tool.log" 2>&1
  rc=$?
  summary=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY|LEAK SUMMARY" "$logs/$tool.log" | tail -2 | tr '\n' ' ')
  tests=$(grep -E "^\[  (PASSED|FAILED)" "$logs/$tool.log" | tr '\n' ' ')
  echo "compute-sanitizer $tool: exit $rc; $summary; $tests"
  [ $rc -ne 0 ] && status=1
done
exit $status
