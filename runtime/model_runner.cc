#include "runtime/model_runner.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "core/logging.h"
#include "model/kv_scales.h"
#include "runtime/step_tuning.h"

namespace sieve {

// Runs one job on every rank of a tensor-parallel model at once: rank 0 on the calling thread
// (the engine's), rank r > 0 on worker thread r, which made its backend current when it started.
// Run returns when every rank has finished the job. The ranks' collectives meet inside the job,
// so it must start on all of them: one job at a time, every rank always.
class RankWorkers {
 public:
  explicit RankWorkers(const std::vector<Backend*>& backends) {
    for (size_t rank = 1; rank < backends.size(); ++rank) {
      threads_.emplace_back([this, rank, backend = backends[rank]] {
        backend->MakeCurrent();
        Loop(static_cast<int>(rank));
      });
    }
  }
  ~RankWorkers() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    start_.notify_all();
    for (std::thread& thread : threads_) thread.join();
  }
  RankWorkers(const RankWorkers&) = delete;
  RankWorkers& operator=(const RankWorkers&) = delete;

  void Run(const std::function<void(int rank)>& job) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      job_ = &job;
      pending_ = static_cast<int>(threads_.size());
      ++generation_;
    }
    start_.notify_all();
    job(0);
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [&] { return pending_ == 0; });
    job_ = nullptr;
  }

 private:
  void Loop(int rank) {
    uint64_t seen = 0;
    while (true) {
      const std::function<void(int)>* job = nullptr;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        start_.wait(lock, [&] { return stopping_ || generation_ != seen; });
        if (stopping_) return;
        seen = generation_;
        job = job_;
      }
      (*job)(rank);
      std::lock_guard<std::mutex> lock(mutex_);
      if (--pending_ == 0) done_.notify_one();
    }
  }

  std::mutex mutex_;
  std::condition_variable start_;
  std::condition_variable done_;
  const std::function<void(int)>* job_ = nullptr;  // the job in flight
  uint64_t generation_ = 0;                        // jobs started
  int pending_ = 0;                                // workers yet to finish it
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

namespace {

// Rows of logits one step computes at most: a decode bucket's samples, and the prompt rows of
// prompt logprobs beside them. Allocated once; no step allocates logits.
int MaxLogitsRows(const ModelRunnerOptions& options) {
  return ModelRunner::BucketFor(options.max_num_seqs) + std::max(options.prompt_logprob_rows, 0);
}

}  // namespace

ModelRunner::ModelRunner(const LlamaModel& model, KvCacheManager& kv,
                         const ModelRunnerOptions& options)
    : ModelRunner(std::vector<const LlamaModel*>{&model}, kv, options) {}

