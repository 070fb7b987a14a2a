#include "model/fp8_checkpoint.h"

#include <cmath>
#include <cstring>
#include <optional>

namespace sieve {
namespace {

constexpr const char* kLinearNames[] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                        "self_attn.o_proj", "mlp.gate_proj",    "mlp.up_proj",
                                        "mlp.down_proj"};

bool IsFloat(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kBF16 || dtype == DType::kF16;
}

int64_t Numel(const std::vector<int64_t>& shape) {
  int64_t count = 1;
  for (const int64_t size : shape) count *= size;
  return count;
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t index = 0; index < shape.size(); ++index) {
    out += (index > 0 ? ", " : "") + std::to_string(shape[index]);
  }
  return out + "]";
}

float ElementAsFloat(const SafetensorsTensor& tensor, int64_t index) {
  float value = 0.0f;
  const auto* bytes = static_cast<const uint8_t*>(tensor.data) + index * DTypeSize(tensor.dtype);
  ConvertToFloat(bytes, tensor.dtype, 1, &value);
  return value;
}

bool ValidScale(float value) { return std::isfinite(value) && value > 0.0f; }

// A scale tensor that must hold one value: "" when it does, else what is wrong with it.
std::string CheckScalar(const SafetensorsTensor& tensor) {
  if (!IsFloat(tensor.dtype)) {
    return tensor.name + " is " + std::string(SafetensorsDTypeName(tensor.dtype)) +
           ", expected F32, BF16 or F16";
  }
  if (Numel(tensor.shape) != 1 || tensor.shape.size() > 1) {
    return tensor.name + " has shape " + ShapeText(tensor.shape) + ", expected one value";
  }
  const float value = ElementAsFloat(tensor, 0);
  if (!ValidScale(value)) {
    return tensor.name + " is " + std::to_string(value) + ", expected a finite value > 0";
  }
  return "";
}

// The layer's K (or V) scale tensor under any of the names producers use; null when absent.
const SafetensorsTensor* FindKvScale(const SafetensorsCheckpoint& checkpoint, int layer, char kv,
                                     std::string* name_found) {
  const std::string prefix = "model.layers." + std::to_string(layer) + ".self_attn.";
  const std::string letter(1, kv);
  for (const std::string& name :
       {prefix + letter + "_scale", prefix + letter + "_proj." + letter + "_scale",
        prefix + letter + "_proj.output_scale", prefix + "kv_scale"}) {
    if (const SafetensorsTensor* tensor = checkpoint.Find(name)) {
      if (name_found != nullptr) *name_found = name;
      return tensor;
    }
  }
  return nullptr;
}

}  // namespace

std::vector<std::string> LayerLinearPrefixes(int layer) {
  std::vector<std::string> prefixes;
  for (const char* name : kLinearNames) {
    prefixes.push_back("model.layers." + std::to_string(layer) + "." + name);
  }
  return prefixes;
}

bool IsE4m3Linear(const SafetensorsCheckpoint& checkpoint, const std::string& prefix) {
  const SafetensorsTensor* weight = checkpoint.Find(prefix + ".weight");
  return weight != nullptr && weight->dtype == DType::kF8E4M3;
}

