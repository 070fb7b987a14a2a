#include "model/model_config.h"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <sstream>
#include <utility>

#include <nlohmann/json.hpp>

namespace sieve {
namespace {

using nlohmann::json;

constexpr std::string_view kLlamaArchitecture = "LlamaForCausalLM";
constexpr std::string_view kMistralArchitecture = "MistralForCausalLM";
constexpr std::string_view kSupportedArchitectures = "LlamaForCausalLM, MistralForCausalLM";

std::string FormatNumber(double value, int precision = 10) {
  std::ostringstream out;
  out.precision(precision);
  out << value;
  return out.str();
}

// floats print at their own precision: 1e-05, not 9.99999975e-06.
std::string FormatFloat(float value) { return FormatNumber(value, 6); }

// A JSON value as it appears in the file, shortened for error messages.
std::string Describe(const json& value) {
  std::string text = value.dump(-1, ' ', false, json::error_handler_t::replace);
  constexpr size_t kMaxChars = 60;
  if (text.size() > kMaxChars) text = text.substr(0, kMaxChars) + "...";
  return std::string(value.type_name()) + " " + text;
}

// The integer a JSON number holds, if it holds one in [min, max]; 4096.0 counts as 4096.
std::optional<int64_t> AsInteger(const json& value, int64_t min, int64_t max) {
  int64_t result;
  if (value.is_number_unsigned()) {
    const auto unsigned_value = value.get<uint64_t>();
    if (unsigned_value > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return std::nullopt;
    }
    result = static_cast<int64_t>(unsigned_value);
  } else if (value.is_number_integer()) {
    result = value.get<int64_t>();
  } else if (value.is_number_float()) {
    const double number = value.get<double>();
    if (!std::isfinite(number) || number != std::floor(number) || std::abs(number) > 1e15) {
      return std::nullopt;
    }
    result = static_cast<int64_t>(number);
  } else {
    return std::nullopt;
  }
  if (result < min || result > max) return std::nullopt;
  return result;
}

// Typed access to the fields of one JSON object. A field set to null counts as absent, as it does
// for transformers (`"head_dim": null`). Errors name the file and the field's dotted path.
class Fields {
 public:
  Fields(const json& object, std::string_view source, std::string prefix = "")
      : object_(object), source_(source), prefix_(std::move(prefix)) {}

  const json* Get(const std::string& key) const {
    const auto it = object_.find(key);
    if (it == object_.end() || it->is_null()) return nullptr;
    return &*it;
  }

  Status Error(const std::string& key, std::string_view problem) const {
    return InvalidArgumentError(std::string(source_) + ": field '" + prefix_ + key + "' " +
                                std::string(problem));
  }
  Status WrongType(const std::string& key, std::string_view expected, const json& value) const {
    return Error(key, "must be " + std::string(expected) + ", got " + Describe(value));
  }
  Status Missing(const std::string& key) const {
    return InvalidArgumentError(std::string(source_) + ": missing required field '" + prefix_ +
                                key + "'");
  }

  Result<std::optional<int>> OptionalInt(const std::string& key) const {
    const json* value = Get(key);
    if (value == nullptr) return std::optional<int>();
    const std::optional<int64_t> integer =
        AsInteger(*value, std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max());
    if (!integer) return WrongType(key, "a 32-bit integer", *value);
    return std::optional<int>(static_cast<int>(*integer));
  }
  Result<int> RequiredInt(const std::string& key) const {
    SIEVE_ASSIGN_OR_RETURN(std::optional<int> value, OptionalInt(key));
    if (!value) return Missing(key);
    return *value;
  }

  Result<std::optional<double>> OptionalNumber(const std::string& key) const {
    const json* value = Get(key);
    if (value == nullptr) return std::optional<double>();
    if (!value->is_number()) return WrongType(key, "a number", *value);
    return std::optional<double>(value->get<double>());
  }
  Result<double> RequiredNumber(const std::string& key) const {
    SIEVE_ASSIGN_OR_RETURN(std::optional<double> value, OptionalNumber(key));
    if (!value) return Missing(key);
    return *value;
  }

