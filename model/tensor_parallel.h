// Tensor parallelism: which slice of a Llama model one rank holds (DESIGN.md "Tensor
// parallelism"). Megatron-style: q/k/v and gate/up are split by rows (column-parallel: each rank
// computes its heads and its part of the MLP's hidden units), o and down by columns (row-parallel:
// each rank's product is a partial sum of the full one, all-reduced). Embedding, final norm and
// LM head are replicated: every rank holds them whole (vocab-parallel embedding and LM head are
// the alternative, to be measured on the GPU against the extra all-gather they need).
//
// KV heads: with G >= N ranks, rank r holds KV heads [r G/N, (r + 1) G/N). With G < N (a GQA
// model on more ranks than KV heads) each KV head is replicated on N/G ranks, as vLLM does: rank
// r holds KV head r G / N. Its query heads [r H/N, (r + 1) H/N) are then part of that KV head's
// group, which spans several ranks; since the KV policies score a KV head by its whole group's
// attention (SPARSITY.md "GQA aggregation"), such a rank also computes q and attention for the
// rest of the group and uses only its own heads' outputs in its o slice. So every replica of a
// KV head keeps the same entries as one rank would, and scoring, selection and compaction stay
// local (no communication) at the cost of the group's attention computed on each replica.
#pragma once

#include <cstdint>

#include "core/status.h"
#include "core/tensor.h"
#include "model/model_config.h"

namespace sieve {

// Rank `rank` of `size` ranks; {0, 1} is the whole model on one device.
struct TensorParallelShard {
  int rank = 0;
  int size = 1;
};

// What one rank holds, in the model's head and unit indices.
struct ShardLayout {
  int num_ranks = 1;
  int q_head_begin = 0;    // heads whose q this rank computes and attends with
  int num_q_heads = 0;     //   (its KV heads' whole groups)
  int out_head_begin = 0;  // heads whose attention output this rank's o slice consumes:
  int num_out_heads = 0;   //   [rank H/N, (rank + 1) H/N), within the q heads above
  int kv_head_begin = 0;
  int num_kv_heads = 0;
  int64_t ffn_begin = 0;  // MLP hidden units [ffn_begin, ffn_begin + ffn_size)
  int64_t ffn_size = 0;

  // Whether KV heads are replicated across ranks (G < N).
  bool replicated_kv() const { return num_q_heads != num_out_heads; }
};

// Whether `config` splits over `size` ranks: size >= 1, attention heads and the MLP's
// intermediate size divisible by it, and KV heads divisible by it or (fewer KV heads than ranks)
// dividing it. InvalidArgument naming what does not divide.
Status CheckTensorParallel(const ModelConfig& config, int size);

// The layout of `shard`; InvalidArgument as CheckTensorParallel, or for a rank outside [0, size).
Result<ShardLayout> MakeShardLayout(const ModelConfig& config, const TensorParallelShard& shard);

// Where the LM head lives: whole on every rank (what the model does), or split by vocabulary rows
// (each rank 1/N of it, then an all-gather of the logits).
enum class LmHeadSplit { kReplicated, kVocabParallel };

// What one decode step moves on one rank of `size` (every rank holds an equal share): `batch`
// sequences, each layer holding `entries` KV entries per sequence (after the step's own token is
// appended), values of `dtype`.
struct DecodeStepTraffic {
  int size = 1;
  double held_bytes = 0;        // the rank's weights in memory (the whole embedding table too)
  double weight_bytes = 0;      // the rank's weights, read once (embedding: the batch's rows only)
  double lm_head_bytes = 0;     //   of which the LM head's
  double kv_bytes = 0;          // the rank's KV heads' entries, read once
  int all_reduces = 0;          // 2 a layer (after o and down) with size > 1
  double all_reduce_bytes = 0;  // one all-reduce's payload: the batch's residual rows
  double logits_gather_bytes = 0;  // kVocabParallel: the f32 logits every rank gathers
};

// InvalidArgument as CheckTensorParallel, or for a batch or entries below 1.
Result<DecodeStepTraffic> ComputeDecodeStepTraffic(const ModelConfig& config, int size, int batch,
                                                   int64_t entries, DType dtype,
                                                   LmHeadSplit lm_head = LmHeadSplit::kReplicated);

// The rates a decode step's bound is computed at.
struct DecodeStepRates {
  double copy_bytes_per_s = 0;      // device memory: a copy's read + write bytes per second
  double bus_bytes_per_s = 0;       // the collectives' bus bandwidth (nccl-tests' busbw)
  double collective_latency_s = 0;  // the fixed time of one small collective
};

struct DecodeStepBound {
  double memory_s = 0;      // the rank's weight + KV bytes at the copy rate
  double collective_s = 0;  // its all-reduces (and logits gather)
  double step_s = 0;        // their sum: a decode step's collectives wait on the GEMM before them
                            // and the next GEMM on them, so neither hides the other
};

// Ring all-reduce: 2 (N - 1) / N of the payload crosses each rank's links; all-gather (N - 1) / N
// of the gathered whole (nccl-tests' busbw definitions).
DecodeStepBound ComputeDecodeStepBound(const DecodeStepTraffic& traffic,
                                       const DecodeStepRates& rates);

}  // namespace sieve