void ValidateFp8Tensors(const SafetensorsCheckpoint& checkpoint, const ModelConfig& config,
                        std::vector<std::string>& problems, std::set<std::string>& expected_names) {
  for (int layer = 0; layer < config.num_layers; ++layer) {
    const std::vector<std::string> prefixes = LayerLinearPrefixes(layer);
    for (const std::string& prefix : prefixes) {
      const SafetensorsTensor* weight = checkpoint.Find(prefix + ".weight");
      const SafetensorsTensor* scale = checkpoint.Find(prefix + ".weight_scale");
      const SafetensorsTensor* input_scale = checkpoint.Find(prefix + ".input_scale");
      expected_names.insert(prefix + ".weight_scale");
      expected_names.insert(prefix + ".input_scale");
      if (weight == nullptr) continue;  // reported as missing by the caller
      if (weight->dtype != DType::kF8E4M3) {
        // Kept unquantized (the producer's ignore list): a float weight, which the caller checks.
        if (scale != nullptr) {
          problems.push_back(prefix + ".weight is " +
                             std::string(SafetensorsDTypeName(weight->dtype)) +
                             " but has a weight_scale (expected F8_E4M3 codes)");
        }
        continue;
      }
      if (scale == nullptr) {
        problems.push_back(prefix + ".weight_scale is missing (its weight is F8_E4M3)");
        continue;
      }
      const int64_t rows = weight->shape.empty() ? 0 : weight->shape[0];
      const std::vector<int64_t>& shape = scale->shape;
      const bool per_tensor = Numel(shape) == 1 && shape.size() <= 1;
      const bool per_channel = (shape.size() == 1 && shape[0] == rows) ||
                               (shape.size() == 2 && shape[0] == rows && shape[1] == 1);
      if (!IsFloat(scale->dtype)) {
        problems.push_back(prefix + ".weight_scale is " +
                           std::string(SafetensorsDTypeName(scale->dtype)) +
                           ", expected F32, BF16 or F16");
        continue;
      }
      if (!per_tensor && !per_channel) {
        problems.push_back(prefix + ".weight_scale has shape " + ShapeText(shape) + ", expected [" +
                           std::to_string(rows) + "], [" + std::to_string(rows) +
                           ", 1] or one value (block-wise scales are not supported)");
        continue;
      }
      for (int64_t index = 0; index < Numel(shape); ++index) {
        const float value = ElementAsFloat(*scale, index);
        if (!ValidScale(value)) {
          problems.push_back(prefix + ".weight_scale[" + std::to_string(index) + "] is " +
                             std::to_string(value) + ", expected a finite value > 0");
          break;
        }
      }
      if (input_scale != nullptr) {
        if (std::string problem = CheckScalar(*input_scale); !problem.empty()) {
          problems.push_back(problem);
        }
      }
    }
    // Sieve fuses q/k/v and gate/up: one fused matrix has one format.
    const auto alike = [&](std::initializer_list<int> members, const char* what) {
      int e4m3 = 0;
      for (const int member : members) e4m3 += IsE4m3Linear(checkpoint, prefixes[member]);
      if (e4m3 != 0 && e4m3 != static_cast<int>(members.size())) {
        problems.push_back("layer " + std::to_string(layer) +
                           " mixes F8_E4M3 and float weights in " + what +
                           " (Sieve fuses them into one matrix)");
      }
    };
    alike({0, 1, 2}, "q/k/v_proj");
    alike({4, 5}, "gate/up_proj");
  }
  // K/V scales: every layer or none.
  int layers_with_scales = 0;
  std::string first_missing;
  for (int layer = 0; layer < config.num_layers; ++layer) {
    const std::string prefix = "model.layers." + std::to_string(layer) + ".self_attn.";
    for (const std::string& name :
         {prefix + "k_scale", prefix + "v_scale", prefix + "k_proj.k_scale",
          prefix + "v_proj.v_scale", prefix + "k_proj.output_scale", prefix + "v_proj.output_scale",
          prefix + "kv_scale", prefix + "q_scale"}) {
      expected_names.insert(name);  // q_scale (FP8 attention's query scale) is not used
    }
    bool complete = true;
    for (const char kv : {'k', 'v'}) {
      const SafetensorsTensor* tensor = FindKvScale(checkpoint, layer, kv, nullptr);
      if (tensor == nullptr) {
        complete = false;
      } else if (std::string problem = CheckScalar(*tensor); !problem.empty()) {
        problems.push_back(problem);
      }
    }
    if (complete) {
      ++layers_with_scales;
    } else if (first_missing.empty()) {
      first_missing = prefix + "k_scale / v_scale";
    }
  }
  const bool declared = config.quantization && config.quantization->kv_cache_scales;
  if ((layers_with_scales > 0 || declared) && layers_with_scales < config.num_layers) {
    problems.push_back(
        "K/V scales are missing for " + std::to_string(config.num_layers - layers_with_scales) +
        " of " + std::to_string(config.num_layers) + " layers (first: " + first_missing + ")" +
        (declared ? "; the config declares them (kv_cache_scheme / kv_cache_quant_algo)" : ""));
  }
}

