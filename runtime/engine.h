// Engine: requests in, tokens out, one step at a time.
//
// The engine owns the scheduler, the KV manager, the model runner and every request's state;
// only the thread that calls Step() may touch it (Add and Abort included — see AsyncEngine for the
// thread-safe front door the server uses). Each Step() plans one batch (continuous batching:
// prefill chunks and decodes together), runs the forward pass, samples, detokenizes, checks stop
// conditions, and returns what each request produced. Steps overlap (EngineOptions::
// overlap_steps): while the device runs one step, the host reads the samples of the step before,
// so a Step() may return the previous step's outputs, or none; call it while HasWork().
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "kv/kv_cache_manager.h"
#include "model/llama_model.h"
#include "runtime/model_runner.h"
#include "runtime/sampler.h"
#include "runtime/sampling_params.h"
#include "sched/scheduler.h"
#include "sparsity/kv_policy.h"
#include "tokenizer/streaming_decoder.h"
#include "tokenizer/tokenizer.h"

namespace sieve {

using RequestId = int64_t;

struct EngineOptions {
  int max_num_seqs = 256;
  int max_num_batched_tokens = 2048;
  bool enable_chunked_prefill = true;
  int max_model_len = 0;  // 0: the model's, capped at 8192 (and at a sliding window)
  int page_size = 16;
  // Per tensor-parallel rank (each rank's pool holds its own KV heads of every page).
  int64_t kv_memory_bytes = 0;   // 0: memory_fraction of what the device has free
  double memory_fraction = 0.9;  // of the device's free memory (GPU: --gpu-memory-utilization)
  std::string kv_policy = "full";
  // auto | bf16 | fp8: the KV pool's dtype. auto and bf16 are the activation dtype (bf16 on the
  // GPU; the CPU backend's is f32, where bf16 is refused); fp8 stores e4m3 with per-(layer, KV
  // head) scales (model/kv_scales.h), twice the entries on the GPU.
  std::string kv_cache_dtype = "auto";
  KvPolicyOptions kv_policy_options;
  bool cuda_graphs = true;          // decode steps as CUDA graphs where the backend has them
  bool step_tuning = true;          // decide near-equal GEMM choices on each bucket's captured
                                    // step (runtime/step_tuning.h)
  bool pad_decode_batches = false;  // pad decode batches to graph buckets even without graphs
                                    // (tests of the padding path on the CPU)
  // Allocate the side pools of decode-time eviction (H2O's scores, positions) even when
  // kv_policy does not evict, so that requests may carry a policy that does (sieve eval runs
  // every policy on one engine). Costs 8 bytes per entry and KV head, and H2O's score updates.
  bool eviction_pools = false;
  // Plan and launch each step before reading the samples of the one before (which the device
  // then feeds to it), so that the host's work for a step (reading samples, detokenizing, stop
  // conditions, planning, uploading) runs while the device computes the previous one, and the
  // device never waits for it. Where a step cannot (a row samples on the host: penalties, top
  // log-probabilities, teacher forcing, a backend without device sampling; tensor parallelism),
  // steps run one at a time. Off: always one at a time (tests compare the two).
  bool overlap_steps = true;
  // Prompt logprobs (SamplingParams::prompt_logprobs): most prefill tokens of such requests in one
  // step, each a row of logits beside the sampled ones. Bounds their logits buffer (this many rows
  // of the vocabulary, allocated at start-up) whatever the prompts' lengths: their prefill goes in
  // chunks of at most this many tokens. A request whose policy must score more prompt rows in
  // its last chunk (KvPolicy::FinalChunkRows) is refused.
  int prompt_logprob_rows = 256;
  // Prefix caching (SchedulerOptions::enable_prefix_caching): requests share the KV pages of the
  // prompt tokens they have in common with earlier ones, computed once, under any policy.
  bool enable_prefix_caching = false;
  // With prefix caching: entries each page-table row holds past max_model_len. During a sparse
  // prompt's final chunk its compressed layers hold the whole prompt (pages other requests may
  // share) and the kept entries written after it (kv/README.md "Prefix caching"); a prompt whose
  // two do not fit its row runs uncached. -1: max_model_len's worth, so that they always fit (a
  // policy keeps at most the prompt), for a page table twice as wide (4 bytes a page, layer and
  // sequence slot; the pool's pages are sized as before).
  int prefix_cache_row_entries = -1;
  // --batch-invariant: a request's greedy or seeded output is bitwise independent of the batch
  // it runs in (runtime/README.md "Batch invariance"). The backend computes every row the same
  // way at any batch (Backend::SetBatchInvariant), prompts are prefilled in chunks cut at
  // multiples of batch_invariant_chunk (SchedulerOptions::batch_invariant_chunk) and a preempted
  // request replays its generated tokens as decode steps. Step tuning is off (its GEMM options
  // are gone).
  bool batch_invariant = false;
  // The fixed prefill chunk of batch_invariant, in tokens: rounded up to a multiple of the page
  // size, and down to one of max_num_batched_tokens' where that is smaller.
  int batch_invariant_chunk = 256;
  // How a running sequence that must give back its pages is preempted (sched/README.md
  // "Preemption"): recompute (its pages freed, computed again later) or swap (its entries copied
  // to host memory and back). --preemption-mode.
  PreemptionMode preemption_mode = PreemptionMode::kRecompute;
  // Swap mode: host bytes for swapped pages, per tensor-parallel rank (pinned on the GPU),
  // allocated at start-up. A preemption whose pages do not fit falls back to recompute.
  // --swap-space (GiB, as vLLM's).
  int64_t swap_space_bytes = int64_t{4} << 30;
};

// The KV pool's dtype for EngineOptions::kv_cache_dtype on a backend of `activation_dtype`;
// InvalidArgument naming the choices otherwise.
Result<DType> ParseKvCacheDtype(std::string_view name, DType activation_dtype);

enum class FinishReason { kNone, kStop, kLength, kAbort };
std::string_view FinishReasonName(FinishReason reason);  // "stop", "length", "abort"

struct Request {
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  std::string kv_policy;  // "" : the engine's policy
  // The knobs (budget, window, ...) of this request's policy: `kv_policy`, or the engine's policy
  // string when that is empty. Unset: the engine's. A policy is a per-request object already
  // (own_policy), so one loaded model can serve or evaluate any number of budgets.
  std::optional<KvPolicyOptions> kv_policy_options;
  // Teacher forcing: when not empty, generated token t is forced_tokens[t] instead of a sample,
  // and each comes with its log-probability under the raw distribution (log_softmax of the
  // logits at temperature 1) in RequestOutput::new_logprobs. The request ends after the last one
  // (or at max_tokens); EOS, stop tokens and stop strings do not end it. Scores held-out text
  // through whatever cache the policy left (sieve eval's perplexity).
  std::vector<int32_t> forced_tokens;
  // With forced tokens: after the last one, go on sampling under `sampling` instead of ending.
  // max_tokens, EOS, stop tokens and stop strings then apply to the sampled tokens only, and the
  // output's text is theirs alone (the forced tokens come in new_tokens, with log-probabilities).
  // A conversation's next turn on the cache its policy left after the last one: sieve eval's
  // two-turn task with --second-turn reuse.
  bool sample_after_forced = false;
};

struct RequestOutput {
  RequestId id = 0;
  std::vector<int32_t> new_tokens;
  std::vector<SampleResult> new_logprobs;  // when requested or forced: one per new token
  // With SamplingParams::prompt_logprobs, in the request's first output: prompt tokens 1 .. n-1
  // (token is the prompt's, logprob its log-probability given the tokens before it, and the top
  // N there). The first prompt token has none.
  std::vector<SampleResult> prompt_logprobs;
  std::string new_text;  // complete UTF-8; stop strings held back until sure
  bool finished = false;
  FinishReason finish_reason = FinishReason::kNone;
  std::string stop_reason;  // the stop string or token that ended it
  int num_prompt_tokens = 0;
  int num_generated_tokens = 0;
  int num_cached_prompt_entries = 0;  // KV entries kept for the prompt (all layers)
};

struct EngineStats {
  int num_running = 0;
  int num_waiting = 0;
  int num_pages = 0;
  int num_pages_used = 0;
  int peak_pages_used = 0;
  int64_t num_preemptions = 0;  // by swap and by recompute
  int num_swapped = 0;          // requests swapped out now
  int num_swap_slots_used = 0;  // host swap slots (one page each) holding swapped pages now
  int64_t num_swapped_out = 0;  // preemptions by swap
  int64_t num_swapped_in = 0;
  // Removed while swapped out, never swapped in: aborted, or finished by the step that was in
  // flight when they were swapped out (num_swapped_out = num_swapped_in + this + num_swapped).
  int64_t num_swapped_removed = 0;
  int64_t num_swap_fallbacks = 0;  // swap mode, swap space full: recomputed instead
  // Decode steps that replayed a known token into the cache after a recompute (sparse requests).
  int64_t num_replayed_tokens = 0;
  int64_t prompt_tokens = 0;  // prompt tokens prefilled (recomputes included)
  // Prefix cache: prompt tokens looked up at admission and those found (not prefilled), as vLLM
  // counts prefix_cache_queries / prefix_cache_hits; the pages cached with no request holding
  // them (counted free), and those evicted to make room.
  int64_t prefix_cache_queries = 0;
  int64_t prefix_cache_hits = 0;
  int num_cached_pages = 0;
  int64_t num_evicted_pages = 0;
  int64_t generation_tokens = 0;
  int64_t steps = 0;
  int64_t steps_launched_ahead = 0;  // launched before the step before's samples were read
  int num_decode_graphs = 0;         // decode graphs captured (warm-up and first use)
  // Over every prompt that finished prefill: sum of its length, and of entries each layer kept.
  int64_t compressed_prompt_tokens = 0;
  std::vector<int64_t> entries_kept_by_layer;  // [L]
  std::vector<int> pages_used_by_layer;        // [L] now
  double kv_usage() const { return num_pages ? double(num_pages_used) / num_pages : 0.0; }
  // prompt entries a dense cache would hold / entries kept (>= 1).
  double compression_ratio() const;
};

// What Engine::WarmUp did.
struct WarmUpReport {
  int decode_graphs = 0;  // decode graphs captured (and step-tuned)
  int decode_buckets = 0;
  int layer_bounds = 0;   // length-bound vectors per bucket (ModelRunner::GraphLayerBounds)
  int prefill_steps = 0;  // prefill-only steps run to plan their shapes
  double seconds = 0;
  bool stopped = false;  // the progress callback asked to stop before the end
};

// Called after each piece of a warm-up with the pieces done and the total; returning false stops
// the warm-up there (a shutdown during start-up).
using WarmUpProgress = std::function<bool(int done, int total)>;

class Engine {
 public:
  // Plans the KV pool from the options and the backend's free memory and builds the runner.
  // `tokenizer` may be null (token ids only: no text, no stop strings). Tensor parallelism:
  // `model` is rank 0 of a sharded model and `other_ranks` ranks 1 .. N-1 (each on its own
  // backend, which must outlive the engine); the runner drives all of them, the scheduler, KV
  // manager and sampling run once. Every rank's pool gets the same number of pages: the fewest
  // that --kv-memory (per rank) or the fraction of any rank's free memory holds.
  static Result<std::unique_ptr<Engine>> Create(
      std::unique_ptr<LlamaModel> model, const Tokenizer* tokenizer, std::vector<int32_t> eos_ids,
      const EngineOptions& options, std::vector<std::unique_ptr<LlamaModel>> other_ranks = {});

