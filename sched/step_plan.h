// StepPlan: what the scheduler decided for one engine step. Planning is const; exactly one
// Scheduler::Commit applies it.
#pragma once

#include <cstdint>
#include <vector>

#include "kv/kv_cache_manager.h"
#include "sparsity/kv_policy.h"

namespace sieve {

struct ScheduledSequence {
  SeqId id = 0;
  int context_len = 0;  // tokens already in the cache
  int num_tokens = 0;   // tokens computed this step (chunk size; 1 for decode)
  bool is_decode = false;
  bool final_chunk = false;        // prefill: this chunk ends the prompt, so its logits are sampled
  bool sample = false;             // a token is sampled after this step
  std::vector<int> capacities;     // [L] entries each layer must hold during the step
  std::vector<int> lengths_after;  // [L] entries each layer holds after the step
  std::vector<LayerPlan> compress;  // [L] final prefill chunk only: each layer's plan
  std::vector<uint8_t> evict;       // [L] decode: the layer evicts one entry after attention
};

struct StepPlan {
  std::vector<ScheduledSequence> prefills;  // prefill chunks (run first in the batch)
  std::vector<ScheduledSequence> decodes;
  std::vector<SeqId> preempted;  // give back their pages and go back to waiting, in this order
  std::vector<SeqId> admitted;   // waiting -> running this step
  int num_tokens = 0;
  bool empty() const { return prefills.empty() && decodes.empty(); }
};

}  // namespace sieve