  Result<bool> Bool(const std::string& key, bool default_value) const {
    const json* value = Get(key);
    if (value == nullptr) return default_value;
    if (!value->is_boolean()) return WrongType(key, "true or false", *value);
    return value->get<bool>();
  }

  Result<std::optional<std::string>> OptionalString(const std::string& key) const {
    const json* value = Get(key);
    if (value == nullptr) return std::optional<std::string>();
    if (!value->is_string()) return WrongType(key, "a string", *value);
    return std::optional<std::string>(value->get<std::string>());
  }

  // An id or a list of ids (`eos_token_id` is either); absent means none.
  Result<std::vector<int32_t>> TokenIds(const std::string& key) const {
    const json* value = Get(key);
    std::vector<int32_t> ids;
    if (value == nullptr) return ids;
    const json list = value->is_array() ? *value : json::array({*value});
    for (const json& element : list) {
      const std::optional<int64_t> id = AsInteger(element, 0, std::numeric_limits<int32_t>::max());
      if (!id) return WrongType(key, "a token id or a list of token ids", *value);
      ids.push_back(static_cast<int32_t>(*id));
    }
    return ids;
  }

 private:
  const json& object_;
  std::string_view source_;
  std::string prefix_;
};

bool IsFloatDType(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kBF16 || dtype == DType::kF16;
}

// `rope_scaling` (or transformers v5's `rope_parameters`): null, default, linear or llama3.
Result<RopeScaling> ParseRopeScaling(const json& value, std::string_view source,
                                     const std::string& field) {
  RopeScaling scaling;
  if (value.is_null()) return scaling;
  if (!value.is_object()) {
    return InvalidArgumentError(std::string(source) + ": field '" + field +
                                "' must be an object or null, got " + Describe(value));
  }
  const Fields fields(value, source, field + ".");
  // transformers reads `rope_type` first and falls back to the older `type`.
  SIEVE_ASSIGN_OR_RETURN(std::optional<std::string> type, fields.OptionalString("rope_type"));
  if (!type) {
    SIEVE_ASSIGN_OR_RETURN(type, fields.OptionalString("type"));
  }
  if (!type) return fields.Missing("rope_type");
  if (*type == "default") return scaling;
  if (*type == "linear") {
    scaling.type = RopeScaling::Type::kLinear;
    SIEVE_ASSIGN_OR_RETURN(const double factor, fields.RequiredNumber("factor"));
    scaling.factor = static_cast<float>(factor);
    return scaling;
  }
  if (*type == "llama3") {
    scaling.type = RopeScaling::Type::kLlama3;
    SIEVE_ASSIGN_OR_RETURN(const double factor, fields.RequiredNumber("factor"));
    SIEVE_ASSIGN_OR_RETURN(const double low, fields.RequiredNumber("low_freq_factor"));
    SIEVE_ASSIGN_OR_RETURN(const double high, fields.RequiredNumber("high_freq_factor"));
    SIEVE_ASSIGN_OR_RETURN(scaling.original_max_position_embeddings,
                           fields.RequiredInt("original_max_position_embeddings"));
    scaling.factor = static_cast<float>(factor);
    scaling.low_freq_factor = static_cast<float>(low);
    scaling.high_freq_factor = static_cast<float>(high);
    return scaling;
  }
  return UnimplementedError(std::string(source) + ": " + field + " type '" + *type +
                            "' is not supported (Sieve supports default, linear, llama3)");
}

// The first supported entry of `architectures`; configs old enough to lack the list still name
// their `model_type`.
Result<std::string> ParseArchitecture(const Fields& fields, std::string_view source) {
  const json* architectures = fields.Get("architectures");
  if (architectures != nullptr) {
    if (!architectures->is_array()) {
      return fields.WrongType("architectures", "a list of strings", *architectures);
    }
    std::string named;
    for (const json& entry : *architectures) {
      if (!entry.is_string()) {
        return fields.WrongType("architectures", "a list of strings", *architectures);
      }
      const std::string name = entry.get<std::string>();
      if (name == kLlamaArchitecture || name == kMistralArchitecture) return name;
      named += (named.empty() ? "" : ", ") + name;
    }
    if (!named.empty()) {
      return UnimplementedError(std::string(source) + ": unsupported architecture " + named +
                                " (Sieve supports " + std::string(kSupportedArchitectures) + ")");
    }
  }
  SIEVE_ASSIGN_OR_RETURN(std::optional<std::string> model_type,
                         fields.OptionalString("model_type"));
  if (!model_type) return fields.Missing("architectures");
  if (*model_type == "llama") return std::string(kLlamaArchitecture);
  if (*model_type == "mistral") return std::string(kMistralArchitecture);
  return UnimplementedError(std::string(source) + ": unsupported model_type " + *model_type +
                            " (Sieve supports " + std::string(kSupportedArchitectures) + ")");
}

Status ExpectObject(const json& value, std::string_view source) {
  if (value.is_object()) return Status::Ok();
  return InvalidArgumentError(std::string(source) + ": expected a JSON object, got " +
                              Describe(value));
}

}  // namespace

std::string_view RopeScalingTypeName(RopeScaling::Type type) {
  switch (type) {
    case RopeScaling::Type::kNone:
      return "none";
    case RopeScaling::Type::kLlama3:
      return "llama3";
    case RopeScaling::Type::kLinear:
      return "linear";
  }
  return "?";
}

int64_t ModelConfig::LinearParametersPerLayer() const {
  const int64_t d = hidden_size;
  const int64_t q_width = static_cast<int64_t>(num_heads) * head_dim;
  const int64_t kv_width = static_cast<int64_t>(num_kv_heads) * head_dim;
  const int64_t attention = d * q_width + 2 * d * kv_width + q_width * d;
  const int64_t mlp = 3 * d * intermediate_size;
  return attention + mlp;
}

int64_t ModelConfig::LinearOutputsPerLayer() const {
  const int64_t d = hidden_size;
  return static_cast<int64_t>(num_heads + 2 * num_kv_heads) * head_dim + d +
         2 * static_cast<int64_t>(intermediate_size) + d;
}

int64_t ModelConfig::NumParameters() const {
  const int64_t d = hidden_size;
  const int64_t norms = 2 * d;
  const int64_t embedding = static_cast<int64_t>(vocab_size) * d;
  return embedding * (tie_word_embeddings ? 1 : 2) +
         num_layers * (LinearParametersPerLayer() + norms) + d;
}

int64_t ModelConfig::KvBytesPerToken(DType kv_dtype) const {
  return 2 * static_cast<int64_t>(num_layers) * num_kv_heads * head_dim *
         static_cast<int64_t>(DTypeSize(kv_dtype));
}

Status ModelConfig::Validate() const {
  if (architecture != kLlamaArchitecture && architecture != kMistralArchitecture) {
    return UnimplementedError("unsupported architecture " + architecture + " (Sieve supports " +
                              std::string(kSupportedArchitectures) + ")");
  }
  const std::pair<const char*, int> sizes[] = {
      {"vocab_size", vocab_size},
      {"hidden_size", hidden_size},
      {"intermediate_size", intermediate_size},
      {"num_layers", num_layers},
      {"num_heads", num_heads},
      {"num_kv_heads", num_kv_heads},
      {"head_dim", head_dim},
      {"max_position_embeddings", max_position_embeddings},
  };
  for (const auto& [name, value] : sizes) {
    if (value <= 0) {
      return InvalidArgumentError(std::string(name) + " must be positive, got " +
                                  std::to_string(value));
    }
  }
  // NumParameters and KvBytesPerToken count in int64: sizes whose products overflow it describe
  // no model (the largest have ~1e12 parameters) but damage. Estimated in double, whose rounding
  // is far below the margin to INT64_MAX (9.2e18).
  constexpr double kMaxCount = 4e18;
  const double d = hidden_size;
  const double q_width = static_cast<double>(num_heads) * head_dim;
  const double kv_width = static_cast<double>(num_kv_heads) * head_dim;
  const double per_layer = 2 * d * q_width + 2 * d * kv_width + 3 * d * intermediate_size + 2 * d;
  const double parameters = 2 * static_cast<double>(vocab_size) * d + num_layers * per_layer + d;
  const double kv_bytes = 2 * static_cast<double>(num_layers) * kv_width * 8;
  if (!(parameters < kMaxCount) || !(kv_bytes < kMaxCount)) {
    return InvalidArgumentError("sizes give " + FormatNumber(parameters, 3) + " parameters and " +
                                FormatNumber(kv_bytes, 3) +
                                " KV bytes per token, beyond what 64-bit counts hold");
  }
  if (num_heads % num_kv_heads != 0) {
    return InvalidArgumentError("num_heads (" + std::to_string(num_heads) +
                                ") must be a multiple of num_kv_heads (" +
                                std::to_string(num_kv_heads) + ")");
  }
  if (head_dim % 2 != 0) {
    // RoPE rotates pairs of dimensions.
    return InvalidArgumentError("head_dim must be even, got " + std::to_string(head_dim));
  }
  if (!(rms_norm_eps > 0.0f) || !std::isfinite(rms_norm_eps)) {
    return InvalidArgumentError("rms_norm_eps must be positive, got " + FormatFloat(rms_norm_eps));
  }
  if (!(rope_theta > 0.0) || !std::isfinite(rope_theta)) {
    return InvalidArgumentError("rope_theta must be positive, got " + FormatNumber(rope_theta));
  }
  if (rope_scaling.type != RopeScaling::Type::kNone &&
      (!(rope_scaling.factor > 0.0f) || !std::isfinite(rope_scaling.factor))) {
    return InvalidArgumentError("rope_scaling.factor must be positive, got " +
                                FormatFloat(rope_scaling.factor));
  }
  if (rope_scaling.type == RopeScaling::Type::kLlama3) {
    // Llama 3 blends between the two wavelengths original / low and original / high.
    if (!(rope_scaling.low_freq_factor > 0.0f) ||
        !(rope_scaling.high_freq_factor > rope_scaling.low_freq_factor)) {
      return InvalidArgumentError(
          "rope_scaling needs 0 < low_freq_factor < high_freq_factor, got " +
          FormatFloat(rope_scaling.low_freq_factor) + " and " +
          FormatFloat(rope_scaling.high_freq_factor));
    }
    if (rope_scaling.original_max_position_embeddings <= 0) {
      return InvalidArgumentError(
          "rope_scaling.original_max_position_embeddings must be positive, got " +
          std::to_string(rope_scaling.original_max_position_embeddings));
    }
  }
  if (sliding_window && *sliding_window <= 0) {
    return InvalidArgumentError("sliding_window must be positive, got " +
                                std::to_string(*sliding_window));
  }
  if (!IsFloatDType(dtype)) {
    return InvalidArgumentError("dtype must be f32, bf16 or f16, got " +
                                std::string(DTypeName(dtype)));
  }
  // bos is looked up in the embedding; an eos id outside the vocabulary is harmless (it is
  // never sampled), so only bos must be in range.
  if (bos_token_id && (*bos_token_id < 0 || *bos_token_id >= vocab_size)) {
    return InvalidArgumentError("bos_token_id " + std::to_string(*bos_token_id) +
                                " is outside the vocabulary [0, " + std::to_string(vocab_size) +
                                ")");
  }
  for (const int32_t eos : eos_token_ids) {
    if (eos < 0) return InvalidArgumentError("eos_token_id " + std::to_string(eos) + " < 0");
  }
  if (attention_bias) {
    return UnimplementedError("attention_bias is true, and Sieve has no bias terms in attention");
  }
  if (mlp_bias)
    return UnimplementedError("mlp_bias is true, and Sieve has no bias terms in the MLP");
  return Status::Ok();
}

std::string ModelConfig::Summary() const {
  std::ostringstream out;
  out << architecture << ": " << num_layers << " layers, hidden " << hidden_size << ", ffn "
      << intermediate_size << ", " << num_heads << " heads / " << num_kv_heads << " kv heads of "
      << head_dim << ", vocab " << vocab_size << ", context " << max_position_embeddings
      << ", rope theta " << FormatNumber(rope_theta);
  if (rope_scaling.type == RopeScaling::Type::kLlama3) {
    out << " (llama3 x" << FormatFloat(rope_scaling.factor) << " from "
        << rope_scaling.original_max_position_embeddings << ")";
  } else if (rope_scaling.type == RopeScaling::Type::kLinear) {
    out << " (linear x" << FormatFloat(rope_scaling.factor) << ")";
  }
  if (sliding_window) out << ", sliding window " << *sliding_window;
  if (tie_word_embeddings) out << ", tied embeddings";
  const auto parameters = static_cast<double>(NumParameters());
  out << ", " << DTypeName(dtype) << ", ";
  if (parameters >= 1e9) {
    out << FormatNumber(parameters / 1e9, 3) << "B";
  } else if (parameters >= 1e6) {
    out << FormatNumber(parameters / 1e6, 3) << "M";
  } else {
    out << NumParameters();
  }
  out << " parameters";
  return out.str();
}

Result<ModelConfig> ParseHfConfig(const json& config_json, std::string_view source) {
  SIEVE_RETURN_IF_ERROR(ExpectObject(config_json, source));
  const Fields fields(config_json, source);
  ModelConfig config;
  SIEVE_ASSIGN_OR_RETURN(config.architecture, ParseArchitecture(fields, source));
  SIEVE_ASSIGN_OR_RETURN(std::optional<std::string> model_type,
                         fields.OptionalString("model_type"));
  config.model_type = model_type
                          ? *model_type
                          : (config.architecture == kMistralArchitecture ? "mistral" : "llama");

  // Refused up front (loading these would otherwise fail later, or worse, run wrongly), except
  // the FP8 checkpoints Sieve reads (checkpoint_quantization.h).
  if (const json* quantization = fields.Get("quantization_config")) {
    SIEVE_ASSIGN_OR_RETURN(config.quantization, ParseQuantizationConfig(*quantization, source));
  }
  for (const char* key : {"hidden_act", "hidden_activation"}) {
    SIEVE_ASSIGN_OR_RETURN(std::optional<std::string> activation, fields.OptionalString(key));
    if (activation && *activation != "silu") {
      return UnimplementedError(std::string(source) + ": " + key + " '" + *activation +
                                "' is not supported (Sieve supports silu)");
    }
  }
  SIEVE_ASSIGN_OR_RETURN(config.attention_bias, fields.Bool("attention_bias", false));
  SIEVE_ASSIGN_OR_RETURN(config.mlp_bias, fields.Bool("mlp_bias", false));
  if (config.attention_bias || config.mlp_bias) {
    return UnimplementedError(std::string(source) + ": " +
                              (config.attention_bias ? "attention_bias" : "mlp_bias") +
                              " is true, and Sieve has no bias terms");
  }

  SIEVE_ASSIGN_OR_RETURN(config.vocab_size, fields.RequiredInt("vocab_size"));
  SIEVE_ASSIGN_OR_RETURN(config.hidden_size, fields.RequiredInt("hidden_size"));
  SIEVE_ASSIGN_OR_RETURN(config.intermediate_size, fields.RequiredInt("intermediate_size"));
  SIEVE_ASSIGN_OR_RETURN(config.num_layers, fields.RequiredInt("num_hidden_layers"));
  SIEVE_ASSIGN_OR_RETURN(config.num_heads, fields.RequiredInt("num_attention_heads"));
  SIEVE_ASSIGN_OR_RETURN(std::optional<int> num_kv_heads,
                         fields.OptionalInt("num_key_value_heads"));
  config.num_kv_heads = num_kv_heads.value_or(config.num_heads);
  SIEVE_ASSIGN_OR_RETURN(std::optional<int> head_dim, fields.OptionalInt("head_dim"));
  if (head_dim) {
    config.head_dim = *head_dim;
  } else if (config.num_heads > 0 && config.hidden_size % config.num_heads == 0) {
    config.head_dim = config.hidden_size / config.num_heads;
  } else {
    return InvalidArgumentError(std::string(source) + ": no head_dim, and hidden_size " +
                                std::to_string(config.hidden_size) +
                                " is not a multiple of num_attention_heads " +
                                std::to_string(config.num_heads));
  }
  SIEVE_ASSIGN_OR_RETURN(const double rms_norm_eps, fields.RequiredNumber("rms_norm_eps"));
  config.rms_norm_eps = static_cast<float>(rms_norm_eps);
  SIEVE_ASSIGN_OR_RETURN(config.max_position_embeddings,
                         fields.RequiredInt("max_position_embeddings"));

  if (const json* parameters = fields.Get("rope_parameters")) {
    // transformers v5 moved rope_theta and the scaling into one object.
    SIEVE_ASSIGN_OR_RETURN(config.rope_scaling,
                           ParseRopeScaling(*parameters, source, "rope_parameters"));
    if (parameters->is_object()) {
      SIEVE_ASSIGN_OR_RETURN(
          std::optional<double> theta,
          Fields(*parameters, source, "rope_parameters.").OptionalNumber("rope_theta"));
      if (theta) config.rope_theta = *theta;
    }
  } else {
    SIEVE_ASSIGN_OR_RETURN(std::optional<double> theta, fields.OptionalNumber("rope_theta"));
    if (theta) config.rope_theta = *theta;
    if (const json* scaling = fields.Get("rope_scaling")) {
      SIEVE_ASSIGN_OR_RETURN(config.rope_scaling,
                             ParseRopeScaling(*scaling, source, "rope_scaling"));
    }
  }

  SIEVE_ASSIGN_OR_RETURN(config.tie_word_embeddings, fields.Bool("tie_word_embeddings", false));
  // Only Mistral's modeling code applies a sliding window; transformers ignores the field for
  // Llama, and so does Sieve.
  if (config.architecture == kMistralArchitecture) {
    SIEVE_ASSIGN_OR_RETURN(config.sliding_window, fields.OptionalInt("sliding_window"));
  }

  SIEVE_ASSIGN_OR_RETURN(std::optional<std::string> dtype_name, fields.OptionalString("dtype"));
  if (!dtype_name) {
    SIEVE_ASSIGN_OR_RETURN(dtype_name, fields.OptionalString("torch_dtype"));
  }
  if (dtype_name) {
    const Result<DType> dtype = ParseDType(*dtype_name);
    if (!dtype.ok() || !IsFloatDType(*dtype)) {
      return UnimplementedError(std::string(source) + ": dtype '" + *dtype_name +
                                "' is not supported (Sieve reads float32, bfloat16, float16)");
    }
    config.dtype = *dtype;
  }

  SIEVE_ASSIGN_OR_RETURN(std::vector<int32_t> bos, fields.TokenIds("bos_token_id"));
  if (bos.size() > 1) {
    return fields.WrongType("bos_token_id", "one token id", *fields.Get("bos_token_id"));
  }
  if (!bos.empty()) config.bos_token_id = bos[0];
  SIEVE_ASSIGN_OR_RETURN(config.eos_token_ids, fields.TokenIds("eos_token_id"));

  const Status valid = config.Validate();
  if (!valid.ok()) return valid.WithContext(source);
  return config;
}

Result<ModelConfig> ParseMetaParams(const json& params, std::string_view source) {
  SIEVE_RETURN_IF_ERROR(ExpectObject(params, source));
  const Fields fields(params, source);
  ModelConfig config;
  config.architecture = std::string(kLlamaArchitecture);
  config.model_type = "llama";
  SIEVE_ASSIGN_OR_RETURN(config.hidden_size, fields.RequiredInt("dim"));
  SIEVE_ASSIGN_OR_RETURN(config.num_layers, fields.RequiredInt("n_layers"));
  SIEVE_ASSIGN_OR_RETURN(config.num_heads, fields.RequiredInt("n_heads"));
  SIEVE_ASSIGN_OR_RETURN(std::optional<int> num_kv_heads, fields.OptionalInt("n_kv_heads"));
  config.num_kv_heads = num_kv_heads.value_or(config.num_heads);
  SIEVE_ASSIGN_OR_RETURN(config.vocab_size, fields.RequiredInt("vocab_size"));
  if (config.vocab_size <= 0) {
    // Llama 2's reference code sets it from the tokenizer at load time.
    return InvalidArgumentError(std::string(source) + ": vocab_size is " +
                                std::to_string(config.vocab_size) +
                                " (left to the tokenizer); use the Hugging Face config.json");
  }
  if (config.num_heads <= 0) return fields.Error("n_heads", "must be positive");
  SIEVE_ASSIGN_OR_RETURN(std::optional<int> head_dim, fields.OptionalInt("head_dim"));
  config.head_dim = head_dim.value_or(config.hidden_size / config.num_heads);

  // Mistral's params.json states the FFN width; Meta's derives it as its reference code does.
  SIEVE_ASSIGN_OR_RETURN(std::optional<int> hidden_dim, fields.OptionalInt("hidden_dim"));
  if (hidden_dim) {
    config.intermediate_size = *hidden_dim;
  } else {
    SIEVE_ASSIGN_OR_RETURN(std::optional<int> multiple_of, fields.OptionalInt("multiple_of"));
    SIEVE_ASSIGN_OR_RETURN(std::optional<double> ffn_dim_multiplier,
                           fields.OptionalNumber("ffn_dim_multiplier"));
    const int64_t multiple = multiple_of.value_or(256);
    if (multiple <= 0) return fields.Error("multiple_of", "must be positive");
    // hidden = int(2 * (4 * dim) / 3) in Python: true division, then truncation; then
    // int(ffn_dim_multiplier * hidden), rounded up to a multiple of multiple_of.
    double hidden = std::trunc(static_cast<double>(8 * int64_t{config.hidden_size}) / 3.0);
    if (ffn_dim_multiplier) hidden = std::trunc(*ffn_dim_multiplier * hidden);
    // Checked before the conversion to an integer, which is undefined for NaN and out of range.
    if (!(hidden > 0.0 && hidden <= std::numeric_limits<int32_t>::max())) {
      return fields.Error("ffn_dim_multiplier", "gives an FFN width of " + FormatNumber(hidden));
    }
    const int64_t rounded = multiple * ((static_cast<int64_t>(hidden) + multiple - 1) / multiple);
    if (rounded > std::numeric_limits<int32_t>::max()) {
      return fields.Error("ffn_dim_multiplier", "gives an FFN width of " + std::to_string(rounded));
    }
    config.intermediate_size = static_cast<int>(rounded);
  }

  SIEVE_ASSIGN_OR_RETURN(std::optional<double> norm_eps, fields.OptionalNumber("norm_eps"));
  config.rms_norm_eps = static_cast<float>(norm_eps.value_or(1e-5));
  SIEVE_ASSIGN_OR_RETURN(std::optional<double> theta, fields.OptionalNumber("rope_theta"));
  config.rope_theta = theta.value_or(10000.0);
  SIEVE_ASSIGN_OR_RETURN(const bool use_scaled_rope, fields.Bool("use_scaled_rope", false));
  if (use_scaled_rope) {
    // Meta's apply_scaling defaults; later releases may override factor and high_freq_factor.
    SIEVE_ASSIGN_OR_RETURN(std::optional<double> factor,
                           fields.OptionalNumber("rope_scaling_factor"));
    SIEVE_ASSIGN_OR_RETURN(std::optional<double> high, fields.OptionalNumber("high_freq_factor"));
    config.rope_scaling.type = RopeScaling::Type::kLlama3;
    config.rope_scaling.factor = static_cast<float>(factor.value_or(8.0));
    config.rope_scaling.low_freq_factor = 1.0f;
    config.rope_scaling.high_freq_factor = static_cast<float>(high.value_or(4.0));
    config.rope_scaling.original_max_position_embeddings = 8192;
  }
  SIEVE_ASSIGN_OR_RETURN(config.sliding_window, fields.OptionalInt("sliding_window"));
  if (config.sliding_window) {
    config.architecture = std::string(kMistralArchitecture);
    config.model_type = "mistral";
  }

  // params.json does not state the context length: take max_seq_len when given, else the length
  // Meta published for each generation (3.1 scaled rope, 3 theta 500000, 2).
  SIEVE_ASSIGN_OR_RETURN(std::optional<int> max_seq_len, fields.OptionalInt("max_seq_len"));
  if (max_seq_len) {
    config.max_position_embeddings = *max_seq_len;
  } else if (use_scaled_rope) {
    config.max_position_embeddings = 131072;
  } else if (config.rope_theta >= 500000.0) {
    config.max_position_embeddings = 8192;
  } else {
    config.max_position_embeddings = 4096;
  }

  const Status valid = config.Validate();
  if (!valid.ok()) return valid.WithContext(source);
  return config;
}

Result<json> ReadJsonFile(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code error;
  if (!fs::exists(path, error)) return NotFoundError(path + " does not exist");
  if (fs::is_directory(path, error)) return InvalidArgumentError(path + " is a directory");
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    return InvalidArgumentError("cannot open " + path + ": " + std::strerror(errno));
  }
  const std::string text((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  if (file.bad()) return InvalidArgumentError("cannot read " + path);
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    return InvalidArgumentError(path + " is not valid JSON: " + e.what());
  }
}

Result<ModelConfig> LoadModelConfig(const std::string& model_dir) {
  namespace fs = std::filesystem;
  std::error_code error;
  if (!fs::is_directory(model_dir, error)) {
    return NotFoundError("model directory " + model_dir + " does not exist");
  }
  const std::string hf_path = (fs::path(model_dir) / "config.json").string();
  if (fs::exists(hf_path, error)) {
    SIEVE_ASSIGN_OR_RETURN(const json config, ReadJsonFile(hf_path));
    SIEVE_ASSIGN_OR_RETURN(ModelConfig parsed, ParseHfConfig(config, hf_path));
    // ModelOpt may describe its quantization beside config.json instead of inside it.
    const std::string modelopt_path = (fs::path(model_dir) / "hf_quant_config.json").string();
    if (!parsed.quantization && fs::exists(modelopt_path, error)) {
      SIEVE_ASSIGN_OR_RETURN(const json modelopt, ReadJsonFile(modelopt_path));
      SIEVE_ASSIGN_OR_RETURN(parsed.quantization,
                             ParseModelOptQuantConfig(modelopt, modelopt_path));
    }
    return parsed;
  }
  const std::string meta_path = (fs::path(model_dir) / "params.json").string();
  if (fs::exists(meta_path, error)) {
    SIEVE_ASSIGN_OR_RETURN(const json params, ReadJsonFile(meta_path));
    return ParseMetaParams(params, meta_path);
  }
  return NotFoundError("no config.json or params.json in " + model_dir);
}

}  // namespace sieve