ModelRunner::ModelRunner(const std::vector<const LlamaModel*>& ranks, KvCacheManager& kv,
                         const ModelRunnerOptions& options)
    : model_(*ranks.at(0)), kv_(kv), options_(options), ranks_(ranks.size()) {
  const ModelConfig& config = model_.config();
  const KvCacheManager::Options& kv_options = kv.options();
  std::vector<Backend*> backends;
  for (size_t rank = 0; rank < ranks.size(); ++rank) {
    ranks_[rank].model = ranks[rank];
    backends.push_back(&ranks[rank]->backend());
  }
  if (ranks.size() > 1) workers_ = std::make_unique<RankWorkers>(backends);
  if (options_.pad_decode_batches) {
    SIEVE_CHECK(kv.padding_slot() >= 0) << "padded decode batches need the KV padding slot";
  }
  const std::vector<int32_t>& table = kv.page_table();
  // Each rank allocates on its own device (its thread has it current).
  ForEachRank([&](int rank) {
    Rank& state = ranks_[rank];
    const LlamaModel& model = *state.model;
    Backend& backend = model.backend();
    const int kv_heads = model.layout().num_kv_heads;  // this rank's
    KvPool& pool = state.pool;
    pool.page_size = kv_options.page_size;
    pool.num_pages = kv_options.num_pages;
    pool.max_seqs = kv_options.max_seqs;
    pool.max_pages_per_seq = kv_options.max_pages_per_seq;
    pool.num_kv_heads = kv_heads;
    pool.head_dim = config.head_dim;
    const DType cache_dtype = options.fp8_kv_cache ? DType::kF8E4M3 : backend.activation_dtype();
    pool.k = backend.Allocate(
        {kv_options.num_pages, kv_options.page_size, kv_heads, config.head_dim}, cache_dtype);
    pool.v = backend.Allocate(pool.k.shape(), cache_dtype);
    if (options.fp8_kv_cache) {
      const KvCacheScales scales = ComputeKvCacheScales(model);
      pool.k_scales = backend.Allocate({config.num_layers, kv_heads}, DType::kF32);
      pool.v_scales = backend.Allocate({config.num_layers, kv_heads}, DType::kF32);
      backend.CopyFromHost(scales.k.data(), scales.k.size() * sizeof(float), pool.k_scales);
      backend.CopyFromHost(scales.v.data(), scales.v.size() * sizeof(float), pool.v_scales);
    }
    const int64_t entries = static_cast<int64_t>(kv_options.num_pages) * kv_options.page_size;
    if (options.score_pool) pool.scores = backend.Allocate({entries, kv_heads}, DType::kF32);
    if (options.position_pool) {
      pool.positions = backend.Allocate({entries, kv_heads}, DType::kI32);
    }
    pool.page_table = backend.Allocate(
        {config.num_layers, kv_options.max_seqs, kv_options.max_pages_per_seq}, DType::kI32);
    backend.CopyFromHost(table.data(), table.size() * sizeof(int32_t), pool.page_table);
    pool.kv_lens = backend.Allocate({config.num_layers, kv_options.max_seqs}, DType::kI32);
    if (rank == 0) {
      logits_device_ = backend.Allocate({MaxLogitsRows(options), config.vocab_size}, DType::kF32);
    }
    // Sized for the largest step the scheduler can plan; long chunked prefills grow the K/V
    // scratch on first use.
    model.EnsureWorkspace(state.workspace,
                          options.max_num_batched_tokens + BucketFor(options.max_num_seqs),
                          options.max_num_batched_tokens, MaxLogitsRows(options), 1, 1);
    if (options_.pad_decode_batches && options_.use_graphs && backend.SupportsGraphs()) {
      backend.PrepareDecodeGraphs(BucketFor(options.max_num_seqs), model.layout().num_q_heads,
                                  config.head_dim, options.max_model_len + 1);
    }
  });
  (void)kv.TakePageTablePatches();  // the uploads above cover them
}

ModelRunner::~ModelRunner() = default;

void ModelRunner::ForEachRank(const std::function<void(int rank)>& job) {
  if (workers_ == nullptr) {
    job(0);
    return;
  }
  // The calling thread may be any (the engine's): rank 0's device first.
  model_.backend().MakeCurrent();
  workers_->Run(job);
}

int32_t ModelRunner::GraphLayerBound(int longest, int max_kv_len) {
  constexpr int kQuantum = 4096;
  return std::min(max_kv_len, (std::max(longest, 1) + kQuantum - 1) / kQuantum * kQuantum);
}

int ModelRunner::BucketFor(int batch) {
  if (batch <= 1) return 1;
  if (batch <= 2) return 2;
  if (batch <= 4) return 4;
  if (batch <= 8) return 8;
  return (batch + 15) / 16 * 16;
}

int64_t ModelRunner::pool_bytes() const {
  int64_t bytes = 0;
  for (const Rank& rank : ranks_) {
    bytes += 2 * static_cast<int64_t>(rank.pool.k.nbytes());
    if (rank.pool.scores.defined()) bytes += rank.pool.scores.nbytes();
    if (rank.pool.positions.defined()) bytes += rank.pool.positions.nbytes();
  }
  return bytes;
}

