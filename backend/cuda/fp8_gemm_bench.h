// FP8 against bf16 GEMMs for `sieve bench kernels --quantization fp8`: each of a layer's GEMMs at
// each row count, bf16 (the backend's GemmRunner) beside FP8 (the input's row quantization plus
// Fp8GemmRunner's pick of cuBLASLt or the skinny kernel's e4m3 form, as CudaBackend runs a
// quantized weight), weights streamed cold; the FP8
// weight bytes as a share of the copy rate, and each side's TFLOP/s.
#pragma once

#include <string>
#include <vector>

#include "backend/cuda/gemm_bench.h"

namespace sieve::cuda {

struct Fp8GemmBenchResult {
  std::string name;
  int m = 0, n = 0, k = 0;
  double bf16_ms = 0;
  double fp8_ms = 0;       // quantizing the input and the GEMM
  double quantize_ms = 0;  // the input's quantization alone
  std::string plan;        // the FP8 runner's choice (cuBLASLt or the skinny kernel)
};

struct Fp8GemmBenchOptions {
  std::vector<GemmBenchShape> shapes;
  std::vector<int> rows = {1, 16, 64, 256, 1024, 8192};
  double copy_bandwidth = 0;  // bytes/s, read + write
  int iterations = 30;
  std::vector<Fp8GemmBenchResult>* results = nullptr;
};

void RunFp8GemmBenchmarks(const Fp8GemmBenchOptions& options);

}  // namespace sieve::cuda
