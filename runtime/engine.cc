#include "runtime/engine.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <set>
#include <span>
#include <sstream>

#include "core/logging.h"
#include "core/logits.h"

namespace sieve {

std::string_view FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kNone:
      return "none";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kAbort:
      return "abort";
  }
  return "none";
}

double EngineStats::compression_ratio() const {
  int64_t kept = 0;
  for (const int64_t entries : entries_kept_by_layer) kept += entries;
  if (kept == 0) return 1.0;
  return static_cast<double>(compressed_prompt_tokens) * entries_kept_by_layer.size() / kept;
}

Result<DType> ParseKvCacheDtype(std::string_view name, DType activation_dtype) {
  if (name == "auto") return activation_dtype;
  if (name == "fp8") return DType::kF8E4M3;
  if (name == "bf16") {
    if (activation_dtype != DType::kBF16) {
      return InvalidArgumentError(
          std::string(
              "--kv-cache-dtype bf16: this backend's KV cache holds its activation dtype, ") +
          std::string(DTypeName(activation_dtype)) + "; use auto or fp8");
    }
    return activation_dtype;
  }
  return InvalidArgumentError("--kv-cache-dtype '" + std::string(name) +
                              "' is not one of auto, bf16, fp8");
}

Engine::Engine(std::unique_ptr<LlamaModel> model, const Tokenizer* tokenizer,
               std::vector<int32_t> eos_ids, const EngineOptions& options)
    : options_(options),
      model_(std::move(model)),
      tokenizer_(tokenizer),
      eos_ids_(std::move(eos_ids)),
      seed_source_(std::random_device{}()) {}

Engine::~Engine() {
  if (in_flight_ && in_flight_->on_device) {
    std::vector<int32_t> tokens;
    std::vector<float> logprobs;
    model_->backend().TakeSamples(tokens, logprobs);
  }
}

