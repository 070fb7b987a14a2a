// LlamaModel: the Llama-family forward pass (Llama 2/3/3.1, Mistral), written once against
// Backend. Weights are uploaded once at load, with q/k/v fused into one [(H + 2G) hd, D] matrix
// and gate/up into one [2F, D] matrix so each block runs two input GEMMs instead of five.
//
// Folded norms (README.md "Folded norms"): each layer's RMSNorm weights are multiplied into the
// columns of the GEMM after them (qkv, gate_up) at load, the GEMMs read the raw residual stream,
// and the ops after them (RoPE + cache write, decode attention, SiLU-and-multiply) scale each row
// by its inverse RMS (RowRms); the residual adds happen inside the o and down GEMMs (LinearAdd).
// A layer runs no RMSNorm kernel (6 ops in a decode step); the final norm is the only one.
//
// One Forward() call runs one scheduler step: a mix of prefill chunks and decode tokens
// described by StepMeta. Inside each layer's prefill attention the layer's KV-sparsity jobs run
// (window scores, selection, write of the kept entries), so a layer's full-length K/V exists
// only in the step's scratch, never in the pages of a compressed layer (SPARSITY.md "When it
// runs").
//
// Tensor parallelism (tensor_parallel.h): a model made for rank r of N holds only that rank's
// slices (its heads of q/k/v, its KV heads, its share of the MLP) and a Communicator; Forward
// then runs the rank's part of the step on its own KV pool (its KV heads only) and all-reduces
// the residual stream after the o and down projections: rank 0 adds its partial product into its
// residual (LinearAdd), every other rank writes its partial product over its residual buffer
// (Linear), and the sum over ranks is the residual plus the full product. N = 1 is the
// unsharded model, with no communicator and no extra work.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "backend/backend.h"
#include "backend/communicator.h"
#include "model/model_config.h"
#include "model/safetensors.h"
#include "model/tensor_parallel.h"

