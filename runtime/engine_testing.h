// Engines over small random models on the CPU backend, shared by the engine tests.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/check.h"
#include "model/llama_model.h"
#include "runtime/engine.h"
#include "runtime/model_loader.h"

namespace sieve::testing {

inline ModelConfig SmallConfig() {
  ModelConfig config = TinyRandomModelConfig();
  config.hidden_size = 64;
  config.intermediate_size = 128;
  config.num_layers = 3;
  config.num_heads = 4;
  config.num_kv_heads = 2;
  config.head_dim = 16;
  config.max_position_embeddings = 8192;
  return config;
}

struct TestEngine {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Engine> engine;
};

inline TestEngine MakeEngine(const ModelConfig& config, EngineOptions options, uint64_t seed = 7) {
  TestEngine t;
  t.backend = MakeCpuBackend();
  if (options.max_model_len == 0) options.max_model_len = config.max_position_embeddings;
  if (options.kv_memory_bytes == 0) options.kv_memory_bytes = int64_t{256} << 20;
  auto model = LlamaModel::Random(config, *t.backend, seed, options.max_model_len, 0.08f);
  auto engine = Engine::Create(std::move(model), nullptr, {257, 260}, options);
  SIEVE_CHECK(engine.ok()) << engine.status().ToString();
  t.engine = std::move(engine).value();
  return t;
}

inline std::vector<int32_t> RandomPrompt(std::mt19937_64& rng, int length) {
  std::vector<int32_t> prompt(length);
  for (int32_t& token : prompt) token = static_cast<int32_t>(rng() % 256);
  return prompt;
}

// Small budgets and 4-entry pages, so that a sparse policy drops entries within a short prompt and
// a pool of a few dozen pages forces preemption.
inline EngineOptions TightPolicyOptions(const std::string& policy) {
  EngineOptions options;
  options.kv_policy = policy;
  options.kv_policy_options.budget = 24;
  options.kv_policy_options.window = 4;
  options.kv_policy_options.heavy = 12;
  options.kv_policy_options.recent = 12;
  options.kv_policy_options.sinks = 2;
  options.page_size = 4;
  options.max_model_len = 160;
  return options;
}

}  // namespace sieve::testing
