// StepPlan: what the scheduler decided for one engine step. Planning is const; exactly one
// Scheduler::Commit applies it.
//
// Per-layer numbers of every scheduled sequence live in flat [sequence][L] arrays of the plan,
// not in each ScheduledSequence, so that an engine reusing one StepPlan allocates nothing per
// step (256 decoding sequences x 32 layers is the common case).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kv/kv_cache_manager.h"
#include "sparsity/kv_policy.h"

namespace sieve {

struct ScheduledSequence {
  SeqId id = 0;
  int context_len = 0;  // tokens already in the cache
  int num_tokens = 0;   // tokens computed this step (chunk size; 1 for decode)
  bool is_decode = false;
  bool final_chunk = false;  // prefill: this chunk ends the prompt, so its logits are sampled
  bool sample = false;       // a token is sampled after this step
  bool evicts = false;       // decode: some layer evicts one entry after attention
  int layer_rows = 0;        // offset of this sequence's rows in the plan's per-layer arrays
  int new_pages = 0;         // pages the step takes from the pool for this sequence
  // Final prefill chunk of a prefix-caching sparse sequence: where its compressed layers' kept
  // entries start in their page lists (after the prompt's pages, which stay as computed:
  // CompressionJob::kept_offset); 0 writes them over the prompt's head as without the cache.
  int kept_offset = 0;
  std::vector<LayerPlan> compress;  // [L] final prefill chunk only: each layer's plan
};

// Page copies between the KV pool and host swap slots (Scheduler::swaps()): [pages] each, page i
// of `out_pages` to slot `out_slots[i]`, then slot `in_slots[i]` to page `in_pages[i]`.
struct PageSwaps {
  std::vector<int32_t> out_pages, out_slots;
  std::vector<int32_t> in_slots, in_pages;
  bool empty() const { return out_pages.empty() && in_pages.empty(); }
  void Clear() {
    out_pages.clear();
    out_slots.clear();
    in_slots.clear();
    in_pages.clear();
  }
};

struct StepPlan {
  std::vector<ScheduledSequence> prefills;  // prefill chunks (run first in the batch)
  std::vector<ScheduledSequence> decodes;
  std::vector<SeqId> preempted;  // give back their pages and go back to waiting, in this order
  std::vector<uint8_t> preempted_swap;  // [preempted] 1: swapped out, 0: recomputed
  std::vector<SeqId> swapped_in;        // swapped -> running this step (and scheduled in it)
  std::vector<SeqId> admitted;          // waiting -> running this step
  // [admitted]: leading prompt tokens each admitted sequence takes from the prefix cache (whole
  // pages; its prefill starts after them).
  std::vector<int> admitted_cached_tokens;
  // [admitted]: 1 for a sequence admitted without the prefix cache although it would use it (its
  // prompt's pages kept whole did not fit: Scheduler::Plan).
  std::vector<uint8_t> admitted_uncached;
  int num_tokens = 0;
  int num_layers = 0;
  std::vector<int> capacities;     // [rows][L] entries each layer must hold during the step
  std::vector<int> lengths_after;  // [rows][L] entries each layer holds after the step
  std::vector<uint8_t> evict;      // [rows][L] decode: the layer evicts one entry

  bool empty() const { return prefills.empty() && decodes.empty(); }  // no forward pass
  // Empties the plan, keeping its memory.
  void Clear(int layers) {
    prefills.clear();
    decodes.clear();
    preempted.clear();
    preempted_swap.clear();
    swapped_in.clear();
    admitted.clear();
    admitted_cached_tokens.clear();
    admitted_uncached.clear();
    num_tokens = 0;
    num_layers = layers;
    capacities.clear();
    lengths_after.clear();
    evict.clear();
  }
  // Rows for one more sequence; returns their offset.
  int AddLayerRows() {
    const int offset = static_cast<int>(capacities.size());
    capacities.resize(offset + num_layers);
    lengths_after.resize(offset + num_layers);
    evict.resize(offset + num_layers, 0);
    return offset;
  }
  // One admission: admitted, admitted_cached_tokens and admitted_uncached go together.
  void Admit(SeqId id, int cached_tokens, bool uncached) {
    admitted.push_back(id);
    admitted_cached_tokens.push_back(cached_tokens);
    admitted_uncached.push_back(uncached);
  }
  // Drops the rows AddLayerRows returned last (a plan tried and not taken).
  void DropLayerRows(int offset) {
    capacities.resize(offset);
    lengths_after.resize(offset);
    evict.resize(offset);
  }
  std::span<const int> Capacities(const ScheduledSequence& s) const {
    return {capacities.data() + s.layer_rows, static_cast<size_t>(num_layers)};
  }
  std::span<const int> LengthsAfter(const ScheduledSequence& s) const {
    return {lengths_after.data() + s.layer_rows, static_cast<size_t>(num_layers)};
  }
  std::span<const uint8_t> Evicts(const ScheduledSequence& s) const {
    return {evict.data() + s.layer_rows, static_cast<size_t>(num_layers)};
  }
};

}  // namespace sieve
