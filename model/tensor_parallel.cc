#include "model/tensor_parallel.h"

#include <string>

namespace sieve {

Status CheckTensorParallel(const ModelConfig& config, int size) {
  const std::string ranks = "tensor parallel size " + std::to_string(size);
  if (size < 1) return InvalidArgumentError(ranks + ": it must be at least 1");
  if (size == 1) return Status::Ok();
  const int heads = config.num_heads;
  const int kv_heads = config.num_kv_heads;
  if (kv_heads < 1 || heads % kv_heads != 0) {
    return InvalidArgumentError(std::to_string(heads) + " attention heads over " +
                                std::to_string(kv_heads) + " KV heads");  // Validate's to catch
  }
  if (size > heads) {
    return InvalidArgumentError(ranks + " exceeds the model's " + std::to_string(heads) +
                                " attention heads: each rank needs at least one");
  }
  if (heads % size != 0) {
    return InvalidArgumentError(ranks + " does not divide the model's " + std::to_string(heads) +
                                " attention heads");
  }
  if (kv_heads >= size && kv_heads % size != 0) {
    return InvalidArgumentError(ranks + " does not divide the model's " + std::to_string(kv_heads) +
                                " KV heads");
  }
  if (kv_heads < size && size % kv_heads != 0) {
    return InvalidArgumentError(ranks + " is not a multiple of the model's " +
                                std::to_string(kv_heads) +
                                " KV heads (with fewer KV heads than ranks, each KV head is "
                                "replicated on the same number of ranks)");
  }
  if (config.intermediate_size % size != 0) {
    return InvalidArgumentError(ranks + " does not divide the model's intermediate size " +
                                std::to_string(config.intermediate_size));
  }
  return Status::Ok();
}

Result<ShardLayout> MakeShardLayout(const ModelConfig& config, const TensorParallelShard& shard) {
  SIEVE_RETURN_IF_ERROR(CheckTensorParallel(config, shard.size));
  if (shard.rank < 0 || shard.rank >= shard.size) {
    return InvalidArgumentError("rank " + std::to_string(shard.rank) + " of " +
                                std::to_string(shard.size) + " ranks");
  }
  const int heads = config.num_heads;
  const int kv_heads = config.num_kv_heads;
  ShardLayout layout;
  if (shard.size == 1) {
    layout.num_q_heads = layout.num_out_heads = heads;
    layout.num_kv_heads = kv_heads;
    layout.ffn_size = config.intermediate_size;
    return layout;
  }
  const int group = heads / kv_heads;  // query heads per KV head (Validate: G divides H)
  layout.num_ranks = shard.size;
  layout.num_out_heads = heads / shard.size;
  layout.out_head_begin = shard.rank * layout.num_out_heads;
  layout.num_kv_heads = kv_heads >= shard.size ? kv_heads / shard.size : 1;
  // G >= N: rank r's own KV heads; G < N: the one KV head of rank r's query heads.
  layout.kv_head_begin = kv_heads >= shard.size ? shard.rank * layout.num_kv_heads
                                                : shard.rank * kv_heads / shard.size;
  layout.q_head_begin = layout.kv_head_begin * group;
  layout.num_q_heads = layout.num_kv_heads * group;
  layout.ffn_size = config.intermediate_size / shard.size;
  layout.ffn_begin = shard.rank * layout.ffn_size;
  return layout;
}

Result<DecodeStepTraffic> ComputeDecodeStepTraffic(const ModelConfig& config, int size, int batch,
                                                   int64_t entries, DType dtype,
                                                   LmHeadSplit lm_head) {
  if (batch < 1 || entries < 1) {
    return InvalidArgumentError("a decode step needs a batch and entries of at least 1");
  }
  SIEVE_ASSIGN_OR_RETURN(ShardLayout layout, MakeShardLayout(config, {0, size}));
  const double elem = static_cast<double>(DTypeSize(dtype));
  const double d = config.hidden_size;
  const double hd = config.head_dim;
  // The rows this rank computes: q for its q heads, k and v for its KV heads; o reads its output
  // heads' columns; the MLP its units.
  const double qkv = (layout.num_q_heads + 2.0 * layout.num_kv_heads) * hd * d;
  const double o = d * layout.num_out_heads * hd;
  const double mlp = 3.0 * static_cast<double>(layout.ffn_size) * d;
  const double norms = 2.0 * d;
  const double vocab = static_cast<double>(config.vocab_size);
  DecodeStepTraffic traffic;
  traffic.size = size;
  traffic.lm_head_bytes =
      (lm_head == LmHeadSplit::kVocabParallel ? vocab / size : vocab) * d * elem;
  traffic.weight_bytes = config.num_layers * (qkv + o + mlp + norms) * elem + d * elem +
                         static_cast<double>(batch) * d * elem + traffic.lm_head_bytes;
  traffic.held_bytes = traffic.weight_bytes - static_cast<double>(batch) * d * elem +
                       (config.tie_word_embeddings ? 0.0 : vocab * d * elem);
  traffic.kv_bytes = static_cast<double>(batch) * config.num_layers * static_cast<double>(entries) *
                     layout.num_kv_heads * hd * 2 * elem;
  if (size > 1) {
    traffic.all_reduces = 2 * config.num_layers;
    traffic.all_reduce_bytes = static_cast<double>(batch) * d * elem;
    if (lm_head == LmHeadSplit::kVocabParallel) {
      traffic.logits_gather_bytes = static_cast<double>(batch) * vocab * sizeof(float);
    }
  }
  return traffic;
}

DecodeStepBound ComputeDecodeStepBound(const DecodeStepTraffic& traffic,
                                       const DecodeStepRates& rates) {
  DecodeStepBound bound;
  bound.memory_s = (traffic.weight_bytes + traffic.kv_bytes) / rates.copy_bytes_per_s;
  const double n = traffic.size;
  if (traffic.size > 1) {
    const double all_reduce = rates.collective_latency_s +
                              2 * (n - 1) / n * traffic.all_reduce_bytes / rates.bus_bytes_per_s;
    bound.collective_s = traffic.all_reduces * all_reduce;
    if (traffic.logits_gather_bytes > 0) {
      bound.collective_s += rates.collective_latency_s +
                            (n - 1) / n * traffic.logits_gather_bytes / rates.bus_bytes_per_s;
    }
  }
  bound.step_s = bound.memory_s + bound.collective_s;
  return bound;
}

}  // namespace sieve
