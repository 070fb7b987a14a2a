#!/usr/bin/env bash
# Everything Sieve does on the GPU machine, in one call: build (CMake + Ninja, sm_90a), generate
# the transformers golden models, run every GPU test, run the benchmarks. Logs and JSON go to
# $OUT (the device tool brings them back): at most 8 files, so logs are bundled in logs.tgz.
#
#   scripts/gpu_check.sh [stage ...]     stages: build [tests_only] golden test sanitize
#                                        sanitize_engine bench step ab profile timeline sdpa
#                                        soak
#                                        serve serve_ab warm prefill headline accuracy tp
#                                        sampling attention large_batch profile_attention
#                                        chunk_ab serve_timeline fp8 kv_fp8 serve_fp8
#                                        fp8_headline arch_sm90 prefix_cache preemption
#                                        accuracy_fp8 fp8_decode_ab batch_invariant
#                                        (default: build golden test bench sdpa)
#
# `step` times the decode step alone (with its variants); `ab` times its defaults for this tree and
# for the tree in .ab/ (made by `scripts/prepare_ab.sh REV`, carried), alternately, AB_ROUNDS
# times each (default 3; AB_STEP_ARGS adds arguments, e.g. "--batch 1 --context 4000", and
# several shapes go separated by ";";
# AB_GEMM_ROWS adds the decode GEMM table at those rows for each tree): a change's effect
# measured in one run on one machine; `sampling` does the same for the GPU sampler's table,
# `attention` for the attention kernels (beside cuDNN SDPA, issue 19 item 2), and `serve_ab` for
# serving (sieve serve + sieve bench serve at SERVE_AB_LEVELS, default 1 and
# 32, sparse 4000-token prompts).
# `build` also builds .ab/'s `sieve` when it exists.
# Needs the carried .deb/ (PCRE2 headers, absent on the GPU machine; make it here with
# `mkdir -p .deb && (cd .deb && apt-get download libpcre2-dev libpcre2-8-0 libpcre2-16-0
# libpcre2-32-0 libpcre2-posix3)`). `serve` and `warm` use the
# committed Llama 3 tokenizer (testdata/tokenizers/llama3).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/sieve-gpu-out}"
LOGS="$OUT/logs"
mkdir -p "$LOGS"
stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(build golden test bench sdpa)
has() { for s in "${stages[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }
summary="$OUT/summary.txt"
: > "$summary"
note() { echo "$*" | tee -a "$summary"; }
finish() {
  tar czf "$OUT/logs.tgz" -C "$OUT" logs 2>/dev/null && rm -rf "$LOGS"
  echo "================ summary"; cat "$summary"
}
trap finish EXIT

note "gpu: $(nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader)"
# The device copy's git metadata can lag its files (HEAD as of the session's start plus changed
# files), so the tree of the files themselves is what identifies the code: it equals
# `git rev-parse COMMIT^{tree}` of the commit that was sent.
tree=$(GIT_INDEX_FILE=/tmp/sieve-gpu-check-index sh -c \
  'rm -f "$GIT_INDEX_FILE"; git read-tree HEAD && git add -A && git write-tree' 2>/dev/null)
note "commit: $(git rev-parse --short HEAD 2>/dev/null) $(git status --porcelain 2>/dev/null | wc -l) changed files; files' tree ${tree:0:12}"

if [ ! -f /usr/include/pcre2.h ] && [ -d .deb ]; then
  for f in .deb/*.deb; do dpkg -x "$f" /tmp/pcre2; done
  export PKG_CONFIG_SYSROOT_DIR=/tmp/pcre2
  export PKG_CONFIG_PATH=/tmp/pcre2/usr/lib/x86_64-linux-gnu/pkgconfig
elif [ ! -f /usr/include/pcre2.h ]; then
  note "no PCRE2 headers here and no .deb/ carried: configure will fail (the header says how to make .deb/)"
fi
export SIEVE_FIXTURES="${SIEVE_FIXTURES:-$PWD/.fixtures}"

# Stages that need only the `sieve` binary build it (incrementally: a warm machine keeps the
# build tree of the call before, whose binary may be stale).
ensure_sieve() {
  local start=$(date +%s)
  { [ -f build/gpu/build.ninja ] || cmake --preset gpu; } > "$LOGS/configure_sieve.log" 2>&1
  { cmake --build --preset gpu -j "$(nproc)" --target sieve; } \
    > "$LOGS/build_sieve.log" 2>&1 || { note "build of sieve FAILED"; tail -40 "$LOGS/build_sieve.log"; exit 1; }
  note "build of sieve: ok in $(( $(date +%s) - start )) s"
}

# Until `sieve serve` (PID $1, port 8123) answers /health with 200, or is gone (a refused
# configuration must not cost minutes of waiting), at most 300 s.
wait_for_server() {
  for _ in $(seq 1 600); do
    python3 -c "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8123/health', timeout=2).status == 200 else 1)" 2>/dev/null && return 0
    kill -0 "$1" 2>/dev/null || return 1
    sleep 0.5
  done
  return 1
}

# start_server BINARY LOG [ARG...]: `BINARY serve` of the Llama-3-8B shape (dummy weights, the
# committed Llama 3 tokenizer, port 8123, --max-model-len 4600, --kv-budget 400, --kv-window 32,
# no progress bar) with ARG added (the caller's --kv-policy, --max-num-batched-tokens, ...), in
# the background with its output in LOG; its PID in $pid once it is ready (wait_for_server).
start_server() {
  "$1" serve --model configs/llama-3-8b --load-format dummy \
    --tokenizer testdata/tokenizers/llama3/tokenizer.model --port 8123 --max-model-len 4600 \
    --kv-budget 400 --kv-window 32 --no-progress "${@:3}" > "$2" 2>&1 &
  pid=$!
  wait_for_server $pid
}

# Whether this call's build stage built .ab/'s sieve (it builds it in the background while the
# tests run; the first caller waits for it).
ab_ready() {
  if [ -n "${ab_build:-}" ]; then
    wait "$ab_build" && ab_built=1
    ab_build=
  fi
  [ -n "${ab_built:-}" ] && [ -x .ab/build/gpu/sieve ]
}
# The sieve binaries an A/B stage runs, in `sieves`: this tree's, and .ab/'s when ab_ready.
ab_sieves() {  # ab_sieves STAGE
  sieves=(./build/gpu/sieve)
  if ab_ready; then
    sieves+=(.ab/build/gpu/sieve)
  elif [ -d .ab ]; then
    note "$1: no .ab/ build (build_ab.log; the build stage builds it)"
  fi
}

if has build; then
  start=$(date +%s)
  if ! cmake --preset gpu > "$LOGS/configure.log" 2>&1; then
    note "configure FAILED"; tail -40 "$LOGS/configure.log"; exit 1
  fi
  # The GPU tests first, so a break elsewhere (server, bench client) does not cost the run.
  if ! cmake --build --preset gpu -j "$(nproc)" --target cuda_test gpu_engine_test model_test fp8_checkpoint_test \
      > "$LOGS/build_tests.log" 2>&1; then
    note "build of the GPU tests FAILED"; grep -E "error|Error" -A6 "$LOGS/build_tests.log" | head -120; exit 1
  fi
  note "build of the GPU tests: ok in $(( $(date +%s) - start )) s"
  if { has ab || has sampling || has attention || has serve_ab || has prefill; } && [ -d .ab ]; then
    # Builds while the tests run: they use the GPU, this the CPUs.
    (cd .ab && cmake --preset gpu && \
      cmake --build --preset gpu -j "$(nproc)" --target sieve sieve_kernel_timeline) \
      > "$LOGS/build_ab.log" 2>&1 &
    ab_build=$!
  fi
  if has tests_only; then
    :
  elif ! cmake --build --preset gpu -j "$(nproc)" > "$LOGS/build.log" 2>&1; then
    note "build of everything FAILED"; grep -E "error|Error" -A6 "$LOGS/build.log" | head -60
  else
    note "build: ok in $(( $(date +%s) - start )) s"
  fi
fi

if has golden; then
  PYTHONUNBUFFERED=1 python3 scripts/make_golden.py testdata/models_gpu --set gpu > "$LOGS/golden_gpu.log" 2>&1 \
    && note "golden gpu models: ok" || { note "golden gpu models FAILED"; tail -20 "$LOGS/golden_gpu.log"; }
  if has golden_cpu; then
    PYTHONUNBUFFERED=1 python3 scripts/make_golden.py /tmp/golden_cpu > "$LOGS/golden_cpu.log" 2>&1 \
      && tar czf "$OUT/golden_cpu.tgz" -C /tmp golden_cpu && note "golden cpu models: ok (golden_cpu.tgz)"
  fi
fi

if has test; then
  # The golden-model tests skip without the golden stage's models (ignored files, which last only
  # as long as the device machine): say so, so that a run without them is not read as covering
  # them.
  [ -d testdata/models_gpu ] || note "gpu tests: no golden models (testdata/models_gpu): the \
golden-model tests skip; add the golden stage to run them"
  start=$(date +%s)
  # GPU_TESTS: a regular expression of the tests to run (ctest -R), e.g. "Decode|GpuEngine".
  ctest --test-dir build/gpu -L gpu ${GPU_TESTS:+-R "$GPU_TESTS"} --output-on-failure --timeout 600 \
    > "$LOGS/gpu_tests.log" 2>&1
  note "gpu tests: $(grep -E 'tests passed|tests failed' "$LOGS/gpu_tests.log" | tail -1) in $(( $(date +%s) - start )) s"
  grep -E "^\s+[0-9]+ - .*(Failed|Exception|Timeout|Not Run)" "$LOGS/gpu_tests.log" | head -40 | tee -a "$summary"
  # Passing tests print their measurements only when run directly (not with GPU_TESTS: the
  # selected tests' verdicts are enough then).
  if [ -z "${GPU_TESTS:-}" ]; then
    ./build/gpu/model/model_test --gtest_filter='*Gpu*' > "$LOGS/gpu_golden.log" 2>&1
    ./build/gpu/runtime/gpu_engine_test > "$LOGS/gpu_engine.log" 2>&1
    grep -hE "on GPU|near-tie|WIDE|greedy tokens equal|SKIPPED|FAILED" "$LOGS/gpu_golden.log" \
      "$LOGS/gpu_engine.log" | head -40 >> "$summary"
  fi
  # The first failures in full, for debugging without another run.
  grep -E "Failure|Expected|Which is|actual|check failed" -m 60 "$LOGS/gpu_tests.log" > "$LOGS/failures.txt"
  head -c 6000 "$LOGS/failures.txt"
fi

if has sanitize; then
  # Small cases only: under the sanitizers kernels run 10-100x slower.
  scripts/sanitize_gpu_tests.sh "$LOGS/sanitize" \
    '*Dense*:*Gemm*:*Sparsity*:*Sampling*:*mha_d64*:*gqa8x2_d64_chunked*:*b7_gqa8x2_d64*:*h2o_mixed*:*page24*:*mixed_b5_gqa8x2_d64*-*ProgrammaticEdgeProbeTells*' \
    2>&1 | tee -a "$summary"
fi

if has sanitize_engine; then
  # The whole engine (sparse policies, chunked prefill, graphs, eviction) under memcheck.
  timeout 240 compute-sanitizer --tool memcheck --error-exitcode 3 \
    ./build/gpu/runtime/gpu_engine_test --gtest_filter='*Sparse*' > "$LOGS/engine_memcheck.log" 2>&1
  note "engine memcheck: exit $?"
  grep -E "Invalid|at 0x|by thread|Address|ERROR SUMMARY|near-tie|greedy tokens" "$LOGS/engine_memcheck.log" \
    | head -30 | tee -a "$summary"
fi

if has bench; then
  ./build/gpu/sieve bench kernels --result-json "$OUT/kernels.json" > "$LOGS/bench_kernels.log" 2>&1 \
    || note "bench kernels FAILED (rc $?)"
  tail -90 "$LOGS/bench_kernels.log" >> "$summary"
fi

if has tp; then
  # Tensor parallelism over TP_SIZE GPUs (default: every GPU of the machine) through NCCL: the
  # GPU tests of N GPUs against one (greedy tokens through the engine, the trained model and a
  # Llama-3-8B-shaped dummy one, dense and sparse; logits of a tiny model), then the 70B plan's
  # bound with the all-reduce timed on them, and the Llama-3-8B decode step split. The tests skip
  # on one GPU.
  ensure_sieve
  cmake --build --preset gpu --target gpu_engine_test tensor_parallel_test > "$LOGS/build_tp_tests.log" 2>&1
  ./build/gpu/runtime/gpu_engine_test --gtest_filter='*TensorParallel*' > "$LOGS/tp_engine_test.log" 2>&1
  note "tp: engine test exit $? ($(grep -cE 'GPUs against one$' "$LOGS/tp_engine_test.log") runs)"
  grep -E "greedy tokens equal|largest \|logprob|FAILED|SKIPPED \]" "$LOGS/tp_engine_test.log" | head -30 | tee -a "$summary"
  ./build/gpu/model/tensor_parallel_test --gtest_filter='GpuTensorParallel*' > "$LOGS/tp_model_test.log" 2>&1
  note "tp: model test exit $?"; grep -E "worst relative L2|FAILED|SKIPPED \]" "$LOGS/tp_model_test.log" | tee -a "$summary"
  tp_size="${TP_SIZE:-$(nvidia-smi -L | wc -l)}"
  ./build/gpu/sieve bench kernels --skip-attention --skip-sparsity --skip-gemm --no-step-variants \
    --tensor-parallel-size "$tp_size" --result-json "$OUT/kernels_tp$tp_size.json" \
    > "$LOGS/bench_tp.log" 2>&1 || note "bench kernels --tensor-parallel-size $tp_size FAILED (rc $?)"
  grep -E "^(==|dense|1/10 kept|kept)" "$LOGS/bench_tp.log" | tee -a "$summary"
fi

step_bench() {  # step_bench BINARY NAME [ARG...]: the decode step (and its variants unless ARG
  # says --no-step-variants), headline lines kept
  "$1" bench kernels --skip-attention --skip-sparsity --skip-gemm "${@:3}" \
    --result-json "$LOGS/step_$2.json" > "$LOGS/step_$2.log" 2>&1 || note "step bench $2 FAILED"
  grep -E "^(dense|1/10 kept)" "$LOGS/step_$2.log" | sed "s/^/$2: /" >> "$summary"
  # With SIEVE_GEMM_VERBOSE=1, the decode GEMMs' picks (they move the step by up to 0.1 ms):
  # N x K: candidate C, cuBLASLt tile T, split-k S.
  # After step tuning (runtime/step_tuning.h) where it decided, else the pick alone.
  local picks
  picks=$(grep -E "^GEMM plan 64 x [0-9]+ x [0-9]+" "$LOGS/step_$2.log" | python3 -c '
import re, sys
picks = {}
for line in sys.stdin:
    m = re.match(r"GEMM plan 64 x (\d+) x (\d+).*?(after step tuning)?: .*candidate (\d+) of.*tile (\d+).*split-k (\d+)", line)
    if m and (m.group(3) or (m.group(1), m.group(2)) not in picks):
        picks[(m.group(1), m.group(2))] = "c%st%ss%s" % m.group(4, 5, 6)
print(" ".join("%sx%s:%s" % (n, k, v) for (n, k), v in picks.items()))')
  if [ -n "$picks" ]; then echo "$2: GEMM picks $picks" >> "$summary"; fi
  grep -A6 "^  step tuning" "$LOGS/step_$2.log" | head -14 | sed "s/^/$2: /" >> "$summary"
}

if has step; then
  step_bench ./build/gpu/sieve this
  grep -A12 "^1/10 kept  " "$LOGS/step_this.log" | head -12 >> "$summary"
fi

if has large_batch; then
  # Decode at large batches, where the products rather than the bytes may set the time: the
  # decode GEMM table at LARGE_BATCH_ROWS rows (bytes and TFLOP/s), then the decode step at batch
  # 256 x 2048 (dense KV fits beside the weights), each beside its byte bound.
  ensure_sieve
  ./build/gpu/sieve bench kernels --skip-attention --skip-sparsity --skip-decode-step \
    --gemm-rows "${LARGE_BATCH_ROWS:-1,64,128,256}" --result-json "$OUT/kernels.json" \
    > "$LOGS/large_batch_gemm.log" 2>&1 || note "large_batch GEMM table FAILED"
  grep -E "^ *[0-9]+  (qkv|o|gate_up|down|lm_head|all) " "$LOGS/large_batch_gemm.log" \
    | cut -c1-90 | tee -a "$summary"
  # The sparse step's kernels on a timeline (tools/kernel_timeline), by kind.
  cmake --build --preset gpu --target sieve_kernel_timeline > "$LOGS/build_timeline.log" 2>&1
  CUDA_INJECTION64_PATH="$PWD/build/gpu/tools/libsieve_kernel_timeline.so" \
    SIEVE_TIMELINE_CSV="$LOGS/batch256_timeline.csv" \
    step_bench ./build/gpu/sieve batch256 --no-step-variants --profile-step --batch 256 --context 2048
  python3 scripts/timeline_gaps.py "$LOGS/batch256_timeline.csv" 2>&1 \
    | grep -E "^timeline(:| kernel)" | head -14 | tee -a "$summary"
fi

if has profile_attention; then
  # One decode attention launch of a sparse step (the second step's first layer) at batch 256 x
  # 2048, 1/10 kept (large_batch's step), under Nsight Compute's full set: its throughputs,
  # occupancy and warp stall reasons, and where in the code the warps stall (scripts/ncu_stalls.py).
  ensure_sieve
  timeout 400 ncu --profile-from-start off --clock-control none \
    --kernel-name regex:DecodeAttentionKernel --launch-skip 32 --launch-count 1 --set full \
    --import-source yes -f -o /tmp/decode_attention ./build/gpu/sieve bench kernels \
    --skip-attention --skip-sparsity --skip-gemm --no-step-variants --no-graph --profile-step \
    --batch 256 --context 2048 > "$LOGS/profile_attention.log" 2>&1
  note "profile_attention: ncu exit $?"
  ncu -i /tmp/decode_attention.ncu-rep --page details --csv > "$LOGS/decode_attention_details.csv" 2>&1
  ncu -i /tmp/decode_attention.ncu-rep --page source --csv --print-source sass \
    > /tmp/decode_attention_sass.csv 2>&1
  python3 - "$LOGS/decode_attention_details.csv" <<'PY' | tee -a "$summary"
import csv, sys
wanted = ("Duration", "DRAM Throughput", "Memory Throughput", "L2 Hit Rate", "Achieved Occupancy",
          "Theoretical Occupancy", "Registers Per Thread", "Waves Per SM", "Grid Size", "Block Size",
          "Dynamic Shared Memory Per Block", "Issue Slots Busy", "No Eligible",
          "Active Warps Per Scheduler", "Eligible Warps Per Scheduler",
          "Warp Cycles Per Issued Instruction")
for row in csv.DictReader(open(sys.argv[1])):
    if row.get("Metric Name") in wanted:
        print(f"decode attention: {row['Metric Name']}: {row['Metric Value']} {row['Metric Unit']}")
PY
  # Stall reasons: warps stalled for each, per issued instruction (the raw page's metrics).
  ncu -i /tmp/decode_attention.ncu-rep --page raw --csv > "$LOGS/decode_attention_raw.csv" 2>&1
  python3 - "$LOGS/decode_attention_raw.csv" <<'PY' | tee -a "$summary"
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
header, values = rows[0], rows[-1]  # names, units, then one row a launch
prefix, suffix = "smsp__average_warps_issue_stalled_", "_per_issue_active.ratio"
stalls = []
for name, value in zip(header, values):
    if name.startswith(prefix) and name.endswith(suffix):
        try:
            stalls.append((float(value.replace(",", "")), name[len(prefix):-len(suffix)]))
        except ValueError:
            pass
print("decode attention stalls per issued instruction: " +
      ", ".join(f"{reason} {value:.2f}" for value, reason in sorted(stalls, reverse=True)[:8]))
PY
  python3 scripts/ncu_stalls.py /tmp/decode_attention_sass.csv 2>&1 | head -24 | tee -a "$summary"
  gzip -c /tmp/decode_attention_sass.csv > "$LOGS/decode_attention_sass.csv.gz"
fi

if has ab; then
  ensure_sieve
  if ab_ready; then
    # AB_STEP_ARGS: other step shapes, e.g. "--batch 1 --context 4000" (word-split on purpose);
    # several shapes separated by ";" are timed in turn, each named by its position (this_1,
    # this_1_s2, ...), so one build measures a change at a small and a large batch.
    IFS=';' read -r -a step_shapes <<< "${AB_STEP_ARGS:- }"
    for round in $(seq 1 "${AB_ROUNDS:-3}"); do
      for shape in "${!step_shapes[@]}"; do
        suffix=$( [ "$shape" -eq 0 ] && echo "" || echo "_s$((shape + 1))" )
        # shellcheck disable=SC2086
        step_bench ./build/gpu/sieve "this_$round$suffix" --no-step-variants ${step_shapes[$shape]}
        # shellcheck disable=SC2086
        step_bench .ab/build/gpu/sieve "ab_$round$suffix" --no-step-variants ${step_shapes[$shape]}
      done
    done
    grep -A12 "^1/10 kept  " "$LOGS/step_this_1.log" | head -12 >> "$summary"
    # AB_GEMM_ROWS (e.g. 16,20,32): the decode GEMM table at those rows, for each tree (the
    # runner's pick and the skinny kernel alone).
    if [ -n "${AB_GEMM_ROWS:-}" ]; then
      for binary in ./build/gpu/sieve .ab/build/gpu/sieve; do
        name=$( [ "$binary" = ./build/gpu/sieve ] && echo this || echo ab )
        "$binary" bench kernels --skip-attention --skip-sparsity --skip-decode-step \
          --gemm-rows "$AB_GEMM_ROWS" > "$LOGS/gemm_ab_$name.log" 2>&1 || note "ab GEMM table $name FAILED"
        grep -E "^ *[0-9]+  (qkv|o|gate_up|down|lm_head|all) " "$LOGS/gemm_ab_$name.log" \
          | cut -c1-120 | sed "s/^/gemm $name: /" | tee -a "$summary"
      done
    fi
  else
    note "ab: no .ab/ build (build_ab.log)"; tail -20 "$LOGS/build_ab.log" 2>/dev/null
  fi
fi

if has serve_ab; then
  # A serving change against .ab/'s tree (scripts/prepare_ab.sh REV, carried) in one run: for each
  # tree in turn, AB_ROUNDS times (default 2), a warmed-up server (Llama-3-8B shape, dummy
  # weights, full:0-2,pyramidkv:3-31 budget 400, --max-num-seqs 64) and at each level C of
  # SERVE_AB_LEVELS (default "1 32") 4000/300 prompts: 3 at C = 1, 2C otherwise. SERVE_AB_ARGS
  # adds arguments to both servers (e.g. "--log-level debug": the step tuning decisions).
  # .ab/'s sieve builds beside this tree's (half the cores each) unless the build stage built it.
  if [ -z "${ab_build:-}" ] && [ -z "${ab_built:-}" ] && [ -d .ab ]; then
    (cd .ab && { [ -f build/gpu/build.ninja ] || cmake --preset gpu; } && \
      cmake --build --preset gpu -j "$(( $(nproc) / 2 ))" --target sieve) > "$LOGS/build_ab.log" 2>&1 &
    ab_build=$!
  fi
  ensure_sieve
  ab_ready
  tok=testdata/tokenizers/llama3/tokenizer.model
  sieves=(./build/gpu/sieve)
  if [ -x .ab/build/gpu/sieve ]; then
    sieves+=(.ab/build/gpu/sieve)
  else
    note "serve_ab: no .ab/ build (build_ab.log)"; tail -20 "$LOGS/build_ab.log" 2>/dev/null
  fi
  for round in $(seq 1 "${AB_ROUNDS:-2}"); do
    for binary in "${sieves[@]}"; do
      name=$( [ "$binary" = ./build/gpu/sieve ] && echo this || echo ab )
      # shellcheck disable=SC2086
      start_server "$binary" "$LOGS/serve_ab_${name}_$round.log" --max-num-batched-tokens 8192 \
        --max-num-seqs 64 --kv-policy "full:0-2,pyramidkv:3-31" ${SERVE_AB_ARGS:-}
      for level in ${SERVE_AB_LEVELS:-1 32}; do
        prompts=$(( level == 1 ? 3 : 2 * level ))
        log="$LOGS/bench_serve_ab_${name}_${round}_c$level.log"
        "$binary" bench serve --base-url http://127.0.0.1:8123 --tokenizer "$tok" \
          --input-len 4000 --output-len 300 --num-prompts "$prompts" --max-concurrency "$level" \
          --ignore-eos --warmup 1 --no-progress > "$log" 2>&1 || note "serve_ab $name C=$level FAILED"
        echo "serve_ab $name $round C=$level: $(grep -E "Output token throughput|Mean TPOT|Median TPOT|Median ITL|Mean TTFT" "$log" | tr -s ' ' | tr '\n' ';')" >> "$summary"
      done
      kill -TERM $pid; wait $pid
    done
  done
  grep "serve_ab" "$summary"
fi

if has chunk_ab; then
  # The step's token budget (--max-num-batched-tokens) against serving throughput: for each budget
  # of CHUNK_AB_TOKENS (default "8192 2048"), AB_ROUNDS times (default 1), a warmed-up server as
  # the headline's sparse one (Llama-3-8B shape, dummy weights, full:0-2,pyramidkv:3-31 budget
  # 400) and `sieve bench sweep` 4000/500 at CHUNK_AB_LEVELS (default 20,128,256; prompts
  # CHUNK_AB_PROMPTS, default 40,256,256), each level beside its bound at fixed ceilings
  # (CHUNK_AB_CEILINGS "copy GB/s, GEMM TFLOP/s, attention TFLOP/s", default the headline
  # record's "4225 703 555"). CHUNK_AB_POLICY (default the sparse one) may be "full".
  ensure_sieve
  tok=testdata/tokenizers/llama3/tokenizer.model
  read -r copy gemm att <<< "${CHUNK_AB_CEILINGS:-4225 703 555}"
  policy="${CHUNK_AB_POLICY:-full:0-2,pyramidkv:3-31}"
  for round in $(seq 1 "${AB_ROUNDS:-1}"); do
    for tokens in ${CHUNK_AB_TOKENS:-8192 2048}; do
      start=$(date +%s)
      start_server ./build/gpu/sieve "$LOGS/chunk_ab_serve_${tokens}_$round.log" \
        --max-num-batched-tokens "$tokens" --kv-policy "$policy"
      log="$LOGS/chunk_ab_${tokens}_$round.log"
      ./build/gpu/sieve bench sweep --base-url http://127.0.0.1:8123 --tokenizer "$tok" \
        --input-len 4000 --output-len 500 --concurrency "${CHUNK_AB_LEVELS:-20,128,256}" \
        --num-prompts-per-level "${CHUNK_AB_PROMPTS:-40,256,256}" --ignore-eos --warmup 2 \
        --no-progress --label "tokens $tokens" --bound-model-config configs/llama-3-8b \
        --bound-kv-policy "$policy" --bound-kv-budget 400 --bound-kv-window 32 \
        --bound-gemm-tflops "$gemm" --bound-attention-tflops "$att" --bound-copy-gbs "$copy" \
        --result-json "$OUT/sweep_chunk_${tokens}_$round.json" > "$log" 2>&1 \
        || note "chunk_ab $tokens FAILED: $(tail -3 "$log")"
      kill -TERM $pid; wait $pid
      note "chunk_ab --max-num-batched-tokens $tokens, round $round ($(( $(date +%s) - start )) s):"
      grep -E "^\|" "$log" | tee -a "$summary"
    done
  done
fi

if has sampling; then
  # The GPU sampler's table (sieve bench kernels: 1/64/256 rows, greedy, top-k, top-p, top-k + top-p,
  # min-p), for this tree and, with .ab/ (scripts/prepare_ab.sh REV, carried), for that tree's
  # sieve, alternately, AB_ROUNDS times each: a sampler change measured in one run.
  ensure_sieve
  ab_sieves sampling
  for round in $(seq 1 "${AB_ROUNDS:-3}"); do
    for binary in "${sieves[@]}"; do
      name=$( [ "$binary" = ./build/gpu/sieve ] && echo this || echo ab )
      "$binary" bench kernels --skip-attention --skip-gemm --skip-decode-step \
        > "$LOGS/sampling_${name}_$round.log" 2>&1 || note "sampling bench $name FAILED"
      grep -E "^ +(1|64|256) \|" "$LOGS/sampling_${name}_$round.log" | tr -s " " | tr "\n" ";" | \
        sed "s/^/sampling $name $round: /" >> "$summary"
      echo >> "$summary"
    done
  done
  grep -A6 "^GPU sampling" "$LOGS/sampling_this_1.log" | tee -a "$summary"
fi

if has attention; then
  # The attention kernels' table (prefill causal 4k and 16k at d128, 4k at d64, both prefill
  # kernels; paged decode) with cuDNN SDPA's rates measured by PyTorch in the same run
  # (attention_sdpa.json), for this tree and, with .ab/ (scripts/prepare_ab.sh REV, carried), for
  # that tree's sieve, alternately, AB_ROUNDS times each (default 2).
  ensure_sieve
  ab_sieves attention
  python3 scripts/sdpa_bench.py > "$OUT/attention_sdpa.json" 2> "$LOGS/attention_sdpa.log" \
    || note "sdpa FAILED"
  python3 -c "import json; print('cuDNN SDPA:', '; '.join(f\"{r['n']} d{r['d']} {r['tflops']:.0f} TFLOP/s\" for r in json.load(open('$OUT/attention_sdpa.json'))['results'] if r['backend'] == 'cudnn' and 'tflops' in r))" \
    | tee -a "$summary"
  for round in $(seq 1 "${AB_ROUNDS:-2}"); do
    for binary in "${sieves[@]}"; do
      name=$( [ "$binary" = ./build/gpu/sieve ] && echo this || echo ab )
      json=()  # this tree's first round also as kernels.json (the page's kernels record)
      [ "$name" = this ] && [ "$round" = 1 ] && json=(--result-json "$OUT/kernels.json")
      "$binary" bench kernels --skip-gemm --skip-decode-step --skip-sparsity "${json[@]}" \
        > "$LOGS/attention_${name}_$round.log" 2>&1 || note "attention bench $name FAILED"
      grep -E "^prefill causal" "$LOGS/attention_${name}_$round.log" | \
        sed -E "s/ +/ /g; s/^/attention $name $round: /" | cut -c1-110 >> "$summary"
    done
  done
  grep "^attention " "$summary"
fi

if has profile; then
  # Where a sparse decode step (batch 64 x 4k, 1/10 kept) spends its time, summed over the three
  # --profile-step steps: every kernel alone under Nsight Compute, caches flushed before each
  # (ncu's default), by kernel name.
  timeout 300 ncu --clock-control none --profile-from-start off --metrics gpu__time_duration.sum \
    --csv --log-file "$LOGS/ncu_step.csv" ./build/gpu/sieve bench kernels --skip-attention \
    --skip-sparsity --skip-gemm --no-graph --no-step-variants --profile-step \
    > "$LOGS/ncu_bench.log" 2>&1
  note "profile: exit $?"
  python3 scripts/ncu_summary.py "$LOGS/ncu_step.csv" 2>&1 | head -30 | tee -a "$summary"
fi

if has timeline; then
  # Three sparse decode steps back to back, each kernel (graph node) on a GPU timeline: Nsight
  # Systems where installed, else tools/kernel_timeline (CUPTI); the middle step's kernel times
  # and the gaps between kernels, by transition (scripts/timeline_gaps.py).
  nsys=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems*/bin/nsys \
    /usr/local/cuda/nsight-systems*/bin/nsys 2>/dev/null | head -1)
  step_args=(bench kernels --skip-attention --skip-sparsity --skip-gemm --no-step-variants
    --profile-step)
  trace="$LOGS/step_timeline.csv"
  if [ -n "$nsys" ]; then
    timeout 300 "$nsys" profile --capture-range=cudaProfilerApi --cuda-graph-trace=node -t cuda \
      -o /tmp/sieve_step --force-overwrite true ./build/gpu/sieve "${step_args[@]}" \
      > "$LOGS/timeline.log" 2>&1
    note "timeline: nsys exit $?"
    "$nsys" stats --report cuda_gpu_trace --format csv -o /tmp/sieve_step \
      /tmp/sieve_step.nsys-rep >> "$LOGS/timeline.log" 2>&1
    cp /tmp/sieve_step_cuda_gpu_trace.csv "$trace" 2>/dev/null
  else
    CUDA_INJECTION64_PATH="$PWD/build/gpu/tools/libsieve_kernel_timeline.so" \
      SIEVE_TIMELINE_CSV="$trace" timeout 300 ./build/gpu/sieve "${step_args[@]}" \
      > "$LOGS/timeline.log" 2>&1
    note "timeline: CUPTI (no nsys) exit $?"
  fi
  grep -E "^(dense|1/10 kept)|kernel_timeline" "$LOGS/timeline.log" | tee -a "$summary"
  python3 scripts/timeline_gaps.py "$trace" 2>&1 | head -80 | tee -a "$summary"
