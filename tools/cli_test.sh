#!/usr/bin/env bash
# The `sieve` command against bad input from outside: each case must fail with a non-zero exit
# and a message that names the problem, never crash. Also the happy paths of generate, tokenize,
# inspect. Usage: cli_test.sh SIEVE_BINARY SOURCE_DIR
set -u
sieve="$1"
source_dir="$2"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
model="$source_dir/testdata/models/llama2_mha"

# expect_fail NAME PATTERN COMMAND...: exit code 1 or 2 (not a signal), stderr matches PATTERN.
expect_fail() {
  local name="$1" pattern="$2"
  shift 2
  "$@" > "$work/out" 2> "$work/err" < "${STDIN:-/dev/null}"
  local rc=$?
  if [ $rc -eq 0 ] || [ $rc -ge 128 ]; then
    echo "FAIL $name: exit code $rc (want a clean non-zero exit)"; cat "$work/err"; failures=$((failures + 1))
  elif ! grep -qiE "$pattern" "$work/err"; then
    echo "FAIL $name: stderr does not match '$pattern':"; cat "$work/err"; failures=$((failures + 1))
  else
    echo "ok   $name: $(grep -iE "$pattern" "$work/err" | head -1 | cut -c1-150)"
  fi
}
expect_ok() {
  local name="$1"
  shift
  if "$@" > "$work/out" 2> "$work/err" < "${STDIN:-/dev/null}"; then
    echo "ok   $name"
  else
    echo "FAIL $name: exit $?"; cat "$work/err"; failures=$((failures + 1))
  fi
}
copy_model() { rm -rf "$work/m"; cp -r "$model" "$work/m"; }
gen() { "$sieve" generate --device cpu --kv-memory 64M --log-level warn "$@"; }

expect_ok "generate on a fixture model" gen --model "$model" --prompt "Hello" -n 5 --temperature 0
grep -q "tokens generated" "$work/err" || { echo "FAIL generate: no summary line"; failures=$((failures + 1)); }

# --batch-invariant on the CPU (whose kernels are batch-invariant already): the same tokens, and a
# step budget below one page is a clear error.
gen --model "$model" --prompt "Hello there, how are you" -n 8 --temperature 0 > "$work/plain" 2> /dev/null
expect_ok "generate --batch-invariant" gen --model "$model" --prompt "Hello there, how are you" -n 8 \
  --temperature 0 --batch-invariant
cmp -s "$work/plain" "$work/out" || { echo "FAIL generate --batch-invariant: other tokens"; failures=$((failures + 1)); }
expect_fail "--batch-invariant within a page" "batch-invariant.*whole pages" gen --model "$model" \
  --prompt hi --batch-invariant --max-num-batched-tokens 4

copy_model; head -c 1000 "$model/model.safetensors" > "$work/m/model.safetensors"
expect_fail "truncated safetensors" "model.safetensors|truncated|past the end|bounds" gen --model "$work/m" --prompt hi

copy_model; printf '\x08\x00\x00\x00\x00\x00\x00\x00{"a": 1' > "$work/m/model.safetensors"
expect_fail "corrupt safetensors header" "model.safetensors|header|json" gen --model "$work/m" --prompt hi

copy_model; printf '\xff\xff\xff\xff\xff\xff\x00\x00' > "$work/m/model.safetensors"
expect_fail "absurd header length" "header" gen --model "$work/m" --prompt hi

copy_model; sed -i 's/"hidden_size": 64/"hidden_size": 96/' "$work/m/config.json"
expect_fail "config disagrees with tensors" "shape|expected" gen --model "$work/m" --prompt hi

copy_model; sed -i 's/"num_hidden_layers": 2/"num_hidden_layers": 3/' "$work/m/config.json"
expect_fail "missing tensors named" "model.layers.2" gen --model "$work/m" --prompt hi

copy_model; sed -i 's/LlamaForCausalLM/GPT2LMHeadModel/' "$work/m/config.json"
expect_fail "unsupported architecture" "unsupported architecture GPT2LMHeadModel" gen --model "$work/m" --prompt hi

copy_model; rm "$work/m/tokenizer.json"
expect_fail "missing tokenizer" "tokenizer" gen --model "$work/m" --prompt hi

copy_model; echo '{"model": {"type": "WordPiece"}}' > "$work/m/tokenizer.json"
expect_fail "unknown tokenizer type" "WordPiece" gen --model "$work/m" --prompt hi

expect_fail "missing model directory" "does not exist" gen --model "$work/nope" --prompt hi

expect_fail "invalid UTF-8 prompt" "UTF-8" gen --model "$model" --prompt "$(printf 'ab\xffcd')"

long=$(head -c 3000 /dev/zero | tr '\0' 'x')
expect_fail "prompt longer than the context" "longer than the context|context holds" \
  gen --model "$model" --prompt "$long" --max-model-len 128

expect_fail "bad flag value" "kv-pool|max, avg or none" gen --prompt hi --kv-pool median
expect_fail "bad kv policy" "unknown policy|policy" gen --prompt hi --kv-policy "magic:0-3"

expect_fail "bench kernels unknown step variant" "step-variant: bogus not in" \
  "$sieve" bench kernels --step-variant no_pdl,bogus