Result<std::unique_ptr<Engine>> Engine::Create(
    std::unique_ptr<LlamaModel> model, const Tokenizer* tokenizer, std::vector<int32_t> eos_ids,
    const EngineOptions& options_in, std::vector<std::unique_ptr<LlamaModel>> other_ranks) {
  EngineOptions options = options_in;
  const ModelConfig& config = model->config();
  const int num_ranks = 1 + static_cast<int>(other_ranks.size());
  if (model->shard().size != num_ranks || model->shard().rank != 0) {
    return InvalidArgumentError(
        "the engine's model is rank " + std::to_string(model->shard().rank) + " of " +
        std::to_string(model->shard().size) + ", given " + std::to_string(num_ranks) + " ranks");
  }
  for (int rank = 1; rank < num_ranks; ++rank) {
    const LlamaModel& other = *other_ranks[rank - 1];
    if (other.shard().rank != rank || other.shard().size != num_ranks ||
        other.config().num_layers != config.num_layers ||
        other.config().vocab_size != config.vocab_size ||
        other.max_positions() != model->max_positions()) {
      return InvalidArgumentError("tensor-parallel rank " + std::to_string(rank) +
                                  " is not a shard of the same model");
    }
  }
  if (options.max_num_seqs < 1) return InvalidArgumentError("--max-num-seqs must be >= 1");
  if (options.max_num_batched_tokens < 1) {
    return InvalidArgumentError("--max-num-batched-tokens must be >= 1");
  }
  if (options.prompt_logprob_rows < 1) {
    return InvalidArgumentError("prompt_logprob_rows must be >= 1");
  }
  if (options.page_size < 1 || options.page_size > 1024) {
    return InvalidArgumentError("--page-size must be in [1, 1024]");
  }
  if (options.prefix_cache_row_entries < -1 || options.prefix_cache_row_entries > (1 << 24)) {
    return InvalidArgumentError("prefix_cache_row_entries must be -1 or in [0, 2^24]");
  }
  if (options.swap_space_bytes < 0) {
    return InvalidArgumentError("--swap-space must not be negative");
  }
  int limit = config.max_position_embeddings;
  if (config.sliding_window && *config.sliding_window < limit) limit = *config.sliding_window;
  if (options.max_model_len <= 0) {
    options.max_model_len = std::min(limit, 8192);
  } else if (options.max_model_len > limit) {
    return InvalidArgumentError("--max-model-len " + std::to_string(options.max_model_len) +
                                " is larger than the model's " + std::to_string(limit));
  }
  if (options.max_model_len > model->max_positions()) {
    return InternalError("the model was loaded for " + std::to_string(model->max_positions()) +
                         " positions but --max-model-len is " +
                         std::to_string(options.max_model_len));
  }
  SIEVE_ASSIGN_OR_RETURN(KvPolicy policy, KvPolicy::Parse(options.kv_policy, config.num_layers,
                                                          options.kv_policy_options));
  if (options.enable_chunked_prefill &&
      policy.FinalChunkRows(options.max_model_len) > options.max_num_batched_tokens &&
      !policy.IsDense()) {
    spdlog::warn(
        "policy {} scores up to {} rows at a prompt's end; longer prompts than "
        "--max-num-batched-tokens {} will be refused",
        policy.ToString(), policy.FinalChunkRows(options.max_model_len),
        options.max_num_batched_tokens);
  }

  int invariant_chunk = 0;  // SchedulerOptions::batch_invariant_chunk
  if (options.batch_invariant) {
    if (!other_ranks.empty() && model->backend().device() != Device::kCpu) {
      // The CPU ranks' in-process communicator sums in rank order, the same bits at any size.
      return UnimplementedError(
          "--batch-invariant with --tensor-parallel-size > 1 on the GPU: NCCL's all-reduce "
          "order depends on the message size, so a row's sum would depend on the batch");
    }
    SIEVE_RETURN_IF_ERROR(model->backend().SetBatchInvariant(true));
    for (const auto& other : other_ranks) {
      SIEVE_RETURN_IF_ERROR(other->backend().SetBatchInvariant(true));
    }
    // A multiple of the page size (a cached prefix ends on one), within every step's budget and
    // the prompt-logprob rows (a chunk must fit an empty step).
    const int page = options.page_size;
    const int most = std::min(options.max_num_batched_tokens, options.prompt_logprob_rows);
    invariant_chunk =
        std::min((options.batch_invariant_chunk + page - 1) / page * page, most / page * page);
    if (invariant_chunk < page) {
      return InvalidArgumentError(
          "--batch-invariant prefills in chunks of whole pages: --max-num-batched-tokens (" +
          std::to_string(options.max_num_batched_tokens) + ") must hold at least one page (" +
          std::to_string(page) + " entries)");
    }
    options.step_tuning = false;  // the invariant GEMM plans leave nothing to tune
  }
  std::unique_ptr<Engine> engine(
      new Engine(std::move(model), tokenizer, std::move(eos_ids), options));
  engine->other_ranks_ = std::move(other_ranks);
  engine->default_policy_ = std::make_unique<KvPolicy>(std::move(policy));
  const KvPolicy& default_policy = *engine->default_policy_;

  // KV memory: every page holds page_size entries of K and V for all KV heads of one layer (a
  // tensor-parallel rank's page: its own KV heads).
  Backend& backend = engine->model_->backend();
  const int64_t entries_per_page = options.page_size;
  const bool score_pool = default_policy.NeedsScorePool() || options.eviction_pools;
  const bool position_pool = default_policy.NeedsPositionPool() || options.eviction_pools;
  const int64_t kv_heads = engine->model_->layout().num_kv_heads;
  SIEVE_ASSIGN_OR_RETURN(const DType cache_dtype,
                         ParseKvCacheDtype(options.kv_cache_dtype, backend.activation_dtype()));
  int64_t bytes_per_page = 2 * entries_per_page * kv_heads * config.head_dim *
                           static_cast<int64_t>(DTypeSize(cache_dtype));
  if (score_pool) bytes_per_page += entries_per_page * kv_heads * 4;
  if (position_pool) bytes_per_page += entries_per_page * kv_heads * 4;
  const int pages_per_seq =
      (options.max_model_len + 1 + options.page_size - 1) / options.page_size + 1;
  const int row_spare_entries = !options.enable_prefix_caching ? 0
                                : options.prefix_cache_row_entries < 0
                                    ? options.max_model_len
                                    : options.prefix_cache_row_entries;
  const int max_pages_per_seq =
      pages_per_seq + (row_spare_entries + options.page_size - 1) / options.page_size;
  // The rows' spare pages hold a sparse prompt's kept entries beside its cached prompt for one
  // step: a pool sized for every sequence at its longest does not count them.
  const int64_t most_useful =
      static_cast<int64_t>(options.max_num_seqs) * pages_per_seq * config.num_layers;
  int64_t budget = options.kv_memory_bytes;  // per rank
  if (budget <= 0) {
    // The device with the least free memory decides (each rank asked on its own device).
    size_t free_bytes = backend.FreeMemoryBytes();
    for (const auto& other : engine->other_ranks_) {
      other->backend().MakeCurrent();
      free_bytes = std::min(free_bytes, other->backend().FreeMemoryBytes());
    }
    backend.MakeCurrent();
    budget = static_cast<int64_t>(options.memory_fraction * static_cast<double>(free_bytes));
    // On the CPU the cache shares RAM with everything else: at most 4 GiB unless asked (as
    // vLLM's CPU backend defaults VLLM_CPU_KVCACHE_SPACE to 4 GB), shared by the ranks.
    if (backend.device() == Device::kCpu) {
      budget = std::min<int64_t>(budget, int64_t{4} << 30) / num_ranks;
    }
  }
  int64_t num_pages = std::min(budget / bytes_per_page, most_useful);
  if (num_pages < config.num_layers) {
    return ResourceExhaustedError("KV memory of " + std::to_string(budget) +
                                  " bytes holds fewer pages than the model has layers; raise "
                                  "--kv-memory (one page is " +
                                  std::to_string(bytes_per_page) + " bytes)");
  }
  num_pages = std::min<int64_t>(num_pages, 1 << 30);
  const bool pad = options.pad_decode_batches || (options.cuda_graphs && backend.SupportsGraphs());
  KvCacheManager::Options kv_options;
  kv_options.num_pages = static_cast<int>(num_pages);
  kv_options.page_size = options.page_size;
  kv_options.num_layers = config.num_layers;
  kv_options.max_seqs = options.max_num_seqs + (pad ? 1 : 0);
  kv_options.max_pages_per_seq = max_pages_per_seq;
  engine->kv_ = std::make_unique<KvCacheManager>(kv_options);
  if (pad) engine->kv_->ReservePaddingSlot();
  SchedulerOptions sched_options;
  sched_options.max_num_seqs = options.max_num_seqs;
  sched_options.max_num_batched_tokens = options.max_num_batched_tokens;
  sched_options.enable_chunked_prefill = options.enable_chunked_prefill;
  sched_options.max_model_len = options.max_model_len;
  sched_options.prompt_logprob_rows = options.prompt_logprob_rows;
  sched_options.enable_prefix_caching = options.enable_prefix_caching;
  sched_options.preemption_mode = options.preemption_mode;
  sched_options.batch_invariant_chunk = invariant_chunk;
  if (options.preemption_mode == PreemptionMode::kSwap) {
    // A slot holds one page of one rank (every rank keeps its own KV heads' slots).
    sched_options.swap_slots = static_cast<int>(
        std::min<int64_t>(options.swap_space_bytes / bytes_per_page, int64_t{1} << 30));
  }
  engine->scheduler_ = std::make_unique<Scheduler>(sched_options, engine->kv_.get());
  ModelRunnerOptions runner_options;
  runner_options.max_num_seqs = options.max_num_seqs;
  runner_options.max_num_batched_tokens = options.max_num_batched_tokens;
  runner_options.max_model_len = options.max_model_len;
  runner_options.pad_decode_batches = pad;
  runner_options.use_graphs = options.cuda_graphs;
  runner_options.step_tuning = options.step_tuning;
  runner_options.score_pool = score_pool;
  runner_options.fp8_kv_cache = cache_dtype == DType::kF8E4M3;
  runner_options.position_pool = position_pool;
  runner_options.prompt_logprob_rows = options.prompt_logprob_rows;
  std::vector<const LlamaModel*> ranks = {engine->model_.get()};
  for (const auto& other : engine->other_ranks_) ranks.push_back(other.get());
  engine->runner_ = std::make_unique<ModelRunner>(ranks, *engine->kv_, runner_options);
  if (sched_options.swap_slots > 0) {
    SIEVE_RETURN_IF_ERROR(engine->runner_->AllocateSwapSpace(sched_options.swap_slots));
  }
  engine->stats_.entries_kept_by_layer.assign(config.num_layers, 0);
  for (Tensor& samples : engine->sampled_tokens_) {
    samples = backend.Allocate({options.max_num_seqs}, DType::kI32);
  }
  engine->options_ = options;
  return engine;
}