fi

if has serve_timeline; then
  # Where a served run's time goes: the headline's sparse server (4000/500, full:0-2,pyramidkv:3-31,
  # budget 400, --max-num-batched-tokens 8192) under tools/kernel_timeline (CUPTI, whole process),
  # `sieve bench serve` (2 warm-up requests, then twice C prompts) at each C of
  # SERVE_TIMELINE_LEVELS (default "128"), a fresh server each; then scripts/timeline_steps.py
  # --totals: the run's time by step kind (decode graph, eager prefill or mixed) and by kernel
  # within each, from the first gap of over a second on (the server's warm-up is done by then).
  ensure_sieve
  cmake --build --preset gpu --target sieve_kernel_timeline > "$LOGS/build_timeline.log" 2>&1
  tok=testdata/tokenizers/llama3/tokenizer.model
  for level in ${SERVE_TIMELINE_LEVELS:-128}; do
    CUDA_INJECTION64_PATH="$PWD/build/gpu/tools/libsieve_kernel_timeline.so" SIEVE_TIMELINE_WHOLE=1 \
      SIEVE_TIMELINE_CSV=/tmp/serve_timeline.csv start_server ./build/gpu/sieve \
      "$LOGS/serve_timeline_server_c$level.log" --max-num-batched-tokens 8192 \
      --kv-policy "full:0-2,pyramidkv:3-31"
    sleep 2  # a gap of over a second between the warm-up's last kernel and the client's first
    ./build/gpu/sieve bench serve --base-url http://127.0.0.1:8123 --tokenizer "$tok" \
      --input-len 4000 --output-len 500 --num-prompts $(( 2 * level )) --max-concurrency "$level" \
      --ignore-eos --warmup 2 --no-progress > "$LOGS/serve_timeline_bench_c$level.log" 2>&1 \
      || note "serve_timeline C=$level: bench FAILED"
    kill -TERM $pid; wait $pid
    note "serve_timeline C=$level (traced): $(grep -E "Benchmark duration|Output token throughput|Mean TTFT|Mean TPOT" \
      "$LOGS/serve_timeline_bench_c$level.log" | tr -s ' ' | tr '\n' ';')"
    python3 scripts/timeline_steps.py /tmp/serve_timeline.csv --after-idle-ms 1000 --totals \
      --by-graph > "$LOGS/serve_timeline_c$level.txt" 2>&1
    sed "s/^/C=$level: /" "$LOGS/serve_timeline_c$level.txt" | tee -a "$summary" | head -12
    rm -f /tmp/serve_timeline.csv
  done
