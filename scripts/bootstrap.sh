#!/usr/bin/env bash
# Installs what Sieve builds with, from Debian/Ubuntu packages. Idempotent.
set -euo pipefail
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends \
  build-essential cmake ninja-build pkg-config git clang-format \
  libgtest-dev libgmock-dev libbenchmark-dev \
  nlohmann-json3-dev libspdlog-dev libfmt-dev libcli11-dev libboost-dev libpcre2-dev
# HAProxy fronts `sieve serve` replicas (docs/deployment.md; server/replica_test.py runs two).
$SUDO apt-get install -y -q --no-install-recommends haproxy
# The checking builds (presets asan, tsan, fuzz) use clang: libclang-rt-dev holds its sanitizer
# runtimes and libFuzzer (libclang_rt.fuzzer, FuzzedDataProvider.h); llvm holds llvm-symbolizer,
# which turns sanitizer stack traces into file:line.
$SUDO apt-get install -y -q --no-install-recommends clang libclang-rt-dev llvm
# Node.js runs the OpenAI client test (server/openai_client_test/). A node already there (CI's is
# NodeSource's 20, which bundles npm) is kept: NodeSource's nodejs conflicts with Debian's npm.
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  $SUDO apt-get install -y -q --no-install-recommends nodejs npm
fi
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  echo "note: nvcc is in /usr/local/cuda/bin; add it to PATH to build the CUDA backend"
fi