Status ModelRunner::AllocateSwapSpace(int slots) {
  Status status = Status::Ok();
  for (Rank& rank : ranks_) {
    const size_t bytes = static_cast<size_t>(slots) * KvPageSwapBytes(rank.pool);
    rank.model->backend().MakeCurrent();
    rank.swap = rank.model->backend().AllocateHostBuffer(bytes);
    if (rank.swap == nullptr) {
      status = ResourceExhaustedError("could not allocate " + std::to_string(bytes) +
                                      " bytes of host memory for --swap-space");
      break;
    }
  }
  model_.backend().MakeCurrent();
  return status;
}

void ModelRunner::SwapPages(const PageSwaps& swaps) {
  ForEachRank([&](int rank_index) {
    Rank& rank = ranks_[rank_index];
    SIEVE_CHECK(rank.swap != nullptr) << "pages swapped without swap space";
    Backend& backend = rank.model->backend();
    if (!swaps.out_pages.empty()) {
      backend.SwapOutPages(rank.pool, swaps.out_pages, swaps.out_slots, rank.swap.get());
    }
    if (!swaps.in_pages.empty()) {
      backend.SwapInPages(rank.swap.get(), swaps.in_slots, swaps.in_pages, rank.pool);
    }
  });
}

void ModelRunner::PrepareStep(const StepPlan& plan, const Scheduler& scheduler,
                              std::vector<SeqId>& sample_ids, int pad_to) {
  BuildStep(plan, scheduler, sample_ids, pad_to);
  ForEachRank([&](int rank) { UploadState(rank); });
}

