// Scheduler: iteration-level (continuous) batching with chunked prefill, admission by the KV
// pages a sequence needs now and will hold after compression, and preemption by recompute.
//
// Each engine step: Plan() (const) decides which sequences run and how many tokens each computes
// (decodes and unfinished prefills of running sequences first, in arrival order, then new ones
// from the waiting queue, FCFS, never skipping ahead); Commit() applies it to the KV manager
// (preemptions free pages, admissions take slots, every scheduled (sequence, layer) grows to its
// step capacity); after the forward pass Complete() advances progress and trims each layer to its
// length after the step (compression frees pages here).
//
// When a running sequence cannot get the pages it needs, the newest running sequence is
// preempted: all its pages are freed and it returns to the waiting queue with everything it has
// generated, to be computed again (recompute). Nothing is lost; the count is kept. A dense
// sequence prefills its prompt and generated tokens at once. A sparse one must get back the cache
// it had, which no prefill of the longer sequence gives (its plan would select again over it, with
// generated tokens as the window, and keep entries computed by attention over everything): it
// prefills its prompt with the prompt's plan, as the first time, then replays each generated token
// as a decode step (evictions included). Replayed steps compute logits that nobody samples
// (Sequence::caught_up), so the answer continues as if it had never been preempted.
//
// Preemption by swap (SchedulerOptions::preemption_mode kSwap; sched/README.md "Preemption"):
// the victim's entries of every layer are copied to host swap slots (Commit lists the copies in
// swaps(), which the engine runs before the step), its pages are released as a removal releases
// them, and it waits in its own queue (kSwapped) with its progress and per-layer lengths. Swapped
// sequences come back before any new admission, oldest first, when their pages and their step
// fit: Commit gives them fresh pages, lists the copies back, and they run in the same step as if
// never preempted (no prefill, no replay). A victim whose pages do not fit the free swap slots is
// preempted by recompute instead (counted: num_swap_fallbacks).
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kv/kv_cache_manager.h"
#include "sched/sequence.h"
#include "sched/step_plan.h"

namespace sieve {

enum class PreemptionMode { kRecompute, kSwap };

// "recompute" / "swap"; InvalidArgument naming the choices otherwise.
Result<PreemptionMode> ParsePreemptionMode(std::string_view name);
std::string_view PreemptionModeName(PreemptionMode mode);

struct SchedulerOptions {
  int max_num_seqs = 256;             // running sequences at once
  int max_num_batched_tokens = 2048;  // tokens per step (prefill chunks + decodes)
  bool enable_chunked_prefill = true;
  int max_model_len = 4096;  // prompt + generated tokens per sequence
  // Most prefill tokens of sequences that need prompt logprobs (Sequence::prompt_logprobs) in one
  // step: each of their rows gets logits, and the logits buffer holds this many such rows.
  int prompt_logprob_rows = 256;
  // Prefix caching (kv/README.md "Prefix caching"): a sequence's full pages (prompt and
  // generated tokens; a compressed layer's prompt as computed) are keyed once computed and stay,
  // cached, after it is gone; a new (or preempted) sequence whose tokens start with cached pages
  // attaches them and prefills only the rest. H2O sequences (they score every prompt row) and
  // those asking for prompt logprobs (every prompt row's logits) neither look up nor key pages.
  bool enable_prefix_caching = false;
  // How a running sequence that must give back its pages is preempted (the header comment).
  PreemptionMode preemption_mode = PreemptionMode::kRecompute;
  int swap_slots = 0;  // kSwap: host slots of one page each (the engine sizes them: swap_space)
  // Batch invariance (EngineOptions::batch_invariant), > 0: a prompt's prefill is cut only where
  // a prompt alone would be cut, whatever else the step holds: chunks end at multiples of this
  // many tokens (the final chunk moved earlier when the policy's scored rows need it), a chunk
  // that does not fit the step's budget waits for the next step, a cached prefix is used up to a
  // multiple of it (a multiple of the page size), and a preempted dense sequence replays its
  // generated tokens as decode steps instead of prefilling them (sched/README.md "Batch
  // invariance"). 0: chunks fill the step's budget.
  int batch_invariant_chunk = 0;
};

class Scheduler {
 public:
  Scheduler(const SchedulerOptions& options, KvCacheManager* kv);

  const SchedulerOptions& options() const { return options_; }

  // Checks that a sequence of `prompt_len` tokens under `policy` can ever be scheduled: fits the
  // context, the per-step token budget where chunking cannot split it, and the whole KV pool.
  Status CanEverSchedule(int prompt_len, int max_total_tokens, const KvPolicy& policy) const;
  // Queues a sequence (state kWaiting, prefill_target = its tokens).
  void Add(Sequence sequence);
  // Removes a sequence wherever it is and frees its pages at once. False when unknown.
  bool Remove(SeqId id);

  // Plans into `plan`, reusing its memory (an engine keeps one StepPlan for every step).
  void Plan(StepPlan& plan) const;
  StepPlan Plan() const {
    StepPlan plan;
    Plan(plan);
    return plan;
  }
  void Commit(const StepPlan& plan);
  // After the step's forward pass: progress and per-layer lengths of every scheduled sequence.
  void Complete(const StepPlan& plan);

