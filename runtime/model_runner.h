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
#pragma once

#include <cstdint>
#include <map>
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
  bool score_pool = false;     // H2O / score-capped decode
  bool position_pool = false;  // any decode-time eviction
  // Pad decode-only steps to bucket sizes (needs kv.ReservePaddingSlot()). On by default when
  // the backend has graphs; tests turn it on for the CPU to check the padding path.
  bool pad_decode_batches = false;
  bool use_graphs = true;
  // Decide the GEMM choices a bucket's first step left open by timing its captured graph
  // (runtime/step_tuning.h); off: they keep their pick alone and the capture is not replayed.
  bool step_tuning = true;
};

class ModelRunner {
 public:
  ModelRunner(const LlamaModel& model, KvCacheManager& kv, const ModelRunnerOptions& options);

  // Runs the step. Returns the logits [R][V] f32 of its sampled rows on the device (valid until
  // the next Run), in plan order: prefills whose final chunk ran, then decodes; `sample_ids`
  // receives each row's sequence.
  const Tensor& Run(const StepPlan& plan, const Scheduler& scheduler,
                    std::vector<SeqId>& sample_ids);

  // The host half of Run: builds and uploads the step's metadata and page-table changes.
  // Public so the scheduler benchmark can time a step's host work without the forward pass.
  // `pad_to` > number of sequences pads a decode-only step to that size.
  void PrepareStep(const StepPlan& plan, const Scheduler& scheduler, std::vector<SeqId>& sample_ids,
                   int pad_to = 0);

  const KvPool& pool() const { return pool_; }
  Backend& backend() const { return model_.backend(); }
  int vocab_size() const { return model_.config().vocab_size; }
  int64_t pool_bytes() const;  // K and V pages and side pools
  int num_graphs() const { return static_cast<int>(graphs_.size()); }
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

  void Upload(Tensor& destination, StepMeta& step);
  // Packs scratch_'s arrays and step_'s jobs into host_meta_, uploads the page-table patches
  // and the lengths: the end of PrepareStep.
  void PackStep();
  // Replays the graph of the step PrepareStep made (bucket `bucket`, step_'s layer bounds),
  // capturing it first if it is new; true if it captured.
  bool RunDecodeGraph(int bucket);

  const LlamaModel& model_;
  KvCacheManager& kv_;
  ModelRunnerOptions options_;
  KvPool pool_;
  ForwardWorkspace workspace_;
  StepMeta step_;
  std::vector<int32_t> host_meta_;  // packed int32 arrays of a step, uploaded at once
  struct Section {
    Tensor StepMeta::*field;
    size_t offset;
    int64_t rows;
    int64_t cols;
  };
  std::vector<Section> sections_;
  Tensor device_meta_;            // [capacity] i32 for eager steps
  Tensor patches_;                // [capacity][2] i32 staging for page-table patches
  std::vector<int32_t> lengths_;  // [L][max_seqs] lengths seen by this step's attention
  struct Scratch {
    std::vector<int32_t> token_ids, positions, query_start, key_start, context_lens, slots,
        sample_rows, write_start;
    std::vector<std::vector<CompressionJob>> jobs_by_layer;
    std::vector<std::vector<EvictionJob>> evictions_by_layer;
  } scratch_;
  Tensor logits_device_;  // [max rows][V] f32
  Tensor logits_view_;
  // By batch bucket and the layers' length bounds (StepMeta::layer_max_kv_len).
  std::map<std::pair<int, std::vector<int32_t>>, DecodeGraph> graphs_;
  int64_t graph_steps_ = 0;
};

}  // namespace sieve