void ModelRunner::BuildStep(const StepPlan& plan, const Scheduler& scheduler,
                            std::vector<SeqId>& sample_ids, int pad_to, const TokenFeed* feed) {
  const int layers = model_.config().num_layers;
  const int kv_heads = model_.config().num_kv_heads;
  std::vector<const ScheduledSequence*> order;
  for (const auto& s : plan.prefills) order.push_back(&s);
  for (const auto& s : plan.decodes) order.push_back(&s);
  const int num_real = static_cast<int>(order.size());
  const int num_prefill = static_cast<int>(plan.prefills.size());
  // A step for a graph of bucket pad_to (padding sequences fill what the real ones leave; a
  // batch that fills its bucket exactly has none, but is a graph's step all the same).
  const bool pad = pad_to > 0;
  SIEVE_CHECK(!pad || (num_prefill == 0 && pad_to >= num_real))
      << "only decode-only steps are padded, to at least their size";
  const int num_seqs = pad ? pad_to : num_real;

  StepMeta& step = step_;
  step.num_seqs = num_seqs;
  step.num_prefill_seqs = num_prefill;
  step.num_layers = layers;
  step.num_tokens = 0;
  step.num_prefill_tokens = 0;
  step.max_query_len = 0;
  step.max_kv_len = 0;
  step.layer_max_kv_len.assign(layers, 0);
  step.num_prefill_keys = 0;
  step.prefill_chunks.clear();
  step.job_begin.assign(layers + 1, 0);
  step.jobs_host.clear();
  step.eviction_begin.assign(layers + 1, 0);
  step.evictions_host.clear();
  step.max_scores_per_layer = 0;
  step.max_indices_per_layer = 0;

  // Per-step arrays are members so that steady-state steps allocate nothing.
  std::vector<int32_t>& token_ids = scratch_.token_ids;
  std::vector<int32_t>& positions = scratch_.positions;
  std::vector<int32_t>& query_start = scratch_.query_start;
  std::vector<int32_t>& key_start = scratch_.key_start;
  std::vector<int32_t>& context_lens = scratch_.context_lens;
  std::vector<int32_t>& slots = scratch_.slots;
  std::vector<int32_t>& sample_rows = scratch_.sample_rows;
  std::vector<int32_t>& token_feed = scratch_.token_feed;
  for (auto* v : {&token_ids, &positions, &query_start, &key_start, &context_lens, &slots,
                  &sample_rows, &token_feed}) {
    v->clear();
  }
  query_start.push_back(0);
  key_start.push_back(0);
  std::vector<int32_t>& write_start = scratch_.write_start;
  write_start.assign(static_cast<size_t>(layers) * num_seqs, -1);
  sample_ids.clear();
  prompt_rows_.clear();
  prompt_token_rows_.clear();
  lengths_ = kv_.lengths();
  auto& jobs_by_layer = scratch_.jobs_by_layer;
  auto& evictions_by_layer = scratch_.evictions_by_layer;
  jobs_by_layer.resize(layers);
  evictions_by_layer.resize(layers);
  for (auto& jobs : jobs_by_layer) jobs.clear();
  for (auto& jobs : evictions_by_layer) jobs.clear();

  for (int index = 0; index < num_real; ++index) {
    const ScheduledSequence& scheduled = *order[index];
    const Sequence& seq = *scheduler.Find(scheduled.id);
    const int slot = kv_.Slot(scheduled.id);
    const std::pair<int, int>* fed = nullptr;  // (position, sample row) of a token on the device
    if (feed != nullptr) {
      const auto it = feed->rows.find(scheduled.id);
      if (it != feed->rows.end()) fed = &it->second;
    }
    // Prompt logprobs: the rows before the prompt's last (whose row is the sample's).
    const int prompt_rows_end =
        !scheduled.is_decode && seq.prompt_logprobs
            ? std::min(scheduled.context_len + scheduled.num_tokens, seq.num_prompt_tokens - 1)
            : 0;
    for (int offset = 0; offset < scheduled.num_tokens; ++offset) {
      const int position = scheduled.context_len + offset;
      if (position < prompt_rows_end) {
        prompt_rows_.push_back({scheduled.id, position});
        prompt_token_rows_.push_back(static_cast<int32_t>(token_ids.size()));
      }
      if (fed != nullptr && position == fed->first) {
        token_feed.push_back(static_cast<int32_t>(token_ids.size()));
        token_feed.push_back(fed->second);
        token_ids.push_back(0);
      } else {
        const int32_t token = seq.tokens[position];
        SIEVE_CHECK(token >= 0) << "sequence " << scheduled.id << " reads token " << position
                                << ", which is not known yet";
        token_ids.push_back(token);
      }
      positions.push_back(position);
    }
    step.num_tokens += scheduled.num_tokens;
    query_start.push_back(step.num_tokens);
    context_lens.push_back(scheduled.context_len);
    slots.push_back(slot);
    step.max_kv_len = std::max(step.max_kv_len, scheduled.context_len + scheduled.num_tokens);
    if (scheduled.sample) {
      sample_rows.push_back(step.num_tokens - 1);
      sample_ids.push_back(scheduled.id);
    }
    if (!scheduled.is_decode) {
      step.num_prefill_tokens += scheduled.num_tokens;
      step.max_query_len = std::max(step.max_query_len, scheduled.num_tokens);
      const int keys = scheduled.context_len + scheduled.num_tokens;
      step.num_prefill_keys += keys;
      step.prefill_chunks.push_back({scheduled.num_tokens, scheduled.context_len});
      key_start.push_back(static_cast<int32_t>(step.num_prefill_keys));
      for (int layer = 0; layer < layers; ++layer) {
        const bool compress = scheduled.final_chunk && scheduled.compress[layer].compress;
        // A compressed layer's final chunk stays in the K/V scratch, unless the prompt's pages
        // are kept (prefix caching): then they get this chunk's entries as any layer's do.
        write_start[static_cast<size_t>(layer) * num_seqs + index] =
            compress && scheduled.kept_offset == 0 ? -1 : scheduled.context_len;
        if (!compress) continue;
        jobs_by_layer[layer].push_back(
            scheduled.compress[layer].Job(layer, index, keys, slot, scheduled.kept_offset));
      }
    } else {
      for (int layer = 0; layer < layers; ++layer) {
        int32_t& length_seen = lengths_[static_cast<size_t>(layer) * kv_.options().max_seqs + slot];
        const int length = length_seen;  // committed length before this step
        write_start[static_cast<size_t>(layer) * num_seqs + index] = length;
        length_seen = length + 1;
        step.layer_max_kv_len[layer] = std::max(step.layer_max_kv_len[layer], length + 1);
        if (!plan.Evicts(scheduled)[layer]) continue;
        const DecodeLimit limit = seq.policy->DecodeLimitFor(layer);
        EvictionJob job{};
        job.layer = layer;
        job.seq_slot = slot;
        job.length = length + 1;
        job.kind = limit.evict == DecodeLimit::Evict::kOldest ? EvictionJob::kOldest
                                                              : EvictionJob::kLowestScore;
        job.protect_recent = limit.protect_recent;
        job.sinks = limit.sinks;
        job.position = scheduled.context_len;
        evictions_by_layer[layer].push_back(job);
      }
    }
  }
  // Padding sequences: one token at position 0 in the padding slot, whose every layer holds one
  // entry that this token overwrites; their logits rows are computed and ignored.
  for (int index = num_real; index < num_seqs; ++index) {
    token_ids.push_back(0);
    positions.push_back(0);
    ++step.num_tokens;
    query_start.push_back(step.num_tokens);
    context_lens.push_back(0);
    slots.push_back(kv_.padding_slot());
    sample_rows.push_back(step.num_tokens - 1);
    for (int layer = 0; layer < layers; ++layer) {
      write_start[static_cast<size_t>(layer) * num_seqs + index] = 0;
    }
  }
  if (pad) {
    // A graph's launch shapes are fixed at capture: max_kv_len at its largest (it sizes the
    // workspaces), and each layer's bound rounded up to whole pieces of the decode attention
    // (GraphLayerBound), which picks the graph (graphs_ is keyed by them too). Sparse layers
    // holding a few hundred entries then launch one piece per sequence, not the
    // max_model_len / 4096 pieces a dense layer may need.
    step.max_kv_len = options_.max_model_len + 1;
    for (int32_t& bound : step.layer_max_kv_len) bound = GraphLayerBound(bound, step.max_kv_len);
  } else {
    step.layer_max_kv_len.clear();  // eager: every layer is bounded by the step's max_kv_len
  }
  for (int layer = 0; layer < layers; ++layer) {
    int64_t scores = 0;
    int64_t kept = 0;
    for (CompressionJob& job : jobs_by_layer[layer]) {
      job.score_offset = static_cast<int32_t>(scores);
      job.index_offset = static_cast<int32_t>(kept);
      if (job.mode == SelectMode::kTopScores)
        scores += static_cast<int64_t>(kv_heads) * job.num_keys;
      kept += static_cast<int64_t>(kv_heads) * (job.budget - job.window);
      step.jobs_host.push_back(job);
    }
    step.job_begin[layer + 1] = static_cast<int32_t>(step.jobs_host.size());
    step.max_scores_per_layer = std::max(step.max_scores_per_layer, scores);
    step.max_indices_per_layer = std::max(step.max_indices_per_layer, kept);
    for (const EvictionJob& job : evictions_by_layer[layer]) step.evictions_host.push_back(job);
    step.eviction_begin[layer + 1] = static_cast<int32_t>(step.evictions_host.size());
  }
  SIEVE_CHECK(static_cast<int>(prompt_rows_.size()) <= options_.prompt_logprob_rows)
      << "the scheduler planned more prompt-logprob rows than the logits buffer holds";
  sample_rows.insert(sample_rows.end(), prompt_token_rows_.begin(), prompt_token_rows_.end());
  step.num_sample_rows = static_cast<int>(sample_rows.size());
  step.num_fed_tokens = static_cast<int>(token_feed.size() / 2);
  PackStep();
}

