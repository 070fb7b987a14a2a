#include "tools/prefill_step_bench.h"

#include <algorithm>
#include <chrono>
#include <random>

#include "core/check.h"
#include "runtime/engine.h"

#ifdef SIEVE_HAVE_CUDA
#include <cuda_profiler_api.h>
#endif

namespace sieve {

namespace {

double Median(std::vector<double> values) {
  SIEVE_CHECK(!values.empty());
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

// One call of out = x w^T at m x n x k, median of 5 samples of 4 calls each (after 2 warm-up
// calls, which also plan the shape if the engine had not).
double TimeGemmMs(Backend& backend, int64_t m, int64_t n, int64_t k,
                  WeightQuantization quantization) {
  Tensor x = backend.Allocate({m, k}, DType::kBF16);
  Tensor w = backend.Allocate({n, k}, DType::kBF16);
  Tensor out = backend.Allocate({m, n}, DType::kBF16);
  backend.FillRandom(x, 3, 1.0f);
  backend.FillRandom(w, 4, 0.02f);
  if (quantization == WeightQuantization::kFp8) w = backend.QuantizeWeightE4m3(w);
  for (int i = 0; i < 2; ++i) backend.Linear(x, w, out);
  backend.Synchronize();
  std::vector<double> samples;
  for (int sample = 0; sample < 5; ++sample) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < 4; ++i) backend.Linear(x, w, out);
    backend.Synchronize();
    samples.push_back(Seconds(start) * 1e3 / 4);
  }
  return Median(samples);
}

}  // namespace

PrefillStepBenchResult RunPrefillStepBench(Backend& backend, const ModelConfig& config,
                                           const PrefillStepBenchOptions& options) {
  const int seqs = options.num_seqs;
  const int n = options.prompt_len;
  const int tokens = seqs * n;
  EngineOptions engine_options;
  engine_options.max_num_seqs = seqs;
  engine_options.max_num_batched_tokens = tokens;  // every prompt in one step
  engine_options.max_model_len = n + 8;
  engine_options.kv_policy = options.kv_policy;
  engine_options.kv_policy_options = options.kv_policy_options;
  engine_options.memory_fraction = 0.5;
  // FP8 weights are quantized layer by layer as they are made (LlamaModel::RandomShard).
  auto model =
      LlamaModel::RandomShard(config, backend, 1, n + 8, {}, nullptr, 0.02f, options.quantization);
  SIEVE_CHECK(model.ok()) << model.status().ToString();  // the command checked the device
  auto engine = Engine::Create(std::move(model).value(), nullptr, {}, engine_options);
  SIEVE_CHECK(engine.ok()) << engine.status().ToString();
  (*engine)->WarmUp();

  std::mt19937_64 rng(11);
  const auto step = [&] {
    for (int seq = 0; seq < seqs; ++seq) {
      std::vector<int32_t> prompt(n);
      for (int32_t& token : prompt) token = static_cast<int32_t>(rng() % config.vocab_size);
      SamplingParams params;
      params.temperature = 0;
      params.max_tokens = 1;
      params.ignore_eos = true;
      SIEVE_CHECK((*engine)->Add({std::move(prompt), params, ""}).ok());
    }
    backend.Synchronize();
    const auto start = std::chrono::steady_clock::now();
    const std::vector<RequestOutput> outputs = (*engine)->Step();
    backend.Synchronize();
    const double ms = Seconds(start) * 1e3;
    // One step prefills every prompt and samples its one token: all finish in it.
    SIEVE_CHECK(static_cast<int>(outputs.size()) == seqs && !(*engine)->HasWork())
        << "the prompts did not fit one step";
    return ms;
  };
  step();  // the first step: any first-use work the warm-up left
  std::vector<double> times;
  for (int i = 0; i < options.iterations; ++i) times.push_back(step());
#ifdef SIEVE_HAVE_CUDA
  if (options.profile && backend.device() == Device::kCuda) {
    cudaProfilerStart();
    step();
    cudaProfilerStop();
  }
#endif

  PrefillStepBenchResult result;
  result.step_ms = Median(times);
  result.tokens_per_second = tokens / (result.step_ms * 1e-3);
  const int64_t d = config.hidden_size, hd = config.head_dim, h = config.num_heads,
                g = config.num_kv_heads, f = config.intermediate_size;
  const int layers = config.num_layers;
  // The last layer's output projection and MLP run on the sampled rows only, one a prompt
  // (LlamaModel::Forward).
  result.gemms = {
      {"qkv", tokens, (h + 2 * g) * hd, d, layers}, {"o", tokens, d, h * hd, layers - 1},
      {"gate_up", tokens, 2 * f, d, layers - 1},    {"down", tokens, d, f, layers - 1},
      {"o, last layer", seqs, d, h * hd, 1},        {"gate_up, last layer", seqs, 2 * f, d, 1},
      {"down, last layer", seqs, d, f, 1}};
  for (PrefillGemm& gemm : result.gemms) {
    gemm.ms_alone = TimeGemmMs(backend, gemm.m, gemm.n, gemm.k, options.quantization);
    const double flops = 2.0 * gemm.m * gemm.n * gemm.k;
    gemm.flops_rate = flops / (gemm.ms_alone * 1e-3);
    result.gemm_flops += flops * gemm.calls;
    result.gemm_bound_ms += gemm.ms_alone * gemm.calls;
  }
  // Causal attention of each prompt: query i sees keys 0..i, QK^T and PV 2 FLOPs each per head
  // dimension.
  result.attention_flops = 4.0 * h * hd * (static_cast<double>(n) * (n + 1) / 2) * seqs * layers;
  if (options.attention_flops_rate > 0) {
    result.attention_bound_ms = result.attention_flops / options.attention_flops_rate * 1e3;
  }
  result.bound_ms = result.gemm_bound_ms + result.attention_bound_ms;
  return result;
}

}  // namespace sieve
