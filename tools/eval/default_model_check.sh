#!/usr/bin/env bash
# The default model's passkey scores on the CPU, dense and at two sparse policies, must equal the
# record its model card states (bench/results/accuracy/sieve-tiny-10m-ci-passkey-cpu.json), cell
# by cell: greedy decoding of fixed-seed samples is deterministic, so any change in a score means
# the model, the engine or a policy changed what it computes.
#   default_model_check.sh SIEVE_BINARY SOURCE_DIR           # the test (CTest runs it)
#   default_model_check.sh SIEVE_BINARY SOURCE_DIR --update  # rewrite the record
# SIEVE_EVAL_DEVICE=cuda runs the same samples on the GPU backend (scripts/gpu_check.sh accuracy),
# which compares the backends: bf16 activations may flip a greedy answer on a near tie.
set -euo pipefail
sieve="$1"
source_dir="$2"
record="$source_dir/bench/results/accuracy/sieve-tiny-10m-ci-passkey-cpu.json"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
device="${SIEVE_EVAL_DEVICE:-cpu}"
flags=(eval --device "$device" --threads 2 --task passkey --lengths 512,1024 --depths 0,0.5,1
       --samples 2 --seed 0 --kv-memory 256M --kv-policy snapkv --kv-policy streamingllm
       --kv-budget 64 --no-progress --log-level warn)
if [ "${3:-}" = "--update" ]; then
  (cd "$source_dir" && "$sieve" "${flags[@]}" --result-json "$record")
  echo "wrote $record"
  exit 0
fi
"$sieve" "${flags[@]}" --result-json "$work/now.json" > "$work/table.txt"
cat "$work/table.txt"
python3 - "$record" "$work/now.json" <<'PY'
import json, sys
want, got = (json.load(open(path)) for path in sys.argv[1:3])
key = lambda c: (c["task"], c["length"], c["depth"], c["config"])
got_cells = {key(c): c for c in got["cells"]}
failures = 0
for cell in want["cells"]:
    now = got_cells.get(key(cell))
    if now is None or now["score"] != cell["score"]:
        failures += 1
        print(f"FAIL {key(cell)}: recorded {cell['score']}, now {now and now['score']}")
print(f"{len(want['cells']) - failures} passed, {failures} failed")
sys.exit(1 if failures or len(want["cells"]) != len(got["cells"]) else 0)
PY