fi

if has fp8; then
  # FP8 weights against bf16 in one run (bench kernels twice, --quantization none then fp8): the
  # decode step at batch 64 x 4096 (dense and 1/10 kept) beside its byte bound, the prefill step
  # (2 x 4000, dense and sparse) beside its GEMMs' bound, and the layer's GEMMs bf16 against FP8
  # at 1 to 8192 rows (the fp8 run's table, with the bf16 decode GEMM table).
  ensure_sieve
  for q in ${FP8_RUNS:-none fp8}; do
    # The bf16 side's GEMMs are in the fp8 run's table. FP8_RUNS=fp8: that run alone.
    # shellcheck disable=SC2046
    timeout 400 ./build/gpu/sieve bench kernels --skip-attention --skip-sparsity --no-step-variants \
      $( [ "$q" = none ] && echo --skip-gemm ) \
      --prefill-step --quantization "$q" --result-json "$OUT/kernels_$q.json" \
      > "$LOGS/fp8_bench_$q.log" 2>&1 || note "bench kernels --quantization $q FAILED (rc $?)"
    grep -E "^(dense|sparse|1/10 kept)" "$LOGS/fp8_bench_$q.log" | sed "s/^/$q: /" | tee -a "$summary"
  done
  grep -E "^ +[0-9]+  (qkv|o|gate_up|down|the layer)" "$LOGS/fp8_bench_fp8.log" | tee -a "$summary"
