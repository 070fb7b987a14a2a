// sieve bench kernels: the GPU numbers of PERF.md in one run, each beside its bound or target:
// the ceilings (device copy bandwidth, a large bf16 GEMM), prefill and decode attention, the
// score + select + compact path, and a full decode step of the Llama-3-8B shape, dense and with
// 1/10 of the KV kept.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/fixtures.h"
#include "model/llama_model.h"
#include "model/model_config.h"
#include "model/tensor_parallel.h"
#include "tools/commands.h"
#include "tools/decode_step_bench.h"
#include "tools/prefill_step_bench.h"
#include "tools/tensor_parallel_bench.h"

#ifdef SIEVE_HAVE_CUDA
#include <cuda_runtime.h>

#include "backend/cuda/attention_bench.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/decode_attention.h"
#include "backend/cuda/fp8_gemm.h"
#include "backend/cuda/fp8_gemm_bench.h"
#include "backend/cuda/gemm_bench.h"
#include "backend/cuda/nccl_communicator.h"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/sparsity_bench.h"
#endif

namespace sieve {

namespace {

// Every line of `text` with `prefix` in front.
[[maybe_unused]] std::string Indent(const std::string& text, const std::string& prefix) {
  std::string out;
  size_t begin = 0;
  while (begin < text.size()) {
    const size_t end = text.find('\n', begin);
    const size_t stop = end == std::string::npos ? text.size() : end + 1;
    out += prefix + text.substr(begin, stop - begin);
    begin = stop;
  }
  return out;
}

// Decode steps bracketed by --profile-step: the middle one is a step between steps.
constexpr int kProfiledSteps = 3;

struct KernelsFlags {
  std::string result_json;
  std::string model_config = "configs/llama-3-8b";
  int batch = 64;
  int context = 4096;
  bool quick = false;
  bool skip_attention = false;
  bool skip_sparsity = false;
  bool skip_gemm = false;
  std::vector<int> gemm_rows = {1, 16, 64};
  bool skip_decode_step = false;
  bool no_graph = false;
  bool batch_invariant = false;
  bool profile_step = false;
  bool no_step_variants = false;
  // The names of the kStepVariants to time beside the defaults (empty: all).
  std::vector<std::string> step_variants;
  bool pages_in_order = false;
  bool prefill_step = false;
  std::string quantization = "none";
  std::string kv_cache_dtype = "auto";
  int prefill_seqs = 2;
  int prefill_len = 4000;
  double prefill_attention_tflops = 0;
  bool profile_prefill = false;
  int tensor_parallel_size = 0;
  std::string tensor_parallel_plan = "configs/llama-3-70b";
  std::vector<int> tensor_parallel_plan_sizes = {1, 2, 4, 8};
  double allreduce_bus_gbs = 370;
  double allreduce_latency_us = 8;
};

// The decode step's variants, timed beside its defaults for comparison. The JSON keys of a
// variant's rows end in "_" + name.
struct StepVariant {
  const char* name = "";   // what --step-variant takes
  const char* label = "";  // appended to the printed row's label
  bool pdl = true;         // SetPdlEnabled (false: off; true: as the environment)
  StepLengthBounds length_bounds = StepLengthBounds::kTrue;
};
const StepVariant kStepVariants[] = {
    {"no_pdl", ", no PDL", false},
    {"engine_bounds", ", engine's layer bounds", true, StepLengthBounds::kEngineLayerBounds},
};

std::vector<std::string> StepVariantNames() {
  std::vector<std::string> names;
  for (const StepVariant& variant : kStepVariants) names.emplace_back(variant.name);
  return names;
}

#ifdef SIEVE_HAVE_CUDA
// A config.json directory as given, or relative to the source tree.
Result<ModelConfig> LoadConfigHereOrInSource(const std::string& dir) {
  auto config = LoadModelConfig(dir);
  if (!config.ok()) config = LoadModelConfig(ProjectSourceDir() + "/" + dir);
  return config;
}

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
  // Checked before any benchmark runs: a bad flag fails in a second, not after minutes.
  std::string dir = flags.model_config;
  auto config = LoadConfigHereOrInSource(dir);
  if (!config.ok()) {
    std::fprintf(stderr, "error: %s\n", config.status().message().c_str());
    return 1;
  }
  // The dense decode step holds the weights and every sequence's whole context at once: a shape
  // the GPU cannot hold is a clear error here, not an abort in cudaMalloc (Llama-3-8B at batch
  // 256 x 2048 needs 68.7 GB of KV).
  if (!flags.skip_decode_step && flags.tensor_parallel_size == 0) {
    DecodeStepBenchOptions dense;
    dense.batch = flags.batch;
    dense.context = flags.context;
    const double needed = DecodeStepBenchBytes(*config, dense, backend.activation_dtype());
    const double free_bytes = static_cast<double>(backend.FreeMemoryBytes());
    if (needed > free_bytes) {
      std::fprintf(stderr,
                   "error: the decode step at batch %d x %d context needs about %.1f GB (weights "
                   "and dense KV) and the GPU has %.1f GB free: lower --batch or --context, or "
                   "pass --skip-decode-step\n",
                   flags.batch, flags.context, needed / 1e9, free_bytes / 1e9);
      return 1;
    }
  }
  const WeightQuantization quantization = *ParseWeightQuantization(flags.quantization);
  if (quantization == WeightQuantization::kFp8 && !cuda::Fp8GemmRunner::DeviceSupportsFp8()) {
    std::fprintf(stderr, "error: --quantization fp8 needs an sm_89 or newer GPU; %s is not\n",
                 backend.name().c_str());
    return 1;
  }
  nlohmann::json json;
  json["gpu"] = backend.name();
  json["quantization"] = flags.quantization;
  json["kv_cache_dtype"] = flags.kv_cache_dtype;
  json["batch_invariant"] = flags.batch_invariant;  // the decode and prefill steps

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
  // The ceilings run after the attention and sparsity rows. Run before them, they held the 4k
  // prefill attention row right after them to 510-522 TFLOP/s, against 558-583 with the
  // attention rows first (16k and d = 64 unchanged; cuDNN, timed in a process of its own, 586),
  // for a cause not found (bench/results/2026-12-06-h100-ceilings-after-attention-ab.json).
  const double copy = MeasureCopyBandwidth();
  const double gemm = MeasureGemm(backend, 8192);
  std::printf("== ceilings on %s\n", backend.name().c_str());
  std::printf("device copy bandwidth   %8.0f GB/s (read + write)     PERF.md: ~4194\n", copy / 1e9);
  std::printf("bf16 GEMM 8192^3        %8.0f TFLOP/s (cuBLASLt)      PERF.md: ~790 (torch)\n",
              gemm / 1e12);
  json["copy_bandwidth_gbs"] = copy / 1e9;
  json["gemm_tflops"] = gemm / 1e12;
  // --tensor-parallel-size N: the ranks, and whether the decode-step model splits over them.
  std::optional<CudaRanks> ranks;
  if (flags.tensor_parallel_size > 0) {
    auto made = MakeCudaRanks(0, flags.tensor_parallel_size);
    Status split = CheckTensorParallel(*config, flags.tensor_parallel_size);
    if (!made.ok() || !split.ok()) {
      std::fprintf(stderr, "error: %s\n", (made.ok() ? split : made.status()).message().c_str());
      return 1;
    }
    ranks = std::move(made).value();
  }
  if (!flags.tensor_parallel_plan.empty() && flags.tensor_parallel_plan != "none") {
    auto plan_config = LoadConfigHereOrInSource(flags.tensor_parallel_plan);
    if (!plan_config.ok()) {
      std::fprintf(stderr, "error: %s\n", plan_config.status().message().c_str());
      return 1;
    }
    TensorParallelPlanOptions plan;
    plan.sizes = flags.tensor_parallel_plan_sizes;
    plan.batch = flags.batch;
    plan.context = flags.context;
    plan.copy_bytes_per_s = copy;
    size_t free_bytes = 0, total_bytes = 0;
    if (cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess) {
      plan.device_memory_bytes = static_cast<double>(total_bytes);
    }
    plan.bus_bytes_per_s = flags.allreduce_bus_gbs * 1e9;
    plan.collective_latency_s = flags.allreduce_latency_us * 1e-6;
    if (ranks) {
      // The plan model's all-reduce, timed on the ranks there are.
      const int64_t elements = static_cast<int64_t>(flags.batch) * plan_config->hidden_size;
      const int count = 2 * plan_config->num_layers;
      plan.measured_size = flags.tensor_parallel_size;
      plan.measured_all_reduce_s =
          TimeAllReduce(ranks->backend_pointers(), ranks->communicator_pointers(), elements, count);
      std::printf(
          "== all-reduce of %lld bf16 (%.2f MB), %d back to back in a CUDA graph on each of %d "
          "rank(s) through NCCL: %.2f us each\n",
          static_cast<long long>(elements), elements * 2 / 1e6, count, flags.tensor_parallel_size,
          plan.measured_all_reduce_s * 1e6);
      json["all_reduce"] = {{"tensor_parallel_size", flags.tensor_parallel_size},
                            {"elements", elements},
                            {"bytes", elements * 2},
                            {"count", count},
                            {"seconds_each", plan.measured_all_reduce_s}};
    }
    json["tensor_parallel_plan"] =
        PrintTensorParallelPlan(*plan_config, flags.tensor_parallel_plan, plan);
  }
  if (!flags.skip_gemm) {
    std::printf("== GEMMs of one %s layer and the lm_head\n", dir.c_str());
    const ModelConfig& c = *config;
    cuda::GemmBenchOptions options;
    options.shapes = {{"qkv", (c.num_heads + 2 * c.num_kv_heads) * c.head_dim, c.hidden_size},
                      {"o", c.hidden_size, c.num_heads * c.head_dim},
                      {"gate_up", 2 * c.intermediate_size, c.hidden_size},
                      {"down", c.hidden_size, c.intermediate_size},
                      {"lm_head", static_cast<int>(c.vocab_size), c.hidden_size}};
    options.rows = flags.gemm_rows;
    options.copy_bandwidth = copy;
    std::vector<cuda::GemmBenchResult> results;
    options.results = &results;
    cuda::RunGemmBenchmarks(options);
    if (quantization == WeightQuantization::kFp8) {
      cuda::Fp8GemmBenchOptions fp8;
      fp8.shapes.assign(options.shapes.begin(), options.shapes.end() - 1);  // lm_head stays bf16
      fp8.copy_bandwidth = copy;
      std::vector<cuda::Fp8GemmBenchResult> fp8_results;
      fp8.results = &fp8_results;
      cuda::RunFp8GemmBenchmarks(fp8);
      for (const cuda::Fp8GemmBenchResult& r : fp8_results) {
        json["fp8_gemm"].push_back({{"name", r.name},
                                    {"m", r.m},
                                    {"n", r.n},
                                    {"k", r.k},
                                    {"bf16_ms", r.bf16_ms},
                                    {"fp8_ms", r.fp8_ms},
                                    {"quantize_ms", r.quantize_ms},
                                    {"plan", r.plan}});
      }
    }
    for (const cuda::GemmBenchResult& r : results) {
      json["gemm"].push_back({{"name", r.name},
                              {"m", r.m},
                              {"n", r.n},
                              {"k", r.k},
                              {"cublas_ms", r.cublas_ms},
                              {"cublas_gbs", r.cublas_gbs},
                              {"skinny_ms", r.skinny_ms},
                              {"plan", r.plan}});
      if (r.gated_skinny_ms > 0) {
        json["gemm"].back()["silu_pair_ms"] = r.silu_pair_ms;
        json["gemm"].back()["gated_skinny_ms"] = r.gated_skinny_ms;
        json["gemm"].back()["gated_max_relative_difference"] = r.gated_max_relative_difference;
      }
    }
  }
  if (flags.prefill_step) {
    std::printf(
        "== prefill step, %s shape: %d prompts x %d tokens in one engine step (dummy weights, "
        "warmed up; host time of the step, median of 5), beside its bound: the GEMMs at the rate "
        "cuBLASLt reaches on each shape alone + causal attention at %s\n",
        dir.c_str(), flags.prefill_seqs, flags.prefill_len,
        flags.prefill_attention_tflops > 0
            ? (std::to_string(static_cast<int>(flags.prefill_attention_tflops)) + " TFLOP/s")
                  .c_str()
            : "(not counted: no --prefill-attention-tflops)");
    for (const bool sparse : {false, true}) {
      auto step_backend = MakeCudaBackend(0);
      if (!step_backend.ok()) {
        std::fprintf(stderr, "error: %s\n", step_backend.status().message().c_str());
        return 1;
      }
      if (flags.batch_invariant) {
        const Status invariant = (*step_backend)->SetBatchInvariant(true);
        SIEVE_CHECK(invariant.ok()) << invariant.ToString();  // the CUDA backend has the mode
      }
      PrefillStepBenchOptions options;
      options.num_seqs = flags.prefill_seqs;
      options.prompt_len = flags.prefill_len;
      // The headline's sparse setting (PERF.md): dense first layers, PyramidKV after.
      options.kv_policy =
          sparse ? "full:0-2,pyramidkv:3-" + std::to_string(config->num_layers - 1) : "full";
      options.kv_policy_options.budget = 400;
      options.kv_policy_options.window = 32;
      options.attention_flops_rate = flags.prefill_attention_tflops * 1e12;
      options.profile = flags.profile_prefill && sparse;
      options.quantization = quantization;
      const PrefillStepBenchResult r = RunPrefillStepBench(**step_backend, *config, options);
      const double fraction = r.bound_ms / r.step_ms;
      const std::string label = sparse ? "sparse (" + options.kv_policy + ")" : "dense";
      std::printf(
          "%-30s step %8.2f ms  %8.0f tok/s   bound %8.2f ms (GEMMs %.2f + attention %.2f)   "
          "%.0f%% of the bound   %s\n",
          label.c_str(), r.step_ms, r.tokens_per_second, r.bound_ms, r.gemm_bound_ms,
          r.attention_bound_ms, 100 * fraction,
          flags.prefill_attention_tflops <= 0 ? "(no attention bound: no target)"
          : fraction >= 0.85                  ? "target >= 85%: MET"
                                              : "target >= 85%: MISSED");
      for (const PrefillGemm& gemm : r.gemms) {
        std::printf("    %-19s %6lld x %6lld x %6lld  %7.3f ms alone  %5.0f TFLOP/s  x %d a step\n",
                    gemm.name.c_str(), static_cast<long long>(gemm.m),
                    static_cast<long long>(gemm.n), static_cast<long long>(gemm.k), gemm.ms_alone,
                    gemm.flops_rate / 1e12, gemm.calls);
      }
      std::printf("    step FLOPs: GEMMs %.1f T, attention %.1f T: %.0f TFLOP/s achieved\n",
                  r.gemm_flops / 1e12, r.attention_flops / 1e12,
                  (r.gemm_flops + r.attention_flops) / (r.step_ms * 1e-3) / 1e12);
      nlohmann::json& out = json[sparse ? "prefill_step_sparse" : "prefill_step_dense"];
      out = {{"policy", options.kv_policy},
             {"num_seqs", options.num_seqs},
             {"prompt_len", options.prompt_len},
             {"step_ms", r.step_ms},
             {"tokens_per_second", r.tokens_per_second},
             {"bound_ms", r.bound_ms},
             {"gemm_bound_ms", r.gemm_bound_ms},
             {"attention_bound_ms", r.attention_bound_ms},
             {"attention_tflops", flags.prefill_attention_tflops},
             {"fraction_of_bound", fraction},
             {"gemm_flops", r.gemm_flops},
             {"attention_flops", r.attention_flops}};
      for (const PrefillGemm& gemm : r.gemms) {
        out["gemms"].push_back({{"name", gemm.name},
                                {"m", gemm.m},
                                {"n", gemm.n},
                                {"k", gemm.k},
                                {"ms_alone", gemm.ms_alone},
                                {"tflops", gemm.flops_rate / 1e12},
                                {"calls", gemm.calls}});
      }
    }
  }
  if (!flags.skip_decode_step) {
    std::printf(
        "== decode step, %s shape, batch %d x %d context (dummy weights, %s; median of 20 samples"
        " of 5 steps, %s; host = one step's launch + run + synchronise, median of 100)\n",
        dir.c_str(), flags.batch, flags.context, flags.no_graph ? "no graph" : "CUDA graph",
        flags.no_graph ? "host time" : "device time by CUDA events");
    if (flags.pages_in_order) {
      std::printf("pages: in order, each sequence's adjacent (--pages-in-order)\n");
    }
    if (flags.batch_invariant) std::printf("batch-invariant kernels (--batch-invariant)\n");
    // The defaults first, then the variants (kStepVariants), each on a backend of its own.
    // SIEVE_PDL=0 when the command starts holds for every row (the first row is then not the
    // defaults, and says so).
    std::vector<StepVariant> variants = {StepVariant{}};
    for (const StepVariant& variant : kStepVariants) {
      const bool named = flags.step_variants.empty() ||
                         std::find(flags.step_variants.begin(), flags.step_variants.end(),
                                   variant.name) != flags.step_variants.end();
      if (!flags.no_step_variants && named) variants.push_back(variant);
    }
    const bool given_pdl = cuda::PdlSetting().load() != 0;
    const std::string given_text = given_pdl ? "" : " SIEVE_PDL=0";
    if (!given_text.empty()) {
      std::printf("environment (every row, variants change only their own):%s\n",
                  given_text.c_str());
    }
    for (const StepVariant& variant : variants) {
      cuda::SetPdlEnabled(variant.pdl && given_pdl);
      const bool headline = variant.label[0] == '\0';
      for (const double kept : {1.0, 0.1}) {
        // A fresh backend for each step, as an engine serving it would have: its GEMM choices
        // are tuned on this step (runtime/step_tuning.h), not on the one before.
        auto step_backend = MakeCudaBackend(0);
        if (!step_backend.ok()) {
          std::fprintf(stderr, "error: %s\n", step_backend.status().message().c_str());
          return 1;
        }
        if (flags.batch_invariant) {
          const Status invariant = (*step_backend)->SetBatchInvariant(true);
          SIEVE_CHECK(invariant.ok()) << invariant.ToString();  // the CUDA backend has the mode
        }
        DecodeStepBenchOptions options;
        options.batch = flags.batch;
        options.context = flags.context;
        options.kept_fraction = kept;
        options.copy_bandwidth = copy;
        options.quantization = quantization;
        options.fp8_kv_cache = flags.kv_cache_dtype == "fp8";
        options.use_graph = !flags.no_graph;
        // The engine's default max_model_len: the model's, capped at 8192 (runtime/engine.h).
        options.length_bounds = variant.length_bounds;
        options.page_order = flags.pages_in_order ? PageOrder::kInOrder : PageOrder::kShuffled;
        if (config->max_position_embeddings > 0) {
          options.max_model_len = std::min(config->max_position_embeddings, 8192);
        }
        options.profiled_steps = flags.profile_step && headline && kept < 1.0 ? kProfiledSteps : 0;
        options.breakdown = headline;
        // SIEVE_DECODE_TRACE=1: the defaults' decode attention phases (decode_attention.h).
        options.trace_attention = headline && cuda::DecodeAttentionTraceRequested();
        const DecodeStepBenchResult r = RunDecodeStepBench(**step_backend, *config, options);
        const double ratio = r.step_ms / r.bound_ms;
        const std::string label = std::string(kept == 1.0 ? "dense" : "1/10 kept") + variant.label;
        std::printf(
            "%-26s step %7.2f ms (host %6.2f)  bound %7.2f ms (%.1f GB at the copy rate)"
            "  %.2fx the bound  %8.0f tok/s   %s\n",
            label.c_str(), r.step_ms, r.step_wall_ms, r.bound_ms, r.bytes / 1e9, ratio,
            r.tokens_per_second,
            !headline             ? "(variant, for comparison)"
            : !given_text.empty() ? "(the environment's choices, not the defaults)"
            : ratio <= 1.3        ? "target <= 1.3x: MET"
                                  : "target <= 1.3x: MISSED");
        if (!r.attention_trace.empty()) std::printf("%s", r.attention_trace.c_str());
        if (!r.tuning.empty()) {
          std::printf("  step tuning (%.2f s with the final capture):\n%s", r.tuning_s,
                      Indent(r.tuning, "    ").c_str());
        }
        for (const DecodeStepPart& part : r.parts) {
          const double bound_ms = copy > 0 ? part.bytes / copy * 1e3 : 0;
          std::printf("    %-28s %7.3f ms  %5.1f%% of the step   bound %7.3f ms   %.2fx\n",
                      part.name.c_str(), part.ms, 100.0 * part.ms / r.step_ms, bound_ms,
                      bound_ms > 0 ? part.ms / bound_ms : 0.0);
        }
        std::string key = kept == 1.0 ? "decode_step_dense" : "decode_step_sparse";
        if (!headline) key += std::string("_") + variant.name;
        json[key] = {{"step_ms", r.step_ms},
                     {"step_wall_ms", r.step_wall_ms},
                     {"bound_ms", r.bound_ms},
                     {"ratio", ratio},
                     {"tokens_per_second", r.tokens_per_second},
                     {"bytes", r.bytes},
                     {"batch", flags.batch},
                     {"context", flags.context},
                     {"kept_fraction", kept}};
        if (headline && !given_text.empty()) json[key]["environment"] = given_text;
        for (const DecodeStepPart& part : r.parts) {
          json[key]["parts"].push_back(
              {{"name", part.name}, {"ms", part.ms}, {"bytes", part.bytes}});
        }
      }
    }
    cuda::SetPdlEnabled(given_pdl);
  }
  if (ranks) {
    std::printf(
        "== decode step, %s shape split over %d rank(s) through NCCL, batch %d x %d context "
        "(CUDA graph per rank, all replayed at once: the slowest rank's device time; bound: one "
        "rank's weights + KV at the copy rate, all-reduces not counted)\n",
        dir.c_str(), flags.tensor_parallel_size, flags.batch, flags.context);
    for (const double kept : {1.0, 0.1}) {
      DecodeStepBenchOptions options;
      options.batch = flags.batch;
      options.context = flags.context;
      options.kept_fraction = kept;
      options.copy_bandwidth = copy;
      const DecodeStepBenchResult r = RunShardedDecodeStepBench(
          ranks->backend_pointers(), ranks->communicator_pointers(), *config, options);
      const std::string label = std::string(kept == 1.0 ? "dense" : "1/10 kept") +
                                ", TP=" + std::to_string(flags.tensor_parallel_size);
      std::printf(
          "%-26s step %7.2f ms (host %6.2f)  bound %7.2f ms (%.1f GB a rank)  %.2fx the "
          "bound  %8.0f tok/s\n",
          label.c_str(), r.step_ms, r.step_wall_ms, r.bound_ms, r.bytes / 1e9,
          r.step_ms / r.bound_ms, r.tokens_per_second);
      json[kept == 1.0 ? "decode_step_dense_tp" : "decode_step_sparse_tp"] = {
          {"tensor_parallel_size", flags.tensor_parallel_size},
          {"step_ms", r.step_ms},
          {"step_wall_ms", r.step_wall_ms},
          {"bound_ms", r.bound_ms},
          {"ratio", r.step_ms / r.bound_ms},
          {"tokens_per_second", r.tokens_per_second},
          {"bytes_per_rank", r.bytes},
          {"batch", flags.batch},
          {"context", flags.context},
          {"kept_fraction", kept}};
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
  app.add_flag("--skip-gemm", flags->skip_gemm, "Skip the decode-size GEMMs");
  app.add_option("--gemm-rows", flags->gemm_rows,
                 "Rows (decode batch sizes) of the GEMM table, e.g. 1,16,64,256")
      ->capture_default_str()
      ->check(CLI::Range(1, 65536))
      ->delimiter(',');
  app.add_flag("--skip-decode-step", flags->skip_decode_step, "Skip the whole-model decode step");
  app.add_flag("--no-graph", flags->no_graph, "Run the decode step without a CUDA graph");
  app.add_flag("--batch-invariant", flags->batch_invariant,
               "Run the decode and prefill steps as --batch-invariant serves them (one GEMM "
               "configuration per weight for every row count, fixed-size decode attention "
               "splits): run with and without it to measure the mode's cost per step");
  app.add_flag("--profile-step", flags->profile_step,
               "Bracket 3 sparse decode steps (back to back) with cudaProfilerStart/Stop, for "
               "`ncu --profile-from-start off` or tools/kernel_timeline");
  CLI::Option* no_step_variants =
      app.add_flag("--no-step-variants", flags->no_step_variants,
                   "Time the decode step's defaults only, not its variants for comparison");
  app.add_option("--step-variant", flags->step_variants,
                 "Time only these variants beside the decode step's defaults (repeat or separate "
                 "by commas; default: all of them)")
      ->check(CLI::IsMember(StepVariantNames()))
      ->delimiter(',')
      ->excludes(no_step_variants);
  app.add_flag("--pages-in-order", flags->pages_in_order,
               "Decode step: every row with the KV pages in order, each sequence's adjacent (as "
               "a fresh server hands them out; default: shuffled over the whole pool)");
  app.add_option("--quantization", flags->quantization,
                 "none | fp8: the decode and prefill steps' layer weights in FP8 (e4m3, per "
                 "channel; inputs per token), and an FP8 against bf16 table of the layer's GEMMs "
                 "at 1 to 8192 rows")
      ->check(CLI::IsMember({"none", "fp8"}))
      ->capture_default_str();
  app.add_option("--kv-cache-dtype", flags->kv_cache_dtype,
                 "auto | fp8: the decode step's KV pool in the activation dtype or in e4m3 with "
                 "per-(layer, KV head) scales (the bound counts its bytes)")
      ->check(CLI::IsMember({"auto", "fp8"}))
      ->capture_default_str();
  app.add_flag("--prefill-step", flags->prefill_step,
               "Also time a prefill step of --prefill-seqs prompts of --prefill-len tokens, dense "
               "and sparse (full:0-2,pyramidkv:3-, budget 400, window 32), beside its compute "
               "bound");
  app.add_option("--prefill-seqs", flags->prefill_seqs, "Prefill step: prompts in the step")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  app.add_option("--prefill-len", flags->prefill_len, "Prefill step: tokens per prompt")
      ->capture_default_str()
      ->check(CLI::Range(16, 131072));
  app.add_option("--prefill-attention-tflops", flags->prefill_attention_tflops,
                 "Prefill step: the attention rate of the bound, TFLOP/s (cuDNN SDPA's, e.g. "
                 "from scripts/sdpa_bench.py; 0: the bound leaves attention out)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_flag(
      "--profile-prefill", flags->profile_prefill,
      "Bracket one sparse prefill step with cudaProfilerStart/Stop (tools/kernel_timeline, "
      "ncu --profile-from-start off)");
  app.add_option("--tensor-parallel-size", flags->tensor_parallel_size,
                 "Split over N GPUs (cuda:0 .. N-1) through NCCL: time the all-reduce of a "
                 "decode step of the --tensor-parallel-plan model (used in the plan's row for N) "
                 "and the --model-config decode step itself, each in CUDA graphs as the engine "
                 "runs them (1: the one-rank NCCL path; 0: none)")
      ->capture_default_str()
      ->check(CLI::Range(0, 64));
  app.add_option("--tensor-parallel-plan", flags->tensor_parallel_plan,
                 "Directory whose config.json shapes the tensor-parallel decode step bound ("
                 "weights, KV and all-reduces of one rank at batch --batch, context --context, "
                 "for each of --tensor-parallel-plan-sizes); none: skip it")
      ->capture_default_str();
  app.add_option("--tensor-parallel-plan-sizes", flags->tensor_parallel_plan_sizes,
                 "Tensor parallel sizes of the plan")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  app.add_option("--allreduce-bus-gbs", flags->allreduce_bus_gbs,
                 "The plan's all-reduce bus bandwidth, GB/s (default: what NCCL's ring reaches on "
                 "NVLink 4 without NVLink SHARP, ~370 by NCCL's maintainers)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--allreduce-latency-us", flags->allreduce_latency_us,
                 "The plan's fixed time of one all-reduce, us")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  return [flags]() { return Run(*flags); };
}

}  // namespace sieve
