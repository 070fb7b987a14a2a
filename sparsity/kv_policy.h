// KvPolicy: which KV entries each layer keeps (SPARSITY.md is the contract).
//
// A policy is composed per layer range, e.g. "full:0-2,pyramidkv:3-31": each layer gets one
// LayerPolicy object; nothing elsewhere branches on layer numbers. The policy decides (host code,
// no memory): for a prompt of n tokens, each layer's budget and how to score and select
// (PlanPrompt); during decode, each layer's cap and what to evict (DecodeLimitFor). The kernels
// that score and select live in the backends; kv/ owns the pages.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "backend/step_meta.h"
#include "core/status.h"

namespace sieve {

enum class PolicyKind { kFull, kSnapKv, kPyramidKv, kStreamingLlm, kH2o };
std::string_view PolicyKindName(PolicyKind kind);  // "full", "snapkv", ...

// Defaults and knobs shared by the layer policies (the --kv-* flags).
struct KvPolicyOptions {
  int budget = 1024;                        // C: entries kept per sparse layer (pyramid: average)
  int window = 32;                          // W: observation window, always kept (SnapKV/PyramidKV)
  PoolKind pool = PoolKind::kMax;           // pooling of window scores
  int kernel = 7;                           // pooling kernel (odd)
  GroupReduce reduce = GroupReduce::kMean;  // GQA aggregation over a KV head's query heads
  int beta = 20;                            // PyramidKV's ratio of top to bottom budget
  int sinks = 4;                            // StreamingLLM: first positions always kept
  int recent = 1020;                        // StreamingLLM / H2O: most recent positions kept
  int heavy = 1024;                         // H2O: heavy hitters kept
  int decode_cap = 0;               // optional cap on a layer's entries during decode (0: none)
  bool decode_cap_by_score = true;  // cap evicts the lowest accumulated score (else oldest)
};

// What one layer does at the end of one prompt.
struct LayerPlan {
  bool compress = false;  // run a selection job (false: the layer keeps all n entries as they are)
  int budget = 0;         // C_l entries kept
  int window = 0;         // last positions always kept
  int score_rows = 0;     // query rows scored (0: no scores needed)
  PoolKind pool = PoolKind::kNone;
  int kernel = 1;
  GroupReduce reduce = GroupReduce::kMean;
  SelectMode mode = SelectMode::kTopScores;

  // The selection job of this plan for one (prefill sequence, layer) of a step; the scores' and
  // kept indices' offsets are left 0 for whoever lays out the step's buffers. `kept_offset`:
  // CompressionJob::kept_offset.
  CompressionJob Job(int layer, int prefill_seq, int num_keys, int seq_slot,
                     int kept_offset = 0) const {
    CompressionJob job{};
    job.layer = layer;
    job.prefill_seq = prefill_seq;
    job.num_keys = num_keys;
    job.window = window;
    job.score_rows = score_rows;
    job.budget = budget;
    job.pool = pool;
    job.pool_kernel = kernel;
    job.reduce = reduce;
    job.mode = mode;
    job.seq_slot = seq_slot;
    job.kept_offset = kept_offset;
    return job;
  }
};

// What one layer does as decode grows it.
struct DecodeLimit {
  enum class Evict { kNone, kLowestScore, kOldest };
  int max_entries = 0;  // 0: unbounded; else evict one entry when a step passes this
  Evict evict = Evict::kNone;
  int protect_recent = 0;  // the most recent positions are never evicted
  int sinks = 0;           // positions [0, sinks) are never evicted
};

class KvPolicy {
 public:
  // "snapkv" (every layer) or "kind:range,kind:range" with ranges "a-b" or "a"; every layer must
  // be covered exactly once. Errors name the bad part ("unknown policy 'x'", "layer 5 covered
  // twice", "layers 30-31 have no policy", "window 64 >= budget 32", "even pooling kernel").
  static Result<KvPolicy> Parse(std::string_view spec, int num_layers,
                                const KvPolicyOptions& options);
  // Every layer full: the dense engine.
  static KvPolicy Dense(int num_layers);

  int num_layers() const;
  PolicyKind kind(int layer) const;
  bool IsDense() const;  // no layer ever drops an entry
  const KvPolicyOptions& options() const;

  // Per-layer plans for a prompt of n tokens ([num_layers]). PyramidKV budgets follow
  // SPARSITY.md over the pyramid layers only; no layer compresses when n <= its budget.
  std::vector<LayerPlan> PlanPrompt(int n) const;
  // Entries each layer holds right after a prompt of n tokens ([num_layers]).
  std::vector<int> EntriesAfterPrompt(int n) const;
  const DecodeLimit& DecodeLimitFor(int layer) const;
  // Query rows of the prompt's end that must be in the final prefill chunk (max score_rows).
  int FinalChunkRows(int n) const;
  bool NeedsScorePool() const;     // H2O or a score-based decode cap
  bool NeedsPositionPool() const;  // any decode-time eviction
  std::string ToString() const;    // "full:0-2,pyramidkv:3-31 (budget 1024, window 32, ...)"
  std::string Spec() const;        // "full:0-2,pyramidkv:3-31": what Parse reads back

 private:
  struct Range {
    PolicyKind kind;
    int first;
    int last;
  };
  std::vector<Range> ranges_;  // sorted, covering [0, num_layers)
  void CacheDecodeLimits();
  DecodeLimit ComputeDecodeLimit(int layer) const;

  std::vector<PolicyKind> layer_kind_;
  std::vector<DecodeLimit> decode_limits_;  // [L], asked for every layer of every decode step
  KvPolicyOptions options_;
};

// PyramidKV's per-layer budgets (SPARSITY.md "Budgets per layer") for `num_layers` pyramid
// layers: total budget C, window W, prompt length n, ratio beta. Returns C_l per layer; when n
// needs no compression or the uniform regime applies, every entry is the uniform value.
std::vector<int> PyramidBudgets(int budget, int window, int n, int num_layers, int beta);

}  // namespace sieve