fi

if has fp8_decode_ab; then
  # TEMPORARY (the FP8 decode A/Bs; removed with the losers): the decode step at batch 64 x 4096
  # with FP8 weights and FP8 KV (dense and 1/10 kept) under each variant of FP8_AB_VARIANTS,
  # "ATTENTION,GEMM" pairs (SIEVE_AB_FP8_DECODE = tiles | registers | registers4, SIEVE_AB_FP8_GEMM
  # = first | all), alternately, FP8_AB_ROUNDS rounds (default 2), until FP8_AB_END (epoch
  # seconds) if set.
  ensure_sieve
  for round in $(seq 1 "${FP8_AB_ROUNDS:-2}"); do
    for variant in ${FP8_AB_VARIANTS:-tiles,first registers,first registers,all registers4,all}; do
      if [ -n "${FP8_AB_END:-}" ] && [ "$(date +%s)" -gt "$FP8_AB_END" ]; then
        note "fp8_decode_ab: deadline reached before round $round $variant"; break 2
      fi
      start=$(date +%s)
      name="${variant/,/_}_r$round"
      SIEVE_AB_FP8_DECODE=${variant%,*} SIEVE_AB_FP8_GEMM=${variant#*,} timeout 200 \
        ./build/gpu/sieve bench kernels --skip-attention --skip-sparsity --skip-gemm \
        --no-step-variants --quantization fp8 --kv-cache-dtype fp8 \
        --result-json "$LOGS/fp8_decode_ab_$name.json" > "$LOGS/fp8_decode_ab_$name.log" 2>&1 \
        || note "fp8_decode_ab $variant FAILED (rc $?)"
      grep -E "^(dense|1/10 kept)|decode attention" "$LOGS/fp8_decode_ab_$name.log" \
        | sed "s/^/$variant r$round ($(( $(date +%s) - start )) s): /" | tee -a "$summary"
    done
  done
fi

if has kv_fp8; then
  # The FP8 KV cache against the bf16 one in one run, both with FP8 weights: the decode step at
  # batch 64 x 4096 (dense and 1/10 kept) beside its byte bound (bench kernels twice,
  # --kv-cache-dtype auto then fp8).
  ensure_sieve
  for kv in auto fp8; do
    timeout 300 ./build/gpu/sieve bench kernels --skip-attention --skip-sparsity --skip-gemm \
      --no-step-variants --quantization fp8 --kv-cache-dtype "$kv" \
      --result-json "$OUT/kernels_fp8_kv_$kv.json" > "$LOGS/kv_fp8_bench_$kv.log" 2>&1 \
      || note "bench kernels --kv-cache-dtype $kv FAILED (rc $?)"
    grep -E "^(dense|1/10 kept)|decode attention|copy" "$LOGS/kv_fp8_bench_$kv.log" | sed "s/^/kv $kv: /" \
      | tee -a "$summary"
  done
fi

if has serve_fp8; then
  # Serving with FP8 weights against bf16 (Llama-3-8B shape, dummy weights, 4000/500 prompts,
  # SERVE_FP8_LEVELS, default "64"; 2C prompts a level), dense and sparse
  # (full:0-2,pyramidkv:3-31, budget 400), each on a fresh warmed-up server.
  ensure_sieve
  tok=testdata/tokenizers/llama3/tokenizer.model
  # SERVE_FP8_RUNS: weights[+fp8kv] of each server, default "none fp8 fp8+fp8kv".
  for kv in ${SERVE_FP8_POLICIES:-full full:0-2,pyramidkv:3-31}; do
    for run in ${SERVE_FP8_RUNS:-none fp8 fp8+fp8kv}; do
      q=${run%%+*}
      kv_dtype=$( [[ "$run" == *+fp8kv ]] && echo fp8 || echo auto )
      name="${run/+/_}_$( [ "$kv" = full ] && echo dense || echo sparse )"
      start_server ./build/gpu/sieve "$LOGS/serve_fp8_$name.log" --max-num-batched-tokens 8192 \
        --kv-policy "$kv" --quantization "$q" --kv-cache-dtype "$kv_dtype" \
        || { note "serve_fp8 $name: server FAILED"; tail -5 "$LOGS/serve_fp8_$name.log"; continue; }
      for level in ${SERVE_FP8_LEVELS:-64}; do
        log="$LOGS/bench_serve_fp8_${name}_c$level.log"
        ./build/gpu/sieve bench serve --base-url http://127.0.0.1:8123 --tokenizer "$tok" \
          --input-len 4000 --output-len 500 --num-prompts $(( 2 * level )) --max-concurrency "$level" \
          --ignore-eos --warmup 1 --no-progress --result-json "$OUT/serve_fp8_${name}_c$level.json" \
          > "$log" 2>&1 || note "serve_fp8 $name C=$level FAILED"
        note "serve_fp8 $name C=$level: $(grep -E "Output token throughput|Median TTFT|Median TPOT" "$log" | tr -s ' ' | tr '\n' ';')"
      done
      kill -TERM $pid; wait $pid
    done
  done
fi

if has arch_sm90; then
  # A build for plain sm_90 (what CMAKE_CUDA_ARCHITECTURES=native gives on an H100 or H200): the
  # device code it loads has no sm_90a kernels, so the prefill attention falls back to the sm_80
  # kernel (device_image.h); the dense, GEMM and attention tests must pass on it.
  start=$(date +%s)
  { cmake -S . -B build/sm90 -G Ninja -DCMAKE_BUILD_TYPE=Release -DSIEVE_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES=90 -DSIEVE_BUILD_BENCHMARKS=OFF && \
    cmake --build build/sm90 -j "$(nproc)" --target cuda_test; } > "$LOGS/build_sm90.log" 2>&1 \
    || { note "sm_90 build FAILED"; tail -20 "$LOGS/build_sm90.log"; }
  ./build/sm90/backend/cuda/cuda_test --gtest_filter='CudaDeviceImage*:CudaDenseTest.*:*Prefill*' \
    > "$LOGS/sm90_tests.log" 2>&1
  note "sm_90 build ($(( $(date +%s) - start )) s): cuda_test exit $? ($(grep -E '^\[  PASSED  \]|^\[  FAILED  \]' "$LOGS/sm90_tests.log" | tr '\n' ' '))"
  grep -E "runs code built for|FAILED  \]" "$LOGS/sm90_tests.log" | head -12 | tee -a "$summary"
fi

if has prefill; then
  # Issue 19 item 3: a prefill step (2 prompts x 4000 tokens in one engine step) beside its bound,
  # the GEMMs at cuBLASLt's alone rate and attention at cuDNN SDPA's (PyTorch, same run); then the
  # sparse step's kernels on a timeline (tools/kernel_timeline), by kind. With .ab/ (made by
  # scripts/prepare_ab.sh REV, carried), the same for that tree's sieve, alternately,
  # PREFILL_ROUNDS times each (1 or 2, default 2).
  ensure_sieve
  trees=(.)
  if [ -d .ab ]; then
    # The build stage's background build of .ab, else one now.
    ab_ready || (cd .ab && { [ -f build/gpu/build.ninja ] || cmake --preset gpu; } && \
      cmake --build --preset gpu -j "$(nproc)" --target sieve sieve_kernel_timeline) \
      > "$LOGS/build_ab_prefill.log" 2>&1 || note "build of .ab FAILED"
    if [ -x .ab/build/gpu/sieve ]; then
      trees=(. .ab)
      [ "${PREFILL_ROUNDS:-2}" -ge 2 ] && trees=(. .ab . .ab)
    fi
  fi
  [ -f "$OUT/sdpa.json" ] || python3 scripts/sdpa_bench.py > "$OUT/sdpa.json" 2> "$LOGS/sdpa.log"
  cudnn=$(python3 -c "import json; r=[x for x in json.load(open('$OUT/sdpa.json'))['results'] if x['backend']=='cudnn' and x['n']==4096 and x.get('d', 128)==128]; print(round(r[0]['tflops']) if r else 0)" 2>/dev/null || echo 0)
  note "prefill: cuDNN SDPA at 4k: $cudnn TFLOP/s (the bound's attention rate)"
  [ -f build/gpu/tools/libsieve_kernel_timeline.so ] || \
    cmake --build --preset gpu --target sieve_kernel_timeline > "$LOGS/build_timeline.log" 2>&1
  run=0
  for tree in "${trees[@]}"; do
    run=$((run + 1)); name=$( [ "$tree" = . ] && echo tree || echo ab )
    [ ${#trees[@]} -gt 1 ] && note "prefill run $run: $name ($( [ "$tree" = . ] && echo this tree || echo .ab/))"
    csv="$LOGS/prefill_timeline_$run.csv"
    json="$OUT/kernels.json"; [ ${#trees[@]} -gt 1 ] && json="$OUT/prefill_${name}_$run.json"
    CUDA_INJECTION64_PATH="$PWD/$tree/build/gpu/tools/libsieve_kernel_timeline.so" \
      SIEVE_TIMELINE_CSV="$csv" timeout 300 "$tree/build/gpu/sieve" bench kernels --skip-attention \
      --skip-sparsity --skip-gemm --skip-decode-step --prefill-step \
      --prefill-attention-tflops "$cudnn" --profile-prefill --result-json "$json" \
      > "$LOGS/prefill_$run.log" 2>&1 || note "prefill bench FAILED: $(tail -3 "$LOGS/prefill_$run.log")"
    grep -E "^(dense|sparse)|^    " "$LOGS/prefill_$run.log" | tee -a "$summary"
    # The kernels by kind, then the largest gaps between them by transition.
    [ -f "$csv" ] && python3 scripts/timeline_gaps.py "$csv" > "$LOGS/prefill_gaps_$run.txt" 2>&1 \
      && { grep -E "^timeline(:| kernel)" "$LOGS/prefill_gaps_$run.txt" | head -16
           grep -E "^timeline gap" "$LOGS/prefill_gaps_$run.txt" | head -6; } | tee -a "$summary"
  done
fi

# The headline, dense against the sparse setting, each level beside its bound (`sieve bench sweep
# --bound-*`), on warmed-up servers. HEADLINE=4k (4000/500 at C = 1, 20, 64, 128, 256;
# full:0-2,pyramidkv:3-31, budget 400) or 16k (16000/500 at C = 16, 48; budget 1024) or all
# (default; more than one device call's 10 minutes), or 70b / 70b-16k (the Llama-3-70B shape split
# over TP_SIZE GPUs, default all: 4000/500 at C = 1, 20, 64, 128, or 16000/500 at C = 16, 48, with
# full:0-2,pyramidkv:3-79 and bounds for that many ranks; at TP_SIZE = 2 the 4000/500 prefills
# alone come to about 180 s a side at 687 TFLOP/s, the H100's rate in record
# 2026-12-06-h100-headline-4k (computed), so run each side in its own call with HEADLINE_KV). The
# ceilings are measured first: the copy rate, the prefill GEMMs' rate (bench kernels
# --prefill-step) and cuDNN SDPA's. `prefill headline` takes them from the prefill stage, so that
# one call records the prefill step (with its timeline) and the headline over the same ceilings.
# HEADLINE_KV="sparse" (or "dense") runs one side only, at half the device time; the default runs
# both. On an H100 both run at 4k in about 460 s, the dense side pool-limited from C = 128 (its KV
# pool holds about 104 dense sequences of 4,500 entries; record 2026-12-06-h100-headline-4k).
if has headline; then
  ensure_sieve
  tok=testdata/tokenizers/llama3/tokenizer.model
  part="${HEADLINE:-all}"
  [ -f "$OUT/sdpa.json" ] || python3 scripts/sdpa_bench.py > "$OUT/sdpa.json" 2> "$LOGS/sdpa.log"
  # The ceilings: the prefill stage's step of this run when it ran (kernels.json), else one now.
  grep -q prefill_step_dense "$OUT/kernels.json" 2>/dev/null || \
    timeout 200 ./build/gpu/sieve bench kernels --skip-attention --skip-sparsity --skip-gemm \
      --skip-decode-step --prefill-step --result-json "$OUT/kernels.json" > "$LOGS/ceilings.log" 2>&1 \
    || note "ceilings FAILED: $(tail -3 "$LOGS/ceilings.log")"
  read -r copy gemm att4k att16k < <(python3 - "$OUT" <<'PY'
import json, sys
k = json.load(open(f"{sys.argv[1]}/kernels.json"))
p = k["prefill_step_dense"]
gemm = p["gemm_flops"] / (p["gemm_bound_ms"] * 1e-3) / 1e12  # the prefill GEMMs' alone rate
sdpa = {r["n"]: r.get("tflops", 0) for r in json.load(open(f"{sys.argv[1]}/sdpa.json"))["results"]
        if r["backend"] == "cudnn" and r.get("d", 128) == 128}
print(round(k["copy_bandwidth_gbs"]), round(gemm), round(sdpa.get(4096, 0)), round(sdpa.get(16384, 0)))
PY
)
  note "headline ceilings: copy $copy GB/s, prefill GEMMs $gemm TFLOP/s, cuDNN SDPA $att4k (4k) / $att16k (16k) TFLOP/s"
  workloads=()
  # name, model shape, input tokens, --max-model-len, --kv-budget, attention rate, levels, prompts
  # per level, tensor parallel size. 16k prompts need Llama 3.1's context (Llama 3's is 8192).
  # HEADLINE=70b and 70b-16k: the Llama-3-70B shape over TP_SIZE GPUs (default: all of them),
  # the multi-GPU runs' headline; the sweeps' names (70b-4k-tp4) say shape, length and ranks, as
  # scripts/render_benchmarks.py reads them.
  [ "$part" = 4k ] || [ "$part" = all ] && \
    workloads+=("4k configs/llama-3-8b 4000 4600 400 $att4k 1,20,64,128,256 4,40,128,256,256 1")
  [ "$part" = 16k ] || [ "$part" = all ] && \
    workloads+=("16k configs/llama-3.1-8b 16000 16600 1024 $att16k 16,48 32,96 1")
  tp_size="${TP_SIZE:-$(nvidia-smi -L | wc -l)}"
  [ "$part" = 70b ] && workloads+=("70b-4k-tp$tp_size configs/llama-3-70b 4000 4600 400 $att4k \
    1,20,64,128 4,40,128,256 $tp_size")
  [ "$part" = 70b-16k ] && workloads+=("70b-16k-tp$tp_size configs/llama-3.1-70b 16000 16600 1024 \
    $att16k 16,48 32,96 $tp_size")
  for workload in "${workloads[@]}"; do
    read -r name model input max_len budget att levels prompts tp <<< "$workload"
    layers=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['num_hidden_layers'])" \
      "$model/config.json")
    for policy in full "full:0-2,pyramidkv:3-$((layers - 1))"; do
      kind=$( [ "$policy" = full ] && echo dense || echo sparse )
      [[ " ${HEADLINE_KV:-dense sparse} " == *" $kind "* ]] || continue
      ./build/gpu/sieve serve --model "$model" --load-format dummy --tokenizer "$tok" \
        --port 8123 --max-model-len "$max_len" --max-num-batched-tokens 8192 --no-progress \
        --tensor-parallel-size "$tp" --kv-policy "$policy" --kv-budget "$budget" --kv-window 32 \
        > "$LOGS/headline_serve_${name}_$kind.log" 2>&1 &
      pid=$!
      wait_for_server $pid
      if ! kill -0 $pid 2>/dev/null; then
        note "headline $name $kind: serve FAILED: $(tail -1 "$LOGS/headline_serve_${name}_$kind.log")"
        continue
      fi
      ./build/gpu/sieve bench sweep --base-url http://127.0.0.1:8123 --tokenizer "$tok" \
        --input-len "$input" --output-len 500 --concurrency "$levels" \
        --num-prompts-per-level "$prompts" --ignore-eos --warmup 2 \
        --no-progress --label "$kind $name" --metadata policy="$policy" budget="$budget" \
        --bound-model-config "$model" --bound-kv-policy "$policy" \
        --bound-kv-budget "$budget" --bound-kv-window 32 --bound-gemm-tflops "$gemm" \
        --bound-attention-tflops "$att" --bound-copy-gbs "$copy" --bound-tensor-parallel-size "$tp" \
        --result-json "$OUT/sweep_${name}_$kind.json" > "$LOGS/headline_${name}_$kind.log" 2>&1 \
        || note "headline $name $kind FAILED: $(tail -3 "$LOGS/headline_${name}_$kind.log")"
      kill -TERM $pid; wait $pid
      note "headline $name $kind ($policy, budget $budget):"
      grep -E "^\|" "$LOGS/headline_${name}_$kind.log" | tee -a "$summary"
    done
  done
fi

# The FP8 headline (issue 58 item 6): the Llama-3.1-8B shape (dummy weights) served by `sieve
# serve` in each configuration FP8_HEADLINE_RUNS names, default "bf16-dense fp8-dense fp8-sparse
# fp8-fp8kv-sparse", each WEIGHTS[-fp8kv]-KV: bf16 or fp8 weights (--quantization fp8), fp8kv an
# FP8 KV cache (--kv-cache-dtype fp8), dense (--kv-policy full) or sparse
# (full:0-2,pyramidkv:3-31, budget 400, window 32); each on a fresh warmed-up server, each level
# beside its bound (`sieve bench sweep --bound-*`, the weights' and KV's dtypes the server's).
# FP8_HEADLINE=5k (default): trtllm-bench throughput's workload, 5000/500 with 1500 requests
# (FP8_HEADLINE_PROMPTS) sent at once (one level of concurrency 1500); 4k: the headline's
# 4000/500 levels (C = 1, 20, 64, 128, 256). The ceilings come first, in the same call: the copy
# rate and the FP8 prefill GEMMs' rate (bench kernels --prefill-step --quantization fp8), the bf16
# prefill GEMMs' (--quantization none, when a bf16 run is asked; else the LM head's bf16 GEMMs,
# one row a prompt, take bench kernels' bf16 8192^3 rate), cuDNN SDPA's at 4k (for 5000 tokens
# too). Time: the ceilings about 1-2 min, a server's start about 1 min, then a 5k configuration's
# 750k output tokens at 85% of its bound, the bound on an H100 at record
# 2026-12-07-h100-fp8-weights's rates (copy 3,015 GB/s, GEMMs 687 bf16 / 839 FP8 TFLOP/s):
# bf16-dense 1,990 tok/s, 7.4 min; fp8-dense 2,280, 6.5 min (a KV pool of about 100 sequences of
# 5,500 bf16 entries: pool-limited); fp8-fp8kv-dense 3,210, 4.6 min; fp8-sparse 4,230, 3.5 min;
# fp8-fp8kv-sparse 4,760, 3.1 min. So one device call (10 min) runs one configuration, or
# fp8-sparse and fp8-fp8kv-sparse together; bf16-dense fits with FP8_HEADLINE_PROMPTS=1000 (its
# row says so). 4k: about 4 min a configuration. Files: fp8_headline_<5k|4k>_<run>.json.
if has fp8_headline; then
  ensure_sieve
  tok=testdata/tokenizers/llama3/tokenizer.model
  runs="${FP8_HEADLINE_RUNS:-bf16-dense fp8-dense fp8-sparse fp8-fp8kv-sparse}"
  workload="${FP8_HEADLINE:-5k}"
  case "$workload" in
    5k) input=5000; max_len=5600; levels=1500; prompts="${FP8_HEADLINE_PROMPTS:-1500}" ;;
    4k) input=4000; max_len=4600; levels=1,20,64,128,256; prompts=4,40,128,256,256 ;;
    *) note "fp8_headline: FP8_HEADLINE is 5k or 4k, not $workload"; exit 1 ;;
  esac
  start=$(date +%s)
  [ -f "$OUT/sdpa.json" ] || python3 scripts/sdpa_bench.py > "$OUT/sdpa.json" 2> "$LOGS/sdpa.log"
  quantizations=fp8
  [[ " $runs " == *" bf16-"* ]] && quantizations="none fp8"
  for q in $quantizations; do
    timeout 300 ./build/gpu/sieve bench kernels --skip-attention --skip-sparsity --skip-gemm \
      --skip-decode-step --prefill-step --quantization "$q" --result-json "$OUT/kernels_$q.json" \
      > "$LOGS/fp8_headline_ceilings_$q.log" 2>&1 \
      || note "fp8_headline ceilings ($q) FAILED: $(tail -3 "$LOGS/fp8_headline_ceilings_$q.log")"
  done
  read -r copy gemm fp8_gemm att < <(python3 - "$OUT" <<'PY'
import json, os, sys
out = sys.argv[1]
def rate(kernels):  # the prefill GEMMs' alone rate, TFLOP/s
    p = kernels["prefill_step_dense"]
    return p["gemm_flops"] / (p["gemm_bound_ms"] * 1e-3) / 1e12
fp8 = json.load(open(f"{out}/kernels_fp8.json"))
bf16 = (rate(json.load(open(f"{out}/kernels_none.json"))) if os.path.exists(f"{out}/kernels_none.json")
        else fp8["gemm_tflops"])
sdpa = {r["n"]: r.get("tflops", 0) for r in json.load(open(f"{out}/sdpa.json"))["results"]
        if r["backend"] == "cudnn" and r.get("d", 128) == 128}
print(round(fp8["copy_bandwidth_gbs"]), round(bf16), round(rate(fp8)), round(sdpa.get(4096, 0)))
PY
)
  note "fp8_headline ceilings ($(( $(date +%s) - start )) s): copy $copy GB/s, prefill GEMMs bf16 $gemm / FP8 $fp8_gemm TFLOP/s, cuDNN SDPA $att TFLOP/s (4k)"
  model=configs/llama-3.1-8b
  for run in $runs; do
    [[ "$run" =~ ^(bf16|fp8)(-fp8kv)?-(dense|sparse)$ ]] \
      || { note "fp8_headline: no such run $run (bf16|fp8, then -fp8kv or not, then -dense|-sparse)"; continue; }
    q=$( [[ "$run" == fp8-* ]] && echo fp8 || echo none )
    kv_dtype=$( [[ "$run" == *-fp8kv-* ]] && echo fp8 || echo auto )
    policy=$( [[ "$run" == *-dense ]] && echo full || echo "full:0-2,pyramidkv:3-31" )
    start=$(date +%s)
    ./build/gpu/sieve serve --model "$model" --load-format dummy --tokenizer "$tok" \
      --port 8123 --max-model-len "$max_len" --max-num-batched-tokens 8192 --no-progress \
      --quantization "$q" --kv-cache-dtype "$kv_dtype" --kv-policy "$policy" --kv-budget 400 \
      --kv-window 32 > "$LOGS/fp8_headline_serve_${workload}_$run.log" 2>&1 &
    pid=$!
    wait_for_server $pid
    if ! kill -0 $pid 2>/dev/null; then
      note "fp8_headline $workload $run: serve FAILED: $(tail -1 "$LOGS/fp8_headline_serve_${workload}_$run.log")"
      continue
    fi
    ready=$(( $(date +%s) - start ))
    ./build/gpu/sieve bench sweep --base-url http://127.0.0.1:8123 --tokenizer "$tok" \
      --input-len "$input" --output-len 500 --concurrency "$levels" \
      --num-prompts-per-level "$prompts" --ignore-eos --warmup 2 --no-progress \
      --label "$run $workload" --metadata run="$run" quantization="$q" kv_cache_dtype="$kv_dtype" \
      policy="$policy" budget=400 \
      --bound-model-config "$model" --bound-kv-policy "$policy" --bound-kv-budget 400 \
      --bound-kv-window 32 --bound-quantization "$q" --bound-kv-cache-dtype "$kv_dtype" \
      --bound-gemm-tflops "$gemm" --bound-fp8-gemm-tflops "$fp8_gemm" \
      --bound-attention-tflops "$att" --bound-copy-gbs "$copy" \
      --result-json "$OUT/fp8_headline_${workload}_$run.json" \
      > "$LOGS/fp8_headline_${workload}_$run.log" 2>&1 \
      || note "fp8_headline $workload $run FAILED: $(tail -3 "$LOGS/fp8_headline_${workload}_$run.log")"
    kill -TERM $pid; wait $pid
    note "fp8_headline $workload $run ($policy, --quantization $q, --kv-cache-dtype $kv_dtype; server ready in $ready s, $(( $(date +%s) - start )) s in all):"
    grep -E "^\|" "$LOGS/fp8_headline_${workload}_$run.log" | tee -a "$summary"
    grep -hE "^(bound|warning)" "$LOGS/fp8_headline_${workload}_$run.log" | sort -u | tee -a "$summary"
    # 1500 requests' records come to about 19 MB, past what the device tool brings back: gzipped
    # (record_gpu_results.py reads NAME.json.gz).
    [ -f "$OUT/fp8_headline_${workload}_$run.json" ] && gzip -9f "$OUT/fp8_headline_${workload}_$run.json"
  done
fi

if has prefix_cache; then
  # Issue 60's measurements: prefix caching on against off (--no-enable-prefix-caching), dense and
  # sparse (full:0-2,pyramidkv:3-31, budget 400), each on a fresh server, Llama-3-8B shape with
  # dummy weights and bf16. Workloads (PREFIX_CACHE_WORKLOADS, default "shared turns"):
  # - shared: one 2,000-token prefix shared by every request, a 200-token suffix of its own and
  #   200 out (vLLM's prefix-repetition dataset), at each of PREFIX_CACHE_LEVELS (default "8 64")
  #   requests in flight, 4 x C requests (at least 64) a level, on the same server;
  # - turns: PREFIX_CACHE_CONVERSATIONS (default 32) 10-turn conversations at once, a 1,000-token
  #   first message, 200-token messages after it, 200 out a turn.
  # Files: prefix_cache_<workload>_<dense|sparse>_<on|off>[_c<level>].json.
  ensure_sieve
  tok=testdata/tokenizers/llama3/tokenizer.model
  for workload in ${PREFIX_CACHE_WORKLOADS:-shared turns}; do
    case "$workload" in
      shared) data=(--dataset-name prefix-repetition --prefix-repetition-prefix-len 2000
                    --prefix-repetition-suffix-len 200 --prefix-repetition-num-prefixes 1
                    --prefix-repetition-output-len 200); levels="${PREFIX_CACHE_LEVELS:-8 64}" ;;
      turns) data=(--dataset-name multi-turn --multi-turn-num-turns 10 --multi-turn-first-len 1000
                   --multi-turn-message-len 200 --multi-turn-output-len 200
                   --num-prompts "${PREFIX_CACHE_CONVERSATIONS:-32}"); levels=all ;;
      *) note "prefix_cache: no such workload $workload (shared, turns)"; continue ;;
    esac
    for policy in ${PREFIX_CACHE_POLICIES:-full full:0-2,pyramidkv:3-31}; do
      kind=$( [ "$policy" = full ] && echo dense || echo sparse )
      for cache in ${PREFIX_CACHE_RUNS:-on off}; do
        name="${workload}_${kind}_$cache"
        start=$(date +%s)
        start_server ./build/gpu/sieve "$LOGS/prefix_cache_server_$name.log" \
          --max-num-batched-tokens 8192 --kv-policy "$policy" \
          $( [ "$cache" = off ] && echo --no-enable-prefix-caching ) \
          || { note "prefix_cache $name: server FAILED: $(tail -1 "$LOGS/prefix_cache_server_$name.log")"; continue; }
        for level in $levels; do
          run="$name"; level_args=()
          if [ "$level" != all ]; then
            run="${name}_c$level"
            level_args=(--max-concurrency "$level" --num-prompts $(( 4 * level < 64 ? 64 : 4 * level )))
          fi
          ./build/gpu/sieve bench serve --base-url http://127.0.0.1:8123 --tokenizer "$tok" \
            "${data[@]}" "${level_args[@]}" --ignore-eos --no-progress \
            --label "prefix cache $cache, $workload, $kind" --metadata workload="$workload" \
            policy="$policy" prefix_caching="$cache" budget=400 \
            --result-json "$OUT/prefix_cache_$run.json" > "$LOGS/prefix_cache_$run.log" 2>&1 \
            || note "prefix_cache $run: bench FAILED: $(tail -3 "$LOGS/prefix_cache_$run.log")"
          note "prefix_cache $run ($(( $(date +%s) - start )) s): $(grep -E "Output token throughput|Median TTFT|P99 TTFT|Median TPOT|hit rate|first turns|later turns" \
            "$LOGS/prefix_cache_$run.log" | tr -s ' ' | tr '\n' ';')"
        done
        kill -TERM $pid; wait $pid
      done
    done
  done