WarmUpReport Engine::WarmUp(const WarmUpProgress& progress, bool plan_prefill_anyway) {
  SIEVE_CHECK(requests_.empty() && !HasWork()) << "warm up the engine before adding requests";
  const auto start = std::chrono::steady_clock::now();
  WarmUpReport report;
  // Decode graphs: each bucket x each bound vector a batch of the engine's policy can meet. A
  // bound vector depends on the longest sequence of the batch only through its length, so
  // walking every prompt length finds them all (a handful: dense layers step by 4096 entries).
  std::vector<std::pair<int, const std::vector<int32_t>*>> graphs;
  std::set<std::vector<int32_t>> bound_vectors;
  int largest_graph_rows = 0;
  if (runner_->uses_graphs()) {
    for (int length = 1; length < options_.max_model_len; ++length) {
      bound_vectors.insert(runner_->GraphLayerBounds(default_policy_->EntriesAfterPrompt(length)));
    }
    const std::vector<int> buckets = runner_->DecodeBuckets();
    for (const int bucket : buckets) {
      for (const auto& bounds : bound_vectors) graphs.emplace_back(bucket, &bounds);
    }
    report.decode_buckets = static_cast<int>(buckets.size());
    report.layer_bounds = static_cast<int>(bound_vectors.size());
    largest_graph_rows = buckets.back();
  }
  // Prefill sizes: GEMM plans of up to largest_graph_rows rows were made by the decode graphs.
  std::vector<int> prefill_sizes;
  if (plan_prefill_anyway || model_->backend().PlansShapes()) {
    int smallest = 1;
    while (smallest <= largest_graph_rows) smallest *= 2;
    for (int rows = smallest; rows < 2 * options_.max_num_batched_tokens; rows *= 2) {
      prefill_sizes.push_back(rows);
    }
  }
  const int total = static_cast<int>(graphs.size() + prefill_sizes.size());
  int done = 0;
  const auto advance = [&] {
    ++done;
    return !progress || progress(done, total);
  };
  for (const auto& [bucket, bounds] : graphs) {
    if (runner_->WarmUpDecodeGraph(bucket, *bounds, *scheduler_)) ++report.decode_graphs;
    if (!advance()) {
      report.stopped = true;
      break;
    }
  }
  for (const int rows : prefill_sizes) {
    if (report.stopped) break;
    runner_->WarmUpPrefill(rows);
    ++report.prefill_steps;
    report.stopped = !advance();
  }
  model_->backend().Synchronize();
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return report;
}

