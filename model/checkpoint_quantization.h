// CheckpointQuantization: what a published FP8 checkpoint's `quantization_config` (config.json)
// says about its weights, read before any tensor is (model/README.md "FP8 weights").
//
// Two producers are read, both e4m3 weights with f32 (or bf16) dequantization scales:
//   - compressed-tensors (llm-compressor, Neural Magic / Red Hat's FP8 and FP8_DYNAMIC models):
//     quant_method "compressed-tensors", one config group whose weights are {num_bits 8, type
//     float, strategy channel | tensor}, input_activations dynamic (per token) or static (per
//     tensor), an `ignore` list, and optionally a kv_cache_scheme {num_bits 8, type float,
//     strategy tensor}.
//   - NVIDIA ModelOpt: quant_method "modelopt" with quant_algo "FP8" (per-tensor weight scales,
//     static input scales), optionally kv_cache_quant_algo "FP8"; also the same fields under
//     `quantization` of an hf_quant_config.json beside the weights.
// Anything else (AWQ, GPTQ, int8, bitsandbytes, FP8 block-wise, ...) is an Unimplemented error
// naming the method: loading it as bf16 would run wrongly.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/status.h"

namespace sieve {

struct CheckpointQuantization {
  enum class Format { kCompressedTensors, kModelOpt };
  // What the config declares; the loader reads each weight_scale's shape as it comes ([N], [N, 1]
  // or one value) and checks it against this.
  enum class WeightScales { kChannel, kTensor };

  Format format = Format::kCompressedTensors;
  WeightScales weight_scales = WeightScales::kChannel;
  // Static: the checkpoint carries a per-tensor `input_scale` for each linear. Sieve reads and
  // checks it but quantizes activations per token as each GEMM runs (at least as accurate: a
  // token's scale comes from its own amax, where a static scale was calibrated for all tokens).
  bool static_input_scales = false;
  // The checkpoint declares K/V scales (kv_cache_scheme, kv_cache_quant_algo): per-layer k_scale
  // and v_scale tensors (LlamaModel::checkpoint_kv_scales).
  bool kv_cache_scales = false;
  // Modules the producer left unquantized (`ignore` / `exclude_modules`), as written; lm_head is
  // the usual one. A layer linear kept in bf16 is recognised by its dtype at load.
  std::vector<std::string> ignored;
};

std::string_view CheckpointFormatName(CheckpointQuantization::Format format);    // "modelopt", ...
std::string_view WeightScalesName(CheckpointQuantization::WeightScales scales);  // "per channel"

// Parses config.json's `quantization_config` object. `source` names the file in errors:
// Unimplemented for a method or scheme Sieve does not run (naming it), InvalidArgument for a
// malformed one.
Result<CheckpointQuantization> ParseQuantizationConfig(const nlohmann::json& config,
                                                       std::string_view source);
// Parses ModelOpt's hf_quant_config.json (its `quantization` object holds quant_algo, ...).
Result<CheckpointQuantization> ParseModelOptQuantConfig(const nlohmann::json& config,
                                                        std::string_view source);

}  // namespace sieve