fi

if has preemption; then
  # Issue 62 item 1: preemption by recompute against swap (--preemption-mode), each on a fresh
  # server (Llama-3-8B shape, dummy weights, bf16), 4000/500 random prompts at
  # PREEMPTION_LEVELS (default 256) requests in flight, PREEMPTION_PROMPTS prompts a level
  # (default 2 x C), under PREEMPTION_POLICIES (default sparse full:0-2,pyramidkv:3-31 budget
  # 400, then dense), with
  # --kv-memory PREEMPTION_KV_MEMORY (default 16G: a pool that C = 256 sparse sequences
  # outgrow, so that preemption happens) and --swap-space PREEMPTION_SWAP_SPACE GiB (default 32).
  # After each run the server's counters: preemptions, swaps out / in, fallbacks, replayed
  # tokens. Files: preemption_<dense|sparse>_<mode>_c<level>.json.
  ensure_sieve
  tok=testdata/tokenizers/llama3/tokenizer.model
  counters() {  # the server's preemption counters, one line
    python3 - <<'PY'
import re, urllib.request
text = urllib.request.urlopen("http://127.0.0.1:8123/metrics", timeout=10).read().decode()
names = ["num_preemptions_total", "num_swapped_out_total", "num_swapped_in_total",
         "num_swap_fallbacks_total", "num_replayed_tokens_total"]
values = {m.group(1): m.group(2) for m in re.finditer(r"^sieve:(\w+)(?:\{[^}]*\})? (\S+)$", text, re.M)}
print(", ".join(f"{name} {values.get(name, '?')}" for name in names))
PY
  }
  for policy in ${PREEMPTION_POLICIES:-full:0-2,pyramidkv:3-31 full}; do
    kind=$( [ "$policy" = full ] && echo dense || echo sparse )
    for mode in ${PREEMPTION_MODES:-recompute swap}; do
      start_server ./build/gpu/sieve "$LOGS/preemption_server_${kind}_$mode.log" \
        --max-num-batched-tokens 8192 --max-num-seqs 256 --kv-policy "$policy" \
        --kv-memory "${PREEMPTION_KV_MEMORY:-16G}" --preemption-mode "$mode" \
        --swap-space "${PREEMPTION_SWAP_SPACE:-32}" \
        || { note "preemption $kind $mode: server FAILED: $(tail -1 "$LOGS/preemption_server_${kind}_$mode.log")"; continue; }
      for level in ${PREEMPTION_LEVELS:-256}; do
        run="${kind}_${mode}_c$level"
        start=$(date +%s)
        ./build/gpu/sieve bench serve --base-url http://127.0.0.1:8123 --tokenizer "$tok" \
          --input-len 4000 --output-len 500 \
          --max-concurrency "$level" --num-prompts "${PREEMPTION_PROMPTS:-$(( 2 * level ))}" \
          --ignore-eos --warmup 1 --no-progress --label "preemption $mode, $kind" --metadata policy="$policy" \
          preemption_mode="$mode" budget=400 --result-json "$OUT/preemption_$run.json" \
          > "$LOGS/preemption_$run.log" 2>&1 || note "preemption $run: bench FAILED"
        note "preemption $run ($(( $(date +%s) - start )) s): $(grep -E "Output token throughput|Median TTFT|Median TPOT" \
          "$LOGS/preemption_$run.log" | tr -s ' ' | tr '\n' ';') $(counters)"
      done
      kill -TERM $pid; wait $pid
    done
  done
