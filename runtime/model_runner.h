// ModelRunner: turns a StepPlan into one forward pass on the backend.
//
// It owns the KV pool's device memory and each step's device-side metadata. Per step it packs
// every int32 array of the StepMeta into one host buffer and uploads it with one copy, applies
// the page-table patches the KV manager logged (only changed entries travel), uploads the
// lengths the step's attention will see, and runs LlamaModel::Forward. No per-token and no
// per-layer host work beyond building these arrays.
//
// Decode-only steps run as CUDA graphs where the backend has them: the batch is padded to a
// bucket size (1, 2, 4, 8, then multiples of 16) with padding sequences that point at the KV
// manager's padding slot, the bucket's metadata lives in its own device buffer at a fixed
// address, and the graph captured at the bucket's first use is replayed. Steps with prefills or
// decode-time evictions run eagerly.
//
// Tensor parallelism (DESIGN.md): given the N ranks of a sharded model, the runner drives them
// all. Each rank has its own KV pool (the same pages, its own KV heads), workspace, metadata
// buffers and graphs; the step is planned and packed once on the host, and each rank uploads it,
// applies the same page-table patches and runs Forward, all ranks at once: rank 0 on the calling
// thread, rank r > 0 on its worker thread (RankWorkers). The logits are rank 0's. With one rank
// there are no workers and nothing changes.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kv/kv_cache_manager.h"
#include "model/llama_model.h"
#include "sched/scheduler.h"

namespace sieve {

struct ModelRunnerOptions {
  int max_num_seqs = 256;
  int max_num_batched_tokens = 2048;
  int max_model_len = 4096;
  bool score_pool = false;  // H2O / score-capped decode
  // The KV pool holds e4m3 with per-(layer, KV head) scales (model/kv_scales.h) instead of the
  // activation dtype: twice the entries in the same bytes on the GPU.
  bool fp8_kv_cache = false;
  bool position_pool = false;  // any decode-time eviction
  // Pad decode-only steps to bucket sizes (needs kv.ReservePaddingSlot()). On by default when
  // the backend has graphs; tests turn it on for the CPU to check the padding path.
  bool pad_decode_batches = false;
  bool use_graphs = true;
  // Decide the GEMM choices a bucket's first step left open by timing its captured graph
  // (runtime/step_tuning.h); off: they keep their pick alone and the capture is not replayed.
  bool step_tuning = true;
  // Prompt logprobs: most prefill rows besides the sampled ones whose logits one step computes
  // (SchedulerOptions::prompt_logprob_rows); the logits buffer holds them beside a decode batch's.
  int prompt_logprob_rows = 0;
};

class RankWorkers;

class ModelRunner {
 public:
  ModelRunner(const LlamaModel& model, KvCacheManager& kv, const ModelRunnerOptions& options);
  // The ranks of a tensor-parallel model, rank r at ranks[r] (ranks[0]'s logits are sampled).
  ModelRunner(const std::vector<const LlamaModel*>& ranks, KvCacheManager& kv,
              const ModelRunnerOptions& options);
  ~ModelRunner();

  // Token ids of a step that are samples of the step before it, still on the device: the engine
  // plans and launches step N + 1 before it reads step N's tokens (runtime/README.md).
  struct TokenFeed {
    const Tensor* samples = nullptr;  // [R] i32, rank 0's device: step N's tokens by sample row
    // By sequence: the index in Sequence::tokens of the token step N sampled for it (a
    // placeholder on the host), and that token's row in `samples`.
    std::unordered_map<SeqId, std::pair<int, int>> rows;
  };

  // Runs the step. Returns the logits [R + P][V] f32 of its sampled rows on the device (valid
  // until the next Run), in plan order: prefills whose final chunk ran, then decodes; `sample_ids`
  // receives each row's sequence. P rows of prompt logprobs follow (prompt_rows()). With `feed`
  // (one rank only), the tokens it names are read from its samples on the device; every other token
  // must be known.
  const Tensor& Run(const StepPlan& plan, const Scheduler& scheduler,
                    std::vector<SeqId>& sample_ids, const TokenFeed* feed = nullptr);

