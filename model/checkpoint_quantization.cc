#include "model/checkpoint_quantization.h"

#include <nlohmann/json.hpp>

namespace sieve {
namespace {

using json = nlohmann::json;

std::string Dump(const json& value) {
  std::string text = value.dump(-1, ' ', false, json::error_handler_t::replace);
  if (text.size() > 80) text = text.substr(0, 80) + "...";
  return text;
}

// The string at `key`, "" when absent or null; InvalidArgument when it is something else.
Result<std::string> StringField(const json& object, const char* key, std::string_view where) {
  const auto it = object.find(key);
  if (it == object.end() || it->is_null()) return std::string();
  if (!it->is_string()) {
    return InvalidArgumentError(std::string(where) + "." + key + " must be a string, got " +
                                Dump(*it));
  }
  return it->get<std::string>();
}

Result<std::vector<std::string>> StringList(const json& object, const char* key,
                                            std::string_view where) {
  std::vector<std::string> out;
  const auto it = object.find(key);
  if (it == object.end() || it->is_null()) return out;
  if (!it->is_array()) {
    return InvalidArgumentError(std::string(where) + "." + key + " must be a list, got " +
                                Dump(*it));
  }
  for (const json& item : *it) {
    if (!item.is_string()) {
      return InvalidArgumentError(std::string(where) + "." + key + " holds " + Dump(item) +
                                  ", not a module name");
    }
    out.push_back(item.get<std::string>());
  }
  return out;
}

// A compressed-tensors QuantizationArgs that must be FP8 e4m3: {num_bits 8, type float}.
Status CheckFloat8Args(const json& args, const std::string& where) {
  if (!args.is_object()) {
    return InvalidArgumentError(where + " must be an object, got " + Dump(args));
  }
  const auto bits = args.find("num_bits");
  const auto type = args.find("type");
  const bool is_fp8 = bits != args.end() && bits->is_number_integer() && bits->get<int>() == 8 &&
                      type != args.end() && type->is_string() &&
                      type->get<std::string>() == "float";
  if (!is_fp8) {
    return UnimplementedError(where + " is " + Dump(args) +
                              "; Sieve reads FP8 checkpoints only (num_bits 8, type float), not "
                              "int8 / int4 / other float widths");
  }
  return Status::Ok();
}

Result<CheckpointQuantization> ParseCompressedTensors(const json& config, std::string_view source) {
  const std::string where = std::string(source) + ": quantization_config";
  CheckpointQuantization out;
  out.format = CheckpointQuantization::Format::kCompressedTensors;
  SIEVE_ASSIGN_OR_RETURN(const std::string format, StringField(config, "format", where));
  if (!format.empty() && format != "float-quantized") {
    return UnimplementedError(where + ".format is '" + format +
                              "'; Sieve reads compressed-tensors FP8 checkpoints "
                              "(float-quantized) only");
  }
  const auto groups = config.find("config_groups");
  if (groups == config.end() || !groups->is_object() || groups->empty()) {
    return InvalidArgumentError(where + " has no config_groups");
  }
  bool first = true;
  for (const auto& [name, group] : groups->items()) {
    const std::string group_where = where + ".config_groups." + name;
    if (!group.is_object()) {
      return InvalidArgumentError(group_where + " must be an object, got " + Dump(group));
    }
    const auto weights = group.find("weights");
    if (weights == group.end() || weights->is_null()) {
      return UnimplementedError(group_where + " quantizes no weights; Sieve reads FP8 weights");
    }
    SIEVE_RETURN_IF_ERROR(CheckFloat8Args(*weights, group_where + ".weights"));
    SIEVE_ASSIGN_OR_RETURN(const std::string strategy,
                           StringField(*weights, "strategy", group_where + ".weights"));
    CheckpointQuantization::WeightScales scales;
    if (strategy == "channel") {
      scales = CheckpointQuantization::WeightScales::kChannel;
    } else if (strategy == "tensor") {
      scales = CheckpointQuantization::WeightScales::kTensor;
    } else {
      return UnimplementedError(group_where + ".weights.strategy is '" + strategy +
                                "'; Sieve reads FP8 weight scales per channel or per tensor, not "
                                "block-wise or grouped");
    }
    bool static_inputs = false;
    const auto inputs = group.find("input_activations");
    if (inputs != group.end() && !inputs->is_null()) {
      SIEVE_RETURN_IF_ERROR(CheckFloat8Args(*inputs, group_where + ".input_activations"));
      const auto dynamic = inputs->find("dynamic");
      static_inputs = dynamic == inputs->end() || !dynamic->is_boolean() || !dynamic->get<bool>();
    }
    if (!first && (scales != out.weight_scales || static_inputs != out.static_input_scales)) {
      return UnimplementedError(where + " has config groups of different schemes; Sieve reads one");
    }
    out.weight_scales = scales;
    out.static_input_scales = static_inputs;
    first = false;
  }
  const auto kv = config.find("kv_cache_scheme");
  if (kv != config.end() && !kv->is_null()) {
    SIEVE_RETURN_IF_ERROR(CheckFloat8Args(*kv, where + ".kv_cache_scheme"));
    SIEVE_ASSIGN_OR_RETURN(const std::string strategy,
                           StringField(*kv, "strategy", where + ".kv_cache_scheme"));
    if (!strategy.empty() && strategy != "tensor") {
      return UnimplementedError(where + ".kv_cache_scheme.strategy is '" + strategy +
                                "'; Sieve reads one K and one V scale per layer (tensor)");
    }
    out.kv_cache_scales = true;
  }
  SIEVE_ASSIGN_OR_RETURN(out.ignored, StringList(config, "ignore", where));
  return out;
}

// ModelOpt's fields, from config.json's quantization_config or hf_quant_config.json's
// `quantization`.
Result<CheckpointQuantization> ParseModelOptFields(const json& fields, const std::string& where) {
  CheckpointQuantization out;
  out.format = CheckpointQuantization::Format::kModelOpt;
  SIEVE_ASSIGN_OR_RETURN(const std::string algo, StringField(fields, "quant_algo", where));
  if (algo != "FP8") {
    return UnimplementedError(where + ".quant_algo is '" + algo +
                              "'; Sieve reads ModelOpt FP8 checkpoints (quant_algo FP8) only");
  }
  // ModelOpt FP8: one scale per weight tensor, and calibrated (static) input scales.
  out.weight_scales = CheckpointQuantization::WeightScales::kTensor;
  out.static_input_scales = true;
  SIEVE_ASSIGN_OR_RETURN(const std::string kv_algo,
                         StringField(fields, "kv_cache_quant_algo", where));
  if (!kv_algo.empty() && kv_algo != "FP8") {
    return UnimplementedError(where + ".kv_cache_quant_algo is '" + kv_algo +
                              "'; Sieve reads FP8 K/V scales only");
  }
  out.kv_cache_scales = !kv_algo.empty();
  SIEVE_ASSIGN_OR_RETURN(out.ignored, StringList(fields, "exclude_modules", where));
  if (out.ignored.empty()) {
    SIEVE_ASSIGN_OR_RETURN(out.ignored, StringList(fields, "ignore", where));
  }
  return out;
}

}  // namespace

std::string_view CheckpointFormatName(CheckpointQuantization::Format format) {
  switch (format) {
    case CheckpointQuantization::Format::kCompressedTensors:
      return "compressed-tensors";
    case CheckpointQuantization::Format::kModelOpt:
      return "modelopt";
  }
  return "?";
}

std::string_view WeightScalesName(CheckpointQuantization::WeightScales scales) {
  switch (scales) {
    case CheckpointQuantization::WeightScales::kChannel:
      return "per channel";
    case CheckpointQuantization::WeightScales::kTensor:
      return "per tensor";
  }
  return "?";
}

Result<CheckpointQuantization> ParseQuantizationConfig(const json& config,
                                                       std::string_view source) {
  const std::string where = std::string(source) + ": quantization_config";
  if (!config.is_object()) {
    return InvalidArgumentError(where + " must be an object, got " + Dump(config));
  }
  SIEVE_ASSIGN_OR_RETURN(const std::string method, StringField(config, "quant_method", where));
  if (method == "compressed-tensors") return ParseCompressedTensors(config, source);
  if (method == "modelopt") {
    const auto nested = config.find("quantization");
    if (nested != config.end() && nested->is_object()) {
      return ParseModelOptFields(*nested, where + ".quantization");
    }
    return ParseModelOptFields(config, where);
  }
  return UnimplementedError(where + ": quant_method '" + (method.empty() ? "unknown" : method) +
                            "' is not supported; Sieve reads FP8 checkpoints in compressed-tensors "
                            "or ModelOpt format, and quantizes a bf16 checkpoint to FP8 at load "
                            "with --quantization fp8");
}

Result<CheckpointQuantization> ParseModelOptQuantConfig(const json& config,
                                                        std::string_view source) {
  const std::string where(source);
  if (!config.is_object()) {
    return InvalidArgumentError(where + " must be an object, got " + Dump(config));
  }
  const auto fields = config.find("quantization");
  if (fields == config.end() || !fields->is_object()) {
    return InvalidArgumentError(where + " has no `quantization` object");
  }
  return ParseModelOptFields(*fields, where + ": quantization");
}

}  // namespace sieve