fi

if has batch_invariant; then
  # Issue 62 items 2 and 3: what --batch-invariant costs. Each policy of BATCH_INVARIANT_POLICIES
  # (default dense, then full:0-2,pyramidkv:3-31 budget 400) served by a fresh server without the
  # flag and one with it (Llama-3-8B shape, dummy weights, bf16), 4000/500 random prompts at
  # BATCH_INVARIANT_LEVELS (default 64) requests in flight, BATCH_INVARIANT_PROMPTS prompts a
  # level (default 2 x C); the issue's bound is at most 15% lower output throughput at C = 64.
  # Then the decode and prefill steps alone, without and with the flag (sieve bench kernels).
  # Files: batch_invariant_<dense|sparse>_<default|invariant>_c<level>.json. Its tests:
  # `GPU_TESTS=BatchInvariant scripts/gpu_check.sh build test`.
  ensure_sieve
  tok=testdata/tokenizers/llama3/tokenizer.model
  for policy in ${BATCH_INVARIANT_POLICIES:-full full:0-2,pyramidkv:3-31}; do
    kind=$( [ "$policy" = full ] && echo dense || echo sparse )
    for mode in default invariant; do
      flag=$( [ "$mode" = invariant ] && echo --batch-invariant )
      start_server ./build/gpu/sieve "$LOGS/batch_invariant_server_${kind}_$mode.log" \
        --max-num-seqs 256 --kv-policy "$policy" $flag \
        || { note "batch_invariant $kind $mode: server FAILED: $(tail -1 "$LOGS/batch_invariant_server_${kind}_$mode.log")"; continue; }
      for level in ${BATCH_INVARIANT_LEVELS:-64}; do
        run="${kind}_${mode}_c$level"
        start=$(date +%s)
        ./build/gpu/sieve bench serve --base-url http://127.0.0.1:8123 --tokenizer "$tok" \
          --input-len 4000 --output-len 500 \
          --max-concurrency "$level" --num-prompts "${BATCH_INVARIANT_PROMPTS:-$(( 2 * level ))}" \
          --ignore-eos --warmup 1 --no-progress --label "batch-invariant $mode, $kind" \
          --metadata policy="$policy" batch_invariant="$mode" budget=400 \
          --result-json "$OUT/batch_invariant_$run.json" \
          > "$LOGS/batch_invariant_$run.log" 2>&1 || note "batch_invariant $run: bench FAILED"
        note "batch_invariant $run ($(( $(date +%s) - start )) s): $(grep -E "Output token throughput|Median TTFT|Median TPOT" \
          "$LOGS/batch_invariant_$run.log" | tr -s ' ' | tr '\n' ';')"
      done
      kill -TERM $pid; wait $pid
    done
  done
  for mode in default invariant; do
    flag=$( [ "$mode" = invariant ] && echo --batch-invariant )
    ./build/gpu/sieve bench kernels --skip-attention --skip-sparsity --skip-gemm \
      --no-step-variants --prefill-step $flag \
      > "$LOGS/batch_invariant_steps_$mode.log" 2>&1 || note "batch_invariant steps $mode: FAILED"
    note "batch_invariant steps $mode: $(grep -E "^(dense|sparse|1/10 kept)" "$LOGS/batch_invariant_steps_$mode.log" \
      | tr -s ' ' | tr '\n' ';')"
  done
