// For the sparsity op tests (sparsity/selection_reference_test.cc on the CPU backend,
// cuda/cuda_sparsity_test.cc on both): the host-side StepMeta of one step of prefill chunks with
// its compression and eviction jobs, built one way so that both tests hand the ops the same
// layout. The CUDA test uploads the same arrays for its StepView.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <numeric>
#include <utility>
#include <vector>

#include "backend/step_meta.h"
#include "core/check.h"
#include "core/tensor.h"

namespace sieve::testing {

// Host int32 tensors of `shape`: from raw memory (the job arrays, whose structs are plain int32
// fields; the shape's element count is read), or from a vector of exactly that many values.
inline Tensor HostI32(const void* values, std::vector<int64_t> shape) {
  Tensor tensor = Tensor::Empty(std::move(shape), DType::kI32);
  // An empty vector's data() may be null, which memcpy must not be given even for 0 bytes.
  if (tensor.numel() > 0) std::memcpy(tensor.data(), values, tensor.numel() * sizeof(int32_t));
  return tensor;
}

inline Tensor HostI32(const std::vector<int32_t>& values, std::vector<int64_t> shape) {
  SIEVE_CHECK(std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>()) ==
              static_cast<int64_t>(values.size()));
  return HostI32(static_cast<const void*>(values.data()), std::move(shape));
}

// One prefill sequence of a step: keys [0, num_keys), of which this step's chunk holds the query
// rows [context, num_keys).
struct SeqChunk {
  int num_keys;
  int context;
};

// The StepMeta fields the sparsity ops read, for `seqs` prefilled in one step (sequence i in page
// table row i) and `jobs` / `evictions` in any order: StepMeta wants them grouped by layer, so they
// are sorted stably by layer. Host tensors only. max_scores_per_layer / max_indices_per_layer stay
// 0: only the model's workspace check reads them, never a backend op.
inline StepMeta MakePrefillStepMeta(const std::vector<SeqChunk>& seqs, int num_layers,
                                    std::vector<CompressionJob> jobs,
                                    std::vector<EvictionJob> evictions = {}) {
  StepMeta step;
  std::vector<int32_t> query_start = {0}, key_start = {0}, context, slots;
  for (const SeqChunk& seq : seqs) {
    query_start.push_back(query_start.back() + seq.num_keys - seq.context);
    key_start.push_back(key_start.back() + seq.num_keys);
    context.push_back(seq.context);
    slots.push_back(static_cast<int32_t>(slots.size()));
  }
  step.num_seqs = step.num_prefill_seqs = static_cast<int>(seqs.size());
  step.num_tokens = step.num_prefill_tokens = query_start.back();
  step.num_prefill_keys = key_start.back();
  step.num_layers = num_layers;
  step.query_start = HostI32(query_start, {static_cast<int64_t>(query_start.size())});
  step.key_start = HostI32(key_start, {static_cast<int64_t>(key_start.size())});
  step.context_lens = HostI32(context, {static_cast<int64_t>(context.size())});
  step.seq_slots = HostI32(slots, {static_cast<int64_t>(slots.size())});

  std::stable_sort(jobs.begin(), jobs.end(), [](const CompressionJob& a, const CompressionJob& b) {
    return a.layer < b.layer;
  });
  step.job_begin.assign(num_layers + 1, 0);
  for (const CompressionJob& job : jobs) ++step.job_begin[job.layer + 1];
  std::partial_sum(step.job_begin.begin(), step.job_begin.end(), step.job_begin.begin());
  step.compression_jobs =
      HostI32(jobs.data(), {static_cast<int64_t>(jobs.size()), kCompressionJobInts});
  step.jobs_host = std::move(jobs);

  std::stable_sort(evictions.begin(), evictions.end(),
                   [](const EvictionJob& a, const EvictionJob& b) { return a.layer < b.layer; });
  step.eviction_begin.assign(num_layers + 1, 0);
  for (const EvictionJob& job : evictions) ++step.eviction_begin[job.layer + 1];
  std::partial_sum(step.eviction_begin.begin(), step.eviction_begin.end(),
                   step.eviction_begin.begin());
  step.eviction_jobs =
      HostI32(evictions.data(), {static_cast<int64_t>(evictions.size()), kEvictionJobInts});
  step.evictions_host = std::move(evictions);
  return step;
}

}  // namespace sieve::testing