std::string Engine::Describe() const {
  std::ostringstream out;
  const ModelConfig& config = model_->config();
  out << config.Summary() << "\n"
      << "backend: " << model_->backend().name();
  for (const auto& other : other_ranks_) out << ", " << other->backend().name();
  if (!other_ranks_.empty()) {
    const ShardLayout& layout = model_->layout();
    out << " (tensor parallel: " << 1 + other_ranks_.size() << " ranks of " << layout.num_out_heads
        << " heads, " << layout.num_kv_heads << " KV heads"
        << (layout.replicated_kv() ? " replicated" : "") << ", " << layout.ffn_size
        << " MLP units)";
  }
  out << "\n"
      << "kv policy: " << default_policy_->ToString() << "\n"
      << "kv pool: " << kv_->num_pages() << " pages of " << options_.page_size << " entries ("
      << runner_->pool_bytes() / (1024.0 * 1024.0) << " MiB, "
      << (runner_->fp8_kv_cache() ? "fp8 e4m3 with per-(layer, KV head) scales"
                                  : std::string(DTypeName(model_->backend().activation_dtype())))
      << "), max model len " << options_.max_model_len << ", max seqs " << options_.max_num_seqs
      << ", max batched tokens " << options_.max_num_batched_tokens
      << (options_.enable_chunked_prefill ? ", chunked prefill" : "")
      << (options_.batch_invariant
              ? ", batch-invariant (prefill chunks of " +
                    std::to_string(scheduler_->options().batch_invariant_chunk) + " tokens)"
              : "");
  return out.str();
}

