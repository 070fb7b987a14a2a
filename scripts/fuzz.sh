#!/usr/bin/env bash
# Builds the libFuzzer targets of fuzz/ (CMake preset fuzz: clang, ASan + UBSan) and runs each for
# a bounded time, starting from its committed seed corpus fuzz/corpus/<target>/. New inputs go to
# build/fuzz/corpus/<target>/ (the committed corpus is only read), crashes to
# build/fuzz/artifacts/<target>/, logs to build/fuzz/logs/. Prints libFuzzer's executions per
# target and fails on any crash, sanitizer report, leak, timeout or out-of-memory.
#   scripts/fuzz.sh [TARGET ...]    all targets when none is named
#   SIEVE_FUZZ_SECONDS=N            seconds per target (default 25)
#   SIEVE_FUZZ_SKIP_BUILD=1         run what build/fuzz holds
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS=0
seconds="${SIEVE_FUZZ_SECONDS:-25}"
build=build/fuzz
if [ "${SIEVE_FUZZ_SKIP_BUILD:-0}" != "1" ]; then
  cmake --preset fuzz >/dev/null
  cmake --build --preset fuzz
fi
targets=("$@")
if [ "${#targets[@]}" -eq 0 ]; then
  for dir in fuzz/corpus/*/; do targets+=("$(basename "$dir")"); done
fi
mkdir -p "$build/logs"
export ASAN_OPTIONS="detect_leaks=1:strict_string_checks=1:${ASAN_OPTIONS:-}"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:${UBSAN_OPTIONS:-}"
summary=()
failed=0
build_seconds=$SECONDS
for target in "${targets[@]}"; do
  binary="$build/fuzz/$target"
  if [ ! -x "$binary" ]; then
    echo "fuzz: no $binary (is $target in fuzz/CMakeLists.txt?)" >&2
    exit 1
  fi
  mkdir -p "$build/corpus/$target" "$build/artifacts/$target"
  args=(-max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1
        -artifact_prefix="$build/artifacts/$target/")
  if [ -f "fuzz/$target.dict" ]; then args+=(-dict="fuzz/$target.dict"); fi
  log="$build/logs/$target.log"
  rc=0
  "$binary" "${args[@]}" "$build/corpus/$target" "fuzz/corpus/$target" >"$log" 2>&1 || rc=$?
  stat() { sed -n "s/^stat::$1: *//p" "$log" | tail -1; }
  line=$(printf '%-28s %10s executions %8s/s  %5s new units  %5s MB peak' "$target" \
    "$(stat number_of_executed_units)" "$(stat average_exec_per_sec)" \
    "$(stat new_units_added)" "$(stat peak_rss_mb)")
  if [ "$rc" -ne 0 ]; then
    failed=$((failed + 1))
    line+="  FAILED (exit $rc; $log)"
    echo "---- $target failed; the end of $log:" >&2
    tail -n 60 "$log" >&2
  fi
  summary+=("$line")
done
echo "fuzz: ${seconds}s per target; build ${build_seconds}s, all ${SECONDS}s"
printf '%s\n' "${summary[@]}"
echo "fuzz: $((${#targets[@]} - failed)) passed, $failed failed"
[ "$failed" -eq 0 ]
