#include "model/generation_config.h"

#include <filesystem>
#include <limits>

#include <nlohmann/json.hpp>

#include "model/model_config.h"

namespace sieve {
namespace {

using nlohmann::json;

Status FieldError(std::string_view source, const std::string& key, std::string_view expected,
                  const json& value) {
  return InvalidArgumentError(std::string(source) + ": field '" + key + "' must be " +
                              std::string(expected) + ", got " +
                              value.dump(-1, ' ', false, json::error_handler_t::replace));
}

// A field set to null counts as absent, as it does for transformers.
const json* Get(const json& object, const std::string& key) {
  const auto it = object.find(key);
  if (it == object.end() || it->is_null()) return nullptr;
  return &*it;
}

bool IsTokenId(const json& value) {
  if (value.is_number_unsigned()) {
    return value.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int32_t>::max());
  }
  return value.is_number_integer() && value.get<int64_t>() >= 0 &&
         value.get<int64_t>() <= std::numeric_limits<int32_t>::max();
}

Result<std::vector<int32_t>> TokenIds(const json& object, const std::string& key,
                                      std::string_view source) {
  std::vector<int32_t> ids;
  const json* value = Get(object, key);
  if (value == nullptr) return ids;
  const json list = value->is_array() ? *value : json::array({*value});
  for (const json& element : list) {
    if (!IsTokenId(element)) {
      return FieldError(source, key, "a token id or a list of token ids", *value);
    }
    ids.push_back(static_cast<int32_t>(element.get<int64_t>()));
  }
  return ids;
}

// A number in [min, max]; absent or null gives nullopt.
Result<std::optional<float>> Number(const json& object, const std::string& key, double min,
                                    double max, std::string_view expected,
                                    std::string_view source) {
  const json* value = Get(object, key);
  if (value == nullptr) return std::optional<float>();
  if (!value->is_number() || !(value->get<double>() >= min && value->get<double>() <= max)) {
    return FieldError(source, key, expected, *value);
  }
  return std::optional<float>(static_cast<float>(value->get<double>()));
}

}  // namespace

Result<GenerationConfig> ParseGenerationConfig(const json& object, std::string_view source) {
  if (!object.is_object()) {
    return InvalidArgumentError(std::string(source) + ": expected a JSON object, got " +
                                std::string(object.type_name()));
  }
  GenerationConfig config;
  SIEVE_ASSIGN_OR_RETURN(config.eos_token_ids, TokenIds(object, "eos_token_id", source));
  SIEVE_ASSIGN_OR_RETURN(std::vector<int32_t> bos, TokenIds(object, "bos_token_id", source));
  if (bos.size() > 1)
    return FieldError(source, "bos_token_id", "one token id", object["bos_token_id"]);
  if (!bos.empty()) config.bos_token_id = bos[0];
  if (const json* do_sample = Get(object, "do_sample")) {
    if (!do_sample->is_boolean())
      return FieldError(source, "do_sample", "true or false", *do_sample);
    config.do_sample = do_sample->get<bool>();
  }
  constexpr double kInf = std::numeric_limits<double>::infinity();
  SIEVE_ASSIGN_OR_RETURN(config.temperature,
                         Number(object, "temperature", 0.0, kInf, "a number >= 0", source));
  SIEVE_ASSIGN_OR_RETURN(config.top_p,
                         Number(object, "top_p", 0.0, 1.0, "a number in [0, 1]", source));
  SIEVE_ASSIGN_OR_RETURN(config.repetition_penalty,
                         Number(object, "repetition_penalty", std::numeric_limits<double>::min(),
                                kInf, "a number > 0", source));
  if (const json* top_k = Get(object, "top_k")) {
    if (!top_k->is_number_integer() || top_k->get<int64_t>() < 0 ||
        top_k->get<int64_t>() > std::numeric_limits<int32_t>::max()) {
      return FieldError(source, "top_k", "an integer >= 0", *top_k);
    }
    config.top_k = static_cast<int>(top_k->get<int64_t>());
  }
  return config;
}

Result<GenerationConfig> LoadGenerationConfig(const std::string& model_dir) {
  const std::string path = (std::filesystem::path(model_dir) / "generation_config.json").string();
  std::error_code error;
  if (!std::filesystem::exists(path, error)) return GenerationConfig();
  SIEVE_ASSIGN_OR_RETURN(const json object, ReadJsonFile(path));
  return ParseGenerationConfig(object, path);
}

}  // namespace sieve