Result<RequestId> Engine::Add(Request request) {
  SIEVE_RETURN_IF_ERROR(request.sampling.Validate());
  const int vocab = model_->config().vocab_size;
  for (const int32_t token : request.prompt) {
    if (token < 0 || token >= vocab) {
      return InvalidArgumentError("token id " + std::to_string(token) +
                                  " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
    }
  }
  for (const int32_t token : request.forced_tokens) {
    if (token < 0 || token >= vocab) {
      return InvalidArgumentError("forced token id " + std::to_string(token) +
                                  " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
    }
  }
  if (request.sample_after_forced && request.forced_tokens.empty()) {
    return InvalidArgumentError("sample_after_forced without forced tokens");
  }
  if (request.sample_after_forced) {
    // The sequence's generated tokens are the forced ones, then up to max_tokens sampled.
    const int64_t total =
        static_cast<int64_t>(request.sampling.max_tokens) + request.forced_tokens.size();
    request.sampling.max_tokens =
        static_cast<int>(std::min<int64_t>(total, std::numeric_limits<int>::max()));
  } else if (!request.forced_tokens.empty()) {
    request.sampling.max_tokens =
        std::min(request.sampling.max_tokens, static_cast<int>(request.forced_tokens.size()));
  }
  if (!request.sampling.stop.empty() && tokenizer_ == nullptr) {
    return InvalidArgumentError("stop strings need a tokenizer");
  }
  std::unique_ptr<KvPolicy> own_policy;
  if (!request.kv_policy.empty() || request.kv_policy_options) {
    const std::string& spec = request.kv_policy.empty() ? options_.kv_policy : request.kv_policy;
    auto parsed = KvPolicy::Parse(spec, model_->config().num_layers,
                                  request.kv_policy_options.value_or(default_policy_->options()));
    if (!parsed.ok()) return parsed.status().WithContext("kv_policy");
    if ((parsed->NeedsScorePool() && !runner_->pool().scores.defined()) ||
        (parsed->NeedsPositionPool() && !runner_->pool().positions.defined())) {
      return InvalidArgumentError("kv_policy '" + spec +
                                  "' evicts during decode, which this server was not started "
                                  "for (start it with such a --kv-policy)");
    }
    own_policy = std::make_unique<KvPolicy>(std::move(parsed).value());
  }
  const KvPolicy& policy = own_policy ? *own_policy : *default_policy_;
  const int prompt_len = static_cast<int>(request.prompt.size());
  const int max_total = std::min(options_.max_model_len, prompt_len + request.sampling.max_tokens);
  // A prompt that generates nothing (max_tokens 0) is checked as one that generates a token.
  SIEVE_RETURN_IF_ERROR(
      scheduler_->CanEverSchedule(prompt_len, std::max(max_total, prompt_len + 1), policy));
  const bool prompt_logprobs = request.sampling.prompt_logprobs >= 0;
  if (prompt_logprobs) {
    // Every prefill row of such a request is a row of logits, at most prompt_logprob_rows a step;
    // the rows a policy scores must all be in the prompt's last chunk (or the whole prompt in one
    // step without chunked prefill).
    const int one_step =
        options_.enable_chunked_prefill ? policy.FinalChunkRows(prompt_len) : prompt_len;
    if (one_step > options_.prompt_logprob_rows) {
      return InvalidArgumentError(
          "prompt logprobs of this prompt need " + std::to_string(one_step) +
          " rows of logits in one step " +
          (options_.enable_chunked_prefill
               ? "(policy " + policy.ToString() + " scores that many rows at the prompt's end)"
               : std::string("(chunked prefill is off)")) +
          " but the engine computes at most " + std::to_string(options_.prompt_logprob_rows));
    }
  }

  const RequestId id = next_id_++;
  RequestState state;
  state.id = id;
  state.sampling = request.sampling;
  state.num_prompt_tokens = prompt_len;
  state.device_seed = request.sampling.seed ? *request.sampling.seed : seed_source_();
  state.rng.seed(state.device_seed);
  if (tokenizer_)
    state.decoder.emplace(*tokenizer_, /*skip_special_tokens=*/true, /*continuation=*/true);
  Sequence seq;
  seq.id = id;
  seq.arrival = arrivals_++;
  seq.tokens = std::move(request.prompt);
  seq.num_prompt_tokens = prompt_len;
  seq.max_total_tokens = max_total;
  seq.policy = &policy;
  seq.prompt_logprobs = prompt_logprobs && prompt_len > 1;
  state.own_policy = std::move(own_policy);
  state.forced_tokens = std::move(request.forced_tokens);
  state.sample_after_forced = request.sample_after_forced;
  requests_.emplace(id, std::move(state));
  scheduler_->Add(std::move(seq));
  return id;
}

bool Engine::Abort(RequestId id) {
  const auto it = requests_.find(id);
  if (it == requests_.end()) return false;
  const Sequence* seq = scheduler_->Find(id);
  RequestOutput output;
  output.id = id;
  output.finished = true;
  output.finish_reason = FinishReason::kAbort;
  output.num_prompt_tokens = it->second.num_prompt_tokens;
  output.num_generated_tokens = seq ? seq->num_known_generated() : 0;
  scheduler_->Remove(id);
  requests_.erase(it);
  pending_outputs_.push_back(std::move(output));
  return true;
}

bool Engine::HasWork() const {
  return scheduler_->HasWork() || !pending_outputs_.empty() || in_flight_.has_value();
}

void Engine::Finish(RequestState& state, RequestOutput& output, FinishReason reason) {
  if (state.decoder) state.text += state.decoder->Flush();
  output.finished = true;
  output.finish_reason = reason;
}

RequestOutput Engine::Advance(RequestState& state, Sequence& seq, const SampleResult& sample,
                              int position) {
  const SamplingParams& params = state.sampling;
  const int32_t token = sample.token;
  SIEVE_CHECK(position < static_cast<int>(seq.tokens.size()) &&
              seq.tokens[position] == kUnknownToken);
  seq.tokens[position] = token;
  // Later tokens may be placeholders of a step in flight: count to this one.
  const int generated = position + 1 - seq.num_prompt_tokens;
  ++stats_.generation_tokens;
  RequestOutput output;
  output.id = state.id;
  output.new_tokens.push_back(token);
  const bool forced = generated <= static_cast<int>(state.forced_tokens.size());
  if (params.logprobs >= 0 || forced) output.new_logprobs.push_back(sample);
  if (params.prompt_logprobs >= 0 && !state.prompt_logprobs_sent) {
    output.prompt_logprobs = std::move(state.prompt_logprobs);
    state.prompt_logprobs_sent = true;
  }

  // Forced text is scored to its end: its EOS or stop tokens are just tokens.
  const bool is_eos =
      !forced && std::find(eos_ids_.begin(), eos_ids_.end(), token) != eos_ids_.end();
  const bool is_stop_token =
      !forced && std::find(params.stop_token_ids.begin(), params.stop_token_ids.end(), token) !=
                     params.stop_token_ids.end();
  size_t search_from = state.text.size();
  // Forced tokens before sampled ones are context, not output: their text is not the answer's.
  const bool context_token = forced && state.sample_after_forced;
  if (state.decoder && !(is_eos && !params.ignore_eos) && !context_token) {
    state.text += state.decoder->Push(token);
  }
  if (is_eos && !params.ignore_eos) {
    Finish(state, output, FinishReason::kStop);
    if (tokenizer_) output.stop_reason = tokenizer_->TokenBytes(token);
  } else if (is_stop_token) {
    Finish(state, output, FinishReason::kStop);
    output.stop_reason = std::to_string(token);
  } else {
    // A stop string may straddle the tokens: search from where the longest could have begun.
    size_t longest = 0;
    for (const std::string& stop : params.stop) longest = std::max(longest, stop.size());
    search_from = search_from >= longest ? search_from - longest + 1 : 0;
    size_t first_match = std::string::npos;
    for (const std::string& stop : forced ? std::span<const std::string>() : params.stop) {
      const size_t position = state.text.find(stop, search_from);
      if (position != std::string::npos && position < first_match) {
        first_match = position;
        output.stop_reason = stop;
      }
    }
    if (first_match != std::string::npos) {
      Finish(state, output, FinishReason::kStop);
      state.text.resize(first_match);  // the stop string and anything after it are dropped
    } else if (generated >= params.max_tokens || position + 1 >= seq.max_total_tokens) {
      Finish(state, output, FinishReason::kLength);
    }
  }
  // Emit complete text, holding back what could still become the start of a stop string.
  size_t emit_to = state.text.size();
  if (!output.finished) {
    size_t hold = 0;
    for (const std::string& stop : params.stop) hold = std::max(hold, stop.size() - 1);
    emit_to = emit_to > state.emitted + hold ? emit_to - hold : state.emitted;
    // Never split a UTF-8 character.
    while (emit_to > state.emitted && emit_to < state.text.size() &&
           (static_cast<uint8_t>(state.text[emit_to]) & 0xc0) == 0x80) {
      --emit_to;
    }
  }
  if (emit_to > state.emitted) {
    output.new_text = state.text.substr(state.emitted, emit_to - state.emitted);
    state.emitted = emit_to;
  }
  output.num_prompt_tokens = state.num_prompt_tokens;
  output.num_generated_tokens = generated;
  return output;
}

std::vector<RequestOutput> Engine::Step() {
  std::vector<RequestOutput> outputs;
  outputs.swap(pending_outputs_);
  if (in_flight_) {
    // The next step is planned and launched before the samples of the one in flight are read,
    // when it can run without them on the host (the device feeds them to it): the host's work
    // below then runs while the device computes.
    std::optional<LaunchedStep> next;
    if (scheduler_->HasSchedulableWork()) {
      scheduler_->Plan(plan_);
      if (!plan_.empty() && CanLaunchAhead(plan_)) {
        CommitPlan();
        next = Launch(plan_, &*in_flight_);
        ++stats_.steps_launched_ahead;
      }
    }
    Collect(*in_flight_, outputs);
    in_flight_ = std::move(next);
    // The backend declined (sampled on the host), or some rows are the host's: the next step
    // needs their tokens from the host.
    if (in_flight_ && (!in_flight_->on_device || !in_flight_->host_rows.empty())) {
      Collect(*in_flight_, outputs);
      in_flight_.reset();
    }
    return outputs;
  }
  if (!scheduler_->HasWork()) return outputs;
  scheduler_->Plan(plan_);
  CommitPlan();
  if (plan_.empty()) return outputs;
  in_flight_ = Launch(plan_, nullptr);
  // Left in flight only when a next step could be launched before its samples are read.
  if (!options_.overlap_steps || !in_flight_->on_device || !in_flight_->host_rows.empty() ||
      runner_->num_ranks() > 1 || !scheduler_->HasSchedulableWork()) {
    Collect(*in_flight_, outputs);
    in_flight_.reset();
  }
  return outputs;
}

void Engine::CommitPlan() {
  scheduler_->Commit(plan_);
  // Before the step: it may write the pages swapped out and reads those swapped in.
  if (!scheduler_->swaps().empty()) runner_->SwapPages(scheduler_->swaps());
}

bool Engine::CanLaunchAhead(const StepPlan& plan) const {
  if (!options_.overlap_steps || runner_->num_ranks() > 1) return false;
  for (const auto* list : {&plan.prefills, &plan.decodes}) {
    for (const ScheduledSequence& scheduled : *list) {
      if (!scheduled.sample) continue;
      const RequestState& state = requests_.at(scheduled.id);
      if (!state.forced_tokens.empty() || !state.sampling.SamplesOnDevice()) return false;
    }
  }
  // Prompt logprobs are read from the step's logits on the host as soon as it has run.
  for (const ScheduledSequence& scheduled : plan.prefills) {
    if (scheduler_->Find(scheduled.id)->prompt_logprobs) return false;
  }
  return true;
}

Engine::LaunchedStep Engine::Launch(const StepPlan& plan, const LaunchedStep* previous) {
  LaunchedStep step;
  ModelRunner::TokenFeed* feed = nullptr;
  if (previous != nullptr) {
    SIEVE_CHECK(previous->on_device);
    feed = &token_feed_;
    feed->samples = &sampled_tokens_[previous->samples_buffer];
    feed->rows.clear();
    for (size_t row = 0; row < previous->sample_ids.size(); ++row) {
      if (previous->positions[row] < 0) continue;
      feed->rows[previous->sample_ids[row]] = {previous->positions[row], static_cast<int>(row)};
    }
  }
  ++stats_.steps;
  const Tensor& logits = runner_->Run(plan, *scheduler_, step.sample_ids, feed);
  ReadPromptLogprobs(logits, step.sample_ids.size());
  scheduler_->Complete(plan);
  for (const ScheduledSequence& scheduled : plan.prefills) {
    stats_.prompt_tokens += scheduled.num_tokens;
    if (!scheduled.final_chunk) continue;
    RequestState& state = requests_.at(scheduled.id);
    if (state.prefill_recorded) continue;  // a recompute after preemption is not a new prompt
    state.prefill_recorded = true;
    stats_.compressed_prompt_tokens += scheduled.context_len + scheduled.num_tokens;
    const std::span<const int> kept = plan.LengthsAfter(scheduled);
    for (size_t layer = 0; layer < kept.size(); ++layer)
      stats_.entries_kept_by_layer[layer] += kept[layer];
  }
  stats_.peak_pages_used = std::max(stats_.peak_pages_used, kv_->num_used_pages());
  FinishPromptOnly(plan);

  SampleRows(logits, step);
  // Each sample's place in its sequence, held by a placeholder until it is read. A sequence
  // whose sample is its last by length gets no further step.
  step.positions.reserve(step.sample_ids.size());
  for (const SeqId id : step.sample_ids) {
    Sequence& seq = *scheduler_->Find(id);
    if (!seq.caught_up()) {  // a preempted sequence replaying known tokens
      step.positions.push_back(-1);
      continue;
    }
    step.positions.push_back(static_cast<int>(seq.tokens.size()));
    seq.tokens.push_back(kUnknownToken);
    if (static_cast<int>(seq.tokens.size()) >= seq.max_total_tokens) seq.finishing = true;
  }
  return step;
}

void Engine::Collect(LaunchedStep& step, std::vector<RequestOutput>& outputs) {
  if (step.on_device) {
    std::vector<int32_t> tokens;
    std::vector<float> logprobs;
    model_->backend().TakeSamples(tokens, logprobs);
    SIEVE_CHECK(tokens.size() == step.sample_ids.size() && logprobs.size() == tokens.size());
    step.host_samples.resize(tokens.size());
    for (size_t row = 0; row < tokens.size(); ++row) {
      if (!step.host_rows.empty() && step.host_rows[row] != 0) continue;  // sampled on the host
      step.host_samples[row].token = tokens[row];
      step.host_samples[row].logprob = logprobs[row];
    }
    step.on_device = false;
  }
  for (size_t row = 0; row < step.sample_ids.size(); ++row) {
    if (step.positions[row] < 0) continue;
    const SeqId id = step.sample_ids[row];
    const auto it = requests_.find(id);
    if (it == requests_.end()) continue;  // aborted (or finished) since the step was launched
    Sequence& seq = *scheduler_->Find(id);
    RequestOutput output = Advance(it->second, seq, step.host_samples[row], step.positions[row]);
    if (output.finished) {
      scheduler_->Remove(id);
      requests_.erase(it);
    }
    outputs.push_back(std::move(output));
  }
}

namespace {

// The prompt-logprob entry of one row of logits: `token`'s log-probability under the raw
// distribution and the `top` most likely tokens (ties: the lower id first, as the sampler's).
SampleResult PromptLogprob(std::span<const float> logits, int32_t token, int top,
                           std::vector<int32_t>& order) {
  const float log_sum = LogSumExp(logits);
  SampleResult result;
  result.token = token;
  result.logprob = logits[static_cast<size_t>(token)] - log_sum;
  if (top <= 0) return result;
  const auto better = [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  // A heap of the best `top` so far: a pass over the vocabulary, no sort of it.
  order.clear();
  for (int32_t id = 0; id < static_cast<int32_t>(logits.size()); ++id) {
    if (static_cast<int>(order.size()) < top) {
      order.push_back(id);
      std::push_heap(order.begin(), order.end(), better);
    } else if (better(id, order.front())) {
      std::pop_heap(order.begin(), order.end(), better);
      order.back() = id;
      std::push_heap(order.begin(), order.end(), better);
    }
  }
  std::sort_heap(order.begin(), order.end(), better);
  for (const int32_t id : order) {
    result.top_logprobs.push_back({id, logits[static_cast<size_t>(id)] - log_sum});
  }
  return result;
}

}  // namespace

void Engine::ReadPromptLogprobs(const Tensor& logits, size_t num_sampled) {
  const std::vector<ModelRunner::PromptRow>& rows = runner_->prompt_rows();
  if (rows.empty()) return;
  const int vocab = model_->config().vocab_size;
  // Copied in pieces so that the host buffer stays small whatever prompt_logprob_rows is.
  constexpr size_t kPiece = 32;
  std::vector<int32_t> order;
  for (size_t begin = 0; begin < rows.size(); begin += kPiece) {
    const size_t end = std::min(rows.size(), begin + kPiece);
    prompt_logits_.resize((end - begin) * vocab);
    model_->backend().CopyToHost(logits.Rows(static_cast<int64_t>(num_sampled + begin),
                                             static_cast<int64_t>(num_sampled + end)),
                                 prompt_logits_.data());
    for (size_t row = begin; row < end; ++row) {
      const ModelRunner::PromptRow& prompt_row = rows[row];
      RequestState& state = requests_.at(prompt_row.id);
      // A prompt computed again after a preemption: its logprobs were read the first time.
      if (static_cast<size_t>(prompt_row.position) < state.prompt_logprobs.size()) continue;
      SIEVE_CHECK(static_cast<size_t>(prompt_row.position) == state.prompt_logprobs.size());
      const Sequence& seq = *scheduler_->Find(prompt_row.id);
      const std::span<const float> row_logits(prompt_logits_.data() + (row - begin) * vocab,
                                              static_cast<size_t>(vocab));
      state.prompt_logprobs.push_back(
          PromptLogprob(row_logits, seq.tokens[static_cast<size_t>(prompt_row.position) + 1],
                        state.sampling.prompt_logprobs, order));
    }
  }
}

void Engine::FinishPromptOnly(const StepPlan& plan) {
  for (const ScheduledSequence& scheduled : plan.prefills) {
    if (!scheduled.final_chunk) continue;
    Sequence& seq = *scheduler_->Find(scheduled.id);
    seq.prompt_logprobs = false;  // scored: a recompute after a preemption need not score it
    if (scheduled.sample) continue;
    // max_tokens 0: the prompt was all there was to compute.
    const auto it = requests_.find(scheduled.id);
    RequestState& state = it->second;
    RequestOutput output;
    output.id = state.id;
    output.prompt_logprobs = std::move(state.prompt_logprobs);
    output.finished = true;
    output.finish_reason = FinishReason::kLength;
    output.num_prompt_tokens = state.num_prompt_tokens;
    scheduler_->Remove(scheduled.id);
    requests_.erase(it);
    pending_outputs_.push_back(std::move(output));
  }
}

void Engine::SampleRows(const Tensor& logits, LaunchedStep& step) {
  const std::vector<SeqId>& sample_ids = step.sample_ids;
  const size_t rows = sample_ids.size();
  std::vector<Backend::DeviceSamplingRow> device_rows;
  device_rows.reserve(rows);
  bool on_device = true;
  // Batch invariance: a row's sampler is its request's own choice, never its batch's. A row the
  // device cannot sample is sampled on the host below while the others go to the device (which
  // samples a greedy placeholder in its place), so that a request that samples on the device
  // alone does so in any crowd: the two samplers draw different random streams.
  std::vector<uint8_t> host_rows;
  for (const SeqId id : sample_ids) {
    const RequestState& state = requests_.at(id);
    const SamplingParams& p = state.sampling;
    const Sequence& seq = *scheduler_->Find(id);
    if (!p.SamplesOnDevice() || !state.forced_tokens.empty()) {
      if (!options_.batch_invariant) {
        on_device = false;
        break;
      }
      host_rows.resize(rows, 0);
      host_rows[device_rows.size()] = 1;
      device_rows.push_back({0.0f, 0, 1.0f, 0.0f, 0, 0});
      continue;
    }
    device_rows.push_back({p.temperature, p.top_k, p.top_p, p.min_p, state.device_seed,
                           static_cast<uint64_t>(seq.num_generated())});
  }
  Backend& backend = model_->backend();
  if (on_device && backend.BeginSampling(logits.Rows(0, static_cast<int64_t>(rows)), device_rows,
                                         sampled_tokens_[next_samples_buffer_])) {
    step.on_device = true;
    step.samples_buffer = next_samples_buffer_;
    next_samples_buffer_ ^= 1;
    if (host_rows.empty()) return;
    step.host_rows = std::move(host_rows);
  } else {
    step.host_rows.clear();
  }
  step.host_samples.assign(rows, SampleResult{});
  const int vocab = model_->config().vocab_size;
  host_logits_.resize(rows * vocab);
  if (rows > 0) backend.CopyToHost(logits.Rows(0, static_cast<int64_t>(rows)), host_logits_.data());
  for (size_t row = 0; row < rows; ++row) {
    const SeqId id = sample_ids[row];
    const Sequence& seq = *scheduler_->Find(id);
    // Replayed tokens are known: sampling them would move the request's random stream.
    if (!seq.caught_up()) continue;
    if (!step.host_rows.empty() && step.host_rows[row] == 0) continue;  // the device's
    RequestState& state = requests_.at(id);
    const std::span<float> row_logits(host_logits_.data() + row * vocab, vocab);
    if (static_cast<size_t>(seq.num_generated()) < state.forced_tokens.size()) {
      const int32_t token = state.forced_tokens[static_cast<size_t>(seq.num_generated())];
      step.host_samples[row].token = token;
      step.host_samples[row].logprob = LogSoftmaxAt(row_logits, token);
      continue;
    }
    step.host_samples[row] =
        Sampler::Sample(row_logits, state.sampling, seq.tokens, seq.num_prompt_tokens, state.rng);
  }
}

EngineStats Engine::Stats() const {
  EngineStats stats = stats_;
  stats.num_running = scheduler_->num_running();
  stats.num_waiting = scheduler_->num_waiting();
  stats.num_pages = kv_->num_pages();
  stats.num_pages_used = kv_->num_used_pages();
  stats.num_preemptions = scheduler_->num_preemptions();
  stats.num_swapped = scheduler_->num_swapped();
  stats.num_swap_slots_used =
      scheduler_->options().swap_slots > 0
          ? scheduler_->options().swap_slots - scheduler_->num_free_swap_slots()
          : 0;
  stats.num_swapped_out = scheduler_->num_swapped_out();
  stats.num_swapped_in = scheduler_->num_swapped_in();
  stats.num_swapped_removed = scheduler_->num_swapped_removed();
  stats.num_swap_fallbacks = scheduler_->num_swap_fallbacks();
  stats.num_replayed_tokens = scheduler_->num_replayed_tokens();
  stats.prefix_cache_queries = scheduler_->prefix_cache_queries();
  stats.prefix_cache_hits = scheduler_->prefix_cache_hits();
  stats.num_cached_pages = kv_->num_cached_pages();
  stats.num_evicted_pages = kv_->num_evicted_pages();
  stats.num_decode_graphs = runner_->num_graphs();
  stats.pages_used_by_layer.resize(kv_->num_layers());
  for (int layer = 0; layer < kv_->num_layers(); ++layer) {
    stats.pages_used_by_layer[layer] = kv_->PagesUsedByLayer(layer);
  }
  return stats;
}

}  // namespace sieve
