#!/usr/bin/env bash
# Fails when a C++/CUDA file differs from what clang-format (.clang-format) would write.
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t files < <(git ls-files '*.h' '*.cc' '*.cu' '*.cuh')
if [ "${#files[@]}" -eq 0 ]; then exit 0; fi
clang-format --dry-run --Werror "${files[@]}"
echo "format: ${#files[@]} files clean"
