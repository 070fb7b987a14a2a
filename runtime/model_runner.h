// ModelRunner: turns a StepPlan into one forward pass on the backend.
//
// It owns the KV pool's device memory and the step's device-side metadata. Per step it packs
// every int32 array of the StepMeta into one host buffer and uploads it with one copy, applies
// the page-table patches the KV manager logged (only changed entries travel), uploads the
// lengths the step's attention will see, runs LlamaModel::Forward and copies the sampled rows'
// logits back. No per-token and no per-layer host work beyond building these arrays.
#pragma once

#include <cstdint>
#include <vector>

#include "kv/kv_cache_manager.h"
#include "model/llama_model.h"
#include "sched/scheduler.h"

namespace sieve {

struct ModelRunnerOptions {
  int max_num_seqs = 256;
  int max_num_batched_tokens = 2048;
  bool score_pool = false;     // H2O / score-capped decode
  bool position_pool = false;  // any decode-time eviction
};

class ModelRunner {
 public:
  ModelRunner(const LlamaModel& model, KvCacheManager& kv, const ModelRunnerOptions& options);

  // Runs the step; returns the logits [R][V] of its sampled rows, in plan order (prefills whose
  // final chunk ran, then decodes). `sample_ids` receives the sequence of each row.
  const std::vector<float>& Run(const StepPlan& plan, const Scheduler& scheduler,
                                std::vector<SeqId>& sample_ids);

  const KvPool& pool() const { return pool_; }
  Backend& backend() const { return model_.backend(); }
  int vocab_size() const { return model_.config().vocab_size; }
  // Bytes of the KV pool (K and V pages, side pools).
  int64_t pool_bytes() const;

 private:
  void BuildStep(const StepPlan& plan, const Scheduler& scheduler, std::vector<SeqId>& sample_ids);

  const LlamaModel& model_;
  KvCacheManager& kv_;
  ModelRunnerOptions options_;
  KvPool pool_;
  ForwardWorkspace workspace_;
  StepMeta step_;
  std::vector<int32_t> host_meta_;  // packed int32 arrays of step_, uploaded at once
  Tensor device_meta_;              // [capacity] i32
  Tensor patches_;                  // [capacity][2] i32 staging for page-table patches
  std::vector<int32_t> lengths_;    // [L][max_seqs] lengths seen by this step's attention
  Tensor logits_device_;            // [max_num_seqs][V] f32
  std::vector<float> logits_host_;
};

}  // namespace sieve
