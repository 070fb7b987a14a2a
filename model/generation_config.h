// GenerationConfig: the decoding defaults a model ships with in `generation_config.json`.
//
// Hugging Face models often list their end-of-turn tokens only here (Llama 3 Instruct adds
// <|eot_id|> to config.json's <|end_of_text|>), so the engine merges these eos ids with the
// model config's. Every field is optional: a model without the file has an empty config.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/status.h"

namespace sieve {

struct GenerationConfig {
  std::vector<int32_t> eos_token_ids;
  std::optional<int32_t> bos_token_id;
  // transformers decodes greedily when this is false and then ignores the sampling knobs below.
  std::optional<bool> do_sample;
  std::optional<float> temperature;
  std::optional<float> top_p;
  std::optional<int> top_k;
  std::optional<float> repetition_penalty;
};

// Parses a `generation_config.json` object. `source` names the file in error messages.
Result<GenerationConfig> ParseGenerationConfig(const nlohmann::json& json,
                                               std::string_view source = "generation_config.json");
// Reads `<model_dir>/generation_config.json`; an absent file gives an empty config, a malformed
// one an InvalidArgument error naming the file and the field.
Result<GenerationConfig> LoadGenerationConfig(const std::string& model_dir);

}  // namespace sieve