# sieve bench cpu on a fixture model, small: every measurement positive and the target judged.
expect_ok "bench cpu" "$sieve" bench cpu --model "$model" --log-level warn --prompts 2 \
  --prompt-len 48 --decode-batch 2 --decode-context 16 --decode-tokens 4 --gemm-size 64 \
  --result-json "$work/cpu.json"
python3 - "$work/cpu.json" <<'PY' || { echo "FAIL bench cpu: its JSON"; failures=$((failures + 1)); }
import json, sys
r = json.load(open(sys.argv[1]))
assert r["fma_peak_gflops"] > 0 and r["gemm_gflops"] > 0 and r["read_bandwidth_gbs"] > 0, r
assert r["prefill"]["gflops"] > 0 and r["prefill"]["met"] in (True, False), r
assert r["decode"]["tokens_per_s"] > 0 and r["decode"]["bound_tokens_per_s"] > 0, r
PY
grep -q "target >= 50% of the GEMM rate: \(MET\|MISSED\)" "$work/out" \
  || { echo "FAIL bench cpu: no prefill target line"; failures=$((failures + 1)); }
expect_fail "bench cpu on a GPU" "runs on the CPU" "$sieve" bench cpu --device cuda
expect_fail "bench cpu with no prompts" "positive" "$sieve" bench cpu --prompts 0
expect_fail "bench kernels step variants with none" "no-step-variants excludes --step-variant" \
  "$sieve" bench kernels --no-step-variants --step-variant no_pdl

evl() { "$sieve" eval --device cpu --kv-memory 64M --log-level warn --no-progress "$@"; }
expect_fail "eval unknown task" "unknown task 'needle'" evl --task needle
expect_fail "eval depth outside [0, 1]" "depths must be in \[0, 1\]" evl --depths 0,2
expect_fail "eval budget below the window" "observation window" evl --kv-policy snapkv --kv-budget 16
expect_fail "eval missing haystack" "haystack.*does not exist" evl --task niah --haystack "$work/nope"
printf '{"context": "c", "input": "q", "answers": ["a"]}\n{"context": "c"}\n' > "$work/data.jsonl"
expect_fail "eval malformed jsonl" "data.jsonl:2: missing \"input\"" evl --task jsonl --data "$work/data.jsonl"
expect_fail "eval length over the context" "max model length" evl --model "$model" --lengths 4096

printf 'This is a test sentence.' > "$work/text"
STDIN="$work/text" expect_ok "tokenize" "$sieve" tokenize --tokenizer "$model" --no-bos
grep -q '^\[' "$work/out" || { echo "FAIL tokenize: output is not a JSON array"; failures=$((failures + 1)); }
expect_fail "tokenize missing tokenizer" "tokenizer" "$sieve" tokenize --tokenizer "$work/nope"

expect_ok "inspect" "$sieve" inspect --model "$model"
grep -q "KV bytes / token" "$work/out" || { echo "FAIL inspect: no KV bytes line"; failures=$((failures + 1)); }

# A published-format FP8 checkpoint (compressed-tensors; scripts/make_fp8_checkpoint.py).
fp8_model="$source_dir/testdata/models/llama_fp8_compressed"
expect_ok "inspect an FP8 checkpoint" "$sieve" inspect --model "$fp8_model"
for want in "FP8 checkpoint, compressed-tensors" "14 linears per channel" "static per tensor" \
    "K/V scales: present \(2 of 2 layers\)" "FP8 as stored"; do
  grep -qE "$want" "$work/out" || { echo "FAIL inspect fp8: no '$want'"; cat "$work/out"; failures=$((failures + 1)); }
done
expect_ok "generate on an FP8 checkpoint" gen --model "$fp8_model" --prompt "Hello" -n 5 --temperature 0
grep -q "tokens generated" "$work/err" || { echo "FAIL generate fp8: no summary line"; failures=$((failures + 1)); }
expect_ok "generate on an FP8 checkpoint with its K/V scales" gen --model "$fp8_model" \
  --kv-cache-dtype fp8 --prompt "Hello" -n 5 --temperature 0
expect_ok "generate with dummy FP8 weights" gen --model "$model" --load-format dummy --quantization fp8 \
  --prompt "Hello" -n 3
copy_fp8() { rm -rf "$work/m"; cp -r "$fp8_model" "$work/m"; }
copy_fp8; sed -i 's/"strategy": "channel"/"strategy": "block"/' "$work/m/config.json"
expect_fail "FP8 block-wise scales" "block" gen --model "$work/m" --prompt hi
copy_fp8; sed -i 's/"quant_method": "compressed-tensors"/"quant_method": "awq"/' "$work/m/config.json"
expect_fail "AWQ checkpoint" "quant_method 'awq' is not supported" gen --model "$work/m" --prompt hi
copy_fp8; sed -i 's/self_attn.q_proj.weight_scale/self_attn.q_proj.weight_scalX/' "$work/m/model.safetensors"
expect_fail "FP8 weight_scale missing" "q_proj.weight_scale is missing" gen --model "$work/m" --prompt hi

if [ $failures -ne 0 ]; then echo "$failures failure(s)"; exit 1; fi
echo "all cli cases passed"