void ModelRunner::PackStep() {
  StepMeta& step = step_;
  const Scratch& s = scratch_;
  const std::vector<int32_t>&token_ids = s.token_ids, &positions = s.positions,
        &query_start = s.query_start, &key_start = s.key_start, &context_lens = s.context_lens,
        &slots = s.slots, &sample_rows = s.sample_rows, &write_start = s.write_start;
  // A pair per sequence whether fed or not, so that a graph's buffer keeps its size.
  std::vector<int32_t>& token_feed = scratch_.token_feed;
  SIEVE_CHECK(static_cast<int>(token_feed.size()) <= 2 * step.num_seqs);
  token_feed.resize(2 * static_cast<size_t>(std::max(step.num_seqs, 1)), 0);
  // Pack every array into one buffer; Upload makes the StepMeta tensors views of one copy.
  host_meta_.clear();
  sections_.clear();
  const auto append = [&](Tensor StepMeta::*field, const int32_t* data, int64_t rows,
                          int64_t cols) {
    sections_.push_back({field, host_meta_.size(), rows, cols});
    host_meta_.insert(host_meta_.end(), data, data + rows * cols);
  };
  const auto size = [](const auto& v) { return static_cast<int64_t>(v.size()); };
  append(&StepMeta::token_ids, token_ids.data(), size(token_ids), 1);
  append(&StepMeta::positions, positions.data(), size(positions), 1);
  append(&StepMeta::query_start, query_start.data(), size(query_start), 1);
  append(&StepMeta::key_start, key_start.data(), size(key_start), 1);
  append(&StepMeta::context_lens, context_lens.data(), size(context_lens), 1);
  append(&StepMeta::seq_slots, slots.data(), size(slots), 1);
  append(&StepMeta::write_start, write_start.data(), size(write_start), 1);
  append(&StepMeta::sample_rows, sample_rows.data(), size(sample_rows), 1);
  append(&StepMeta::token_feed, token_feed.data(), size(token_feed) / 2, 2);
  append(&StepMeta::compression_jobs, reinterpret_cast<const int32_t*>(step.jobs_host.data()),
         size(step.jobs_host), kCompressionJobInts);
  append(&StepMeta::eviction_jobs, reinterpret_cast<const int32_t*>(step.evictions_host.data()),
         size(step.evictions_host), kEvictionJobInts);
  // Page-table changes since the last step, uploaded to every rank by UploadState.
  patches_ = kv_.TakePageTablePatches();  // each entry once: any order applies
}

