#!/usr/bin/env bash
# Puts the files of commit REV (default: main) in .ab/ (ignored by git), for
# `scripts/gpu_check.sh build ab` to time its decode step against this tree's in one device run.
# Carry .ab with the run: `run` with carry [".deb", ".fixtures", ".ab"].
#   scripts/prepare_ab.sh [REV]
set -euo pipefail
cd "$(dirname "$0")/.."
rev="${1:-main}"
rm -rf .ab
mkdir .ab
git archive "$rev" | tar -x -C .ab
echo ".ab/ holds $(git rev-parse --short "$rev") ($(du -sh .ab | cut -f1))"
