#!/usr/bin/env bash
# The default model's card (models/sieve-tiny-10m/README.md) from its template, training log and
# the `sieve eval` records it cites. `--check` (CI): exit 1 when the card is stale.
#   scripts/train/render_default_card.sh [--check]
set -euo pipefail
cd "$(dirname "$0")/../.."
records=bench/results/accuracy
# The dense and perplexity records predate the `command` field: their commands are given here.
python3 scripts/train/render_model_card.py \
  --dense-eval "$records/sieve-tiny-10m-dense-cpu.json" \
  --dense-command "sieve eval --model models/sieve-tiny-10m --device cpu --lengths 1000,2000,4000 --depths 0,0.25,0.5,0.75,1 --samples 4 --seed 0 --haystack .data/eval/haystack --result-json $records/sieve-tiny-10m-dense-cpu.json --plot-dir PLOTS" \
  --ci-eval "$records/sieve-tiny-10m-ci-passkey-cpu.json" \
  --perplexity-eval "$records/sieve-tiny-10m-perplexity-cpu.json" \
  --perplexity-command "sieve eval --model models/sieve-tiny-10m --device cpu --task perplexity --lengths 1000,2000,3840 --samples 4 --seed 0 --text .data/eval/text --ppl-tokens 256 --kv-policy snapkv --kv-policy streamingllm --kv-budget 256" \
  "$@"