namespace sieve {

// Shapes are those of one rank; unsharded, H_q = H_o = H, G_r = G, F_r = F (ShardLayout:
// H_q = num_q_heads, H_o = num_out_heads, G_r = num_kv_heads, F_r = ffn_size).
// Columns "scaled by" a norm: where the model folds its norms (LlamaModel::norms_folded()).
struct LlamaLayerWeights {
  Tensor attn_norm;  // [D]
  Tensor qkv;        // [(H_q + 2 G_r) hd][D], columns scaled by attn_norm
  Tensor o;          // [D][H_o hd]
  Tensor mlp_norm;   // [D]
  Tensor gate_up;    // [2 F_r][D]: gate rows, then up rows; columns scaled by mlp_norm
  Tensor down;       // [D][F_r]
};

// How the layers' linear weights (q/k/v, o, gate/up, down) are held. Embeddings, norms and the LM
// head stay in the activation dtype (as vLLM's --quantization fp8 keeps lm_head bf16).
enum class WeightQuantization {
  kNone,  // the activation dtype (bf16 on the GPU, f32 on the CPU)
  // e4m3 with one f32 scale per output channel, inputs quantized per token (dynamic;
  // Backend::QuantizeWeightE4m3): vLLM's --quantization fp8 for a bf16 checkpoint. The down
  // GEMM's input is quantized by SiluMul and, with the norms unfolded, the qkv and gate_up GEMMs'
  // by RmsNorm (README.md "FP8 weights"); the other inputs by the GEMM.
  kFp8,
};
// Bytes `weight` takes as held: its elements, plus an e4m3 matrix's f32 row scales.
int64_t HeldBytes(const Tensor& weight);

// "none" | "fp8"; InvalidArgument naming the choices otherwise.
Result<WeightQuantization> ParseWeightQuantization(std::string_view name);
std::string_view WeightQuantizationName(WeightQuantization quantization);

struct LlamaWeights {
  Tensor embed;       // [V][D]
  Tensor final_norm;  // [D]
  Tensor lm_head;     // [V][D]; the embed tensor itself when tied
  std::vector<LlamaLayerWeights> layers;
};

// Activation buffers of one step, sized for the largest step the runner will plan.
struct ForwardWorkspace {
  int max_tokens = 0;
  int64_t max_prefill_keys = 0;
  int max_sample_rows = 0;
  int64_t max_scores = 0;
  int64_t max_kept = 0;
  // Widths of one rank, as in LlamaLayerWeights.
  Tensor hidden;     // [max_tokens][D] residual stream
  Tensor normed;     // [max_tokens][D] the final norm's output (and unfolded norms' outputs)
  Tensor qkv;        // [max_tokens][(H_q + 2 G_r) hd]
  Tensor attn;       // [max_tokens][H_q hd]
  Tensor gate_up;    // [max_tokens][2 F_r]
  Tensor act;        // [max_tokens][F_r]
  Tensor lse;        // [max_tokens][H_q] f32
  Tensor k_scratch;  // [max_prefill_keys][G_r][hd]
  Tensor v_scratch;  // [max_prefill_keys][G_r][hd]
  Tensor scores;     // [max_scores] f32
  Tensor kept;       // [max_kept] i32
  Tensor last;  // [max_sample_rows][D]: the sampled rows (normed, or the last layer's residual)
  Tensor last_attn;  // [max_sample_rows][H_q hd]: their attention output in the last layer
  // Quantized activations (Backend: e4m3 with row scales [max_tokens] f32), defined when the
  // model's linear weights are FP8: the MLP's activation before an e4m3 down GEMM, and the
  // unfolded norms' output before e4m3 qkv and gate_up GEMMs (GemmInput).
  Tensor act_e4m3;     // [max_tokens][F_r]
  Tensor normed_e4m3;  // [max_tokens][D], only where the norms are not folded
};

// The buffer a GEMM over `weight` reads its `rows` input rows from, for the op before it to
// write: the quantized activation `quantized` where the weight is e4m3 and `quantized` is
// defined (the op quantizes as it writes), else `plain`.
Tensor GemmInput(const Tensor& weight, const Tensor& plain, const Tensor& quantized, int64_t rows);

class LlamaModel {
 public:
  // Loads and validates the checkpoint's weights (any float dtype, converted to the backend's).
  // With a shard of N > 1 ranks: only this rank's slices, read straight from the mapped file
  // (rows of q/k/v/gate/up, columns of o/down), and `communicator` (its rank and size those of
  // `shard`) carries the all-reduces. InvalidArgument when the model does not split N ways.
  // An FP8 checkpoint (config.quantization; model/fp8_checkpoint.h) keeps its e4m3 weights and
  // scales bit for bit (a row keeps its scale in a fused or sharded matrix), so its norms run
  // unfolded; Unimplemented etc. from Backend::CheckE4m3Weight before any weight is read.
  // `fold_norms` false runs the norms unfolded for a float checkpoint too (explicit RmsNorm
  // kernels: the FP8 checkpoints' forward, which tests compare with the folded one).
  static Result<std::unique_ptr<LlamaModel>> Load(const ModelConfig& config,
                                                  const SafetensorsCheckpoint& checkpoint,
                                                  Backend& backend, int max_positions,
                                                  const TensorParallelShard& shard = {},
                                                  Communicator* communicator = nullptr,
                                                  bool fold_norms = true);
  // Seeded random weights on the device (--load-format dummy and the embedded model): N(0,
  // init_std) for matrices, 1 + N(0, 0.1) for norms.
  static std::unique_ptr<LlamaModel> Random(const ModelConfig& config, Backend& backend,
                                            uint64_t seed, int max_positions,
                                            float init_std = 0.02f);
  // The same weights as Random with the same seed, cut to `shard`'s slices (each full matrix is
  // made on the device, sliced and dropped), so N ranks together compute what one does.
  // `quantization` kFp8 quantizes each layer as soon as it is made (exactly what
  // QuantizeWeights does afterwards), so that the device never holds more than one layer in the
  // activation dtype: a 70B model's dummy FP8 weights fit one 80 GB GPU, its bf16 ones do not.
  // Errors as Load and QuantizeWeights (checked before any weight is made).
  static Result<std::unique_ptr<LlamaModel>> RandomShard(
      const ModelConfig& config, Backend& backend, uint64_t seed, int max_positions,
      const TensorParallelShard& shard, Communicator* communicator, float init_std = 0.02f,
      WeightQuantization quantization = WeightQuantization::kNone);

