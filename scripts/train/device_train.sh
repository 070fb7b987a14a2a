#!/usr/bin/env bash
# One call of the device tool that trains (or resumes training) Sieve's model:
#   carry: .data/text .data/eval [.resume]
#   command: bash scripts/train/device_train.sh [smoke] train
# `smoke` first runs a few steps of a tiny configuration through every stage (tokenizer, data,
# validation, export, the transformers check) so a broken stage costs seconds, not a call.
# `train` trains in /tmp/sieve-train until STEPS or TIME_LIMIT seconds, resuming from the
# checkpoint there (a warm machine) or from .resume/ (weights a previous call sent back).
# What comes back in $OUT: train.out (stdout), train_log.jsonl, and either the exported model
# (model_small_files.tgz + safetensors shards) or fp32 weights to resume from.
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/sieve-train-out}"
STEPS="${STEPS:-4000}"
TIME_LIMIT="${TIME_LIMIT:-480}"
WORK="${WORK:-/tmp/sieve-train}"
mkdir -p "$WORK" "$OUT"
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
for stage in "$@"; do
  case "$stage" in
    smoke)
      rm -rf /tmp/sieve-smoke
      timeout 240 python3 scripts/train/train.py --data .data --work /tmp/sieve-smoke \
        --out /tmp/sieve-smoke/out --tokenizer "$WORK/tokenizer" --steps 6 --batch 4 \
        --seq-len 1024 --val-every 3 --val-rows 2 --workers 2 --warmup 2 --no-compile 2>&1 \
        | grep -v Warning || exit 1
      ls -la /tmp/sieve-smoke/out /tmp/sieve-smoke/model || exit 1
      ;;
    train)
      resume=()
      # Weights a call sent back, with its resume_small_files.tgz unpacked beside them.
      [ -f .resume/state.json ] && resume=(--resume-weights .resume --tokenizer .resume)
      timeout $((TIME_LIMIT + 150)) python3 scripts/train/train.py --data .data --work "$WORK" --out "$OUT" --steps "$STEPS" \
        --time-limit "$TIME_LIMIT" --send-weights "${resume[@]}" ${TRAIN_ARGS:-} 2>&1 \
        | tee "$OUT/train.out" | grep --line-buffered -v '"loss"' 
      grep '"step"' "$OUT/train.out" | tail -3
      ;;
  esac
done
ls -la "$OUT"
