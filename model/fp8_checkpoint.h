// The tensors of a published FP8 checkpoint (checkpoint_quantization.h says which formats), as
// the Llama loader reads them (model/README.md "FP8 weights"). Beside the bf16 layout of
// llama_checkpoint.h, each quantized linear `<p>` (q/k/v/o/gate/up/down_proj of a layer) holds
//   <p>.weight        [N, K] F8_E4M3 codes
//   <p>.weight_scale  [N], [N, 1] (per channel) or [] / [1] (per tensor), F32 / BF16 / F16:
//                     row n stands for codes[n] * scale[n] (or * the one scale)
//   <p>.input_scale   [] / [1], optional: a static activation scale, checked and not used (Sieve
//                     quantizes activations per token as each GEMM runs: at least as accurate)
// and each layer may hold its K and V scales (stored K = K / k_scale):
//   compressed-tensors  model.layers.{i}.self_attn.k_scale, .v_scale
//   ModelOpt            model.layers.{i}.self_attn.k_proj.k_scale, .v_proj.v_scale (older
//                       exports: .k_proj.output_scale, .v_proj.output_scale)
//   legacy              model.layers.{i}.self_attn.kv_scale (one scale for both)
// A linear the producer left unquantized (its `ignore` list) is stored as a float weight with no
// scales; q/k/v and gate/up are fused in Sieve, so each fused group is all e4m3 or all float.
#pragma once

#include <array>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/model_config.h"
#include "model/safetensors.h"

namespace sieve {

// Rows [row_begin, row_end) and columns [col_begin, col_end) of the linear `prefix`
// ("model.layers.0.self_attn.q_proj"); -1 ends take it to the end.
struct E4m3Slice {
  std::string prefix;
  int64_t row_begin = 0;
  int64_t row_end = -1;
  int64_t col_begin = 0;
  int64_t col_end = -1;
};

// Slices of e4m3 linears stacked by rows, on the host: each row keeps its own scale (a per-tensor
// scale becomes one per row), so a fused matrix dequantizes exactly as its parts did.
struct E4m3Rows {
  int64_t rows = 0;
  int64_t cols = 0;
  std::vector<uint8_t> codes;  // [rows][cols] e4m3
  std::vector<float> scales;   // [rows] f32
};

// Whether the linear `prefix` is stored as e4m3 (else it is a float weight, kept unquantized).
bool IsE4m3Linear(const SafetensorsCheckpoint& checkpoint, const std::string& prefix);

// Reads the slices (validated by ValidateFp8Tensors first). InvalidArgument when their widths
// differ.
Result<E4m3Rows> ReadE4m3Slices(const SafetensorsCheckpoint& checkpoint,
                                const std::vector<E4m3Slice>& slices);

// The FP8 half of ValidateLlamaCheckpoint for a checkpoint whose config has `quantization`: each
// layer linear is e4m3 with a weight_scale of a valid shape, dtype and value (finite, > 0), or a
// float weight with no scales; fused groups are alike; input scales and K/V scales are scalars of
// valid values; K/V scales cover every layer or none (and every layer where the config declares
// them). Appends what is wrong to `problems` and the scale tensors' names to `expected_names`
// (so they are not reported as unexpected).
void ValidateFp8Tensors(const SafetensorsCheckpoint& checkpoint, const ModelConfig& config,
                        std::vector<std::string>& problems, std::set<std::string>& expected_names);

// {k_scale, v_scale} of every layer, empty when the checkpoint has none (validated first).
Result<std::vector<std::array<float, 2>>> ReadCheckpointKvScales(
    const SafetensorsCheckpoint& checkpoint, const ModelConfig& config);

// What an FP8 checkpoint holds, for `sieve inspect` (read from the tensor table and the scales'
// shapes, without loading weights).
struct Fp8CheckpointSummary {
  int linears_per_channel = 0;  // e4m3 linears with one scale per row
  int linears_per_tensor = 0;   // e4m3 linears with one scale
  int linears_float = 0;        // layer linears kept unquantized (the producer's ignore list)
  int input_scales = 0;         // linears with a static input_scale
  int kv_scale_layers = 0;      // layers with both a K and a V scale
};
Fp8CheckpointSummary SummarizeFp8Checkpoint(const SafetensorsCheckpoint& checkpoint,
                                            const ModelConfig& config);

// The names of a layer's seven linears, "model.layers.{i}.self_attn.q_proj", ...
std::vector<std::string> LayerLinearPrefixes(int layer);

}  // namespace sieve
