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
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  echo "note: nvcc is in /usr/local/cuda/bin; add it to PATH to build the CUDA backend"
fi
