#!/usr/bin/env bash
# One-off probe of the GPU machine's toolchain, and generation of the golden fixtures there.
set -u
echo "== toolchain"; nvcc --version | tail -1; cmake --version | head -1; g++ --version | head -1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
for p in nlohmann/json.hpp gtest/gtest.h benchmark/benchmark.h fmt/core.h spdlog/spdlog.h CLI/CLI.hpp boost/beast.hpp boost/version.hpp pcre2.h cudnn.h nccl.h cublasLt.h; do
  f=$(find /usr/include /usr/local/include /usr/local/cuda/include -name "$(basename $p)" -path "*$p" 2>/dev/null | head -1); echo "$p -> ${f:-MISSING}"; done
grep -h "define BOOST_LIB_VERSION" /usr/include/boost/version.hpp; grep -h "CLI11_VERSION " /usr/include/CLI/Version.hpp
ls /usr/lib/x86_64-linux-gnu/cmake 2>/dev/null | tr '\n' ' '; echo
ls /usr/lib/x86_64-linux-gnu/ | grep -E "pcre2|spdlog|fmt|benchmark|gtest|cudnn|nccl" | tr '\n' ' '; echo
python3 -c "import torch, transformers; print(torch.__version__, transformers.__version__)"
cat /etc/os-release | head -2
echo "== golden"
mkdir -p $OUT/golden && PYTHONUNBUFFERED=1 python3 scripts/make_golden.py $OUT/golden_models 2>&1 | tail -60
cd $OUT && tar czf golden.tgz golden_models && rm -rf golden_models golden
