#include "tools/engine_flags.h"

#include <cctype>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/in_process_communicator.h"
#include "core/logging.h"
#include "core/thread_pool.h"
#include "model/tensor_parallel.h"

#ifdef SIEVE_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/nccl_communicator.h"
#endif

namespace sieve {

void AddEngineFlags(CLI::App& app, EngineFlags& flags, bool policy_flags) {
  app.add_option("--model", flags.load.model_dir,
                 "Hugging Face model directory (config.json, *.safetensors, tokenizer). Without "
                 "it: Sieve's default model sieve-tiny-10m (a 10M-parameter long-context "
                 "retrieval model, models/sieve-tiny-10m)");
  app.add_option("--tokenizer", flags.load.tokenizer_path,
                 "Tokenizer to use instead of the model's: a directory, tokenizer.json or "
                 "tokenizer.model");
  app.add_option("--load-format", flags.load.load_format,
                 "auto | safetensors | dummy (seeded random weights of the config's shape)")
      ->capture_default_str();
  app.add_option("--dummy-seed", flags.load.dummy_seed, "Seed of --load-format dummy weights")
      ->capture_default_str();
  app.add_option("--quantization", flags.load.quantization,
                 "none | fp8: fp8 quantizes the layers' linear weights at load to e4m3 with one "
                 "scale per output channel, and each GEMM's input per token as it runs (vLLM's "
                 "--quantization fp8; embeddings and the LM head stay bf16). A published FP8 "
                 "checkpoint (compressed-tensors or ModelOpt) is detected from its config and "
                 "loaded as it is, whatever this says. GPU: sm_89 or newer")
      ->check(CLI::IsMember({"none", "fp8"}))
      ->capture_default_str();
  app.add_option("--chat-template", flags.load.chat_template,
                 "Override the chat format: llama3 | llama2 | mistral");
  app.add_option("--device", flags.device, "auto | cpu | cuda | cuda:N")->capture_default_str();
  app.add_option("--threads", flags.threads, "CPU threads (0: all cores; also SIEVE_NUM_THREADS)");
  app.add_option("--tensor-parallel-size", flags.tensor_parallel_size,
                 "Ranks the model is split over (heads, KV heads and MLP; one worker thread "
                 "each): GPUs cuda:K .. cuda:K+N-1 with --device cuda[:K], or CPU ranks sharing "
                 "--threads. --kv-memory is per rank")
      ->capture_default_str();
  app.add_flag("--enforce-eager", flags.enforce_eager,
               "Run decode steps eagerly instead of as CUDA graphs (for debugging and profiling)");
  app.add_flag("--no-step-tuning", flags.no_step_tuning,
               "Capture each decode batch size's graph without timing the captured step to choose "
               "between near-equal GEMM kernels (saves ~1-3 s on its first step, at up to 2% of "
               "the step's speed)");
  app.add_flag("--batch-invariant", flags.engine.batch_invariant,
               "Make a request's greedy or seeded output bitwise independent of the batch it "
               "runs in (dense and under every policy, CUDA graphs kept). GPU: one GEMM "
               "configuration per weight for every row count (no split-k, skinny kernel or step "
               "tuning) and decode attention cut into pieces of a fixed number of entries. "
               "Everywhere: prompts prefilled in chunks of 256 tokens cut where the request "
               "alone would cut them, preempted requests replaying their generated tokens as "
               "decode steps, each request sampled on the device or the host as it would be "
               "alone. The CPU kernels are batch-invariant already. Costs GPU throughput (not "
               "measured yet); refused with GPU tensor parallelism (NCCL's sums follow the "
               "message size). runtime/README.md \"Batch invariance\"");
  app.add_option("--max-model-len", flags.engine.max_model_len,
                 "Context length: prompt + generated tokens (0: the model's, at most 8192)")
      ->capture_default_str();
  app.add_option("--max-num-seqs", flags.engine.max_num_seqs, "Sequences running at once")
      ->capture_default_str();
  app.add_option("--max-num-batched-tokens", flags.engine.max_num_batched_tokens,
                 "Tokens computed per engine step (prefill chunks + decodes). Larger steps "
                 "prefill at a higher rate (more output tok/s under load); smaller ones keep the "
                 "time to first token and the gaps between tokens short (sched/README.md "
                 "has the measured trade)")
      ->capture_default_str();
  app.add_flag("--no-chunked-prefill", flags.no_chunked_prefill,
               "Prefill each prompt in one step (it must fit --max-num-batched-tokens)");
  app.add_flag("--enable-prefix-caching,!--no-enable-prefix-caching", flags.enable_prefix_caching,
               "Share the KV pages of prompt tokens a request has in common with earlier ones "
               "(whole pages from the prompt's start): computed once, kept after their requests "
               "end until the pool needs the room (default on, as in vLLM). Exact under every "
               "policy: a sparse request shares its prompt's pages as computed and compresses "
               "into pages of its own. H2O requests and those asking for prompt logprobs "
               "neither reuse nor leave pages (kv/README.md \"Prefix caching\")");
  app.add_option("--preemption-mode", flags.preemption_mode,
                 "recompute | swap: how a running request that must give back its KV pages is "
                 "preempted. recompute frees them and computes the request again later (a sparse "
                 "request replays its generated tokens one decode step each); swap copies its "
                 "pages to host memory (--swap-space) and back, then it goes on decoding. A swap "
                 "that does not fit the swap space recomputes instead (sched/README.md "
                 "\"Preemption\")")
      ->check(CLI::IsMember({"recompute", "swap"}))
      ->capture_default_str();
  app.add_option("--swap-space", flags.swap_space_gib,
                 "GiB of host memory (pinned on the GPU, per tensor-parallel rank) for the KV "
                 "pages of requests preempted with --preemption-mode swap, allocated at start-up "
                 "(vLLM's --swap-space)")
      ->capture_default_str();
  app.add_option("--page-size", flags.engine.page_size, "KV entries per page")
      ->capture_default_str();
  app.add_option("--kv-memory", flags.kv_memory,
                 "Bytes for the KV cache, e.g. 2G (default: --gpu-memory-utilization of free "
                 "memory)");
  app.add_option("--kv-cache-dtype", flags.engine.kv_cache_dtype,
                 "auto | bf16 | fp8: fp8 stores the KV cache as e4m3 with one scale per layer and "
                 "KV head (the checkpoint's k_scale/v_scale, else a bound from the weights that "
                 "no input exceeds), twice the entries in the same memory; auto (and bf16) keep "
                 "the activation dtype (vLLM's --kv-cache-dtype)")
      ->check(CLI::IsMember({"auto", "bf16", "fp8"}))
      ->capture_default_str();
  app.add_option("--gpu-memory-utilization", flags.engine.memory_fraction,
                 "Fraction of the device's free memory (after weights) given to the KV cache")
      ->capture_default_str();
  KvPolicyOptions& kv = flags.engine.kv_policy_options;
  if (policy_flags) {
    app.add_option("--kv-policy", flags.engine.kv_policy,
                   "KV-cache policy per layer range: full | snapkv | pyramidkv | streamingllm | "
                   "h2o, e.g. \"full:0-2,pyramidkv:3-31\"")
        ->capture_default_str();
    app.add_option("--kv-budget", kv.budget, "Entries kept per sparse layer (PyramidKV: average)")
        ->capture_default_str();
  }
  app.add_option("--kv-window", kv.window, "Observation window: last prompt tokens scored and kept")
      ->capture_default_str();
  app.add_option("--kv-pool", flags.kv_pool, "Pooling of window scores: max | avg | none")
      ->capture_default_str();
  app.add_option("--kv-kernel", kv.kernel, "Pooling kernel (odd)")->capture_default_str();
  app.add_option("--kv-group-reduce", flags.kv_group_reduce,
                 "GQA aggregation of a KV head's query heads: mean | max")
      ->capture_default_str();
  app.add_option("--kv-pyramid-beta", kv.beta, "PyramidKV top/bottom budget ratio")
      ->capture_default_str();
  app.add_option("--kv-sinks", kv.sinks, "StreamingLLM attention sinks")->capture_default_str();
  app.add_option("--kv-recent", kv.recent, "StreamingLLM / H2O recent entries kept")
      ->capture_default_str();
  app.add_option("--kv-heavy", kv.heavy, "H2O heavy-hitter entries kept")->capture_default_str();
  app.add_option("--kv-decode-cap", kv.decode_cap,
                 "Cap on a layer's entries during decode (0: none); evicts one per step past it")
      ->capture_default_str();
  app.add_option("--kv-decode-cap-by", flags.kv_decode_cap_by,
                 "What the decode cap evicts: score (lowest accumulated attention) | oldest")
      ->capture_default_str();
}

Result<int64_t> ParseByteSize(const std::string& text) {
  if (text.empty()) return InvalidArgumentError("empty byte size");
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (...) {
    return InvalidArgumentError("bad byte size '" + text + "' (e.g. 512M, 4G)");
  }
  std::string suffix = text.substr(used);
  for (char& c : suffix) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  double scale = 1;
  if (suffix == "K" || suffix == "KB" || suffix == "KIB")
    scale = 1024.0;
  else if (suffix == "M" || suffix == "MB" || suffix == "MIB")
    scale = 1024.0 * 1024;
  else if (suffix == "G" || suffix == "GB" || suffix == "GIB")
    scale = 1024.0 * 1024 * 1024;
  else if (!suffix.empty() && suffix != "B")
    return InvalidArgumentError("bad byte size '" + text + "'");
  if (value <= 0) return InvalidArgumentError("byte size must be positive: '" + text + "'");
  return static_cast<int64_t>(value * scale);
}

namespace {

Result<PoolKind> ParsePool(const std::string& name) {
  if (name == "max") return PoolKind::kMax;
  if (name == "avg") return PoolKind::kAvg;
  if (name == "none") return PoolKind::kNone;
  return InvalidArgumentError("--kv-pool must be max, avg or none, not '" + name + "'");
}

Result<std::unique_ptr<Backend>> MakeBackend(const std::string& device) {
  if (device == "cpu") return MakeCpuBackend();
#ifdef SIEVE_HAVE_CUDA
  if (device == "auto" || device.rfind("cuda", 0) == 0) {
    int index = 0;
    if (device.size() > 5 && device[4] == ':') index = std::atoi(device.c_str() + 5);
    auto cuda = MakeCudaBackend(index);
    if (cuda.ok()) return std::move(cuda).value();
    if (device != "auto") return cuda.status();
    spdlog::info("no usable CUDA device ({}); running on the CPU", cuda.status().message());
  }
#else
  if (device.rfind("cuda", 0) == 0) {
    return UnavailableError("this sieve was built without the CUDA backend");
  }
#endif
  if (device != "auto") {
    return InvalidArgumentError("--device must be auto, cpu, cuda or cuda:N, not '" + device + "'");
  }
  return MakeCpuBackend();
}

// The ranks of --tensor-parallel-size N > 1, in place of bundle.backend (made for --device): rank
// 0's backend becomes bundle.backend; the others and every rank's communicator go into the
// bundle. CPU ranks split the threads the one backend would have had.
Status MakeTensorParallelRanks(const std::string& device, int size, EngineBundle& bundle) {
  if (bundle.backend->device() == Device::kCpu) {
    const int threads = std::max(1, ThreadPool::Default().num_threads() / size);
    bundle.backend.reset();
    for (int rank = 0; rank < size; ++rank) {
      bundle.thread_pools.push_back(std::make_unique<ThreadPool>(threads));
      auto backend = std::make_unique<CpuBackend>(bundle.thread_pools.back().get());
      (rank == 0 ? bundle.backend : bundle.other_backends.emplace_back()) = std::move(backend);
    }
    bundle.communicators = MakeInProcessCommunicators(size);
    return Status::Ok();
  }
#ifdef SIEVE_HAVE_CUDA
  int first = 0;
  if (device.size() > 5 && device[4] == ':') first = std::atoi(device.c_str() + 5);
  auto ranks = MakeCudaRanks(first, size);
  if (!ranks.ok()) {
    return ranks.status().WithContext("--tensor-parallel-size " + std::to_string(size));
  }
  // Rank 0's backend replaces the one made for the device.
  bundle.backend = std::move(ranks->backends.front());
  for (size_t rank = 1; rank < ranks->backends.size(); ++rank) {
    bundle.other_backends.push_back(std::move(ranks->backends[rank]));
  }
  bundle.communicators = std::move(ranks->communicators);
  bundle.backend->MakeCurrent();
  return Status::Ok();
#else
  (void)device;
  return InternalError("a non-CPU backend in a build without CUDA");
#endif
}

}  // namespace

Result<EngineBundle> BuildEngine(EngineFlags& flags) {
  if (flags.threads > 0) setenv("SIEVE_NUM_THREADS", std::to_string(flags.threads).c_str(), 1);
  const int tensor_parallel = flags.tensor_parallel_size;
  if (tensor_parallel < 1) {
    return InvalidArgumentError("--tensor-parallel-size must be at least 1, not " +
                                std::to_string(tensor_parallel));
  }
  EngineBundle bundle;
  SIEVE_ASSIGN_OR_RETURN(bundle.backend, MakeBackend(flags.device));
  if (tensor_parallel > 1) {
    SIEVE_RETURN_IF_ERROR(MakeTensorParallelRanks(flags.device, tensor_parallel, bundle));
  }
  if (!flags.kv_memory.empty()) {
    SIEVE_ASSIGN_OR_RETURN(flags.engine.kv_memory_bytes, ParseByteSize(flags.kv_memory));
  }
  SIEVE_ASSIGN_OR_RETURN(flags.engine.kv_policy_options.pool, ParsePool(flags.kv_pool));
  if (flags.kv_group_reduce == "mean") {
    flags.engine.kv_policy_options.reduce = GroupReduce::kMean;
  } else if (flags.kv_group_reduce == "max") {
    flags.engine.kv_policy_options.reduce = GroupReduce::kMax;
  } else {
    return InvalidArgumentError("--kv-group-reduce must be mean or max");
  }
  if (flags.kv_decode_cap_by != "score" && flags.kv_decode_cap_by != "oldest") {
    return InvalidArgumentError("--kv-decode-cap-by must be score or oldest");
  }
  flags.engine.kv_policy_options.decode_cap_by_score = flags.kv_decode_cap_by == "score";
  flags.engine.enable_chunked_prefill = !flags.no_chunked_prefill;
  flags.engine.enable_prefix_caching = flags.enable_prefix_caching;
  SIEVE_ASSIGN_OR_RETURN(flags.engine.preemption_mode, ParsePreemptionMode(flags.preemption_mode));
  if (!(flags.swap_space_gib >= 0.0 && flags.swap_space_gib <= 1024.0)) {
    return InvalidArgumentError("--swap-space must be between 0 and 1024 (GiB)");
  }
  flags.engine.swap_space_bytes =
      static_cast<int64_t>(flags.swap_space_gib * static_cast<double>(int64_t{1} << 30));
  flags.engine.cuda_graphs = !flags.enforce_eager;
  flags.engine.step_tuning = !flags.no_step_tuning;
  flags.load.max_model_len = flags.engine.max_model_len;
  spdlog::info(
      "loading {} on {}",
      flags.load.model_dir.empty() ? std::string("the default model") : flags.load.model_dir,
      bundle.backend->name());
  std::vector<std::unique_ptr<LlamaModel>> other_ranks;
  if (tensor_parallel == 1) {
    SIEVE_ASSIGN_OR_RETURN(bundle.loaded, LoadModel(flags.load, *bundle.backend));
  } else {
    std::vector<Backend*> backends = {bundle.backend.get()};
    std::vector<Communicator*> communicators;
    for (const auto& backend : bundle.other_backends) backends.push_back(backend.get());
    for (const auto& communicator : bundle.communicators) {
      communicators.push_back(communicator.get());
    }
    SIEVE_ASSIGN_OR_RETURN(LoadedShards shards,
                           LoadModelShards(flags.load, backends, communicators));
    bundle.loaded = std::move(shards.model);
    other_ranks = std::move(shards.other_ranks);
    spdlog::info("tensor parallel: {} ranks", tensor_parallel);
  }
  spdlog::info("model: {}", bundle.loaded.description);
  auto engine = Engine::Create(std::move(bundle.loaded.model), bundle.loaded.tokenizer.get(),
                               bundle.loaded.eos_ids, flags.engine, std::move(other_ranks));
  if (!engine.ok()) return engine.status();
  bundle.engine = std::move(engine).value();
  spdlog::info("engine:\n{}", bundle.engine->Describe());
  return bundle;
}

}  // namespace sieve