  // Reads the samples of a step still in flight, if any: the backend outlives the engine and
  // must not be left holding them.
  ~Engine();

  // Validates and queues a request. InvalidArgument / OutOfRange errors say what is wrong
  // (bad sampling values, prompt longer than the context, unknown token ids, bad kv_policy).
  Result<RequestId> Add(Request request);
  // Ends a request now; its pages are freed at once. The next Step() reports it finished with
  // reason abort. False when unknown or already finished.
  bool Abort(RequestId id);
  bool HasWork() const;
  std::vector<RequestOutput> Step();

  // Warm start (runtime/README.md): does now what first use would otherwise do while requests
  // wait. Captures and step-tunes the decode graph of every batch bucket up to max_num_seqs, for
  // every vector of per-layer length bounds the engine's policy gives a prompt of some length
  // (dense layers grow with the prompt, compressed ones stay at their budget), then plans the
  // prefill GEMM shapes: a prefill-only step of each power-of-two token count above the largest
  // decode bucket, up to max_num_batched_tokens' (GEMM plans are shared by power-of-two rows).
  // Prefill steps run only on backends that plan shapes on first use (Backend::PlansShapes),
  // or with `plan_prefill_anyway` (tests). Only before any request is added. Leaves no trace in
  // the KV cache's accounting or the stats.
  WarmUpReport WarmUp(const WarmUpProgress& progress = {}, bool plan_prefill_anyway = false);

