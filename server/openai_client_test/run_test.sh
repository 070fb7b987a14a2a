#!/usr/bin/env bash
# CTest's openai_client_test: the official OpenAI Node client (test.mjs) against `sieve serve`.
# Installs the pinned client (package-lock.json) into WORK_DIR, outside the source tree, with
# `npm ci` when that copy is missing or stale, then runs test.mjs there. Exits 77 (CTest's
# SKIP_RETURN_CODE) when node or npm is missing or node is older than the client supports.
# Usage: run_test.sh SIEVE_BINARY SOURCE_DIR WORK_DIR
set -euo pipefail
sieve="$1"
source_dir="$2"
work="$3"
here="$source_dir/server/openai_client_test"
kMinNodeMajor=20  # the pinned openai package supports Node.js 20 LTS and later

skip() { echo "SKIP openai_client_test: $1"; exit 77; }
command -v node > /dev/null || skip "node is not installed (scripts/bootstrap.sh installs it)"
command -v npm > /dev/null || skip "npm is not installed (scripts/bootstrap.sh installs it)"
node_major=$(node -p 'process.versions.node.split(".")[0]')
if [ "$node_major" -lt "$kMinNodeMajor" ]; then
  skip "node $(node --version) is older than the v$kMinNodeMajor the openai package needs"
fi

mkdir -p "$work"
cp "$here/package.json" "$here/package-lock.json" "$here/test.mjs" "$work/"
# npm ci deletes and reinstalls node_modules: only when the lock file changed since the last one.
stamp="$work/node_modules/.sieve-package-lock.json"
if ! cmp -s "$work/package-lock.json" "$stamp" 2> /dev/null; then
  echo "npm ci in $work"
  if ! (cd "$work" && npm ci --no-audit --no-fund --loglevel=error); then
    echo "FAIL openai_client_test: 'npm ci' could not install the openai package (is the npm" \
         "registry reachable?)"
    exit 1
  fi
  cp "$work/package-lock.json" "$stamp"
fi
cd "$work"
exec node test.mjs "$sieve" "$source_dir/models/sieve-tiny-10m"