void ModelRunner::UploadState(int rank) {
  Rank& state = ranks_[rank];
  Backend& backend = state.model->backend();
  // Page-table changes since the last step, then the lengths this step's attention sees.
  if (!patches_.empty()) {
    const int64_t count = static_cast<int64_t>(patches_.size());
    if (!state.patches.defined() || state.patches.dim(0) < count) {
      state.patches = backend.Allocate({std::max<int64_t>(count, 4096), 2}, DType::kI32);
    }
    backend.CopyFromHost(patches_.data(), patches_.size() * sizeof(patches_[0]), state.patches);
    backend.ScatterInt32(state.patches, static_cast<int>(count), state.pool.page_table);
  }
  backend.CopyFromHost(lengths_.data(), lengths_.size() * sizeof(int32_t), state.pool.kv_lens);
}

void ModelRunner::Upload(int rank, Tensor& destination, StepMeta& step) {
  Backend& backend = ranks_[rank].model->backend();
  const int64_t needed = std::max<int64_t>(1, static_cast<int64_t>(host_meta_.size()));
  if (!destination.defined() || destination.numel() < needed) {
    destination = backend.Allocate({std::max<int64_t>(needed, 1 << 12)}, DType::kI32);
  }
  backend.CopyFromHost(host_meta_.data(), host_meta_.size() * sizeof(int32_t), destination);
  // This step's host fields, device views into this rank's buffer (step_ itself stays host-only:
  // the ranks read it at once).
  step = step_;
  for (const Section& section : sections_) {
    Tensor& tensor = step.*(section.field);
    tensor = destination.Rows(static_cast<int64_t>(section.offset),
                              static_cast<int64_t>(section.offset) + section.rows * section.cols);
    if (section.cols > 1) tensor = tensor.Reshape({section.rows, section.cols});
  }
}

