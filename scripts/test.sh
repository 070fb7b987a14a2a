#!/usr/bin/env bash
# Sets up, builds everything and runs every test. SIEVE_PRESET picks the CMake preset
# (default: release; CI uses ci, the release build with warnings as errors and the CUDA backend
# required). GPU tests skip themselves on machines without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
preset="${SIEVE_PRESET:-release}"
if [ "${SIEVE_SKIP_BOOTSTRAP:-0}" != "1" ]; then ./scripts/bootstrap.sh; fi
if [ -d /usr/local/cuda/bin ]; then export PATH="/usr/local/cuda/bin:$PATH"; fi
cmake --preset "$preset"
cmake --build --preset "$preset"
ctest --preset "$preset"
