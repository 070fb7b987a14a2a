#include "backend/cuda/fp8_gemm_bench.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/fp8_gemm.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/kernels.h"

namespace sieve::cuda {

void RunFp8GemmBenchmarks(const Fp8GemmBenchOptions& options) {
  cudaStream_t stream;
  SIEVE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  int device = 0;
  int l2_bytes = 0;
  SIEVE_CUDA_CHECK(cudaGetDevice(&device));
  SIEVE_CUDA_CHECK(cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, device));
  const double copy = options.copy_bandwidth;
  std::printf(
      "FP8 (e4m3 weights per channel, inputs quantized per token) against bf16 GEMMs: weights "
      "cold (rotating copies > 3x the L2), %d calls back to back in a CUDA graph, median of 5 "
      "replays. FP8 = the input's quantization + the FP8 runner's pick; %% copy: the FP8 weight "
      "bytes over the copy rate\n",
      options.iterations);
  std::printf(
      "      m  gemm      n x k      |  bf16 ms  TFLOP/s |   fp8 ms  TFLOP/s  %% copy  "
      "(quantize ms) | fp8 speed-up\n");
  for (const int m : options.rows) {
    double bf16_total = 0, fp8_total = 0;
    for (const GemmBenchShape& shape : options.shapes) {
      const size_t count = static_cast<size_t>(shape.n) * shape.k;
      const size_t copies =
          std::max<size_t>(2, static_cast<size_t>(3.0 * l2_bytes / static_cast<double>(count)) + 1);
      std::vector<bf16*> weights(copies);
      std::vector<uint8_t*> codes(copies);
      std::vector<float*> scales(copies);
      for (size_t index = 0; index < copies; ++index) {
        SIEVE_CUDA_CHECK(cudaMalloc(&weights[index], count * sizeof(bf16)));
        SIEVE_CUDA_CHECK(cudaMalloc(&codes[index], count));
        SIEVE_CUDA_CHECK(cudaMalloc(&scales[index], static_cast<size_t>(shape.n) * 4));
        FillRandomBf16(weights[index], static_cast<int64_t>(count), 11 + index, 0.02f, stream);
        QuantizeRowsE4m3(weights[index], shape.k, shape.n, shape.k, codes[index], shape.k,
                         scales[index], stream);
      }
      const size_t x_count = static_cast<size_t>(m) * shape.k;
      bf16* x = nullptr;
      uint8_t* x_codes = nullptr;
      float* x_scales = nullptr;
      bf16* out = nullptr;
      SIEVE_CUDA_CHECK(cudaMalloc(&x, x_count * sizeof(bf16)));
      SIEVE_CUDA_CHECK(cudaMalloc(&x_codes, x_count));
      SIEVE_CUDA_CHECK(cudaMalloc(&x_scales, static_cast<size_t>(m) * 4));
      SIEVE_CUDA_CHECK(cudaMalloc(&out, static_cast<size_t>(m) * shape.n * sizeof(bf16)));
      FillRandomBf16(x, static_cast<int64_t>(x_count), 5, 1.0f, stream);
      const int operands = static_cast<int>(copies);
      Fp8GemmBenchResult result;
      {
        GemmRunner runner(stream);
        result.bf16_ms = TimeGraphedCalls(stream, operands, options.iterations, [&](int i) {
          runner.Run(m, shape.n, shape.k, weights[i], shape.k, x, shape.k, out, shape.n, false);
        });
      }
      {
        Fp8GemmRunner runner(stream);
        result.fp8_ms = TimeGraphedCalls(stream, operands, options.iterations, [&](int i) {
          QuantizeRowsE4m3(x, shape.k, m, shape.k, x_codes, shape.k, x_scales, stream);
          runner.Run(m, shape.n, shape.k, codes[i], shape.k, scales[i], x_codes, shape.k, x_scales,
                     out, shape.n, /*out_f32=*/false, /*accumulate=*/false);
        });
        result.plan = runner.last_plan();
        result.quantize_ms = TimeGraphedCalls(stream, 1, options.iterations, [&](int) {
          QuantizeRowsE4m3(x, shape.k, m, shape.k, x_codes, shape.k, x_scales, stream);
        });
      }
      for (size_t index = 0; index < copies; ++index) {
        cudaFree(weights[index]);
        cudaFree(codes[index]);
        cudaFree(scales[index]);
      }
      cudaFree(x);
      cudaFree(x_codes);
      cudaFree(x_scales);
      cudaFree(out);
      result.name = shape.name;
      result.m = m;
      result.n = shape.n;
      result.k = shape.k;
      const double flop = 2.0 * m * static_cast<double>(count);
      const double fp8_gbs = static_cast<double>(count) / (result.fp8_ms * 1e-3) / 1e9;
      std::printf(
          "  %5d  %-8s %5d x %-5d | %8.4f %8.1f | %8.4f %8.1f  %5.1f%%  (%.4f) | %.2fx  %s\n", m,
          shape.name.c_str(), shape.n, shape.k, result.bf16_ms,
          flop / (result.bf16_ms * 1e-3) / 1e12, result.fp8_ms,
          flop / (result.fp8_ms * 1e-3) / 1e12, copy > 0 ? 100.0 * fp8_gbs * 1e9 / copy : 0.0,
          result.quantize_ms, result.bf16_ms / result.fp8_ms, result.plan.c_str());
      bf16_total += result.bf16_ms;
      fp8_total += result.fp8_ms;
      if (options.results != nullptr) options.results->push_back(result);
    }
    std::printf("  %5d  the layer's GEMMs: bf16 %.4f ms, fp8 %.4f ms: %.2fx\n", m, bf16_total,
                fp8_total, bf16_total / fp8_total);
  }
  SIEVE_CUDA_CHECK(cudaStreamDestroy(stream));
}

}  // namespace sieve::cuda