  // The prompt rows of the last Run whose logits follow the sampled rows' (in this order): row
  // sample_ids.size() + k of Run's logits is the distribution after prompt_rows()[k].position of
  // sequence prompt_rows()[k].id, i.e. of its token at position + 1.
  struct PromptRow {
    SeqId id = 0;
    int position = 0;
  };
  const std::vector<PromptRow>& prompt_rows() const { return prompt_rows_; }

  // The host half of Run: builds and uploads the step's metadata and page-table changes.
  // Public so the scheduler benchmark can time a step's host work without the forward pass.
  // `pad_to` > 0: a decode-only step of the graph of that bucket (at least the step's size), padded
  // to it.
  void PrepareStep(const StepPlan& plan, const Scheduler& scheduler, std::vector<SeqId>& sample_ids,
                   int pad_to = 0);

  const KvPool& pool() const { return ranks_[0].pool; }  // rank 0's
  Backend& backend() const { return model_.backend(); }  // rank 0's
  int num_ranks() const { return static_cast<int>(ranks_.size()); }
  int vocab_size() const { return model_.config().vocab_size; }
  int64_t pool_bytes() const;  // K and V pages and side pools, of every rank
  // Preemption by swap: host memory for `slots` swapped pages on every rank (its own KV heads'
  // bytes of each page: KvPageSwapBytes), allocated once. ResourceExhausted when a host cannot
  // give it.
  Status AllocateSwapSpace(int slots);
  // A Commit's page copies on every rank: swap-outs, then swap-ins, on each rank's stream before
  // the step that follows.
  void SwapPages(const PageSwaps& swaps);
  bool fp8_kv_cache() const { return options_.fp8_kv_cache; }
  int num_graphs() const { return static_cast<int>(ranks_[0].graphs.size()); }
  int64_t graph_steps() const { return graph_steps_; }

  // The bucket a decode batch of `batch` sequences is padded to.
  static int BucketFor(int batch);
  // A decode graph's bound for a layer whose longest sequence holds `longest` entries: rounded up
  // to a multiple of 4096, the decode attention's longest piece of a sequence
  // (backend/cuda/decode_attention.h), so that the graph launches the pieces the true lengths
  // need; at most `max_kv_len`, the graph's bound for the whole step.
  static int32_t GraphLayerBound(int longest, int max_kv_len);

  // Warm start (runtime/README.md): the work a decode bucket's or a prefill size's first step
  // does (GEMM planning, graph capture and step tuning), done before requests arrive.
  //
  // Whether decode-only steps run as graphs (the backend has them and they are on).
  bool uses_graphs() const;
  // Every bucket a decode batch can be padded to, smallest first: 1, 2, 4, 8, 16, 32, ...,
  // BucketFor(max_num_seqs).
  std::vector<int> DecodeBuckets() const;
  // The per-layer bounds (GraphLayerBound) a graph of a decode step of requests whose layers
  // hold `entries` [L] (the longest sequence's, before the step's token) is keyed by.
  std::vector<int32_t> GraphLayerBounds(const std::vector<int>& entries) const;
  // Captures (and step-tunes) the graph of a decode-only step of `bucket` sequences whose layers
  // are bounded by `layer_bounds`, running it on padding sequences; the graph a later step of
  // that bucket and those bounds replays. False when there was nothing to do (no graphs, or
  // captured already). Only before requests run: `scheduler` must hold none.
  bool WarmUpDecodeGraph(int bucket, const std::vector<int32_t>& layer_bounds,
                         const Scheduler& scheduler);
  // Runs a prefill-only step of `tokens` tokens that reads and writes no KV entries, so that the
  // backend plans the step's shapes (and grows its workspaces) now. Only before requests run.
  void WarmUpPrefill(int tokens);

 private:
  struct DecodeGraph {
    Tensor meta;    // [capacity] i32: this bucket's packed StepMeta, fixed address
    StepMeta step;  // views of `meta`
    int graph = -1;
  };