  Sequence* Find(SeqId id);
  const Sequence* Find(SeqId id) const;
  int num_running() const { return static_cast<int>(running_.size()); }
  int num_waiting() const { return static_cast<int>(waiting_.size()); }
  int num_swapped() const { return static_cast<int>(swapped_.size()); }
  int64_t num_preemptions() const { return num_preemptions_; }  // by swap and by recompute
  int64_t num_swapped_out() const { return num_swapped_out_; }
  int64_t num_swapped_in() const { return num_swapped_in_; }
  // Sequences removed while swapped out (aborted, or finished by the step in flight when they
  // were swapped out: steps are planned before the step before them is read), never swapped in.
  int64_t num_swapped_removed() const { return num_swapped_removed_; }
  // Preemptions in swap mode done by recompute because the swap slots were full.
  int64_t num_swap_fallbacks() const { return num_swap_fallbacks_; }
  // Decode steps that replayed a known token after a recompute (sparse sequences), unsampled.
  int64_t num_replayed_tokens() const { return num_replayed_tokens_; }
  // Host swap slots not holding a swapped page.
  int num_free_swap_slots() const { return static_cast<int>(free_swap_slots_.size()); }
  // The copies the last Commit() needs before its step runs: swap-outs first (their pages may be
  // handed out by this step), then swap-ins.
  const PageSwaps& swaps() const { return swaps_; }
  // Prompt tokens looked up in the prefix cache at admission, and those found (vLLM's
  // prefix_cache_queries / prefix_cache_hits).
  int64_t prefix_cache_queries() const { return prefix_cache_queries_; }
  int64_t prefix_cache_hits() const { return prefix_cache_hits_; }
  bool HasWork() const { return !running_.empty() || !waiting_.empty() || !swapped_.empty(); }
  // Whether a next step could schedule anything: a waiting sequence or a running one that is
  // not finishing (Sequence::finishing).
  bool HasSchedulableWork() const;
  const std::vector<SeqId>& running() const { return running_; }

 private:
  // Tokens of this sequence's prefill from `start` that fit in `token_budget` this step (0: none).
  int ChunkSize(const Sequence& seq, int token_budget, int start) const;
  // Batch invariance: the chunk from `start` a prompt alone gets (SchedulerOptions::
  // batch_invariant_chunk), whatever the budget; at most max(unit, final_chunk_rows) tokens.
  int InvariantChunk(const Sequence& seq, int start) const;
  // `keep_prompt_pages`: a prefix-caching sparse sequence's final chunk writes its compressed
  // layers' entries into pages as the other layers do and puts the kept ones after them
  // (ScheduledSequence::kept_offset); false compresses over the prompt's head.
  ScheduledSequence PlanPrefill(const Sequence& seq, int chunk, int start, StepPlan& plan,
                                bool keep_prompt_pages) const;
  // Whether the sequence uses the prefix cache (Sequence::uses_prefix_cache and
  // compressed_layers, for its prefill_target), its keying reset.
  void ResetPrefixCache(Sequence& seq) const;
  // After a final chunk with kept_offset: keys the compressed layers' prompt pages and releases
  // them (KvCacheManager::ReleasePromptPages).
  void ReleasePromptPages(Sequence& seq, const ScheduledSequence& scheduled, const StepPlan& plan);
  // One layer's keys of the sequence's pages [first, end), chained from `parent`.
  std::vector<PageKey> SequenceKeys(const Sequence& seq, int layer, int first, int end,
                                    uint64_t parent) const;
  // Leading pages every layer has cached for this waiting sequence (at most what leaves one token
  // to compute), and how many of all layers' such pages no list holds.
  int CachedPrefixPages(const Sequence& seq, int* idle) const;
  // Leading whole pages a lookup may find for the sequence (CachedPrefixPages' limit).
  int PagesToLookUp(const Sequence& seq) const;
  bool CanHitPages(const Sequence& seq) const { return PagesToLookUp(seq) > 0; }
  // The hash of the sequence's first page's key in layer 0.
  uint64_t FirstPageKey(const Sequence& seq) const;
  // Keys the pages that the sequence's progress has made full (of known tokens).
  void KeyComputedPages(Sequence& seq);
  // Each layer's decode cap (DecodeLimit::max_entries, 0: none) under one policy, so that Plan()
  // reads them once per policy rather than once per (sequence, layer).
  struct DecodeCaps {
    const KvPolicy* policy = nullptr;
    bool any = false;              // some layer evicts during decode
    std::vector<int> max_entries;  // [L]
    void Load(const KvPolicy& from, int layers);
  };
  ScheduledSequence PlanDecode(const Sequence& seq, const DecodeCaps& caps, StepPlan& plan) const;
  // Pages the sequence holds once its prompt is compressed (or now, when decoding).
  int PagesAfterCompression(const Sequence& seq) const;
  // Pages a swapped-out sequence would take for `capacities` ([L]) beyond those it gets back.
  int SwappedPagesToGrow(const Sequence& seq, std::span<const int> capacities) const;
  // Commit's halves of a swap: host slots and the copy out, pages released; fresh pages, lengths
  // and the copy back in.
  void SwapOut(Sequence& seq);
  void SwapIn(Sequence& seq);

  SchedulerOptions options_;
  KvCacheManager* kv_;
  // Looked up for every scheduled sequence of every step: hashed.
  std::unordered_map<SeqId, Sequence> seqs_;
  std::vector<SeqId> running_;            // arrival order
  std::vector<SeqId> waiting_;            // arrival order
  std::vector<SeqId> swapped_;            // arrival order: swapped back in oldest first
  std::vector<int32_t> free_swap_slots_;  // a stack; low slots handed out first
  PageSwaps swaps_;                       // of the last Commit
  int64_t num_preemptions_ = 0;
  int64_t num_swapped_out_ = 0;
  int64_t num_swapped_in_ = 0;
  int64_t num_swapped_removed_ = 0;
  int64_t num_swap_fallbacks_ = 0;
  int64_t num_replayed_tokens_ = 0;
  int64_t prefix_cache_queries_ = 0;
  int64_t prefix_cache_hits_ = 0;
};

}  // namespace sieve
