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
#include "backend/cuda/epilogue_gemm.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/skinny_gemm.h"

namespace sieve::cuda {
namespace {

struct Timing {
  double ms = 0;
  std::string plan;
};

// Time of one call inside a CUDA graph of `iterations` back-to-back calls of `call`, each on the
// next of `weights` (together larger than the L2, so every call streams its weight from memory as
// in a decode step); the median of 5 replays. A graph, as decode steps run, so that host launch
// costs are not counted.
double TimeCalls(cudaStream_t stream, const std::vector<bf16*>& weights, int iterations,
                 const std::function<void(bf16* w)>& call) {
  for (bf16* w : weights) call(w);  // a runner plans on its first call; then a warm-up
  SIEVE_CUDA_CHECK(cudaStreamSynchronize(stream));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  SIEVE_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int iteration = 0; iteration < iterations; ++iteration) {
    call(weights[iteration % weights.size()]);
  }
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

}  // namespace

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
      for (bf16* w : weights) cudaFree(w);
      cudaFree(x);
      cudaFree(out);
      GemmBenchResult result;
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

int RunSwiGluBenchmarks(const SwiGluBenchOptions& options) {
  cudaStream_t stream;
  SIEVE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const int f = options.f;
  const int k = options.k;
  const size_t weight_count = static_cast<size_t>(2 * f) * k;
  bf16* w = nullptr;
  SIEVE_CUDA_CHECK(cudaMalloc(&w, weight_count * sizeof(bf16)));
  FillRandomBf16(w, static_cast<int64_t>(weight_count), 17, 0.02f, stream);
  std::printf(
      "gate_up (2 x %d x %d) and SiLU with a folded norm's row scales: %d calls back to back in a "
      "CUDA graph, median of 5 replays; TFLOP/s of the GEMM's FLOPs\n",
      f, k, options.iterations);
  std::printf(
      "     m | gate_up alone         | gate_up + SiluMul     | fused (x unfused)            | "
      "fused, CTA pairs (x unfused) | ping-pong (x unfused)        | ping-pong, CTA pairs         "
      "| "
      "gated skinny (x unfused)     | max rel. difference\n");
  for (const int m : options.rows) {
    const size_t x_count = static_cast<size_t>(m) * k;
    bf16* x = nullptr;
    bf16* gate_up = nullptr;
    bf16* unfused = nullptr;
    bf16* fused = nullptr;
    SIEVE_CUDA_CHECK(cudaMalloc(&x, x_count * sizeof(bf16)));
    SIEVE_CUDA_CHECK(cudaMalloc(&gate_up, static_cast<size_t>(m) * 2 * f * sizeof(bf16)));
    SIEVE_CUDA_CHECK(cudaMalloc(&unfused, static_cast<size_t>(m) * f * sizeof(bf16)));
    SIEVE_CUDA_CHECK(cudaMalloc(&fused, static_cast<size_t>(m) * f * sizeof(bf16)));
    FillRandomBf16(x, static_cast<int64_t>(x_count), 5, 3.0f, stream);
    RowRmsView norm;
    norm.rows = x;  // the GEMM reads the residual stream, whose rows' RMS scales the products
    norm.stride = k;
    norm.width = k;
    norm.eps = 1e-5f;
    GemmRunner runner(stream);
    const std::vector<bf16*> weights = {w};
    const auto run_gemm = [&](bf16* weight) {
      runner.Run(m, 2 * f, k, weight, k, x, k, gate_up, 2 * f, /*out_f32=*/false);
    };
    // The fused kernel's row scales go into the (otherwise unused) gate_up buffer, as in the
    // backend.
    const auto run_fused = [&](bf16* weight, const EpilogueGemmVariant& variant) {
      SwiGluGemm(m, f, k, x, k, weight, norm, reinterpret_cast<float*>(gate_up), fused, f, stream,
                 variant);
    };
    SwiGluBenchResult result;
    result.m = m;
    result.f = f;
    result.k = k;
    result.gemm_ms = TimeCalls(stream, weights, options.iterations, run_gemm);
    result.unfused_ms = TimeCalls(stream, weights, options.iterations, [&](bf16* weight) {
      run_gemm(weight);
      SiluMul(gate_up, 2 * f, m, f, unfused, f, norm, stream);
    });
    if (SwiGluGemmSupports(f, k, x, k, w, fused, f)) {
      // Each variant's output against the unfused pair's from the same input first (the largest
      // difference over the largest unfused value), then its time.
      run_gemm(w);
      SiluMul(gate_up, 2 * f, m, f, unfused, f, norm, stream);
      std::vector<bf16> expected(static_cast<size_t>(m) * f), got(expected.size());
      SIEVE_CUDA_CHECK(cudaStreamSynchronize(stream));
      SIEVE_CUDA_CHECK(
          cudaMemcpy(expected.data(), unfused, expected.size() * sizeof(bf16), cudaMemcpyDefault));
      double max_abs = 0, max_difference = 0;
      for (const bf16 value : expected) {
        max_abs = std::max(max_abs, std::abs(static_cast<double>(__bfloat162float(value))));
      }
      for (int index = 0; index < 4; ++index) {
        const EpilogueGemmVariant& variant = kEpilogueGemmVariants[index];
        run_fused(w, variant);
        SIEVE_CUDA_CHECK(cudaStreamSynchronize(stream));
        SIEVE_CUDA_CHECK(
            cudaMemcpy(got.data(), fused, got.size() * sizeof(bf16), cudaMemcpyDefault));
        for (size_t index = 0; index < got.size(); ++index) {
          const double difference = static_cast<double>(__bfloat162float(got[index])) -
                                    static_cast<double>(__bfloat162float(expected[index]));
          max_difference = std::max(max_difference, std::abs(difference));
        }
        result.fused_ms[index] = TimeCalls(stream, weights, options.iterations,
                                           [&](bf16* weight) { run_fused(weight, variant); });
      }
      result.max_relative_difference = max_abs > 0 ? max_difference / max_abs : 0;
    }
    if (m <= kSkinnyGemmMaxGatedRows && SkinnyGemmSupports(m, k, w, k, x, k)) {
      const auto run_skinny = [&](bf16* weight) {
        SkinnyGemmSwiGlu(m, f, k, weight, x, k, norm, fused, f, stream);
      };
      result.skinny_ms = TimeCalls(stream, weights, options.iterations, run_skinny);
    }
    cudaFree(x);
    cudaFree(gate_up);
    cudaFree(unfused);
    cudaFree(fused);
    const double flops = 2.0 * m * 2.0 * f * k;
    const auto rate = [&](double ms) { return ms > 0 ? flops / (ms * 1e-3) / 1e12 : 0.0; };
    const auto column = [&](double ms) {
      char text[64] = "-";
      if (ms > 0) {
        std::snprintf(text, sizeof(text), "%7.3f ms %4.0f TFLOP/s %.3f", ms, rate(ms),
                      ms / result.unfused_ms);
      }
      return std::string(text);
    };
    std::printf(
        "%6d | %7.3f ms %4.0f TFLOP/s | %7.3f ms %4.0f TFLOP/s | %-28s | %-28s | %-28s | %-28s | "
        "%-28s | %.2e\n",
        m, result.gemm_ms, rate(result.gemm_ms), result.unfused_ms, rate(result.unfused_ms),
        column(result.fused_ms[0]).c_str(), column(result.fused_ms[1]).c_str(),
        column(result.fused_ms[2]).c_str(), column(result.fused_ms[3]).c_str(),
        column(result.skinny_ms).c_str(), result.max_relative_difference);
    if (options.results != nullptr) options.results->push_back(result);
  }
  cudaFree(w);
  cudaStreamDestroy(stream);
  return 0;
}

}  // namespace sieve::cuda
