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

}  // namespace sieve
