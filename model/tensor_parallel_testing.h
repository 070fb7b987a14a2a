// For the tensor-parallel tests (model/ and runtime/): how a test builds each rank's model shard.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "core/status.h"
#include "model/llama_model.h"
#include "model/tensor_parallel.h"

namespace sieve::testing {

// Builds one rank's shard of a model on that rank's backend, joined to its communicator.
using ModelFactory = std::function<Result<std::unique_ptr<LlamaModel>>(
    Backend&, const TensorParallelShard&, Communicator*)>;

// Every rank's slice of the same random model (LlamaModel::RandomShard with `seed`, init_std 0.08
// as the engine tests' random models use).
inline ModelFactory RandomShardFactory(const ModelConfig& config, uint64_t seed) {
  return [config, seed](Backend& backend, const TensorParallelShard& shard,
                        Communicator* communicator) {
    return LlamaModel::RandomShard(config, backend, seed, config.max_position_embeddings, shard,
                                   communicator, 0.08f);
  };
}

}  // namespace sieve::testing
