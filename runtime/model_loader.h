// LoadModel: everything `sieve generate` and `sieve serve` need from a model directory (or the
// embedded default): the config, the weights on the backend, the tokenizer, the EOS ids.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/communicator.h"
#include "model/generation_config.h"
#include "model/llama_model.h"
#include "model/model_config.h"
#include "tokenizer/tokenizer.h"

namespace sieve {

struct LoadModelOptions {
  std::string model_dir;             // "" : the default model (FindDefaultModelDir)
  bool tiny_random = false;          // the in-memory tiny random-weight model instead (tests that
                                     // need a fast model whatever the default is)
  std::string load_format = "auto";  // auto | safetensors | dummy (random weights, config only)
  std::string tokenizer_path;        // "" : the model directory
  std::string chat_template;         // "" : detect; else llama3 | llama2 | mistral
  int max_model_len = 0;             // positions to prepare RoPE for (0: engine default)
  uint64_t dummy_seed = 0;
  // none | fp8: the layers' linear weights quantized at load (LlamaModel::QuantizeWeights).
  std::string quantization = "none";
  // Tensor parallelism: the rank whose weights to load ({0, 1}: the whole model) and its
  // communicator. LoadModelShards sets them for each rank.
  TensorParallelShard shard;
  Communicator* communicator = nullptr;
};

struct LoadedModel {
  std::unique_ptr<LlamaModel> model;
  std::unique_ptr<Tokenizer> tokenizer;  // null when a dummy model has none
  std::vector<int32_t> eos_ids;
  GenerationConfig generation_config;
  std::string description;     // what was loaded, for logs and output headers
  bool default_model = false;  // no --model was given
};

// The default model, run when no model directory is given: Sieve's own long-context Llama
// (models/sieve-tiny-10m: 8 layers, hidden 256, 10.5M parameters, trained by scripts/train/ on
// retrieval tasks; not a chat model). Its directory is $SIEVE_DEFAULT_MODEL when set, else
// share/sieve/models/sieve-tiny-10m beside an installed binary (<prefix>/bin/sieve), else the
// models/ folder of the source tree the binary was built from.
inline constexpr char kDefaultModelName[] = "sieve-tiny-10m";
Result<std::string> FindDefaultModelDir();

// The tiny random-weight model (LoadModelOptions::tiny_random): 4 layers, hidden 128, GQA 4/2,
// a byte-level vocabulary of 261, deterministic random weights built in memory. Its text is
// noise; tests use it where they need a model that runs in milliseconds.
ModelConfig TinyRandomModelConfig();
inline constexpr uint64_t kTinyRandomModelSeed = 20261130;

// Positions a model is prepared for when the engine options leave max_model_len at 0.
int DefaultMaxModelLen(const ModelConfig& config);

Result<LoadedModel> LoadModel(const LoadModelOptions& options, Backend& backend);

// A model split over N ranks (tensor parallelism): rank r on backends[r] with communicators[r].
struct LoadedShards {
  LoadedModel model;                                     // rank 0, with tokenizer and EOS ids
  std::vector<std::unique_ptr<LlamaModel>> other_ranks;  // ranks 1 .. N-1
};
// Checks that the model splits N ways (InvalidArgument naming what does not divide, before any
// weight is read), then loads every rank's slices at once, each on its own thread with its
// backend current. One backend: LoadModel.
Result<LoadedShards> LoadModelShards(const LoadModelOptions& options,
                                     const std::vector<Backend*>& backends,
                                     const std::vector<Communicator*>& communicators);

}  // namespace sieve