  // Quantizes the layers' linear weights in place (after loading, folded norms included):
  // kFp8 holds each as e4m3 with per-output-channel scales, which halves their bytes. kNone, or
  // a model already so quantized: nothing to do.
  // Errors (nothing changed) where the backend cannot run such weights.
  Status QuantizeWeights(WeightQuantization quantization);
  WeightQuantization quantization() const { return quantization_; }
  // Whether the layers' norms are folded into the qkv and gate_up weights (top of this file);
  // false for an FP8 checkpoint, whose weights folding would requantize: then each layer runs
  // RmsNorm into the workspace's `normed` (`normed_e4m3` before e4m3 weights) before those
  // GEMMs, and no op scales by RowRms.
  bool norms_folded() const { return norms_folded_; }
  // An FP8 checkpoint's K and V scales, {k_scale, v_scale} per layer (stored K = K / k_scale),
  // as model/fp8_checkpoint.h reads them; empty when the checkpoint has none.
  const std::vector<std::array<float, 2>>& checkpoint_kv_scales() const {
    return checkpoint_kv_scales_;
  }
  // Bytes of the weights as held on the backend (quantized ones with their scales).
  int64_t WeightBytes() const;

  const ModelConfig& config() const { return config_; }
  Backend& backend() const { return backend_; }
  int max_positions() const { return max_positions_; }
  const LlamaWeights& weights() const { return weights_; }
  const Tensor& rope_table() const { return rope_table_; }
  // This rank's slice; {0, 1} and the whole model's heads when unsharded.
  const TensorParallelShard& shard() const { return shard_; }
  const ShardLayout& layout() const { return layout_; }
  Communicator* communicator() const { return communicator_; }

  // Makes (or grows) the workspace so it holds a step of these sizes. Not on the hot path: the
  // runner sizes it once at start-up for the largest step it will plan.
  void EnsureWorkspace(ForwardWorkspace& workspace, int max_tokens, int64_t max_prefill_keys,
                       int max_sample_rows, int64_t max_scores, int64_t max_kept) const;

  // Runs one step. `logits` [R][V] f32 receives the logits of step.sample_rows; an undefined
  // `logits` skips the final norm and the LM head (tensor-parallel ranks whose logits nobody
  // samples). Where R is less than the step's tokens, the last layer's output projection and
  // MLP run on the sampled rows alone (workspace.hidden then holds the last layer's input for
  // every row, not its output). `pool` holds this rank's KV heads (pool.num_kv_heads ==
  // layout().num_kv_heads). Every rank of a sharded model runs Forward on the same step at the same
  // time.
  void Forward(const StepMeta& step, KvPool& pool, ForwardWorkspace& workspace,
               Tensor& logits) const;

 private:
  LlamaModel(const ModelConfig& config, Backend& backend, int max_positions,
             const TensorParallelShard& shard, const ShardLayout& layout,
             Communicator* communicator);
  // The layout of `shard`, or InvalidArgument when the model does not split so or the
  // communicator does not match it.
  static Result<ShardLayout> CheckShard(const ModelConfig& config, const TensorParallelShard& shard,
                                        const Communicator* communicator);
  // The row-parallel projections: residual += x w^T summed over ranks (see the top of this
  // file); unsharded, exactly LinearAdd.
  void RowParallelAdd(const Tensor& x, const Tensor& w, Tensor& residual) const;
  // A layer past its attention: residual += o(attn), then residual += down(silu(gate) * up) of
  // its folded post-attention norm, on residual's rows (attn has as many).
  void OutputAndMlp(const LlamaLayerWeights& w, const Tensor& attn, Tensor& residual,
                    ForwardWorkspace& ws) const;
  void UploadRopeTable();
  // qkv *= diag(attn_norm), gate_up *= diag(mlp_norm) for every layer (see the top of this file).
  void FoldNorms();
  void FoldNorms(LlamaLayerWeights& w);
  // The RowRms of the ops after a GEMM that read `rows`: its rows' inverse RMS when the norms are
  // folded, none otherwise.
  RowRms FoldedNorm(const Tensor& rows) const;
  // The input of the GEMM over `gemm_weight` after a norm: `x` itself when folded, else
  // RmsNorm(x, weight) written into the first rows of the workspace's `normed` (`normed_e4m3`
  // before an e4m3 weight: GemmInput).
  Tensor NormedInput(const Tensor& x, const Tensor& weight, const Tensor& gemm_weight,
                     ForwardWorkspace& ws) const;

  ModelConfig config_;
  Backend& backend_;
  int max_positions_;
  TensorParallelShard shard_;
  ShardLayout layout_;
  Communicator* communicator_;  // null when unsharded (one rank may have one: tests the path)
  LlamaWeights weights_;
  WeightQuantization quantization_ = WeightQuantization::kNone;
  bool norms_folded_ = true;
  std::vector<std::array<float, 2>> checkpoint_kv_scales_;  // [L] {k_scale, v_scale} or empty
  Tensor rope_table_;                                       // [max_positions][hd / 2][2] f32
};

}  // namespace sieve