  EngineStats Stats() const;
  const EngineOptions& options() const { return options_; }
  const LlamaModel& model() const { return *model_; }
  const Tokenizer* tokenizer() const { return tokenizer_; }
  const KvPolicy& default_policy() const { return *default_policy_; }
  int max_model_len() const { return options_.max_model_len; }
  int64_t kv_pool_bytes() const { return runner_->pool_bytes(); }
  int tensor_parallel_size() const { return 1 + static_cast<int>(other_ranks_.size()); }
  std::string Describe() const;  // a multi-line summary for start-up logs

 private:
  struct RequestState {
    RequestId id = 0;
    SamplingParams sampling;
    int num_prompt_tokens = 0;
    std::unique_ptr<KvPolicy> own_policy;  // a per-request policy, if any
    std::vector<int32_t> forced_tokens;    // teacher forcing (Request::forced_tokens)
    bool sample_after_forced = false;      // Request::sample_after_forced
    // Prompt logprobs computed so far (positions 1 .. size()), until the first output takes them.
    std::vector<SampleResult> prompt_logprobs;
    bool prompt_logprobs_sent = false;
    std::mt19937_64 rng;       // host sampling
    uint64_t device_seed = 0;  // device sampling: draw t of the request uses (seed, t)
    std::optional<StreamingDecoder> decoder;
    std::string text;    // generated text so far (stop strings are searched here)
    size_t emitted = 0;  // bytes of text already returned
    bool prefill_recorded = false;
  };