bool ModelRunner::RunDecodeGraph(int rank, int bucket) {
  Rank& state = ranks_[rank];
  const LlamaModel& model = *state.model;
  Backend& backend = model.backend();
  DecodeGraph& graph = state.graphs[{bucket, step_.layer_max_kv_len}];
  Upload(rank, graph.meta, graph.step);  // same size every time for a bucket: same address
  FeedTokens(rank, graph.step);
  Tensor& logits = LogitsOf(rank);
  if (graph.graph >= 0) {
    backend.ReplayGraph(graph.graph);
    if (rank == 0) ++graph_steps_;
    return false;
  }
  // The bucket's first step runs eagerly (planning its GEMMs), then is captured, with the
  // choices its GEMMs left open decided by timing the captured step (runtime/step_tuning.h).
  // Replaying it writes the same K/V entries and logits again; not H2O's score pool, which
  // adds into itself, so with one the choices keep their pick alone. Nor with several ranks:
  // a replay runs the step's all-reduces, which every rank would have to replay in step.
  backend.MarkTuningScope();
  model.Forward(graph.step, state.pool, state.workspace, logits);
  std::vector<StepTuningOutcome> tuning;
  graph.graph = CaptureTunedGraph(
      backend, [&] { model.Forward(graph.step, state.pool, state.workspace, logits); },
      /*replays_allowed=*/options_.step_tuning && !state.pool.scores.defined() &&
          ranks_.size() == 1,
      &tuning);
  if (!tuning.empty()) {
    spdlog::debug("step tuning, decode bucket {}:\n{}", bucket, DescribeStepTuning(tuning));
  }
  return true;
}

void ModelRunner::RunEager(int rank) {
  Rank& state = ranks_[rank];
  StepMeta& step = state.step;
  Upload(rank, state.device_meta, step);
  FeedTokens(rank, step);
  state.model->EnsureWorkspace(state.workspace, step_.num_tokens, step_.num_prefill_keys,
                               std::max(1, step_.num_sample_rows), step_.max_scores_per_layer,
                               step_.max_indices_per_layer);
  state.model->Forward(step, state.pool, state.workspace, LogitsOf(rank));
}

void ModelRunner::FeedTokens(int rank, StepMeta& step) {
  if (step_.num_fed_tokens == 0) return;
  SIEVE_CHECK(rank == 0 && feed_samples_ != nullptr);
  ranks_[0].model->backend().GatherInt32(*feed_samples_, step.token_feed, step_.num_fed_tokens,
                                         step.token_ids);
}

bool ModelRunner::uses_graphs() const {
  return options_.pad_decode_batches && options_.use_graphs && model_.backend().SupportsGraphs();
}

std::vector<int> ModelRunner::DecodeBuckets() const {
  std::vector<int> buckets;
  const int largest = BucketFor(options_.max_num_seqs);
  for (int batch = 1; batch <= largest; batch = BucketFor(batch) + 1) {
    buckets.push_back(BucketFor(batch));
  }
  return buckets;
}

std::vector<int32_t> ModelRunner::GraphLayerBounds(const std::vector<int>& entries) const {
  // As PrepareStep computes them for a padded step: the step's token makes each layer one
  // longer, and max_kv_len is max_model_len + 1.
  std::vector<int32_t> bounds;
  bounds.reserve(entries.size());
  for (const int held : entries) {
    bounds.push_back(GraphLayerBound(held + 1, options_.max_model_len + 1));
  }
  return bounds;
}

bool ModelRunner::WarmUpDecodeGraph(int bucket, const std::vector<int32_t>& layer_bounds,
                                    const Scheduler& scheduler) {
  if (!uses_graphs() || ranks_[0].graphs.contains({bucket, layer_bounds})) return false;
  SIEVE_CHECK(static_cast<int>(layer_bounds.size()) == model_.config().num_layers);
  SIEVE_CHECK(bucket == BucketFor(bucket) && bucket <= BucketFor(options_.max_num_seqs));
  // A step of padding sequences only: one token each at position 0 in the padding slot. What a
  // graph launches depends on the bucket and the bounds alone; the data of each step is
  // uploaded into the graph's buffer before it replays.
  const StepPlan empty;
  std::vector<SeqId> sample_ids;
  BuildStep(empty, scheduler, sample_ids, bucket);
  step_.layer_max_kv_len = layer_bounds;
  logits_view_ = logits_device_.Rows(0, step_.num_sample_rows);
  bool captured = false;
  ForEachRank([&](int rank) {
    UploadState(rank);
    const bool rank_captured = RunDecodeGraph(rank, bucket);
    if (rank == 0) captured = rank_captured;
  });
  return captured;
}