  // What each rank holds on its device.
  struct Rank {
    const LlamaModel* model = nullptr;
    KvPool pool;  // every rank's has the same pages and page tables, its own KV heads
    HostBuffer swap{nullptr, nullptr};  // [swap slots][KvPageSwapBytes(pool)] host
    ForwardWorkspace workspace;
    StepMeta step;       // eager steps: step_'s host fields, device views of device_meta
    Tensor device_meta;  // [capacity] i32 for eager steps
    Tensor patches;      // [capacity][2] i32 staging for page-table patches
    // By batch bucket and the layers' length bounds (StepMeta::layer_max_kv_len).
    std::map<std::pair<int, std::vector<int32_t>>, DecodeGraph> graphs;
  };

  // The step's host half: builds step_'s host fields and host_meta_ (and takes the page-table
  // patches) without touching a device.
  void BuildStep(const StepPlan& plan, const Scheduler& scheduler, std::vector<SeqId>& sample_ids,
                 int pad_to, const TokenFeed* feed = nullptr);
  // Runs job(rank) for every rank at once and returns when all are done (one rank: a call).
  void ForEachRank(const std::function<void(int rank)>& job);
  // Rank `rank`'s share of a step's uploads: the page-table patches and the lengths.
  void UploadState(int rank);
  // Uploads host_meta_ into rank `rank`'s `destination`; `step` takes step_'s host fields and
  // device arrays pointing into `destination`.
  void Upload(int rank, Tensor& destination, StepMeta& step);
  // Packs scratch_'s arrays and step_'s jobs into host_meta_ and takes the page-table patches:
  // the end of BuildStep.
  void PackStep();
  // Rank `rank` replays the graph of the step BuildStep made (bucket `bucket`, step_'s layer
  // bounds), capturing it first if it is new; true if it captured.
  bool RunDecodeGraph(int rank, int bucket);
  // Rank `rank` runs step_ eagerly.
  void RunEager(int rank);
  // Writes the fed tokens (TokenFeed) into `step`'s uploaded token ids.
  void FeedTokens(int rank, StepMeta& step);
  // The logits rank `rank`'s Forward writes: rank 0's view; none for the others.
  Tensor& LogitsOf(int rank) { return rank == 0 ? logits_view_ : no_logits_; }

  const LlamaModel& model_;  // rank 0's
  KvCacheManager& kv_;
  ModelRunnerOptions options_;
  std::vector<Rank> ranks_;
  StepMeta step_;  // the step's host fields (its device arrays stay unset: each rank has its own)
  std::vector<int32_t> host_meta_;  // packed int32 arrays of a step, uploaded at once
  struct Section {
    Tensor StepMeta::*field;
    size_t offset;
    int64_t rows;
    int64_t cols;
  };
  std::vector<Section> sections_;
  std::vector<std::pair<int32_t, int32_t>> patches_;  // this step's page-table changes
  std::vector<PromptRow> prompt_rows_;                // this step's prompt-logprob rows
  std::vector<int32_t> prompt_token_rows_;            // [prompt_rows_] their token rows
  std::vector<int32_t> lengths_;  // [L][max_seqs] lengths seen by this step's attention
  struct Scratch {
    std::vector<int32_t> token_ids, positions, query_start, key_start, context_lens, slots,
        sample_rows, write_start, token_feed;
    std::vector<std::vector<CompressionJob>> jobs_by_layer;
    std::vector<std::vector<EvictionJob>> evictions_by_layer;
  } scratch_;
  const Tensor* feed_samples_ = nullptr;  // this step's TokenFeed::samples
  Tensor logits_device_;                  // [max rows][V] f32, rank 0's
  Tensor logits_view_;
  Tensor no_logits_;  // undefined: ranks > 0 skip the LM head
  int64_t graph_steps_ = 0;
  std::unique_ptr<RankWorkers> workers_;  // ranks > 0's threads; null with one rank
};

}  // namespace sieve
