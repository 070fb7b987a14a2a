#include "model/llama_checkpoint.h"

#include <spdlog/spdlog.h>

#include <filesystem>
#include <set>
#include <string_view>

#include "model/fp8_checkpoint.h"

namespace sieve {
namespace {

constexpr std::string_view kLmHeadName = "lm_head.weight";
// Enough names to act on; the count says how many more there are.
constexpr size_t kMaxListed = 10;

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t index = 0; index < shape.size(); ++index) {
    if (index > 0) out += ", ";
    out += std::to_string(shape[index]);
  }
  return out + "]";
}

bool IsFloat(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kBF16 || dtype == DType::kF16;
}

// Buffers some exporters save although the model recomputes them.
bool IsHarmlessExtra(std::string_view name) {
  constexpr std::string_view kInvFreq = ".rotary_emb.inv_freq";
  return name.size() >= kInvFreq.size() && name.substr(name.size() - kInvFreq.size()) == kInvFreq;
}

// "missing tensors (3): a, b, c" with at most kMaxListed items, then "and N more".
std::string Section(std::string_view what, const std::vector<std::string>& items) {
  std::string out = std::string(what) + " (" + std::to_string(items.size()) + "): ";
  for (size_t index = 0; index < items.size() && index < kMaxListed; ++index) {
    if (index > 0) out += ", ";
    out += items[index];
  }
  if (items.size() > kMaxListed)
    out += ", and " + std::to_string(items.size() - kMaxListed) + " more";
  return out;
}

}  // namespace

std::vector<ExpectedTensor> LlamaTensorSpecs(const ModelConfig& config) {
  const int64_t d = config.hidden_size;
  const int64_t q_width = static_cast<int64_t>(config.num_heads) * config.head_dim;
  const int64_t kv_width = static_cast<int64_t>(config.num_kv_heads) * config.head_dim;
  const int64_t f = config.intermediate_size;
  const int64_t v = config.vocab_size;

  std::vector<ExpectedTensor> specs;
  specs.reserve(static_cast<size_t>(config.num_layers) * 9 + 3);
  specs.push_back({"model.embed_tokens.weight", {v, d}});
  for (int layer_idx = 0; layer_idx < config.num_layers; ++layer_idx) {
    const std::string prefix = "model.layers." + std::to_string(layer_idx) + ".";
    specs.push_back({prefix + "input_layernorm.weight", {d}});
    specs.push_back({prefix + "self_attn.q_proj.weight", {q_width, d}});
    specs.push_back({prefix + "self_attn.k_proj.weight", {kv_width, d}});
    specs.push_back({prefix + "self_attn.v_proj.weight", {kv_width, d}});
    specs.push_back({prefix + "self_attn.o_proj.weight", {d, q_width}});
    specs.push_back({prefix + "post_attention_layernorm.weight", {d}});
    specs.push_back({prefix + "mlp.gate_proj.weight", {f, d}});
    specs.push_back({prefix + "mlp.up_proj.weight", {f, d}});
    specs.push_back({prefix + "mlp.down_proj.weight", {d, f}});
  }
  specs.push_back({"model.norm.weight", {d}});
  if (!config.tie_word_embeddings) specs.push_back({std::string(kLmHeadName), {v, d}});
  return specs;
}

Status ValidateLlamaCheckpoint(const SafetensorsCheckpoint& checkpoint, const ModelConfig& config) {
  std::vector<std::string> missing;
  std::vector<std::string> misshaped;
  std::vector<std::string> non_float;
  std::set<std::string> expected_names;

  for (const ExpectedTensor& spec : LlamaTensorSpecs(config)) {
    expected_names.insert(spec.name);
    const SafetensorsTensor* tensor = checkpoint.Find(spec.name);
    if (tensor == nullptr) {
      missing.push_back(spec.name);
      continue;
    }
    const SafetensorsFile* file = checkpoint.FileOf(spec.name);
    const std::string file_name = std::filesystem::path(file->path()).filename().string();
    if (tensor->shape != spec.shape) {
      misshaped.push_back(spec.name + " (expected " + ShapeString(spec.shape) + ", got " +
                          ShapeString(tensor->shape) + " in " + file_name + ")");
    }
    // An FP8 checkpoint's layer linears are e4m3 codes (ValidateFp8Tensors checks their scales).
    const bool e4m3_allowed = config.quantization && tensor->dtype == DType::kF8E4M3 &&
                              tensor->shape.size() == 2 &&
                              spec.name.find("_proj.") != std::string::npos;
    if (!IsFloat(tensor->dtype) && !e4m3_allowed) {
      non_float.push_back(spec.name + " (" + std::string(SafetensorsDTypeName(tensor->dtype)) +
                          " in " + file_name + ")");
    }
  }

  std::vector<std::string> fp8_problems;
  if (config.quantization) ValidateFp8Tensors(checkpoint, config, fp8_problems, expected_names);

  std::vector<std::string> unexpected;
  for (const std::string& name : checkpoint.Names()) {
    if (expected_names.count(name) > 0 || IsHarmlessExtra(name)) continue;
    if (config.tie_word_embeddings && name == kLmHeadName) {
      spdlog::info(
          "{}: lm_head.weight is present but the config ties it to embed_tokens; "
          "ignoring it",
          checkpoint.dir());
      continue;
    }
    unexpected.push_back(name);
  }

  if (missing.empty() && misshaped.empty() && non_float.empty() && unexpected.empty() &&
      fp8_problems.empty()) {
    return Status::Ok();
  }
  std::string message =
      "checkpoint " + checkpoint.dir() + " does not match its config (" + config.Summary() + ")";
  if (!missing.empty()) message += "; " + Section("missing tensors", missing);
  if (!misshaped.empty()) message += "; " + Section("tensors with the wrong shape", misshaped);
  if (!non_float.empty()) {
    message += "; " + Section("tensors not in F32, BF16 or F16", non_float);
  }
  if (!fp8_problems.empty()) message += "; " + Section("FP8 tensors", fp8_problems);
  if (!unexpected.empty()) message += "; " + Section("unexpected tensors", unexpected);
  return InvalidArgumentError(message);
}

}  // namespace sieve
