// sieve bench: benchmarks. Each subcommand is one row of kBenchSubcommands: a name, a line of help
// and the function that registers its flags and returns its runner. Adding one is a row here and
// its Add function.
#include <cstdint>
#include <cstdio>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tools/bench/bench_commands.h"
#include "tools/commands.h"

namespace sieve {

namespace {

using bench::ClientConfig;
using bench::DatasetConfig;

void AddDatasetFlags(CLI::App& app, DatasetConfig& dataset, bool with_num_prompts) {
  app.add_option("--dataset-name", dataset.name,
                 "random: random token ids decoded to text (vLLM's RandomDataset); "
                 "prefix-repetition (or prefix_repetition): random prompts that share a few "
                 "random prefixes, to load a prefix cache (vLLM's PrefixRepetitionRandomDataset; "
                 "the --prefix-repetition-* flags); multi-turn (or multi_turn, bench serve "
                 "only): --num-prompts conversations, each turn's prompt the last turn's prompt + "
                 "the server's answer + a new random message, sent when the last turn's answer "
                 "is complete (the --multi-turn-* flags); jsonl: --dataset-path")
      ->capture_default_str();
  app.add_option("--dataset-path", dataset.path,
                 "JSONL file, one {\"prompt\": \"...\", \"output_len\": N} per line (output_len "
                 "optional: --output-len); implies --dataset-name jsonl");
  app.add_option("--tokenizer", dataset.tokenizer,
                 "The served model's tokenizer (directory, tokenizer.json or tokenizer.model): "
                 "builds random prompts of exact token lengths and counts output tokens when the "
                 "server sends no usage. Default: Sieve's embedded byte-level tokenizer");
  app.add_option("--input-len", dataset.input_len, "Random dataset: prompt tokens")
      ->capture_default_str();
  app.add_option("--output-len", dataset.output_len,
                 "Random and jsonl datasets: tokens to generate per request (max_tokens; add "
                 "--ignore-eos to force them)")
      ->capture_default_str();
  app.add_option("--range-ratio", dataset.range_ratio,
                 "Random dataset: lengths uniform in [len x (1 - r), len x (1 + r)], 0 <= r < 1")
      ->capture_default_str();
  app.add_option("--prefix-repetition-prefix-len", dataset.prefix_len,
                 "Prefix-repetition dataset: tokens of each shared prefix")
      ->capture_default_str();
  app.add_option("--prefix-repetition-suffix-len", dataset.suffix_len,
                 "Prefix-repetition dataset: tokens of the random suffix each prompt has of its "
                 "own after its prefix")
      ->capture_default_str();
  app.add_option("--prefix-repetition-num-prefixes", dataset.num_prefixes,
                 "Prefix-repetition dataset: distinct prefixes; the prompts are split evenly "
                 "among them (the first num-prompts % N get one more) and shuffled; at most the "
                 "number of prompts")
      ->capture_default_str();
  app.add_option("--prefix-repetition-output-len", dataset.prefix_output_len,
                 "Prefix-repetition dataset: tokens to generate per request (max_tokens; "
                 "--output-len is the other datasets')")
      ->capture_default_str();
  app.add_option("--multi-turn-num-turns", dataset.num_turns,
                 "Multi-turn dataset: turns (requests) of each conversation")
      ->capture_default_str();
  app.add_option("--multi-turn-first-len", dataset.first_len,
                 "Multi-turn dataset: tokens of each conversation's first user message")
      ->capture_default_str();
  app.add_option("--multi-turn-message-len", dataset.message_len,
                 "Multi-turn dataset: tokens of each later user message (appended after the "
                 "last turn's prompt and answer)")
      ->capture_default_str();
  app.add_option("--multi-turn-output-len", dataset.multi_turn_output_len,
                 "Multi-turn dataset: tokens to generate per turn (max_tokens; --output-len is "
                 "the random and jsonl datasets')")
      ->capture_default_str();
  if (with_num_prompts) {
    app.add_option("--num-prompts", dataset.num_prompts,
                   "Requests to send (jsonl: default every line; more repeats the file; "
                   "multi-turn: conversations, of --multi-turn-num-turns requests each)")
        ->capture_default_str();
  }
  app.add_option("--seed", dataset.seed, "Seed of the random prompts and of the arrival times")
      ->capture_default_str();
}

void AddClientFlags(CLI::App& app, ClientConfig& client) {
  app.add_option("--base-url", client.base_url,
                 "The server: http://host:port (any OpenAI-compatible server: Sieve, vLLM, "
                 "llama-server)")
      ->capture_default_str();
  app.add_option("--endpoint", client.endpoint,
                 "/v1/completions or /v1/chat/completions (the prompt becomes one user message)")
      ->capture_default_str();
  app.add_option("--model", client.model,
                 "Model name sent in each request (default: the first of GET /v1/models)");
  app.add_option("--api-key", client.api_key, "Sent as 'Authorization: Bearer KEY'")
      ->envname("OPENAI_API_KEY");
  app.add_flag("--ignore-eos", client.ignore_eos,
               "Ask the server to generate all --output-len tokens (\"ignore_eos\": true)");
  app.add_option("--temperature", client.temperature, "Sampling temperature (0: greedy)")
      ->capture_default_str();
  app.add_option("--extra-body", client.extra_body,
                 "JSON object merged into every request body, e.g. '{\"top_p\": 0.9}'");
  app.add_option("--request-timeout", client.request_timeout_s,
                 "Seconds before one request counts as failed")
      ->capture_default_str();
  app.add_option("--warmup", client.warmup,
                 "Requests sent and discarded before measuring (per level in a sweep)")
      ->capture_default_str();
  app.add_flag("!--no-progress", client.progress,
               "No progress display (it goes to stderr: a bar on a terminal, else a line every "
               "10 s)");
  app.add_option("--label", client.label, "A name for this run, stored in --result-json");
  app.add_option(
      "--metadata", client.metadata,
      "KEY=VALUE pairs stored in --result-json (repeatable), e.g. gpu=H200 policy=snapkv");
  app.add_option("--result-json", client.result_json,
                 "Write the whole run: config, server info and flags, metrics, errors and every "
                 "request's timings");
  app.add_flag("--save-texts", client.save_texts,
               "Also store every request's generated text in --result-json");
}

void AddBoundFlags(CLI::App& app, bench::BoundConfig& bound) {
  app.add_option("--bound-model-config", bound.model_config,
                 "Print each run beside its bound (PERF.md's model: every prefill at the GEMM and "
                 "attention rates + every decode step's weights and KV at the copy rate, with no "
                 "more sequences decoding at once than the server's KV pool holds): the served "
                 "model's config directory, e.g. configs/llama-3-8b");
  app.add_option("--bound-kv-policy", bound.kv_policy,
                 "Bound: the server's --kv-policy (how many KV entries decode steps read; "
                 "default: the server's own, with its knobs, from its GET /server_info, else full; "
                 "a warning when the two differ)");
  app.add_option("--bound-kv-budget", bound.kv_budget,
                 "Bound: the server's --kv-budget (0: the server's, or the default)")
      ->capture_default_str();
  app.add_option("--bound-kv-window", bound.kv_window,
                 "Bound: the server's --kv-window (0: the server's, or the default)")
      ->capture_default_str();
  app.add_option("--bound-gemm-tflops", bound.gemm_tflops,
                 "Bound: bf16 GEMM rate at prefill sizes (sieve bench kernels --prefill-step)");
  app.add_option("--bound-fp8-gemm-tflops", bound.fp8_gemm_tflops,
                 "Bound: FP8 GEMM rate at prefill sizes, for FP8 weights (sieve bench kernels "
                 "--prefill-step --quantization fp8)");
  app.add_option(
         "--bound-quantization", bound.quantization,
         "Bound: the server's --quantization, none | fp8 (fp8: decode reads the layers' "
         "weights as e4m3, the embeddings and LM head bf16, and prefill runs their GEMMs at "
         "--bound-fp8-gemm-tflops; default: the server's, from its GET /server_info, else "
         "none)")
      ->check(CLI::IsMember({"none", "fp8"}));
  app.add_option("--bound-kv-cache-dtype", bound.kv_cache_dtype,
                 "Bound: the server's --kv-cache-dtype, auto | bf16 | fp8 (fp8: 1 byte a K or V "
                 "element; default: the server's, from its GET /server_info or its KV pool's "
                 "bytes an entry, else bf16)")
      ->check(CLI::IsMember({"auto", "bf16", "fp8"}));
  app.add_option("--bound-attention-tflops", bound.attention_tflops,
                 "Bound: causal prefill attention rate (scripts/sdpa_bench.py's cuDNN; 0: not "
                 "counted)")
      ->capture_default_str();
  app.add_option("--bound-copy-gbs", bound.copy_gbs,
                 "Bound: device copy rate, read + write, GB/s (sieve bench kernels)");
  app.add_option("--bound-tensor-parallel-size", bound.tensor_parallel_size,
                 "Bound: the server's --tensor-parallel-size (one rank's share of the FLOPs, "
                 "weights and KV, plus 2 all-reduces a layer)")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  app.add_option("--bound-allreduce-bus-gbs", bound.allreduce_bus_gbs,
                 "Bound: all-reduce bus bandwidth, GB/s (sieve bench kernels "
                 "--tensor-parallel-size N measures an all-reduce)")
      ->capture_default_str();
  app.add_option("--bound-allreduce-latency-us", bound.allreduce_latency_us,
                 "Bound: fixed time of one all-reduce, us")
      ->capture_default_str();
  app.add_option("--bound-kv-pool-pages", bound.kv_pool_pages,
                 "Bound: the server's KV pool in pages; past the concurrency whose sequences it "
                 "holds, fewer decode at once (-1: the server's, from its GET /server_info; 0: "
                 "not limited)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{-1}, std::numeric_limits<int64_t>::max()).description(">= -1"));
  app.add_option("--bound-page-size", bound.page_size,
                 "Bound: KV entries a page, with --bound-kv-pool-pages (the server's with -1)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
}

// Runs `run` and turns its Status into the process exit code.
template <typename Config>
CommandRunner Runner(std::shared_ptr<Config> config, Status (*run)(const Config&)) {
  return [config, run] {
    const Status status = run(*config);
    if (status.ok()) return 0;
    std::fprintf(stderr, "error: %s\n", status.message().c_str());
    return 1;
  };
}

// `--dataset-path` alone means a JSONL dataset of every line unless --num-prompts says otherwise.
void ApplyJsonlDefaults(DatasetConfig& dataset, const CLI::App& app, bool with_num_prompts) {
  if (!dataset.path.empty() && app.get_option("--dataset-name")->count() == 0) {
    dataset.name = "jsonl";
  }
  if (dataset.name == "jsonl" && with_num_prompts &&
      app.get_option("--num-prompts")->count() == 0) {
    dataset.num_prompts = 0;
  }
}

// The length flags of one dataset given with another (--input-len with prefix-repetition,
// --prefix-repetition-* with random) would be silently ignored: refuse them instead.
Status CheckDatasetFlags(const DatasetConfig& dataset, const CLI::App& app) {
  // Each dataset with flags of its own: those flags need it, and the random dataset's length
  // flags do not apply to it.
  struct OwnFlags {
    bool selected;
    const char* name;
    std::vector<const char*> flags;
    const char* lengths;  // what sets its lengths instead
  };
  const OwnFlags datasets[] = {
      {bench::IsMultiTurn(dataset.name),
       "multi-turn",
       {"--multi-turn-num-turns", "--multi-turn-first-len", "--multi-turn-message-len",
        "--multi-turn-output-len"},
       "its turns are --multi-turn-first-len, then --multi-turn-message-len tokens more than the "
       "last turn's prompt and answer, and each generates --multi-turn-output-len"},
      {bench::IsPrefixRepetition(dataset.name),
       "prefix-repetition",
       {"--prefix-repetition-prefix-len", "--prefix-repetition-suffix-len",
        "--prefix-repetition-num-prefixes", "--prefix-repetition-output-len"},
       "its prompts are --prefix-repetition-prefix-len + --prefix-repetition-suffix-len tokens "
       "and it generates --prefix-repetition-output-len"},
  };
  for (const OwnFlags& own : datasets) {
    for (const char* flag : {"--input-len", "--output-len", "--range-ratio"}) {
      if (own.selected && app.get_option(flag)->count() > 0) {
        return InvalidArgumentError(std::string(flag) + " does not apply to --dataset-name " +
                                    own.name + ": " + own.lengths);
      }
    }
    for (const char* flag : own.flags) {
      if (!own.selected && app.get_option(flag)->count() > 0) {
        return InvalidArgumentError(std::string(flag) + " needs --dataset-name " + own.name);
      }
    }
  }
  return Status::Ok();
}

// ApplyJsonlDefaults and CheckDatasetFlags, then `run`.
template <typename Config>
int RunWithDataset(std::shared_ptr<Config> config, const CLI::App& app, bool with_num_prompts,
                   Status (*run)(const Config&)) {
  ApplyJsonlDefaults(config->dataset, app, with_num_prompts);
  if (const Status status = CheckDatasetFlags(config->dataset, app); !status.ok()) {
    std::fprintf(stderr, "error: %s\n", status.message().c_str());
    return 1;
  }
  return Runner<Config>(config, run)();
}

CommandRunner AddServeBenchmark(CLI::App& app) {
  auto config = std::make_shared<bench::ServeConfig>();
  AddClientFlags(app, config->client);
  AddDatasetFlags(app, config->dataset, /*with_num_prompts=*/true);
  app.add_option("--max-concurrency", config->max_concurrency,
                 "Requests in flight at most; released requests wait for a slot (0: no cap)")
      ->capture_default_str();
  app.add_option("--request-rate", config->request_rate,
                 "Requests released per second by a Poisson process, or inf: all at once")
      ->capture_default_str();
  app.add_option("--burstiness", config->burstiness,
                 "Gamma shape of the arrival gaps: 1 Poisson, < 1 burstier, > 1 more regular")
      ->capture_default_str();
  AddBoundFlags(app, config->bound);
  CLI::App* parsed = &app;
  return [config, parsed] {
    return RunWithDataset<bench::ServeConfig>(config, *parsed, /*with_num_prompts=*/true,
                                              bench::RunBenchServe);
  };
}

CommandRunner AddSweepBenchmark(CLI::App& app) {
  auto config = std::make_shared<bench::SweepConfig>();
  AddClientFlags(app, config->client);
  AddDatasetFlags(app, config->dataset, /*with_num_prompts=*/false);
  app.add_option("--concurrency", config->concurrency,
                 "Concurrency levels, comma-separated: a closed loop of C clients each "
                 "(default: PERF.md's 1,10,20,64,128)")
      ->delimiter(',');
  app.add_option("--num-prompts-per-level", config->num_prompts_per_level,
                 "Requests per level: one count for every level, or one per level, "
                 "comma-separated (0: max(10, 2 x concurrency))")
      ->delimiter(',');
  app.add_option("--plot", config->plot,
                 "Draw output tokens/s and TTFT P50/P99 against concurrency into this SVG file "
                 "(*.svg)");
  AddBoundFlags(app, config->bound);
  CLI::App* parsed = &app;
  return [config, parsed] {
    return RunWithDataset<bench::SweepConfig>(config, *parsed, /*with_num_prompts=*/false,
                                              bench::RunBenchSweep);
  };
}

CommandRunner AddPlotBenchmark(CLI::App& app) {
  auto config = std::make_shared<bench::PlotConfig>();
  app.add_option("--result-json", config->result_jsons,
                 "A `sieve bench sweep` result (repeatable: one curve per file, named by its "
                 "--label)")
      ->required();
  app.add_option("--plot", config->plot, "The SVG file to write (*.svg)")->required();
  app.add_option("--title", config->title, "Chart title (default: the workload)");
  return Runner<bench::PlotConfig>(config, bench::RunBenchPlot);
}

struct BenchSubcommand {
  const char* name;
  const char* description;
  CommandRunner (*add)(CLI::App& app);
};

const BenchSubcommand kBenchSubcommands[] = {
    {"serve",
     "Load-test an OpenAI-compatible server like `vllm bench serve`: streamed requests, TTFT, "
     "TPOT, ITL, E2E latency and throughput",
     AddServeBenchmark},
    {"sweep",
     "Run `bench serve` at each concurrency level (closed loop) and tabulate / plot throughput "
     "and TTFT against concurrency",
     AddSweepBenchmark},
    {"plot", "Redraw the chart of saved `bench sweep` results (several overlay as curves)",
     AddPlotBenchmark},
    {"kernels",
     "GPU kernels and a whole decode step, each beside PERF.md's bound (copy bandwidth, GEMM, "
     "attention, score/select/compact)",
     AddBenchKernelsCommand},
    {"cpu",
     "The CPU backend's prefill and decode rates beside this machine's measured ceilings (fp32 "
     "FMA peak, fp32 GEMM rate, read bandwidth)",
     AddBenchCpuCommand},
};

}  // namespace

CommandRunner AddBenchCommand(CLI::App& app) {
  app.require_subcommand(1);
  auto runners = std::make_shared<std::vector<std::pair<CLI::App*, CommandRunner>>>();
  for (const BenchSubcommand& subcommand : kBenchSubcommands) {
    CLI::App* sub = app.add_subcommand(subcommand.name, subcommand.description);
    runners->emplace_back(sub, subcommand.add(*sub));
  }
  return [runners] {
    for (auto& [sub, runner] : *runners) {
      if (sub->parsed()) return runner();
    }
    return 2;
  };
}

}  // namespace sieve
