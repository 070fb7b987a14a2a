// What one forward step computes, as flat int32 arrays on the backend's device plus the host-side
// sizes that launches need. Built by the ModelRunner (runtime/) once per step from the
// scheduler's plan and the KV manager's page tables; read by every Backend op of that step.
//
// Token order: the tokens of prefill sequences first (each sequence's chunk contiguous), then one
// token per decode sequence. Sequences are indexed the same way: [0, num_prefill_seqs) prefill,
// then decode.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace sieve {

// How the scores of one KV head's keys are smoothed before top-k (SPARSITY.md "Pooling").
enum class PoolKind : int32_t { kNone = 0, kMax = 1, kAvg = 2 };
// How a GQA group's query-head scores become one KV head's score.
enum class GroupReduce : int32_t { kMean = 0, kMax = 1 };
// What the selection keeps besides the protected tail: the highest pooled scores, or the first
// positions (StreamingLLM's attention sinks).
enum class SelectMode : int32_t { kTopScores = 0, kFirstPositions = 1 };

// One compression of one (prefill sequence, layer) at the end of its prompt. Stored as rows of
// int32 in StepMeta::compression_jobs so a kernel can read them; the layout is this struct's.
struct CompressionJob {
  int32_t layer;
  int32_t prefill_seq;  // index into the prefill sequences of this step
  int32_t num_keys;     // n: the prompt length (keys in the K/V scratch)
  int32_t window;       // W: the last W positions, always kept
  int32_t score_rows;   // query rows scored: the last score_rows of the prompt (SnapKV: W;
                        // H2O: n, every row); 0 when the mode needs no scores
  int32_t budget;       // C_l: entries kept in total (C_l - W from the prefix, W from the tail)
  PoolKind pool;
  int32_t pool_kernel;
  GroupReduce reduce;
  SelectMode mode;
  int32_t score_offset;  // first float of this job's scores in the scores buffer ([G][n])
  int32_t index_offset;  // first int of this job's kept indices ([G][C_l - W])
  int32_t seq_slot;      // page-table row of the sequence
  // First entry of the layer's page list that the kept entries go to: 0 writes them over the
  // head of the prompt's own pages; a prefix-caching sequence's prompt pages stay as they are
  // (other requests may read them) and its kept entries go after them (Scheduler::PlanPrefill).
  int32_t kept_offset;
};
static_assert(sizeof(CompressionJob) == 14 * sizeof(int32_t));
inline constexpr int kCompressionJobInts = 14;

// One decode-time eviction of one (decode sequence, layer): after this step's attention the layer
// holds `length` entries, one more than its cap, and drops one per KV head.
struct EvictionJob {
  enum Kind : int32_t { kLowestScore = 1, kOldest = 2 };
  int32_t layer;
  int32_t seq_slot;
  int32_t length;  // entries before the eviction (this step's token included)
  Kind kind;
  int32_t protect_recent;  // entries at positions > position - protect_recent are never evicted
  int32_t sinks;           // entries at positions < sinks are never evicted
  int32_t position;        // true position of this step's token
};
static_assert(sizeof(EvictionJob) == 7 * sizeof(int32_t));
inline constexpr int kEvictionJobInts = 7;

// One prefill sequence's chunk as the host planned it, the host's copy of what query_start and
// context_lens hold on the device: launches that order their work on the host read it (the CUDA
// prefill attention hands out its longest items first).
struct PrefillChunk {
  int32_t query_len = 0;    // rows of this step's chunk
  int32_t context_len = 0;  // keys cached before it
};

struct StepMeta {
  // ---- host-side sizes ----
  int num_tokens = 0;          // T
  int num_prefill_tokens = 0;  // T_p (tokens [0, T_p) belong to prefill sequences)
  int num_seqs = 0;            // S
  int num_prefill_seqs = 0;    // S_p
  int num_layers = 0;          // L
  int max_query_len = 0;       // longest prefill chunk this step
  int max_kv_len = 0;          // longest context (keys) of any sequence this step
  // Per layer, at least as many entries as any decode sequence holds in that layer this step; empty
  // means max_kv_len for every layer. Decode attention sizes its launch by it: the engine's
  // graphs, whose max_kv_len is max_model_len + 1, give sparse layers a smaller bound here.
  std::vector<int32_t> layer_max_kv_len;
  int MaxKvLen(int layer) const {
    return layer < static_cast<int>(layer_max_kv_len.size()) ? layer_max_kv_len[layer] : max_kv_len;
  }
  int64_t num_prefill_keys = 0;  // rows of the prefill K/V scratch (sum of prefill kv lengths)
  std::vector<PrefillChunk> prefill_chunks;  // [S_p]
  int num_sample_rows = 0;                   // R