void ModelRunner::WarmUpPrefill(int tokens) {
  SIEVE_CHECK(tokens > 0);
  const int layers = model_.config().num_layers;
  // Sequences of at most max_model_len tokens each, at position 0, all in one slot: with every
  // write_start at -1 no layer writes an entry (as a compressed layer's prompt, without its
  // jobs) and with no context none is read, so the slot's pages are never touched (any slot
  // does; the padding slot where there is one).
  const int slot = std::max(kv_.padding_slot(), 0);
  const int per_seq = options_.max_model_len;
  const int num_seqs = (tokens + per_seq - 1) / per_seq;
  StepMeta& step = step_;
  step = StepMeta{};
  step.num_seqs = num_seqs;
  step.num_prefill_seqs = num_seqs;
  step.num_layers = layers;
  step.job_begin.assign(layers + 1, 0);
  step.eviction_begin.assign(layers + 1, 0);
  Scratch& s = scratch_;
  for (auto* v : {&s.token_ids, &s.positions, &s.query_start, &s.key_start, &s.context_lens,
                  &s.slots, &s.sample_rows, &s.write_start, &s.token_feed}) {
    v->clear();
  }
  s.query_start.push_back(0);
  s.key_start.push_back(0);
  const int vocab = model_.config().vocab_size;
  for (int seq = 0; seq < num_seqs; ++seq) {
    const int length = std::min(per_seq, tokens - seq * per_seq);
    for (int position = 0; position < length; ++position) {
      // Any valid ids: a GEMM's time does not depend on its values.
      s.token_ids.push_back((position * 7919 + seq) % vocab);
      s.positions.push_back(position);
    }
    step.num_tokens += length;
    step.num_prefill_tokens += length;
    step.num_prefill_keys += length;
    step.prefill_chunks.push_back({length, 0});
    step.max_query_len = std::max(step.max_query_len, length);
    step.max_kv_len = std::max(step.max_kv_len, length);
    s.query_start.push_back(step.num_tokens);
    s.key_start.push_back(static_cast<int32_t>(step.num_prefill_keys));
    s.context_lens.push_back(0);
    s.slots.push_back(slot);
  }
  // One logits row (the logits buffer holds a decode bucket's rows, which may be fewer than
  // these sequences).
  s.sample_rows.push_back(step.num_tokens - 1);
  s.write_start.assign(static_cast<size_t>(layers) * num_seqs, -1);
  for (auto& jobs : s.jobs_by_layer) jobs.clear();
  for (auto& jobs : s.evictions_by_layer) jobs.clear();
  step.num_sample_rows = 1;
  prompt_rows_.clear();
  lengths_ = kv_.lengths();
  PackStep();
  logits_view_ = logits_device_.Rows(0, step_.num_sample_rows);
  ForEachRank([&](int rank) {
    UploadState(rank);
    RunEager(rank);
  });
}

const Tensor& ModelRunner::Run(const StepPlan& plan, const Scheduler& scheduler,
                               std::vector<SeqId>& sample_ids, const TokenFeed* feed) {
  SIEVE_CHECK(feed == nullptr || ranks_.size() == 1)
      << "fed tokens live on rank 0's device; with several ranks every token must be known";
  bool evicts = false;
  for (const ScheduledSequence& decode : plan.decodes) evicts = evicts || decode.evicts;
  const bool padded =
      options_.pad_decode_batches && plan.prefills.empty() && !plan.decodes.empty() && !evicts;
  const int bucket = padded ? BucketFor(static_cast<int>(plan.decodes.size())) : 0;
  BuildStep(plan, scheduler, sample_ids, bucket, feed);
  feed_samples_ = feed != nullptr ? feed->samples : nullptr;
  logits_view_ = logits_device_.Rows(0, step_.num_sample_rows);
  const bool graph = padded && uses_graphs();
  ForEachRank([&](int rank) {
    UploadState(rank);
    if (graph) {
      RunDecodeGraph(rank, bucket);
    } else {
      RunEager(rank);
    }
  });
  return logits_view_;
}

}  // namespace sieve
