// sieve bench cpu: the CPU backend's prefill and decode rates beside this machine's ceilings. The
// ceilings are measured first: the fp32 FMA rate of the vector unit (registers only), the rate of
// the backend's own GEMM on a large square product (the machine's fp32 GEMM rate as Sieve reaches
// it), and the read bandwidth. Then a model (the default one unless --model) prefills a batch of
// prompts in one engine, as `sieve eval` runs its samples, and decodes a batch of sequences.
// Prefill is held to half the GEMM rate; decode is shown beside its roofline (each step's weights
// and KV at the read bandwidth, or its FLOPs at the GEMM rate, whichever is longer).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_ceilings.h"
#include "backend/cpu/cpu_kernels.h"
#include "core/thread_pool.h"
#include "tools/commands.h"
#include "tools/engine_flags.h"

namespace sieve {

namespace {

struct CpuBenchFlags {
  EngineFlags engine;
  int prompts = 8;
  int prompt_len = 2048;
  int decode_batch = 8;
  int decode_context = 512;
  int decode_tokens = 64;
  int gemm_size = 2048;
  double prefill_target = 0.5;  // of the GEMM rate
  std::string result_json;
};

double Seconds(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The backend's GEMM on x [n][n] w [n][n]^T, best of 3 after a warm-up: FLOP/s.
double MeasureSquareGemm(Backend& backend, int n) {
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  std::vector<float> values(static_cast<size_t>(n) * n);
  for (float& value : values) value = normal(rng);
  Tensor x = backend.Allocate({n, n}, DType::kF32);
  Tensor w = backend.Allocate({n, n}, DType::kF32);
  Tensor out = backend.Allocate({n, n}, DType::kF32);
  backend.CopyFromHost(values.data(), values.size() * sizeof(float), x);
  backend.CopyFromHost(values.data(), values.size() * sizeof(float), w);
  backend.Linear(x, w, out);
  double best = 1e30;
  for (int trial = 0; trial < 3; ++trial) {
    const auto start = std::chrono::steady_clock::now();
    backend.Linear(x, w, out);
    backend.Synchronize();
    best = std::min(best, Seconds(start));
  }
  return 2.0 * n * n * static_cast<double>(n) / best;
}

// The machine's fp32 GEMM rate as the backend reaches it: its best over square products of
// largest / 4, largest / 2 and largest (the large ones outgrow the caches its tiles stream from,
// the small ones its threads' share of work).
double MeasureGemmRate(Backend& backend, int largest) {
  double best = 0;
  for (int n : {largest / 4, largest / 2, largest}) {
    if (n >= 16) best = std::max(best, MeasureSquareGemm(backend, n));
  }
  return best;
}

// FLOPs of a prefill of `len` tokens: every token through the layers' linear weights, causal
// attention (q.k and p.v over the tokens before it and itself), and the LM head for the last row
// only (what the engine computes for a sampled prompt).
double PrefillFlops(const ModelConfig& config, int len) {
  const double linear =
      2.0 * static_cast<double>(config.LinearParametersPerLayer()) * config.num_layers * len;
  const double attention = 4.0 * config.num_layers * config.num_heads * config.head_dim *
                           (static_cast<double>(len) * (len + 1) / 2);
  const double lm_head = 2.0 * config.hidden_size * config.vocab_size;
  return linear + attention + lm_head;
}

std::vector<int32_t> RandomPrompt(std::mt19937& rng, int len, int vocab) {
  std::uniform_int_distribution<int32_t> token(2, vocab - 1);
  std::vector<int32_t> prompt(len);
  for (int32_t& id : prompt) id = token(rng);
  return prompt;
}

// Adds the requests and steps the engine until they finish: seconds.
Result<double> RunBatch(Engine& engine, const std::vector<std::vector<int32_t>>& prompts,
                        int max_tokens, double* decode_seconds, int64_t* decode_tokens) {
  for (const auto& prompt : prompts) {
    Request request;
    request.prompt = prompt;
    request.sampling.temperature = 0;
    request.sampling.max_tokens = max_tokens;
    request.sampling.ignore_eos = true;
    auto id = engine.Add(std::move(request));
    if (!id.ok()) {
      // Requests already added would still run: finish them before reporting.
      while (engine.HasWork()) engine.Step();
      return id.status();
    }
  }
  const auto start = std::chrono::steady_clock::now();
  // Decode is timed from the step after the last prompt's first token on.
  size_t first_tokens = 0;
  std::chrono::steady_clock::time_point decode_start;
  int64_t tokens_after = 0;
  while (engine.HasWork()) {
    for (const RequestOutput& output : engine.Step()) {
      if (first_tokens < prompts.size()) {
        if (!output.new_tokens.empty()) ++first_tokens;
        if (first_tokens == prompts.size()) decode_start = std::chrono::steady_clock::now();
      } else {
        tokens_after += static_cast<int64_t>(output.new_tokens.size());
      }
    }
  }
  if (decode_seconds != nullptr) *decode_seconds = Seconds(decode_start);
  if (decode_tokens != nullptr) *decode_tokens = tokens_after;
  return Seconds(start);
}

int Run(CpuBenchFlags& flags) {
  if (flags.engine.device != "cpu") {
    std::fprintf(stderr, "error: sieve bench cpu runs on the CPU (--device cpu), not '%s'\n",
                 flags.engine.device.c_str());
    return 2;
  }
  if (flags.prompts < 1 || flags.prompt_len < 1 || flags.decode_batch < 1 ||
      flags.decode_context < 1 || flags.decode_tokens < 1 || flags.gemm_size < 16) {
    std::fprintf(stderr, "error: the counts and lengths must be positive (--gemm-size >= 16)\n");
    return 2;
  }
  EngineOptions& options = flags.engine.engine;
  options.max_model_len = std::max({options.max_model_len, flags.prompt_len + 1,
                                    flags.decode_context + flags.decode_tokens + 1});
  auto built = BuildEngine(flags.engine);
  if (!built.ok()) {
    std::fprintf(stderr, "error: %s\n", built.status().message().c_str());
    return 1;
  }
  EngineBundle bundle = std::move(built).value();
  Engine& engine = *bundle.engine;
  const ModelConfig& config = engine.model().config();
  ThreadPool& pool = ThreadPool::Default();
  const cpu::Isa isa = cpu::BestIsa();

  const double peak = cpu::MeasureFmaPeak(pool, isa);
  const double gemm = MeasureGemmRate(*bundle.backend, flags.gemm_size);
  const double bandwidth = cpu::MeasureReadBandwidth(pool);
  std::printf(
      "CPU ceilings (%d threads, %s): fp32 FMA peak %.1f GFLOP/s (registers only); fp32 "
      "GEMM %.1f GFLOP/s (the backend's best up to %d^3, %.0f%% of the peak); read bandwidth "
      "%.1f GB/s\n",
      pool.num_threads(), cpu::IsaName(isa), peak / 1e9, gemm / 1e9, flags.gemm_size,
      100 * gemm / peak, bandwidth / 1e9);
  std::printf("model: %s (%.1fM parameters)\n", bundle.loaded.description.c_str(),
              config.NumParameters() / 1e6);

  // Prefill: the batch once to warm up (the KV pool's first touch, the allocator), then timed.
  std::mt19937 rng(7);
  auto prompt_batch = [&](int count, int len) {
    std::vector<std::vector<int32_t>> batch;
    for (int i = 0; i < count; ++i) batch.push_back(RandomPrompt(rng, len, config.vocab_size));
    return batch;
  };
  auto timed = RunBatch(engine, prompt_batch(flags.prompts, flags.prompt_len), 1, nullptr, nullptr);
  if (timed.ok()) {
    timed = RunBatch(engine, prompt_batch(flags.prompts, flags.prompt_len), 1, nullptr, nullptr);
  }
  if (!timed.ok()) {
    std::fprintf(stderr, "error: prefill: %s\n", timed.status().message().c_str());
    return 1;
  }
  const double prefill_s = *timed;
  const double prefill_flops = flags.prompts * PrefillFlops(config, flags.prompt_len);
  const double prefill_rate = prefill_flops / prefill_s;
  const bool prefill_met = prefill_rate >= flags.prefill_target * gemm;
  std::printf(
      "prefill  %d prompts x %d tokens: %.2f s, %.0f prompt tok/s, %.1f GFLOP/s = %.0f%% "
      "of the GEMM rate (%.0f%% of the peak)   target >= %.0f%% of the GEMM rate: %s\n",
      flags.prompts, flags.prompt_len, prefill_s,
      flags.prompts * static_cast<double>(flags.prompt_len) / prefill_s, prefill_rate / 1e9,
      100 * prefill_rate / gemm, 100 * prefill_rate / peak, 100 * flags.prefill_target,
      prefill_met ? "MET" : "MISSED");

  // Decode: the batch's steps after every prompt's first token.
  double decode_s = 0;
  int64_t decode_tokens = 0;
  auto decoded = RunBatch(engine, prompt_batch(flags.decode_batch, flags.decode_context),
                          flags.decode_tokens + 1, &decode_s, &decode_tokens);
  if (!decoded.ok()) {
    std::fprintf(stderr, "error: decode: %s\n", decoded.status().message().c_str());
    return 1;
  }
  const double decode_rate = decode_tokens / decode_s;
  // A step reads every weight but the embedding table (one row a token) and each sequence's KV
  // (f32, both halves, every layer) at its mean context; its GEMMs do 2 FLOPs a weight a row.
  const double weights =
      static_cast<double>(config.NumParameters()) -
      (config.tie_word_embeddings ? 0.0
                                  : static_cast<double>(config.vocab_size) * config.hidden_size);
  const double mean_context = flags.decode_context + flags.decode_tokens / 2.0;
  const double kv_bytes = static_cast<double>(flags.decode_batch) * mean_context * 2.0 *
                          config.num_layers * config.num_kv_heads * config.head_dim * 4;
  const double step_bytes = weights * 4 + kv_bytes;
  const double step_flops =
      2.0 * weights * flags.decode_batch + 4.0 * flags.decode_batch * config.num_layers *
                                               config.num_heads * config.head_dim * mean_context;
  const double step_bound = std::max(step_bytes / bandwidth, step_flops / gemm);
  const double decode_bound = flags.decode_batch / step_bound;
  std::printf(
      "decode   batch %d, context %d + %d tokens: %.0f tok/s (%.2f ms a step)   "
      "bound %.0f tok/s (%s: %.1f MB a step at the read bandwidth, %.2f GFLOP at the GEMM "
      "rate) = %.0f%% of it\n",
      flags.decode_batch, flags.decode_context, flags.decode_tokens, decode_rate,
      1e3 * flags.decode_batch / decode_rate, decode_bound,
      step_bytes / bandwidth >= step_flops / gemm ? "bytes" : "FLOPs", step_bytes / 1e6,
      step_flops / 1e9, 100 * decode_rate / decode_bound);

  if (!flags.result_json.empty()) {
    nlohmann::json json;
    json["threads"] = pool.num_threads();
    json["isa"] = cpu::IsaName(isa);
    json["model"] = bundle.loaded.description;
    json["fma_peak_gflops"] = peak / 1e9;
    json["gemm_gflops"] = gemm / 1e9;
    json["gemm_size"] = flags.gemm_size;
    json["read_bandwidth_gbs"] = bandwidth / 1e9;
    json["prefill"] = {{"prompts", flags.prompts},
                       {"prompt_len", flags.prompt_len},
                       {"seconds", prefill_s},
                       {"gflops", prefill_rate / 1e9},
                       {"fraction_of_gemm", prefill_rate / gemm},
                       {"target_fraction_of_gemm", flags.prefill_target},
                       {"met", prefill_met}};
    json["decode"] = {{"batch", flags.decode_batch},
                      {"context", flags.decode_context},
                      {"tokens", flags.decode_tokens},
                      {"tokens_per_s", decode_rate},
                      {"bound_tokens_per_s", decode_bound}};
    std::ofstream(flags.result_json) << json.dump(1) << "\n";
  }
  return 0;
}

}  // namespace

CommandRunner AddBenchCpuCommand(CLI::App& app) {
  auto flags = std::make_shared<CpuBenchFlags>();
  flags->engine.device = "cpu";
  flags->engine.kv_memory = "1G";
  AddEngineFlags(app, flags->engine);
  app.add_option("--prompts", flags->prompts, "Prompts prefilled together")->capture_default_str();
  app.add_option("--prompt-len", flags->prompt_len, "Tokens a prompt (random ids)")
      ->capture_default_str();
  app.add_option("--decode-batch", flags->decode_batch, "Sequences decoding together")
      ->capture_default_str();
  app.add_option("--decode-context", flags->decode_context, "Prompt tokens of each decoding one")
      ->capture_default_str();
  app.add_option("--decode-tokens", flags->decode_tokens, "Tokens each decodes (timed)")
      ->capture_default_str();
  app.add_option("--gemm-size", flags->gemm_size,
                 "The largest N of the N x N x N GEMMs (N/4, N/2, N) whose best rate is the "
                 "machine's GEMM rate")
      ->capture_default_str();
  app.add_option("--result-json", flags->result_json, "Write the measurements here");
  return [flags] { return Run(*flags); };
}

}  // namespace sieve