  // ---- device arrays (int32) ----
  Tensor token_ids;     // [T]
  Tensor positions;     // [T] true RoPE position of each token
  Tensor query_start;   // [S + 1] first token row of each sequence (cumulative)
  Tensor key_start;     // [S_p + 1] first row of each prefill sequence in the K/V scratch
  Tensor context_lens;  // [S] tokens already cached before this step (prefill: chunk start)
  Tensor seq_slots;     // [S] row of each sequence in the page tables
  Tensor write_start;   // [L][S] entry index in layer l where this step's tokens are written;
                        //        -1: not written (the layer is compressed at the prompt's end)
  Tensor sample_rows;   // [R] token rows whose logits are computed
  // Token ids not known on the host when the step was planned: samples of the step before, still
  // on the device (the engine plans a step before it reads the previous one's tokens). Written
  // into token_ids before the forward pass: token_ids[token_feed[f][0]] = those samples'
  // [token_feed[f][1]] for f < num_fed_tokens (Backend::GatherInt32).
  Tensor token_feed;        // [>= F][2]
  int num_fed_tokens = 0;   // F (host)
  Tensor compression_jobs;  // [J][kCompressionJobInts] sorted by layer
  // Host-side: jobs [job_begin[l], job_begin[l + 1]) belong to layer l; the sizes of their
  // scratch buffers.
  std::vector<int32_t> job_begin;         // [L + 1]
  std::vector<CompressionJob> jobs_host;  // [J] same rows as compression_jobs
  int64_t max_scores_per_layer = 0;       // floats of scores needed by one layer's jobs
  int64_t max_indices_per_layer = 0;      // ints of kept indices needed by one layer's jobs

  Tensor eviction_jobs;                     // [E][kEvictionJobInts] sorted by layer
  std::vector<int32_t> eviction_begin;      // [L + 1] host: jobs of layer l
  std::vector<EvictionJob> evictions_host;  // [E]
};

// The paged KV storage of all layers: one pool of pages shared by every (sequence, layer).
// Entry e of (slot s, layer l) lives in page page_table[l][s][e / page_size] at offset
// e % page_size. The page table is CSR with a fixed row pitch (indptr = slot * max_pages), so it
// can be patched in place and CUDA graphs see stable addresses.
struct KvPool {
  int page_size = 16;
  int num_pages = 0;
  int max_seqs = 0;           // rows (sequence slots) of the page tables
  int max_pages_per_seq = 0;  // row pitch of the page tables
  int num_kv_heads = 0;
  int head_dim = 0;
  Tensor k;  // [num_pages][page_size][G][d] cache dtype
  Tensor v;  // [num_pages][page_size][G][d]
  // An FP8 pool (k and v of dtype kF8E4M3) stores entry x of layer l, KV head g as
  // e4m3(x * (1 / scale[l][g])) (core/float8.h: round to nearest even, saturating) and reads it
  // back as e4m3 value * scale[l][g]. Undefined for a pool of the activation dtype.
  Tensor k_scales;  // [L][G] f32
  Tensor v_scales;  // [L][G] f32
  bool fp8() const { return k.defined() && k.dtype() == DType::kF8E4M3; }
  Tensor page_table;  // [L][max_seqs][max_pages_per_seq] i32
  Tensor kv_lens;     // [L][max_seqs] i32 entries held after this step's writes
  // Optional side pools for decode-time eviction (H2O, decode cap); undefined when unused.
  Tensor scores;     // [num_pages * page_size][G] f32 accumulated attention per entry
  Tensor positions;  // [num_pages * page_size][G] i32 true position of each entry
};

// What one page of a pool occupies in a host swap slot (Backend::SwapOutPages), in slot order:
// its K, its V, then its entries of the side pools the pool has (scores, positions), as bytes.
// Each part's bytes per page are the tensor's bytes / num_pages (every tensor is page-major).
inline std::array<const Tensor*, 4> KvPoolPageParts(const KvPool& pool) {
  return {&pool.k, &pool.v, &pool.scores, &pool.positions};
}
inline size_t KvPoolPartBytes(const KvPool& pool, const Tensor& part) {
  return part.defined() ? part.nbytes() / static_cast<size_t>(pool.num_pages) : 0;
}
inline size_t KvPageSwapBytes(const KvPool& pool) {
  size_t bytes = 0;
  for (const Tensor* part : KvPoolPageParts(pool)) bytes += KvPoolPartBytes(pool, *part);
  return bytes;
}

}  // namespace sieve
