// LoadModel: everything `sieve generate` and `sieve serve` need from a model directory (or the
// embedded default): the config, the weights on the backend, the tokenizer, the EOS ids.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/generation_config.h"
#include "model/llama_model.h"
#include "model/model_config.h"
#include "tokenizer/tokenizer.h"

namespace sieve {

struct LoadModelOptions {
  std::string model_dir;             // "" : the embedded default model
  std::string load_format = "auto";  // auto | safetensors | dummy (random weights, config only)
  std::string tokenizer_path;        // "" : the model directory
  std::string chat_template;         // "" : detect; else llama3 | llama2 | mistral
  int max_model_len = 0;             // positions to prepare RoPE for (0: engine default)
  uint64_t dummy_seed = 0;
};

struct LoadedModel {
  std::unique_ptr<LlamaModel> model;
  std::unique_ptr<Tokenizer> tokenizer;  // null when a dummy model has none
  std::vector<int32_t> eos_ids;
  GenerationConfig generation_config;
  std::string description;  // what was loaded, for logs and output headers
  bool embedded = false;
};

// The embedded default: a tiny Llama (4 layers, hidden 128, GQA 4/2, byte-level vocabulary of
// 261) with deterministic random weights. It is NOT a trained model: its text is noise.
ModelConfig EmbeddedModelConfig();
inline constexpr uint64_t kEmbeddedModelSeed = 20261130;

// Positions a model is prepared for when the engine options leave max_model_len at 0.
int DefaultMaxModelLen(const ModelConfig& config);

Result<LoadedModel> LoadModel(const LoadModelOptions& options, Backend& backend);

}  // namespace sieve