fi

if has accuracy_fp8; then
  # Issue 58's accuracy rows on the GPU: the default model's grid (every task and perplexity, 1k
  # to 3.84k tokens, dense, SnapKV and PyramidKV at budgets 256 and 1024) three times, every
  # other setting equal, so that docs/accuracy.md compares them cell for cell: bf16 weights and
  # KV cache, FP8 weights (--quantization fp8), FP8 weights + FP8 KV (--kv-cache-dtype fp8).
  # Needs the carried .data/eval. Files: sieve-tiny-10m-<bf16|fp8|fp8-kv-fp8>-gpu.json (records
  # this large are committed gzipped: scripts/render_accuracy.py).
  ensure_sieve
  for spec in bf16:none:auto fp8:fp8:auto fp8-kv-fp8:fp8:fp8; do
    IFS=: read -r name quantization kv_dtype <<< "$spec"
    start=$(date +%s)
    timeout 300 ./build/gpu/sieve eval --device cuda --no-progress \
      --task passkey,niah,niah-multikey,niah-multivalue,kv-retrieval,variable-tracking,common-words,perplexity \
      --lengths 1000,2000,3840 --depths 0,0.25,0.5,0.75,1 --samples 10 --seed 0 \
      --haystack .data/eval/haystack --text .data/eval/text --ppl-tokens 256 \
      --kv-policy snapkv --kv-policy pyramidkv --kv-budget 256,1024 \
      --quantization "$quantization" --kv-cache-dtype "$kv_dtype" \
      --result-json "$OUT/sieve-tiny-10m-$name-gpu.json" > "$LOGS/accuracy_fp8_$name.log" 2>&1
    note "accuracy_fp8 $name: rc $? in $(( $(date +%s) - start )) s"
    [ -f "$OUT/sieve-tiny-10m-$name-gpu.json" ] && \
      python3 scripts/accuracy_summary.py "$OUT/sieve-tiny-10m-$name-gpu.json" >> "$summary"
  done
