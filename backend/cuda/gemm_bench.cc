#include "backend/cuda/gemm_bench.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <iterator>
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

// A row of a fused kernel's table: the GEMM alone and the unfused pair (time and TFLOP/s of the
// GEMM's `flops`), then each schedule of the fused kernel and each of `more` (time, TFLOP/s, time
// over the unfused pair's; "-" where it did not run), then the largest difference.
void PrintFusedRow(int m, double flops, double gemm_ms, double unfused_ms,
                   const double (&fused_ms)[4], const std::vector<double>& more,
                   double max_relative_difference) {
  const auto rate = [&](double ms) { return ms > 0 ? flops / (ms * 1e-3) / 1e12 : 0.0; };
  std::printf("%6d | %7.3f ms %4.0f TFLOP/s | %7.3f ms %4.0f TFLOP/s |", m, gemm_ms, rate(gemm_ms),
              unfused_ms, rate(unfused_ms));
  std::vector<double> columns(std::begin(fused_ms), std::end(fused_ms));
  columns.insert(columns.end(), more.begin(), more.end());
  for (const double ms : columns) {
    char text[64] = "-";
    if (ms > 0) {
      std::snprintf(text, sizeof(text), "%7.3f ms %4.0f TFLOP/s %.3f", ms, rate(ms),
                    ms / unfused_ms);
    }
    std::printf(" %-28s |", text);
  }
  std::printf(" %.2e\n", max_relative_difference);
}

// Each schedule of a fused kernel (kEpilogueGemmVariants), `run(weight, variant)` writing
// `fused`: its output against `unfused` (computed by the caller from the same input) first, the
// largest difference over the largest unfused value kept in `max_relative_difference`, then its
// time into `ms`.
void TimeVariants(cudaStream_t stream, const std::vector<bf16*>& weights, int iterations,
                  const bf16* unfused, const bf16* fused, size_t count,
                  const std::function<void(bf16*, const EpilogueGemmVariant&)>& run,
                  double (&ms)[4], double& max_relative_difference) {
  std::vector<bf16> expected(count), got(count);
  SIEVE_CUDA_CHECK(cudaStreamSynchronize(stream));
  SIEVE_CUDA_CHECK(cudaMemcpy(expected.data(), unfused, count * sizeof(bf16), cudaMemcpyDefault));
  double max_abs = 0, max_difference = 0;
  for (const bf16 value : expected) {
    max_abs = std::max(max_abs, std::abs(static_cast<double>(__bfloat162float(value))));
  }
  for (int variant = 0; variant < 4; ++variant) {
    run(weights[0], kEpilogueGemmVariants[variant]);
    SIEVE_CUDA_CHECK(cudaStreamSynchronize(stream));
    SIEVE_CUDA_CHECK(cudaMemcpy(got.data(), fused, count * sizeof(bf16), cudaMemcpyDefault));
    for (size_t index = 0; index < count; ++index) {
      const double difference = static_cast<double>(__bfloat162float(got[index])) -
                                static_cast<double>(__bfloat162float(expected[index]));
      max_difference = std::max(max_difference, std::abs(difference));
    }
    ms[variant] = TimeCalls(stream, weights, iterations,
                            [&](bf16* weight) { run(weight, kEpilogueGemmVariants[variant]); });
  }
  max_relative_difference = max_abs > 0 ? max_difference / max_abs : 0;
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
      run_gemm(w);
      SiluMul(gate_up, 2 * f, m, f, unfused, f, norm, stream);
      TimeVariants(stream, weights, options.iterations, unfused, fused, static_cast<size_t>(m) * f,
                   run_fused, result.fused_ms, result.max_relative_difference);
    }
    if (SkinnyGemmSupports(m, k, w, k, x, k)) {
      const auto run_skinny = [&](bf16* weight) {
        SkinnyGemmSwiGlu(m, f, k, weight, x, k, norm, fused, f, stream);
      };
      result.skinny_ms = TimeCalls(stream, weights, options.iterations, run_skinny);
    }
    cudaFree(x);
    cudaFree(gate_up);
    cudaFree(unfused);
    cudaFree(fused);
    PrintFusedRow(m, 2.0 * m * 2.0 * f * k, result.gemm_ms, result.unfused_ms, result.fused_ms,
                  {result.skinny_ms}, result.max_relative_difference);
    if (options.results != nullptr) options.results->push_back(result);
  }
  cudaFree(w);
  cudaStreamDestroy(stream);
  return 0;
}

