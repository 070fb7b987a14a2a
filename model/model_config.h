// ModelConfig: the shape of a Llama-family model, read from a Hugging Face `config.json` or a
// Meta `params.json`.
//
// Everything the forward pass, the weight loader and the KV planner need to know about a model
// lives here, already checked: a config that parses is one Sieve can run (supported architecture,
// no bias terms, a RoPE variant Sieve implements). What Sieve cannot run is an Unimplemented
// error that names the feature; what is malformed is an InvalidArgument error that names the
// file, the field, and the expected and actual values.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/dtype.h"
#include "core/status.h"
#include "model/checkpoint_quantization.h"

namespace sieve {

// How RoPE frequencies are rescaled for long context.
struct RopeScaling {
  enum class Type { kNone, kLlama3, kLinear };

  Type type = Type::kNone;
  // kLinear: positions are divided by `factor`. kLlama3: low frequencies are divided by
  // `factor`, high ones kept, the band between blended (Llama 3.1's `rope_type: llama3`).
  float factor = 1.0f;
  float low_freq_factor = 1.0f;                 // kLlama3 only
  float high_freq_factor = 4.0f;                // kLlama3 only
  int original_max_position_embeddings = 8192;  // kLlama3 only
};

std::string_view RopeScalingTypeName(RopeScaling::Type type);  // "none", "llama3", "linear"

struct ModelConfig {
  std::string architecture;  // "LlamaForCausalLM" | "MistralForCausalLM"
  std::string model_type;    // "llama" | "mistral"
  int vocab_size = 0;
  int hidden_size = 0;        // D
  int intermediate_size = 0;  // F
  int num_layers = 0;         // L
  int num_heads = 0;          // H
  int num_kv_heads = 0;       // G; H % G == 0
  int head_dim = 0;           // hd; not always D / H (Mistral NeMo has 5120 / 32 heads of 128)
  float rms_norm_eps = 1e-5f;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  int max_position_embeddings = 0;
  bool tie_word_embeddings = false;   // lm_head shares embed_tokens' [V, D] matrix
  std::optional<int> sliding_window;  // Mistral v0.1: attend to the last N positions only
  DType dtype = DType::kBF16;         // the checkpoint's dtype (`torch_dtype` / `dtype`)
  std::optional<int32_t> bos_token_id;
  std::vector<int32_t> eos_token_ids;  // any of these ends generation
  bool attention_bias = false;         // Sieve has no bias path: always false once parsed
  bool mlp_bias = false;               // Sieve has no bias path: always false once parsed
  // Set for a published FP8 checkpoint (config.json's quantization_config, or ModelOpt's
  // hf_quant_config.json beside it): its layers' linear weights are e4m3 with scales.
  std::optional<CheckpointQuantization> quantization;

  // Weights in the checkpoint, counting lm_head only when it is not tied.
  int64_t NumParameters() const;
  // One layer's q, k, v, o, gate, up and down matrices: their parameters, and their output
  // channels (rows), which FP8 weights hold one scale each for.
  int64_t LinearParametersPerLayer() const;
  int64_t LinearOutputsPerLayer() const;
  // K and V for one token across all layers: 2 * L * G * hd * sizeof(kv_dtype).
  int64_t KvBytesPerToken(DType kv_dtype) const;
  // Positive sizes, H divisible by G, even head_dim, sane RoPE and norm parameters.
  Status Validate() const;
  // One line for logs: "LlamaForCausalLM: 32 layers, hidden 4096, ...".
  std::string Summary() const;
};

// Parses a Hugging Face `config.json` object. `source` names the file in error messages.
Result<ModelConfig> ParseHfConfig(const nlohmann::json& json,
                                  std::string_view source = "config.json");
// Parses a Meta `params.json` object (Llama 2/3 reference format; also Mistral's `hidden_dim`).
Result<ModelConfig> ParseMetaParams(const nlohmann::json& json,
                                    std::string_view source = "params.json");
// Reads `<model_dir>/config.json` (and ModelOpt's `hf_quant_config.json` beside it), or
// `<model_dir>/params.json` when there is no config.json.
Result<ModelConfig> LoadModelConfig(const std::string& model_dir);

// Reads and parses a JSON file: NotFound when it does not exist, InvalidArgument naming the path
// when it cannot be read or is not JSON. Shared by the loaders in this folder.
Result<nlohmann::json> ReadJsonFile(const std::string& path);

}  // namespace sieve