fi

if has accuracy; then
  # docs/accuracy.md's GPU records: the default model at 1k-4k, dense against every policy at
  # every budget, on every task; again with prompts ending in the space before the answer
  # (--prompt-suffix " ": the token that retrieves is then in the prompt); perplexity; and the CPU
  # record CI checks, on the GPU. The held-out haystack and text come from the carried .data/eval,
  # made by scripts/train/fetch_data.sh. ACCURACY_SAMPLES samples per cell (default 10);
  # ACCURACY_SECONDS (default 420) bounds the stage, each run getting what is left.
  ensure_sieve
  samples="${ACCURACY_SAMPLES:-10}"
  deadline=$(( $(date +%s) + ${ACCURACY_SECONDS:-420} ))
  policies=(--kv-policy snapkv --kv-policy pyramidkv --kv-policy streamingllm --kv-policy h2o
            --kv-policy "full:0-2,pyramidkv:3-7" --kv-budget 64,128,256,512,1024)
  grid=(--lengths 1000,2000,4000 --depths 0,0.25,0.5,0.75,1 --samples "$samples" --seed 0
        --haystack .data/eval/haystack "${policies[@]}")
  accuracy_run() {  # NAME, then sieve eval's arguments
    local name=$1; shift
    local left=$(( deadline - $(date +%s) )) start=$(date +%s)
    if [ "$left" -lt 20 ]; then note "accuracy $name: skipped, the stage's time is spent"; return; fi
    timeout "$left" ./build/gpu/sieve eval --device cuda --no-progress "$@" \
      --result-json "$OUT/$name.json" --plot-dir "$LOGS/$name-plots" > "$LOGS/$name.log" 2>&1
    note "accuracy $name: rc $? in $(( $(date +%s) - start )) s"
    [ -f "$OUT/$name.json" ] && python3 scripts/accuracy_summary.py "$OUT/$name.json" >> "$summary"
  }
  accuracy_run sieve-tiny-10m-gpu "${grid[@]}" \
    --task passkey,niah,niah-multikey,niah-multivalue,kv-retrieval,variable-tracking,common-words
  # Only the tasks whose answers are numbers: this tokenizer (as Llama 3's) splits the space off
  # digits, while it joins it to the words and quotes the other answers start with.
  accuracy_run sieve-tiny-10m-answer-space-gpu "${grid[@]}" --prompt-suffix " " \
    --task passkey,niah,niah-multikey,niah-multivalue
  accuracy_run sieve-tiny-10m-perplexity-gpu --task perplexity --lengths 1000,2000,3840 \
    --samples 16 --seed 0 --text .data/eval/text --ppl-tokens 256 "${policies[@]}"
  # The CPU record CI checks, re-run on the GPU: the two backends' greedy answers compared.
  SIEVE_EVAL_DEVICE=cuda bash tools/eval/default_model_check.sh build/gpu/sieve . \
    > "$LOGS/ci_record_on_gpu.log" 2>&1
  note "the CI passkey record on the GPU (rc $?): $(tail -1 "$LOGS/ci_record_on_gpu.log")"
  grep FAIL "$LOGS/ci_record_on_gpu.log" >> "$summary"
fi

if has soak; then
  # docs/reliability.md's GPU soak: scripts/soak.py against `sieve serve --device cuda` (the
  # default model, a pool small enough to preempt), then a short one with the server under
  # compute-sanitizer's memcheck (its report in logs/soak_memcheck_sanitizer.log).
  ensure_sieve
  start=$(date +%s)
  # SOAK_ARGS adds arguments, e.g. "--replay-max 1000 -- --batch-invariant" (strict: every
  # replayed answer must equal the one under load, issue 62).
  python3 scripts/soak.py --sieve build/gpu/sieve --device cuda --requests "${SOAK_REQUESTS:-5000}" \
    --clients 64 --result-json "$OUT/soak-gpu.json" ${SOAK_ARGS:-} > "$LOGS/soak_gpu.log" 2>&1
  note "soak on the GPU: rc $? in $(( $(date +%s) - start )) s"
  tail -30 "$LOGS/soak_gpu.log" >> "$summary"
  # The soak stops its server with SIGTERM and wants exit status 0: the wrapper hands the signal
  # to sieve (compute-sanitizer's child) so that it drains and exits, and compute-sanitizer then
  # writes its summary and exits with sieve's status (3 on any memcheck error).
  wrapper=/tmp/sieve-under-memcheck
  cat > "$wrapper" <<WRAPPER
#!/usr/bin/env bash
compute-sanitizer --tool memcheck --error-exitcode 3 --log-file "$LOGS/soak_memcheck_sanitizer.log" \\
  "$PWD/build/gpu/sieve" "\$@" &
sanitizer=\$!
trap 'pkill -TERM -P \$sanitizer' TERM INT
wait \$sanitizer; status=\$?
[ \$status -gt 128 ] && wait \$sanitizer && status=\$?
exit \$status
WRAPPER
  chmod +x "$wrapper"
  start=$(date +%s)
  timeout 300 python3 scripts/soak.py --sieve "$wrapper" --device cuda --requests 400 --clients 8 \
    --no-rss-check --startup-timeout 150 --request-timeout 150 \
    --result-json "$OUT/soak-gpu-memcheck.json" > "$LOGS/soak_memcheck.log" 2>&1
  note "soak under compute-sanitizer memcheck: rc $? in $(( $(date +%s) - start )) s;" \
    "$(grep -h "ERROR SUMMARY" "$LOGS/soak_memcheck_sanitizer.log" | tail -1)"
  tail -12 "$LOGS/soak_memcheck.log" >> "$summary"
fi

if has sdpa; then
  python3 scripts/sdpa_bench.py > "$OUT/sdpa.json" 2> "$LOGS/sdpa.log" || note "sdpa FAILED"
  python3 -c "import json; d=json.load(open('$OUT/sdpa.json')); [print('sdpa', r['backend'], r['n'], 'd', r.get('d', 128), round(r.get('tflops',0)), 'TFLOP/s', r.get('error','')) for r in d['results']]" >> "$summary"
fi

# Warm start (issue 19 item 1): a fresh server's first benchmark against its second, with the
# start-up warm-up and without it (--no-warm-up), on the sparse setting at C=128, 4000/500.
if has warm; then
  ensure_sieve
  tok=testdata/tokenizers/llama3/tokenizer.model
  for mode in on off; do
    flag=$( [ "$mode" = off ] && echo --no-warm-up )
    start=$(date +%s.%N)
    # shellcheck disable=SC2086
    start_server ./build/gpu/sieve "$LOGS/serve_warm_$mode.log" --max-num-batched-tokens 8192 \
      --kv-policy "full:0-2,pyramidkv:3-31" $flag
    note "warm start $mode: /health 200 after $(python3 -c "print(round($(date +%s.%N) - $start, 1))") s;" \
      "$(grep -h "warm-up" "$LOGS/serve_warm_$mode.log" | tail -1 | sed 's/.*warm-up/warm-up/')"
    for run in first second; do
      ./build/gpu/sieve bench serve --base-url http://127.0.0.1:8123 --tokenizer "$tok" \
        --input-len 4000 --output-len 500 --num-prompts 256 --max-concurrency 128 --ignore-eos \
        --warmup 0 --no-progress --label "warm-$mode-$run" --metadata warm_up=$mode \
        --result-json "$OUT/serve_warm_${mode}_$run.json" > "$LOGS/bench_warm_${mode}_$run.log" 2>&1 \
        || note "bench serve warm $mode $run FAILED"
    done
    kill -TERM $pid; wait $pid; note "serve warm $mode exited with $?"
    python3 - "$OUT" "$mode" <<'PY' | tee -a "$summary"
import json, sys
out, mode = sys.argv[1], sys.argv[2]
m = [json.load(open(f"{out}/serve_warm_{mode}_{run}.json"))["metrics"] for run in ("first", "second")]
ratio = m[0]["output_throughput"] / m[1]["output_throughput"]
print(f"warm start {mode}: first {m[0]['output_throughput']:.0f} out tok/s, second "
      f"{m[1]['output_throughput']:.0f}: first / second {ratio:.3f} (target >= 0.97); max ITL "
      f"{m[0]['max_itl_ms']:.0f} / {m[1]['max_itl_ms']:.0f} ms; P50 TTFT {m[0]['median_ttft_ms']:.0f} / "
      f"{m[1]['median_ttft_ms']:.0f} ms")
PY
  done
fi

if has serve; then
  # Issue 5's numbers: Llama-3-8B-shaped dummy model, 4000/500, concurrency 10, dense and sparse.
  tok=testdata/tokenizers/llama3/tokenizer.model
  for policy in full "full:0-2,pyramidkv:3-31"; do
    name=$( [ "$policy" = full ] && echo dense || echo sparse )
    start_server ./build/gpu/sieve "$LOGS/serve_$name.log" --max-num-batched-tokens 8192 \
      --kv-policy "$policy"
    ./build/gpu/sieve bench serve --base-url http://127.0.0.1:8123 --tokenizer "$tok" \
      --input-len 4000 --output-len 500 --num-prompts 40 --max-concurrency 10 --ignore-eos \
      --warmup 2 --no-progress --label "$name" --metadata policy="$policy" \
      --result-json "$OUT/serve_$name.json" > "$LOGS/bench_serve_$name.log" 2>&1 \
      || note "bench serve $name FAILED"
    kill -TERM $pid; wait $pid; note "serve $name exited with $?"
    note "serve $name:"; grep -E "throughput|TTFT|TPOT|ITL|Successful|Failed" "$LOGS/bench_serve_$name.log" >> "$summary"
  done
fi