  Engine(std::unique_ptr<LlamaModel> model, const Tokenizer* tokenizer,
         std::vector<int32_t> eos_ids, const EngineOptions& options);
  // A step launched whose samples the host has not read yet.
  struct LaunchedStep {
    std::vector<SeqId> sample_ids;  // by sample row
    // By sample row: where the sample goes in its sequence's tokens (a placeholder there until
    // the sample is read); -1 for a row nobody samples (a preempted sequence replaying).
    std::vector<int> positions;
    bool on_device = false;                  // sampling begun on the device: Backend::TakeSamples
    std::vector<SampleResult> host_samples;  // else sampled on the host already
    // Batch invariance, with on_device: by sample row, 1 where the row was sampled on the host
    // already (its result in host_samples; the device's is a placeholder), as it would be alone.
    std::vector<uint8_t> host_rows;
    int samples_buffer = 0;  // sampled_tokens_[.] holds the device samples
  };
  // Runs a planned, committed step: the forward pass (its tokens that `previous` sampled fed
  // from the device), Complete, stats, and sampling begun. Every sampled sequence gets a
  // placeholder token, and is marked finishing when that token is its last by length.
  LaunchedStep Launch(const StepPlan& plan, const LaunchedStep* previous);
  // Reads a launched step's samples into its sequences and appends each request's output.
  void Collect(LaunchedStep& step, std::vector<RequestOutput>& outputs);
  // Commits plan_ and runs the page copies of its swaps (Scheduler::swaps()).
  void CommitPlan();
  // Whether every row `plan` samples can be sampled on the device, fed by the step in flight.
  bool CanLaunchAhead(const StepPlan& plan) const;
  // Writes the sampled token at `position` of the sequence; returns the request's output.
  RequestOutput Advance(RequestState& state, Sequence& seq, const SampleResult& sample,
                        int position);
  // Samples every row of `logits` [R][V] (rows in step.sample_ids order): begun on the device
  // when the backend can and no row needs host-only features (penalties, top log-probabilities,
  // teacher forcing), else on the host now.
  void SampleRows(const Tensor& logits, LaunchedStep& step);
  // Reads the prompt-logprob rows of the step just run (ModelRunner::prompt_rows(), after the
  // `num_sampled` sampled rows of `logits`) into their requests' prompt_logprobs, a few numbers
  // per row; the rows themselves are not kept.
  void ReadPromptLogprobs(const Tensor& logits, size_t num_sampled);
  // After a step: requests of max_tokens 0 whose prompt it finished end here (pending_outputs_).
  void FinishPromptOnly(const StepPlan& plan);
  void Finish(RequestState& state, RequestOutput& output, FinishReason reason);

  EngineOptions options_;
  std::unique_ptr<LlamaModel> model_;
  std::vector<std::unique_ptr<LlamaModel>> other_ranks_;  // tensor parallelism: ranks 1 .. N-1
  const Tokenizer* tokenizer_;
  std::vector<int32_t> eos_ids_;
  std::unique_ptr<KvPolicy> default_policy_;
  std::unique_ptr<KvCacheManager> kv_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<ModelRunner> runner_;
  std::map<RequestId, RequestState> requests_;
  // Outputs no step sampled (aborts, prompts scored with nothing to generate): reported by the
  // next Step().
  std::vector<RequestOutput> pending_outputs_;
  RequestId next_id_ = 1;
  int64_t arrivals_ = 0;
  std::mt19937_64 seed_source_;
  EngineStats stats_;
  StepPlan plan_;  // reused every step: planning allocates nothing in steady state
  std::vector<float> host_logits_;
  std::vector<float> prompt_logits_;       // [<= prompt_logprob_rows][V] host copy of a step's rows
  std::optional<LaunchedStep> in_flight_;  // launched, samples not read yet
  ModelRunner::TokenFeed token_feed_;      // reused by every Launch
  Tensor sampled_tokens_[2];  // device samples of the last two steps, alternately: fed forward
  int next_samples_buffer_ = 0;
};

}  // namespace sieve
