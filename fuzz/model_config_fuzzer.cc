// Fuzzes the model folder's JSON files: each input is parsed once and read as a Hugging Face
// `config.json` (ParseHfConfig), a Meta `params.json` (ParseMetaParams) and a
// `generation_config.json` (ParseGenerationConfig). Bad input must be a Status, never a crash or
// undefined behaviour; a config that parses must pass Validate() and describe itself.
#include <cstddef>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "model/generation_config.h"
#include "model/model_config.h"

namespace {

void CheckConfig(const sieve::Result<sieve::ModelConfig>& config) {
  if (!config.ok()) {
    SIEVE_CHECK(!config.status().message().empty());
    return;
  }
  SIEVE_CHECK(config->Validate().ok()) << config->Validate().ToString();
  SIEVE_CHECK(!config->Summary().empty());
  SIEVE_CHECK(config->NumParameters() > 0);
  SIEVE_CHECK(config->KvBytesPerToken(sieve::DType::kBF16) > 0);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const nlohmann::json json = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) return 0;
  CheckConfig(sieve::ParseHfConfig(json));
  CheckConfig(sieve::ParseMetaParams(json));
  const sieve::Result<sieve::GenerationConfig> generation = sieve::ParseGenerationConfig(json);
  if (generation.ok()) {
    for (const int32_t id : generation->eos_token_ids) SIEVE_CHECK(id >= 0);
    if (generation->top_p) SIEVE_CHECK(*generation->top_p >= 0.0f && *generation->top_p <= 1.0f);
  }
  return 0;
}
