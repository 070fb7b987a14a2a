// sieve bench kernels: the GPU numbers of PERF.md in one run, each beside its bound or target:
// the ceilings (device copy bandwidth, a large bf16 GEMM), prefill and decode attention, the
// score + select + compact path, and a full decode step of the Llama-3-8B shape, dense and with
// 1/10 of the KV kept.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/fixtures.h"
#include "model/model_config.h"
#include "tools/commands.h"
#include "tools/decode_step_bench.h"

#ifdef SIEVE_HAVE_CUDA
#include <cuda_runtime.h>

#include "backend/cuda/attention_bench.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/sparsity_bench.h"
#endif

namespace sieve {

namespace {

struct KernelsFlags {
  std::string result_json;
  std::string model_config = "configs/llama-3-8b";
  int batch = 64;
  int context = 4096;
  bool quick = false;
  bool skip_attention = false;
  bool skip_sparsity = false;
  bool skip_decode_step = false;
};

#ifdef SIEVE_HAVE_CUDA
// Device-to-device copy of 2 GiB, counting bytes read + written; median of 10 (bytes/s).
double MeasureCopyBandwidth() {
  const size_t bytes = size_t{2} << 30;
  void* a = nullptr;
  void* b = nullptr;
  if (cudaMalloc(&a, bytes) != cudaSuccess || cudaMalloc(&b, bytes) != cudaSuccess) return 0;
  cudaMemset(a, 1, bytes);
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  std::vector<float> times;
  for (int i = 0; i < 12; ++i) {
    cudaEventRecord(start);
    cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);
    cudaEventRecord(stop);
    cudaEventSynchronize(stop);
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    if (i >= 2) times.push_back(ms);
  }
  std::sort(times.begin(), times.end());
  cudaFree(a);
  cudaFree(b);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return 2.0 * bytes / (times[times.size() / 2] * 1e-3);
}

// A square bf16 GEMM through the backend (cuBLASLt): FLOP/s.
double MeasureGemm(Backend& backend, int size) {
  Tensor x = backend.Allocate({size, size}, DType::kBF16);
  Tensor w = backend.Allocate({size, size}, DType::kBF16);
  Tensor out = backend.Allocate({size, size}, DType::kBF16);
  backend.FillRandom(x, 1, 1.0f);
  backend.FillRandom(w, 2, 1.0f);
  for (int i = 0; i < 3; ++i) backend.Linear(x, w, out);
  backend.Synchronize();
  const int iterations = 10;
  const auto begin = std::chrono::steady_clock::now();
  for (int i = 0; i < iterations; ++i) backend.Linear(x, w, out);
  backend.Synchronize();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  return 2.0 * size * size * static_cast<double>(size) * iterations / seconds;
}

int Run(const KernelsFlags& flags) {
  auto backend_or = MakeCudaBackend(0);
  if (!backend_or.ok()) {
    std::fprintf(stderr, "error: %s\n", backend_or.status().message().c_str());
    return 1;
  }
  Backend& backend = **backend_or;
  nlohmann::json json;
  json["gpu"] = backend.name();
  const double copy = MeasureCopyBandwidth();
  const double gemm = MeasureGemm(backend, 8192);
  std::printf("== ceilings on %s\n", backend.name().c_str());
  std::printf("device copy bandwidth   %8.0f GB/s (read + write)     PERF.md: ~4194\n", copy / 1e9);
  std::printf("bf16 GEMM 8192^3        %8.0f TFLOP/s (cuBLASLt)      PERF.md: ~790 (torch)\n",
              gemm / 1e12);
  json["copy_bandwidth_gbs"] = copy / 1e9;
  json["gemm_tflops"] = gemm / 1e12;

  if (!flags.skip_attention) {
    std::printf("== attention\n");
    std::vector<cuda::AttentionBenchResult> results;
    cuda::AttentionBenchOptions options;
    options.quick = flags.quick;
    options.results = &results;
    cuda::RunAttentionBenchmarks(options);
    json["attention"] = nlohmann::json::parse(cuda::AttentionBenchResultsToJson(results));
  }
  if (!flags.skip_sparsity) {
    std::printf("== score + select + compact\n");
    cuda::SparsityBenchOptions options;
    cuda::RunSparsityBenchmarks(options);
  }
  if (!flags.skip_decode_step) {
    std::string dir = flags.model_config;
    auto config = LoadModelConfig(dir);
    if (!config.ok()) config = LoadModelConfig(ProjectSourceDir() + "/" + dir);
    if (!config.ok()) {
      std::fprintf(stderr, "error: %s\n", config.status().message().c_str());
      return 1;
    }
    std::printf("== decode step, %s shape, batch %d x %d context (dummy weights, CUDA graph)\n",
                dir.c_str(), flags.batch, flags.context);
    for (const double kept : {1.0, 0.1}) {
      DecodeStepBenchOptions options;
      options.batch = flags.batch;
      options.context = flags.context;
      options.kept_fraction = kept;
      options.copy_bandwidth = copy;
      const DecodeStepBenchResult r = RunDecodeStepBench(backend, *config, options);
      const double ratio = r.step_ms / r.bound_ms;
      std::printf(
          "%-12s step %7.2f ms  bound %7.2f ms (%.1f GB at the copy rate)  %.2fx the bound"
          "  %8.0f tok/s   target <= 1.3x: %s\n",
          kept == 1.0 ? "dense" : "1/10 kept", r.step_ms, r.bound_ms, r.bytes / 1e9, ratio,
          r.tokens_per_second, ratio <= 1.3 ? "MET" : "MISSED");
      json[kept == 1.0 ? "decode_step_dense" : "decode_step_sparse"] = {
          {"step_ms", r.step_ms},     {"bound_ms", r.bound_ms},
          {"ratio", ratio},           {"tokens_per_second", r.tokens_per_second},
          {"bytes", r.bytes},         {"batch", flags.batch},
          {"context", flags.context}, {"kept_fraction", kept}};
    }
  }
  if (!flags.result_json.empty()) {
    std::ofstream out(flags.result_json);
    out << json.dump(2) << "\n";
  }
  return 0;
}
#else
int Run(const KernelsFlags&) {
  std::fprintf(stderr, "error: this sieve was built without the CUDA backend\n");
  return 1;
}
#endif

}  // namespace

CommandRunner AddBenchKernelsCommand(CLI::App& app) {
  auto flags = std::make_shared<KernelsFlags>();
  app.add_option("--result-json", flags->result_json, "Write every number as JSON");
  app.add_option("--model-config", flags->model_config,
                 "Directory whose config.json shapes the decode-step benchmark")
      ->capture_default_str();
  app.add_option("--batch", flags->batch, "Decode-step batch")->capture_default_str();
  app.add_option("--context", flags->context, "Decode-step context per sequence")
      ->capture_default_str();
  app.add_flag("--quick", flags->quick, "Only the headline attention rows");
  app.add_flag("--skip-attention", flags->skip_attention, "Skip the attention kernels");
  app.add_flag("--skip-sparsity", flags->skip_sparsity, "Skip the score/select/compact path");
  app.add_flag("--skip-decode-step", flags->skip_decode_step, "Skip the whole-model decode step");
  return [flags]() { return Run(*flags); };
}

}  // namespace sieve
