#include "backend/cuda/gemm_bench.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/skinny_gemm.h"

namespace sieve::cuda {
namespace {

struct Timing {
  double ms = 0;
  std::string plan;
};

double TimeCalls(cudaStream_t stream, const std::vector<bf16*>& weights, int iterations,
                 const std::function<void(bf16* w)>& call) {
  return TimeGraphedCalls(stream, static_cast<int>(weights.size()), iterations,
                          [&](int index) { call(weights[index]); });
}

Timing TimeRunner(cudaStream_t stream, int m, const GemmBenchShape& shape,
                  const std::vector<bf16*>& weights, const bf16* x, void* out, bool out_f32,
                  int iterations) {
  GemmRunner runner(stream);
  const double ms = TimeCalls(stream, weights, iterations, [&](bf16* w) {
    runner.Run(m, shape.n, shape.k, w, shape.k, x, shape.k, out, shape.n, out_f32);
  });
  return {ms, runner.last_plan()};
}

// The skinny kernel alone at its fastest k split (launched as in a step: with PDL, so that each
// call's first weight loads run under the call before), where it takes the shape; else 0 ms.
Timing TimeSkinny(cudaStream_t stream, int m, const GemmBenchShape& shape,
                  const std::vector<bf16*>& weights, const bf16* x, void* out, bool out_f32,
                  int iterations) {
  Timing best;
  if (!SkinnyGemmSupports(m, shape.k, weights[0], shape.k, x, shape.k)) return best;
  for (const int splits : SkinnyGemmSplits(shape.k)) {
    const double ms = TimeCalls(stream, weights, iterations, [&](bf16* w) {
      SkinnyGemm(m, shape.n, shape.k, w, shape.k, x, shape.k, out, shape.n, out_f32,
                 /*accumulate=*/false, splits, stream);
    });
    if (best.ms == 0 || ms < best.ms) best = {ms, "split " + std::to_string(splits)};
  }
  return best;
}

// gate_up then SiluMul (the runner's plan, then the SiLU kernel) against the gated skinny kernel,
// on `weights` ([2F][K], F = shape.n / 2), with x's own rows as the folded norm's; fills `result`'s
// silu_pair_ms, gated_skinny_ms and gated_max_relative_difference.
void TimeGatedSkinny(cudaStream_t stream, int m, const GemmBenchShape& shape,
                     const std::vector<bf16*>& weights, const bf16* x, int iterations,
                     GemmBenchResult& result) {
  const int f = shape.n / 2;
  const int k = shape.k;
  const size_t count = static_cast<size_t>(m) * f;
  bf16* gate_up = nullptr;
  bf16* pair_out = nullptr;
  bf16* gated_out = nullptr;
  SIEVE_CUDA_CHECK(cudaMalloc(&gate_up, static_cast<size_t>(m) * shape.n * sizeof(bf16)));
  SIEVE_CUDA_CHECK(cudaMalloc(&pair_out, count * sizeof(bf16)));
  SIEVE_CUDA_CHECK(cudaMalloc(&gated_out, count * sizeof(bf16)));
  RowRmsView norm;
  norm.rows = x;  // the GEMM reads the residual stream, whose rows' RMS scales the products
  norm.stride = k;
  norm.width = k;
  norm.eps = 1e-5f;
  GemmRunner runner(stream);
  const auto pair = [&](bf16* w) {
    runner.Run(m, shape.n, k, w, k, x, k, gate_up, shape.n, /*out_f32=*/false);
    SiluMul(gate_up, shape.n, m, f, pair_out, f, norm, stream);
  };
  const auto gated = [&](bf16* w) {
    SkinnyGemmSwiGlu(m, f, k, w, x, k, norm, gated_out, f, stream);
  };
  result.silu_pair_ms = TimeCalls(stream, weights, iterations, pair);
  result.gated_skinny_ms = TimeCalls(stream, weights, iterations, gated);
  pair(weights[0]);
  gated(weights[0]);
  std::vector<bf16> expected(count), got(count);
  SIEVE_CUDA_CHECK(cudaStreamSynchronize(stream));
  SIEVE_CUDA_CHECK(cudaMemcpy(expected.data(), pair_out, count * sizeof(bf16), cudaMemcpyDefault));
  SIEVE_CUDA_CHECK(cudaMemcpy(got.data(), gated_out, count * sizeof(bf16), cudaMemcpyDefault));
  double max_abs = 0, max_difference = 0;
  for (size_t index = 0; index < count; ++index) {
    const double want = __bfloat162float(expected[index]);
    max_abs = std::max(max_abs, std::abs(want));
    max_difference = std::max(max_difference,
                              std::abs(static_cast<double>(__bfloat162float(got[index])) - want));
  }
  result.gated_max_relative_difference = max_abs > 0 ? max_difference / max_abs : 0;
  cudaFree(gate_up);
  cudaFree(pair_out);
  cudaFree(gated_out);
}

}  // namespace

double TimeGraphedCalls(cudaStream_t stream, int operands, int iterations,
                        const std::function<void(int operand)>& call) {
  for (int operand = 0; operand < operands; ++operand) call(operand);  // plans, then a warm-up
  SIEVE_CUDA_CHECK(cudaStreamSynchronize(stream));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  SIEVE_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int iteration = 0; iteration < iterations; ++iteration) call(iteration % operands);
  SIEVE_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  SIEVE_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  cudaEvent_t start, stop;
  SIEVE_CUDA_CHECK(cudaEventCreate(&start));
  SIEVE_CUDA_CHECK(cudaEventCreate(&stop));
  SIEVE_CUDA_CHECK(cudaGraphLaunch(exec, stream));  // warm-up
  std::vector<float> times;
  for (int replay = 0; replay < 5; ++replay) {
    SIEVE_CUDA_CHECK(cudaEventRecord(start, stream));
    SIEVE_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    SIEVE_CUDA_CHECK(cudaEventRecord(stop, stream));
    SIEVE_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    SIEVE_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    times.push_back(ms / static_cast<float>(iterations));
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

int RunGemmBenchmarks(const GemmBenchOptions& options) {
  cudaStream_t stream;
  SIEVE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  int device = 0;
  int l2_bytes = 0;
  SIEVE_CUDA_CHECK(cudaGetDevice(&device));
  SIEVE_CUDA_CHECK(cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, device));
  const double copy = options.copy_bandwidth;
  const auto percent = [&](double gbs) { return copy > 0 ? 100.0 * gbs * 1e9 / copy : 0.0; };
  std::printf(
      "GEMMs at decode batch sizes: bf16 weights streamed cold (rotating copies > 3x the L2), "
      "%d calls back to back in a CUDA graph, median of 5 replays; %% of the copy rate\n",
      options.iterations);
  std::printf(
      "   m  gemm         n x k      |      the runner (cuBLASLt or skinny)          | the skinny "
      "kernel alone, fastest split | the runner's plan\n");
  // The plans are made (timed) per runner before capture; cuBLASLt keeps its own launches.
  for (const int m : options.rows) {
    double cublas_total_ms = 0, total_bytes = 0;
    for (const GemmBenchShape& shape : options.shapes) {
      const size_t count = static_cast<size_t>(shape.n) * shape.k;
      const double bytes = 2.0 * static_cast<double>(count);
      const size_t copies = std::max<size_t>(2, static_cast<size_t>(3.0 * l2_bytes / bytes) + 1);
      std::vector<bf16*> weights(copies);
      for (size_t copy_index = 0; copy_index < copies; ++copy_index) {
        SIEVE_CUDA_CHECK(cudaMalloc(&weights[copy_index], count * sizeof(bf16)));
        FillRandomBf16(weights[copy_index], static_cast<int64_t>(count), 11 + copy_index, 0.02f,
                       stream);
      }
      bf16* x = nullptr;
      SIEVE_CUDA_CHECK(cudaMalloc(&x, static_cast<size_t>(m) * shape.k * sizeof(bf16)));
      FillRandomBf16(x, static_cast<int64_t>(m) * shape.k, 5, 1.0f, stream);
      const bool out_f32 = shape.name == "lm_head";  // logits are f32
      void* out = nullptr;
      SIEVE_CUDA_CHECK(cudaMalloc(&out, static_cast<size_t>(m) * shape.n * 4));
      const Timing cublas =
          TimeRunner(stream, m, shape, weights, x, out, out_f32, options.iterations);
      const Timing skinny =
          TimeSkinny(stream, m, shape, weights, x, out, out_f32, options.iterations);
      GemmBenchResult result;
      const bool gated = shape.name == "gate_up" && m <= kSkinnyGemmSwiGluMaxRows &&
                         SkinnyGemmSupports(m, shape.k, weights[0], shape.k, x, shape.k);
      if (gated) TimeGatedSkinny(stream, m, shape, weights, x, options.iterations, result);
      for (bf16* w : weights) cudaFree(w);
      cudaFree(x);
      cudaFree(out);
      result.name = shape.name;
      result.m = m;
      result.n = shape.n;
      result.k = shape.k;
      result.cublas_ms = cublas.ms;
      result.cublas_gbs = bytes / (cublas.ms * 1e-3) / 1e9;
      result.plan = cublas.plan;
      result.skinny_ms = skinny.ms;
      // Past about 170 rows (700 TFLOP/s over 4.2 TB/s, what cuBLASLt and a copy reach on an
      // H200) the products, not the weights' bytes, set a GEMM's time: both rates are printed.
      const double tflops = 2.0 * m * static_cast<double>(count) / (cublas.ms * 1e-3) / 1e12;
      char skinny_column[64] = "-";
      if (skinny.ms > 0) {
        std::snprintf(skinny_column, sizeof(skinny_column), "%8.3f ms (%3.0f%%) %s", skinny.ms,
                      percent(bytes / (skinny.ms * 1e-3) / 1e9), skinny.plan.c_str());
      }
      std::printf(
          "%4d  %-8s %6d x %-6d | %8.3f ms %6.0f GB/s (%3.0f%%) %4.0f TFLOP/s | %-28s | %s\n", m,
          shape.name.c_str(), shape.n, shape.k, cublas.ms, result.cublas_gbs,
          percent(result.cublas_gbs), tflops, skinny_column, cublas.plan.c_str());
      if (gated) {
        std::printf(
            "%4d  %-8s %15s | + SiluMul %8.3f ms, gated skinny %8.3f ms (%.3fx the pair, max rel. "
            "difference %.2e)\n",
            m, "gate_up", "and SiLU", result.silu_pair_ms, result.gated_skinny_ms,
            result.gated_skinny_ms / result.silu_pair_ms, result.gated_max_relative_difference);
      }
      cublas_total_ms += cublas.ms;
      total_bytes += bytes;
      if (options.results != nullptr) options.results->push_back(result);
    }
    const double cublas_gbs = total_bytes / (cublas_total_ms * 1e-3) / 1e9;
    const double tflops = m * total_bytes / (cublas_total_ms * 1e-3) / 1e12;  // 2 m FLOPs a weight
    std::printf("%4d  %-8s %15s | %8.3f ms %6.0f GB/s (%3.0f%%) %4.0f TFLOP/s |\n", m, "all", "",
                cublas_total_ms, cublas_gbs, percent(cublas_gbs), tflops);
  }
  cudaStreamDestroy(stream);
  return 0;
}

}  // namespace sieve::cuda