Result<E4m3Rows> ReadE4m3Slices(const SafetensorsCheckpoint& checkpoint,
                                const std::vector<E4m3Slice>& slices) {
  E4m3Rows out;
  out.cols = -1;
  for (const E4m3Slice& slice : slices) {
    const SafetensorsTensor* weight = checkpoint.Find(slice.prefix + ".weight");
    const SafetensorsTensor* scale = checkpoint.Find(slice.prefix + ".weight_scale");
    if (weight == nullptr || scale == nullptr || weight->dtype != DType::kF8E4M3 ||
        weight->shape.size() != 2) {
      return InvalidArgumentError(slice.prefix + " is not an F8_E4M3 matrix with a weight_scale");
    }
    const int64_t rows = weight->shape[0];
    const int64_t cols = weight->shape[1];
    const int64_t row_end = slice.row_end < 0 ? rows : slice.row_end;
    const int64_t col_end = slice.col_end < 0 ? cols : slice.col_end;
    // The caller's slices come from a config the checkpoint was validated against.
    SIEVE_CHECK(0 <= slice.row_begin && slice.row_begin <= row_end && row_end <= rows &&
                0 <= slice.col_begin && slice.col_begin < col_end && col_end <= cols)
        << slice.prefix << ": slice outside the tensor";
    const int64_t width = col_end - slice.col_begin;
    if (out.cols >= 0 && width != out.cols) {
      return InvalidArgumentError(slice.prefix + ".weight has " + std::to_string(width) +
                                  " columns, expected " + std::to_string(out.cols));
    }
    out.cols = width;
    const bool per_tensor = Numel(scale->shape) == 1;
    const auto* codes = static_cast<const uint8_t*>(weight->data);
    for (int64_t row = slice.row_begin; row < row_end; ++row) {
      const uint8_t* begin = codes + row * cols + slice.col_begin;
      out.codes.insert(out.codes.end(), begin, begin + width);
      out.scales.push_back(ElementAsFloat(*scale, per_tensor ? 0 : row));
    }
    out.rows += row_end - slice.row_begin;
  }
  return out;
}

Fp8CheckpointSummary SummarizeFp8Checkpoint(const SafetensorsCheckpoint& checkpoint,
                                            const ModelConfig& config) {
  Fp8CheckpointSummary summary;
  for (int layer = 0; layer < config.num_layers; ++layer) {
    for (const std::string& prefix : LayerLinearPrefixes(layer)) {
      const SafetensorsTensor* weight = checkpoint.Find(prefix + ".weight");
      const SafetensorsTensor* scale = checkpoint.Find(prefix + ".weight_scale");
      if (weight == nullptr) continue;
      if (weight->dtype != DType::kF8E4M3 || scale == nullptr) {
        ++summary.linears_float;
        continue;
      }
      ++(Numel(scale->shape) == 1 ? summary.linears_per_tensor : summary.linears_per_channel);
      summary.input_scales += checkpoint.Find(prefix + ".input_scale") != nullptr;
    }
    summary.kv_scale_layers += FindKvScale(checkpoint, layer, 'k', nullptr) != nullptr &&
                               FindKvScale(checkpoint, layer, 'v', nullptr) != nullptr;
  }
  return summary;
}

Result<std::vector<std::array<float, 2>>> ReadCheckpointKvScales(
    const SafetensorsCheckpoint& checkpoint, const ModelConfig& config) {
  std::vector<std::array<float, 2>> scales;
  for (int layer = 0; layer < config.num_layers; ++layer) {
    std::array<float, 2> layer_scales{};
    for (const int index : {0, 1}) {
      const char kv = index == 0 ? 'k' : 'v';
      std::string name;
      const SafetensorsTensor* tensor = FindKvScale(checkpoint, layer, kv, &name);
      if (tensor == nullptr) {
        if (layer == 0 && index == 0) return scales;  // none
        return InvalidArgumentError("model.layers." + std::to_string(layer) + ".self_attn: no " +
                                    std::string(1, kv) +
                                    "_scale, while other layers have K/V scales");
      }
      if (std::string problem = CheckScalar(*tensor); !problem.empty()) {
        return InvalidArgumentError(problem);
      }
      layer_scales[index] = ElementAsFloat(*tensor, 0);
    }
    scales.push_back(layer_scales);
  }
  return scales;
}

}  // namespace sieve