int RunQkvRopeBenchmarks(const QkvRopeBenchOptions& options) {
  cudaStream_t stream;
  SIEVE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const int heads = options.num_heads;
  const int kv_heads = options.num_kv_heads;
  const int d = options.head_dim;
  const int k = options.k;
  const int width = (heads + 2 * kv_heads) * d;
  bf16* w = nullptr;
  SIEVE_CUDA_CHECK(cudaMalloc(&w, static_cast<size_t>(width) * k * sizeof(bf16)));
  FillRandomBf16(w, static_cast<int64_t>(width) * k, 19, 0.02f, stream);
  const std::vector<bf16*> weights = {w};
  std::printf(
      "qkv (%d x %d, %d heads, %d KV heads, d %d) and RoPE + cache write of one prompt with a "
      "folded norm's row scales: %d calls back to back in a CUDA graph, median of 5 replays; "
      "TFLOP/s of the GEMM's FLOPs\n",
      width, k, heads, kv_heads, d, options.iterations);
  std::printf(
      "     m | qkv alone             | qkv + RoPE            | fused (x unfused)            | "
      "fused, CTA pairs (x unfused) | ping-pong (x unfused)        | ping-pong, CTA pairs         "
      "| "
      "max rel. difference\n");
  constexpr int kPageSize = 16;
  for (const int m : options.rows) {
    // One prompt of m tokens at positions 0 .. m - 1, written to entries 0 .. m - 1 of its pages
    // (pages in order), and a RoPE table of random angles' cos and sin.
    const int pages = (m + kPageSize - 1) / kPageSize;
    std::vector<int32_t> positions(static_cast<size_t>(m)), page_table(static_cast<size_t>(pages));
    for (int i = 0; i < m; ++i) positions[static_cast<size_t>(i)] = i;
    for (int p = 0; p < pages; ++p) page_table[static_cast<size_t>(p)] = p;
    const std::vector<int32_t> starts = {0, m};
    const std::vector<int32_t> zero = {0};
    std::vector<float> rope(static_cast<size_t>(m) * d);
    for (size_t i = 0; i < rope.size(); i += 2) {
      const double angle = 0.618034 * static_cast<double>(i);
      rope[i] = static_cast<float>(std::cos(angle));
      rope[i + 1] = static_cast<float>(std::sin(angle));
    }
    std::vector<void*> buffers;
    const auto upload = [&](const void* host, size_t bytes) {
      void* device = nullptr;
      SIEVE_CUDA_CHECK(cudaMalloc(&device, bytes));
      SIEVE_CUDA_CHECK(cudaMemcpy(device, host, bytes, cudaMemcpyHostToDevice));
      buffers.push_back(device);
      return device;
    };
    const auto allocate = [&](size_t bytes) {
      void* device = nullptr;
      SIEVE_CUDA_CHECK(cudaMalloc(&device, bytes));
      buffers.push_back(device);
      return device;
    };
    StepView step{};
    step.positions = static_cast<const int32_t*>(upload(positions.data(), positions.size() * 4));
    step.token_ids = step.positions;
    step.query_start = static_cast<const int32_t*>(upload(starts.data(), 8));
    step.key_start = step.query_start;
    step.context_lens = static_cast<const int32_t*>(upload(zero.data(), 4));
    step.seq_slots = step.context_lens;
    step.write_start = step.context_lens;
    step.num_tokens = m;
    step.num_prefill_tokens = m;
    step.num_seqs = 1;
    step.num_prefill_seqs = 1;
    step.max_query_len = m;
    step.max_kv_len = m;
    step.num_prefill_keys = m;
    PoolView pool{};
    const size_t entries = static_cast<size_t>(pages) * kPageSize;
    pool.k = static_cast<bf16*>(allocate(entries * kv_heads * d * sizeof(bf16)));
    pool.v = static_cast<bf16*>(allocate(entries * kv_heads * d * sizeof(bf16)));
    pool.page_table = static_cast<const int32_t*>(upload(page_table.data(), page_table.size() * 4));
    pool.positions = static_cast<int32_t*>(allocate(entries * kv_heads * sizeof(int32_t)));
    pool.page_size = kPageSize;
    pool.max_seqs = 1;
    pool.max_pages_per_seq = pages;
    pool.num_kv_heads = kv_heads;
    pool.head_dim = d;
    const auto* rope_table = static_cast<const float*>(upload(rope.data(), rope.size() * 4));
    auto* x = static_cast<bf16*>(allocate(static_cast<size_t>(m) * k * sizeof(bf16)));
    auto* unfused = static_cast<bf16*>(allocate(static_cast<size_t>(m) * width * sizeof(bf16)));
    auto* fused = static_cast<bf16*>(allocate(static_cast<size_t>(m) * width * sizeof(bf16)));
    auto* scales = static_cast<float*>(allocate(static_cast<size_t>(m) * sizeof(float)));
    FillRandomBf16(x, static_cast<int64_t>(m) * k, 7, 3.0f, stream);
    RowRmsView norm;
    norm.rows = x;  // the GEMM reads the residual stream, whose rows' RMS scales the products
    norm.stride = k;
    norm.width = k;
    norm.eps = 1e-5f;
    GemmRunner runner(stream);
    const auto run_gemm = [&](bf16* weight) {
      runner.Run(m, width, k, weight, k, x, k, unfused, width, /*out_f32=*/false);
    };
    const auto run_unfused = [&](bf16* weight) {
      run_gemm(weight);
      RopeAndCacheWrite(unfused, width, rope_table, heads, step, 0, pool, 0, m, norm, stream);
    };
    QkvRopeBenchResult result;
    result.m = m;
    result.width = width;
    result.k = k;
    result.gemm_ms = TimeCalls(stream, weights, options.iterations, run_gemm);
    result.unfused_ms = TimeCalls(stream, weights, options.iterations, run_unfused);
    if (QkvRopeGemmSupports(width, d, k, x, k, w, fused, width, rope_table)) {
      run_unfused(w);
      TimeVariants(
          stream, weights, options.iterations, unfused, fused, static_cast<size_t>(m) * width,
          [&](bf16* weight, const EpilogueGemmVariant& variant) {
            QkvRopeGemm(m, k, x, k, weight, rope_table, heads, step, 0, pool, norm, scales, fused,
                        width, stream, variant);
          },
          result.fused_ms, result.max_relative_difference);
    }
    SIEVE_CUDA_CHECK(cudaStreamSynchronize(stream));
    for (void* buffer : buffers) cudaFree(buffer);
    PrintFusedRow(m, 2.0 * m * width * k, result.gemm_ms, result.unfused_ms, result.fused_ms, {},
                  result.max_relative_difference);
    if (options.results != nullptr) options.results->push_back(result);
  }
  cudaFree(w);
  cudaStreamDestroy(stream);
  return 0;
}

}  // namespace sieve::cuda
