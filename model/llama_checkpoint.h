// The tensor layout of a Hugging Face Llama / Mistral checkpoint, and the check that a checkpoint
// matches its config before any weight is loaded.
//
// Shapes are as stored (PyTorch nn.Linear keeps [out_features, in_features]), with D = hidden,
// H = heads, G = kv heads, hd = head_dim, F = intermediate, V = vocab:
//   model.embed_tokens.weight                      [V, D]
//   model.layers.{i}.input_layernorm.weight        [D]
//   model.layers.{i}.self_attn.q_proj.weight       [H * hd, D]
//   model.layers.{i}.self_attn.k_proj.weight       [G * hd, D]
//   model.layers.{i}.self_attn.v_proj.weight       [G * hd, D]
//   model.layers.{i}.self_attn.o_proj.weight       [D, H * hd]
//   model.layers.{i}.post_attention_layernorm.weight [D]
//   model.layers.{i}.mlp.gate_proj.weight          [F, D]
//   model.layers.{i}.mlp.up_proj.weight            [F, D]
//   model.layers.{i}.mlp.down_proj.weight          [D, F]
//   model.norm.weight                              [D]
//   lm_head.weight                                 [V, D]  (absent when tie_word_embeddings)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/model_config.h"
#include "model/safetensors.h"

namespace sieve {

struct ExpectedTensor {
  std::string name;
  std::vector<int64_t> shape;
};

// Every tensor the forward pass reads, in checkpoint order (embedding, layers, norm, lm_head).
std::vector<ExpectedTensor> LlamaTensorSpecs(const ModelConfig& config);

// OK when every expected tensor is present with its exact shape and a float dtype (F32, BF16,
// F16), and nothing else is there. Otherwise one InvalidArgument error that lists all missing,
// mis-shaped, non-float and unexpected tensors at once. Tolerated: `*.rotary_emb.inv_freq` (old
// checkpoints saved RoPE's buffer) and an lm_head.weight beside tied embeddings (ignored, as
// transformers ignores it). A config with `quantization` (an FP8 checkpoint) also takes F8_E4M3
// layer linears with their scale tensors, checked as fp8_checkpoint.h says.
Status ValidateLlamaCheckpoint(const SafetensorsCheckpoint& checkpoint, const ModelConfig& config);

}  // namespace sieve
