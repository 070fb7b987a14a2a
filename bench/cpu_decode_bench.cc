// CPU decode speed of the reference backend: the embedded tiny model and a 100M-class
// random-weight model, one sequence, greedy. Prints tokens/s, the weight-streaming bound of the
// measured memory bandwidth, and the memory used.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>

#include "backend/cpu/cpu_ceilings.h"
#include "bench/memory_usage.h"
#include "core/thread_pool.h"
#include "runtime/engine.h"
#include "runtime/model_loader.h"

namespace sieve {
namespace {

void Run(const char* name, const ModelConfig& config, float init_std, double bandwidth) {
  const int64_t rss_before = ProcStatusKb("VmRSS");
  auto backend = MakeCpuBackend();
  auto model = LlamaModel::Random(config, *backend, 5, 1024, init_std);
  EngineOptions options;
  options.max_model_len = 1024;
  options.max_num_seqs = 8;
  options.kv_memory_bytes = 64 << 20;
  auto engine = Engine::Create(std::move(model), nullptr, {}, options);
  if (!engine.ok()) {
    std::printf("%s: %s\n", name, engine.status().ToString().c_str());
    return;
  }
  std::vector<int32_t> prompt(32);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>((i * 37) % 256);
  SamplingParams params;
  params.temperature = 0;
  params.ignore_eos = true;
  params.max_tokens = 65;
  (void)(*engine)->Add({prompt, params, ""});
  // The first step is the prefill; time the decode steps after it.
  (*engine)->Step();
  const auto start = std::chrono::steady_clock::now();
  int tokens = 0;
  while ((*engine)->HasWork()) {
    for (const auto& output : (*engine)->Step())
      tokens += static_cast<int>(output.new_tokens.size());
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // f32 weights streamed once per token; the embedding table is not (one row is read).
  const double weight_bytes = (static_cast<double>(config.NumParameters()) -
                               static_cast<double>(config.vocab_size) * config.hidden_size *
                                   (config.tie_word_embeddings ? 0 : 1)) *
                              4;
  const double bound = bandwidth / weight_bytes;  // tokens/s if each step streams the weights once
  std::printf(
      "%-28s %6.1fM params  decode %8.1f tok/s (%6.2f ms/token)  bound %8.1f tok/s (%3.0f%%)"
      "  memory %lld MB (peak %lld MB)\n",
      name, config.NumParameters() / 1e6, tokens / seconds, 1e3 * seconds / tokens, bound,
      100.0 * (tokens / seconds) / bound,
      static_cast<long long>((ProcStatusKb("VmRSS") - rss_before) / 1024),
      static_cast<long long>(ProcStatusKb("VmHWM") / 1024));
}

}  // namespace
}  // namespace sieve

int main() {
  using namespace sieve;
  const double bandwidth = cpu::MeasureReadBandwidth(ThreadPool::Default());
  std::printf(
      "CPU decode, %d threads, measured read bandwidth %.1f GB/s (the bound streams the "
      "f32 weights once per token)\n",
      ThreadPool::Default().num_threads(), bandwidth / 1e9);
  Run("tiny (random)", TinyRandomModelConfig(), 0.08f, bandwidth);
  ModelConfig medium = TinyRandomModelConfig();
  medium.vocab_size = 32000;
  medium.hidden_size = 768;
  medium.intermediate_size = 2048;
  medium.num_layers = 12;
  medium.num_heads = 12;
  medium.num_kv_heads = 4;
  medium.head_dim = 64;
  Run("100M-class (random)", medium, 0.02f, bandwidth);
  return 0;
}
