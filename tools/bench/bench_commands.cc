#include "tools/bench/bench_commands.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <memory>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "tokenizer/tokenizer_loader.h"
#include "tools/bench/dataset.h"
#include "tools/bench/plot.h"
#include "tools/bench/progress_bar.h"
#include "tools/bench/report.h"
#include "tools/bench/server_info.h"
#include "tools/bench/serving_benchmark.h"

namespace sieve::bench {

namespace {

constexpr std::chrono::seconds kProbeTimeout{10};
constexpr size_t kErrorsKept = 5;
// The first request checks the endpoint and model before the load starts; it need not be long.
constexpr int kTestRequestTokens = 8;
constexpr uint64_t kWarmupSeedOffset = 0x5EED0000;

// Everything a run needs that does not depend on the load: the server, the model, the tokenizer.
struct BenchSetup {
  ServingLoadOptions load;
  std::unique_ptr<Tokenizer> tokenizer;
  nlohmann::json server_info;
  nlohmann::json metadata = nlohmann::json::object();
};

Result<double> ParseRequestRate(const std::string& text) {
  if (text == "inf" || text == "INF" || text == "Inf") {
    return std::numeric_limits<double>::infinity();
  }
  double rate = 0;
  try {
    size_t used = 0;
    rate = std::stod(text, &used);
    if (used != text.size()) throw std::invalid_argument(text);
  } catch (const std::exception&) {
    return InvalidArgumentError("--request-rate must be a number of requests/s or inf, not '" +
                                text + "'");
  }
  if (!(rate > 0)) return InvalidArgumentError("--request-rate must be positive");
  return rate;
}

Result<nlohmann::json> ParseMetadata(const std::vector<std::string>& pairs) {
  nlohmann::json metadata = nlohmann::json::object();
  for (const std::string& pair : pairs) {
    const size_t equals = pair.find('=');
    if (equals == std::string::npos || equals == 0) {
      return InvalidArgumentError("--metadata takes KEY=VALUE, not '" + pair + "'");
    }
    metadata[pair.substr(0, equals)] = pair.substr(equals + 1);
  }
  return metadata;
}

std::string Hostname() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "";
  return name;
}

Result<BenchSetup> Prepare(const ClientConfig& client, const DatasetConfig& dataset) {
  BenchSetup setup;
  SIEVE_ASSIGN_OR_RETURN(setup.load.base_url, ParseHttpUrl(client.base_url));
  SIEVE_ASSIGN_OR_RETURN(setup.metadata, ParseMetadata(client.metadata));
  if (client.warmup < 0) return InvalidArgumentError("--warmup must not be negative");
  if (!(client.request_timeout_s > 0)) {
    return InvalidArgumentError("--request-timeout must be positive");
  }
  if (!client.extra_body.empty()) {
    setup.load.body.extra =
        nlohmann::json::parse(client.extra_body, nullptr, /*allow_exceptions=*/false);
    if (!setup.load.body.extra.is_object()) {
      return InvalidArgumentError("--extra-body must be a JSON object, e.g. '{\"top_p\": 0.9}'");
    }
  }
  if (dataset.tokenizer.empty()) {
    std::fprintf(stderr,
                 "note: no --tokenizer: prompts are built and unreported output tokens counted "
                 "with Sieve's embedded byte-level tokenizer (one token per byte); pass the "
                 "served model's tokenizer for token counts that match the server's\n");
    setup.tokenizer = MakeEmbeddedByteTokenizer();
  } else {
    auto tokenizer = LoadTokenizer(dataset.tokenizer);
    if (!tokenizer.ok()) return tokenizer.status().WithContext("loading --tokenizer");
    setup.tokenizer = std::move(tokenizer).value();
  }
  auto info = FetchServerInfo(setup.load.base_url, client.api_key,
                              std::chrono::duration_cast<std::chrono::milliseconds>(kProbeTimeout));
  if (!info.ok()) return info.status().WithContext("cannot reach the server");
  setup.server_info = std::move(info).value();
  setup.load.body.model = client.model;
  if (setup.load.body.model.empty()) {
    SIEVE_ASSIGN_OR_RETURN(setup.load.body.model, FirstModelId(setup.server_info));
    std::fprintf(stderr, "model: %s (from GET /v1/models)\n", setup.load.body.model.c_str());
  }
  setup.load.endpoint = client.endpoint;
  setup.load.body.api = ApiKindForEndpoint(client.endpoint);
  setup.load.body.temperature = client.temperature;
  setup.load.body.ignore_eos = client.ignore_eos;
  setup.load.api_key = client.api_key;
  setup.load.request_timeout_s = client.request_timeout_s;
  setup.load.seed = dataset.seed;
  return setup;
}

// The multi-turn dataset's conversations (`num_conversations` of them, drawn with `seed`).
Result<std::vector<BenchConversation>> MakeConversations(const DatasetConfig& dataset,
                                                         const Tokenizer& tokenizer,
                                                         int num_conversations, uint64_t seed) {
  if (!dataset.path.empty()) {
    return InvalidArgumentError("--dataset-path needs --dataset-name jsonl");
  }
  MultiTurnOptions options;
  options.num_conversations = num_conversations;
  options.num_turns = dataset.num_turns;
  options.first_len = dataset.first_len;
  options.message_len = dataset.message_len;
  options.output_len = dataset.multi_turn_output_len;
  options.seed = seed;
  return MakeMultiTurnDataset(tokenizer, options);
}

// `seed` rather than dataset.seed: each sweep level and the warm-up draw their own prompts.
Result<std::vector<BenchPrompt>> MakePrompts(const DatasetConfig& dataset,
                                             const Tokenizer& tokenizer, int num_prompts,
                                             uint64_t seed) {
  const bool generated =
      dataset.name == "random" || IsPrefixRepetition(dataset.name) || IsMultiTurn(dataset.name);
  if (generated && !dataset.path.empty()) {
    return InvalidArgumentError("--dataset-path needs --dataset-name jsonl");
  }
  if (dataset.name == "random") {
    RandomDatasetOptions options;
    options.num_prompts = num_prompts;
    options.input_len = dataset.input_len;
    options.output_len = dataset.output_len;
    options.range_ratio = dataset.range_ratio;
    options.seed = seed;
    return MakeRandomDataset(tokenizer, options);
  }
  if (IsPrefixRepetition(dataset.name)) {
    PrefixRepetitionOptions options;
    options.num_prompts = num_prompts;
    options.prefix_len = dataset.prefix_len;
    options.suffix_len = dataset.suffix_len;
    options.num_prefixes = dataset.num_prefixes;
    options.output_len = dataset.prefix_output_len;
    options.seed = seed;
    return MakePrefixRepetitionDataset(tokenizer, options);
  }
  if (IsMultiTurn(dataset.name)) {
    // Single requests: each conversation's first turn (the warm-up's prompts).
    SIEVE_ASSIGN_OR_RETURN(std::vector<BenchConversation> conversations,
                           MakeConversations(dataset, tokenizer, num_prompts, seed));
    std::vector<BenchPrompt> prompts;
    for (const BenchConversation& conversation : conversations) {
      BenchPrompt prompt;
      prompt.prompt = conversation.messages.front();
      prompt.prompt_len = conversation.message_lens.front();
      prompt.output_len = conversation.output_len;
      prompts.push_back(std::move(prompt));
    }
    return prompts;
  }
  if (dataset.name == "jsonl") {
    if (dataset.path.empty())
      return InvalidArgumentError("--dataset-name jsonl needs --dataset-path");
    return LoadJsonlDataset(dataset.path, tokenizer, dataset.output_len, num_prompts);
  }
  return InvalidArgumentError(
      "--dataset-name must be random, prefix-repetition, multi-turn or jsonl, not '" +
      dataset.name + "'");
}

// Prompts for the test request and the warm-up, drawn apart from the measured ones (their own
// seed; for prefix-repetition, prefixes of their own; for multi-turn, first turns of conversations
// of their own, sent as single requests): a server with a prefix cache (vLLM's is on by default)
// must not find a measured prompt, or a measured prefix, already cached.
Result<std::vector<BenchPrompt>> MakeWarmupPrompts(const DatasetConfig& dataset,
                                                   const Tokenizer& tokenizer, int warmup) {
  const int count = std::max(1, warmup);
  DatasetConfig config = dataset;
  // Fewer warm-up requests than prefixes: as many prefixes as requests.
  config.num_prefixes = std::min(dataset.num_prefixes, count);
  return MakePrompts(config, tokenizer, count, dataset.seed + kWarmupSeedOffset);
}

// The server's prefix-cache counters now (server_info.h), or nothing when it does not expose them.
std::optional<PrefixCacheCounters> ReadPrefixCache(const BenchSetup& setup) {
  return FetchPrefixCacheCounters(
      setup.load.base_url, setup.load.api_key,
      std::chrono::duration_cast<std::chrono::milliseconds>(kProbeTimeout));
}

// One short request first, so that a wrong endpoint, model or API key is one clear error and not
// a thousand failed requests.
Status SendTestRequest(const BenchSetup& setup, const BenchPrompt& prompt) {
  BenchPrompt test = prompt;
  test.output_len = std::min(test.output_len, kTestRequestTokens);
  SIEVE_ASSIGN_OR_RETURN(ServingLoadResult result,
                         RunServingLoad(setup.load, {test}, *setup.tokenizer, nullptr));
  const RequestRecord& record = result.records.front();
  if (!record.success) return UnavailableError("the test request failed: " + record.error);
  return Status::Ok();
}

// `count` requests (the prompts from the top, repeated) whose results are thrown away: they let
// the server allocate, compile and capture before anything is timed.
Status Warmup(const BenchSetup& setup, const std::vector<BenchPrompt>& prompts, int count,
              int max_concurrency, bool progress) {
  if (count <= 0) return Status::Ok();
  std::vector<BenchPrompt> warmup;
  for (int index = 0; index < count; ++index) {
    warmup.push_back(prompts[static_cast<size_t>(index) % prompts.size()]);
  }
  ServingLoadOptions options = setup.load;
  options.max_concurrency = max_concurrency;
  options.request_rate = std::numeric_limits<double>::infinity();
  ProgressBar bar("warmup", count, progress);
  SIEVE_ASSIGN_OR_RETURN(ServingLoadResult result,
                         RunServingLoad(options, warmup, *setup.tokenizer, &bar));
  const int failed = static_cast<int>(std::count_if(result.records.begin(), result.records.end(),
                                                    [](const auto& r) { return !r.success; }));
  if (failed > 0) std::fprintf(stderr, "warning: %d warmup request(s) failed\n", failed);
  return Status::Ok();
}

nlohmann::json DatasetJson(const DatasetConfig& dataset, int num_prompts) {
  nlohmann::json json = {
      {"name", IsPrefixRepetition(dataset.name) ? std::string("prefix-repetition") : dataset.name},
      {"path", dataset.path},
      {"tokenizer", dataset.tokenizer.empty() ? "embedded-byte" : dataset.tokenizer},
      {"input_len", dataset.input_len},
      {"output_len", dataset.output_len},
      {"range_ratio", dataset.range_ratio},
      {"num_prompts", num_prompts},
      {"seed", dataset.seed}};
  if (IsMultiTurn(dataset.name)) {
    // num_prompts: conversations. input_len: the first message; --range-ratio plays no part.
    json["name"] = "multi-turn";
    json["input_len"] = dataset.first_len;
    json["output_len"] = dataset.multi_turn_output_len;
    json["range_ratio"] = 0.0;
    json["num_turns"] = dataset.num_turns;
    json["first_len"] = dataset.first_len;
    json["message_len"] = dataset.message_len;
  }
  if (IsPrefixRepetition(dataset.name)) {
    // What the prompts were made of: --input-len, --output-len and --range-ratio play no part.
    json["input_len"] = dataset.prefix_len + dataset.suffix_len;
    json["output_len"] = dataset.prefix_output_len;
    json["range_ratio"] = 0.0;
    json["prefix_len"] = dataset.prefix_len;
    json["suffix_len"] = dataset.suffix_len;
    json["num_prefixes"] = dataset.num_prefixes;
  }
  return json;
}

nlohmann::json ClientJson(const ClientConfig& client, const BenchSetup& setup) {
  return {{"base_url", setup.load.base_url.ToString()},
          {"endpoint", client.endpoint},
          {"model", setup.load.body.model},
          {"ignore_eos", client.ignore_eos},
          {"temperature", client.temperature},
          {"extra_body", setup.load.body.extra},
          {"request_timeout_s", client.request_timeout_s},
          {"warmup", client.warmup}};
}

// The fields every result file starts with.
nlohmann::json ResultHeader(const char* kind, const ClientConfig& client, const BenchSetup& setup) {
  nlohmann::json json;
  json["kind"] = kind;
  json["date"] = NowIso8601();
  json["label"] = client.label;
  json["metadata"] = setup.metadata;
  json["client_host"] = Hostname();
  json["server"] = setup.server_info;
  return json;
}

nlohmann::json RecordsJson(const std::vector<RequestRecord>& records, bool with_text) {
  nlohmann::json json = nlohmann::json::array();
  for (const RequestRecord& record : records) json.push_back(RecordToJson(record, with_text));
  return json;
}

void PrintErrors(const nlohmann::json& errors, int failed) {
  if (errors.empty()) return;
  std::printf("%d request(s) failed; the most frequent error(s):\n", failed);
  for (const nlohmann::json& error : errors) {
    std::printf("  [%d x] %s\n", error["count"].get<int>(),
                error["message"].get<std::string>().c_str());
  }
}

// "4000 in / 500 out tokens" (prefix-repetition: "256 shared of 512 in (10 prefixes) / 128 out
// tokens") from a result's dataset settings (DatasetJson).
std::string DatasetTitle(const nlohmann::json& dataset) {
  if (dataset.value("name", std::string()) == "jsonl") return dataset.value("path", std::string());
  if (dataset.contains("num_prefixes")) {
    return fmt::format("{} shared of {} in ({} prefixes) / {} out tokens",
                       dataset.value("prefix_len", 0), dataset.value("input_len", 0),
                       dataset.value("num_prefixes", 0), dataset.value("output_len", 0));
  }
  return fmt::format("{} in / {} out tokens", dataset.value("input_len", 0),
                     dataset.value("output_len", 0));
}

std::string WorkloadTitle(const nlohmann::json& sweep) {
  return DatasetTitle(
      sweep.value("config", nlohmann::json::object()).value("dataset", nlohmann::json::object()));
}

// --plot writes SVG; a name ending in anything else (an old script's .png) is refused before the
// load runs rather than producing a file its name misdescribes.
Status CheckPlotPath(const std::string& path) {
  if (path.empty() || (path.size() > 4 && path.compare(path.size() - 4, 4, ".svg") == 0)) {
    return Status::Ok();
  }
  return InvalidArgumentError("--plot " + path + ": the chart is SVG; name the file *.svg");
}

Status WriteSvg(const std::string& path, const std::string& svg) {
  std::ofstream file(path, std::ios::binary);
  file << svg;
  file.close();
  if (!file) return UnavailableError("cannot write " + path);
  std::fprintf(stderr, "wrote %s\n", path.c_str());
  return Status::Ok();
}

}  // namespace

// The bound of sending `prompts` at `concurrency` (serving_bound.h), its line of the report, and
// its JSON.
struct RunBound {
  ServingBound bound;
  nlohmann::json json;
};

Result<RunBound> BoundOfRun(const BoundConfig& config, const std::vector<BenchPrompt>& prompts,
                            int concurrency, double measured_output_throughput) {
  std::vector<BoundRequest> requests;
  requests.reserve(prompts.size());
  for (const BenchPrompt& prompt : prompts)
    requests.push_back({prompt.prompt_len, prompt.output_len});
  SIEVE_ASSIGN_OR_RETURN(ServingBound bound, ComputeServingBound(config, requests, concurrency));
  RunBound run{bound, {}};
  run.json = {{"model_config", config.model_config},
              {"kv_policy", config.kv_policy},
              {"kv_policy_description", bound.kv_policy},
              {"kv_budget", config.kv_budget},
              {"kv_window", config.kv_window},
              {"gemm_tflops", config.gemm_tflops},
              {"fp8_gemm_tflops", config.fp8_gemm_tflops},
              {"quantization", bound.quantization},
              {"kv_cache_dtype", bound.kv_cache_dtype},
              {"weight_bytes", bound.weight_bytes},
              {"kv_bytes_read", bound.kv_bytes_read},
              {"attention_tflops", config.attention_tflops},
              {"copy_gbs", config.copy_gbs},
              {"tensor_parallel_size", config.tensor_parallel_size},
              {"allreduce_bus_gbs", config.allreduce_bus_gbs},
              {"allreduce_latency_us", config.allreduce_latency_us},
              {"kv_pool_pages", config.kv_pool_pages},
              {"page_size", config.page_size},
              {"decode_steps", bound.decode_steps},
              {"pool_limited_steps", bound.pool_limited_steps},
              {"all_reduce_s", bound.all_reduce_s},
              {"prefill_s", bound.prefill_s},
              {"decode_s", bound.decode_s},
              {"output_throughput", bound.output_tokens_per_s},
              {"fraction", bound.output_tokens_per_s > 0
                               ? measured_output_throughput / bound.output_tokens_per_s
                               : 0.0},
              {"decode_roofline_s", bound.decode_roofline_s},
              {"compute_bound_steps", bound.compute_bound_steps},
              {"roofline_output_throughput", bound.roofline_output_tokens_per_s},
              {"roofline_fraction", 0.0}};
  if (bound.roofline_output_tokens_per_s > 0) {
    run.json["roofline_fraction"] = measured_output_throughput / bound.roofline_output_tokens_per_s;
  }
  return run;
}

std::string BoundLine(const BoundConfig& config, const ServingBound& bound, double measured) {
  std::string line = fmt::format(
      "Bound: {:.1f} output tok/s (prefill {:.1f} s at {:.4g} TFLOP/s GEMM{}{}, decode {:.1f} s at "
      "{:.4g} GB/s{}{}{}; {} on {}): measured {:.0f}% of it\n",
      bound.output_tokens_per_s, bound.prefill_s, config.gemm_tflops,
      bound.quantization == "fp8"
          ? fmt::format(" ({:.4g} TFLOP/s the layers' FP8 GEMMs)", config.fp8_gemm_tflops)
          : std::string(),
      config.attention_tflops > 0
          ? fmt::format(" + {:.4g} TFLOP/s attention", config.attention_tflops)
          : std::string(", attention not counted"),
      bound.decode_s, config.copy_gbs,
      bound.quantization == "fp8" || bound.kv_cache_dtype == "fp8"
          ? fmt::format(", {:.1f} GB of weights a step, {} KV", bound.weight_bytes / 1e9,
                        bound.kv_cache_dtype)
          : std::string(),
      config.tensor_parallel_size > 1 ? fmt::format("; {} ranks, {:.2f} s of all-reduces",
                                                    config.tensor_parallel_size, bound.all_reduce_s)
                                      : std::string(),
      bound.pool_limited_steps > 0
          ? fmt::format("; {} of its {} steps because the KV pool ({} pages) holds fewer "
                        "sequences",
                        bound.pool_limited_steps, bound.decode_steps, config.kv_pool_pages)
          : std::string(),
      config.kv_policy, config.model_config,
      bound.output_tokens_per_s > 0 ? 100 * measured / bound.output_tokens_per_s : 0.0);
  if (bound.compute_bound_steps > 0) {
    line += fmt::format(
        "Roofline: {:.1f} output tok/s (decode {:.1f} s: in {} of its {} steps the GEMMs' FLOPs "
        "at {:.4g} TFLOP/s outlast their weights at the copy rate): measured {:.0f}% of it\n",
        bound.roofline_output_tokens_per_s, bound.decode_roofline_s, bound.compute_bound_steps,
        bound.decode_steps, config.gemm_tflops,
        100 * measured / bound.roofline_output_tokens_per_s);
  }
  return line;
}

bool IsPrefixRepetition(const std::string& name) {
  return name == "prefix-repetition" || name == "prefix_repetition";
}

bool IsMultiTurn(const std::string& name) { return name == "multi-turn" || name == "multi_turn"; }

int PromptsForLevel(const SweepConfig& config, size_t level) {
  const std::vector<int>& counts = config.num_prompts_per_level;
  const int count = counts.size() == 1 ? counts[0] : level < counts.size() ? counts[level] : 0;
  if (count > 0) return count;
  return std::max(10, 2 * config.concurrency.at(level));
}

Status RunBenchServe(const ServeConfig& config) {
  SIEVE_ASSIGN_OR_RETURN(const double request_rate, ParseRequestRate(config.request_rate));
  if (config.max_concurrency < 0) return InvalidArgumentError("--max-concurrency must be >= 0");
  if (!(config.burstiness > 0)) return InvalidArgumentError("--burstiness must be positive");
  SIEVE_RETURN_IF_ERROR(ValidateBoundConfig(config.bound));
  SIEVE_ASSIGN_OR_RETURN(BenchSetup setup, Prepare(config.client, config.dataset));
  BoundConfig bound_config = config.bound;
  if (!bound_config.model_config.empty()) {
    std::fprintf(stderr, "%s", ResolveFromServer(setup.server_info, bound_config).c_str());
  }
  setup.load.max_concurrency = config.max_concurrency;
  setup.load.request_rate = request_rate;
  setup.load.burstiness = config.burstiness;
  const bool multi_turn = IsMultiTurn(config.dataset.name);
  std::vector<BenchPrompt> prompts;
  std::vector<BenchConversation> conversations;
  if (multi_turn) {
    SIEVE_ASSIGN_OR_RETURN(conversations,
                           MakeConversations(config.dataset, *setup.tokenizer,
                                             config.dataset.num_prompts, config.dataset.seed));
  } else {
    SIEVE_ASSIGN_OR_RETURN(prompts, MakePrompts(config.dataset, *setup.tokenizer,
                                                config.dataset.num_prompts, config.dataset.seed));
  }
  SIEVE_ASSIGN_OR_RETURN(std::vector<BenchPrompt> warmup_prompts,
                         MakeWarmupPrompts(config.dataset, *setup.tokenizer, config.client.warmup));
  SIEVE_RETURN_IF_ERROR(SendTestRequest(setup, warmup_prompts.front()));
  SIEVE_RETURN_IF_ERROR(Warmup(setup, warmup_prompts, config.client.warmup, config.max_concurrency,
                               config.client.progress));
  const int num_requests = multi_turn
                               ? static_cast<int>(conversations.size()) * config.dataset.num_turns
                               : static_cast<int>(prompts.size());
  ProgressBar bar("benchmark", num_requests, config.client.progress);
  const std::optional<PrefixCacheCounters> cache_before = ReadPrefixCache(setup);
  SIEVE_ASSIGN_OR_RETURN(
      ServingLoadResult result,
      multi_turn ? RunConversationLoad(setup.load, conversations, *setup.tokenizer, &bar)
                 : RunServingLoad(setup.load, prompts, *setup.tokenizer, &bar));
  const PrefixCacheRun prefix_cache = PrefixCacheOfRun(cache_before, ReadPrefixCache(setup));
  const BenchMetrics metrics = ComputeMetrics(result.records, result.duration_s);
  std::printf("%s", FormatServingTable(metrics, config.max_concurrency, request_rate).c_str());
  std::printf("%s", FormatPrefixCacheLine(prefix_cache).c_str());
  std::optional<TurnSplit> turns;
  if (multi_turn) {
    turns = SplitTurns(result.records);
    std::printf("%s", FormatTurnSplitLine(*turns).c_str());
    // The bound's requests: every turn as it was sent (its whole prompt, re-tokenised).
    for (const RequestRecord& record : result.records) {
      prompts.push_back({std::string(), record.prompt_len, record.output_len_requested});
    }
  }
  std::optional<RunBound> bound;
  if (!bound_config.model_config.empty()) {
    SIEVE_ASSIGN_OR_RETURN(bound, BoundOfRun(bound_config, prompts, config.max_concurrency,
                                             metrics.output_throughput));
    std::printf("%s", BoundLine(bound_config, bound->bound, metrics.output_throughput).c_str());
  }
  const nlohmann::json errors = SummarizeErrors(result.records, kErrorsKept);
  PrintErrors(errors, metrics.failed);
  std::fflush(stdout);
  if (!config.client.result_json.empty()) {
    nlohmann::json json = ResultHeader("sieve_bench_serve", config.client, setup);
    json["config"] = {
        {"dataset", DatasetJson(config.dataset, multi_turn ? static_cast<int>(conversations.size())
                                                           : static_cast<int>(prompts.size()))},
        {"client", ClientJson(config.client, setup)},
        {"max_concurrency", config.max_concurrency},
        {"request_rate", config.request_rate},
        {"burstiness", config.burstiness}};
    json["metrics"] = MetricsToJson(metrics);
    json["prefix_cache"] = PrefixCacheJson(prefix_cache);
    if (turns) json["multi_turn"] = TurnSplitJson(*turns);
    if (bound) json["bound"] = bound->json;
    json["errors"] = errors;
    json["requests"] = RecordsJson(result.records, config.client.save_texts);
    SIEVE_RETURN_IF_ERROR(WriteJsonFile(config.client.result_json, json));
    std::fprintf(stderr, "wrote %s\n", config.client.result_json.c_str());
  }
  if (metrics.completed == 0) {
    return UnavailableError(fmt::format("all {} requests failed", metrics.failed));
  }
  return Status::Ok();
}

Status RunBenchSweep(const SweepConfig& config) {
  if (config.concurrency.empty()) return InvalidArgumentError("--concurrency needs a level");
  if (IsMultiTurn(config.dataset.name)) {
    return InvalidArgumentError(
        "--dataset-name multi-turn is for `sieve bench serve` (bench sweep does not run "
        "conversations yet)");
  }
  for (int level : config.concurrency) {
    if (level <= 0) return InvalidArgumentError("--concurrency levels must be positive");
  }
  const auto& counts = config.num_prompts_per_level;
  if (counts.size() > 1 && counts.size() != config.concurrency.size()) {
    return InvalidArgumentError(fmt::format(
        "--num-prompts-per-level has {} counts for {} --concurrency levels (give one, or one a "
        "level)",
        counts.size(), config.concurrency.size()));
  }
  for (int count : counts) {
    if (count < 0) return InvalidArgumentError("--num-prompts-per-level counts must be >= 0");
  }
  SIEVE_RETURN_IF_ERROR(CheckPlotPath(config.plot));
  SIEVE_RETURN_IF_ERROR(ValidateBoundConfig(config.bound));
  SIEVE_ASSIGN_OR_RETURN(BenchSetup setup, Prepare(config.client, config.dataset));
  BoundConfig bound_config = config.bound;
  if (!bound_config.model_config.empty()) {
    std::fprintf(stderr, "%s", ResolveFromServer(setup.server_info, bound_config).c_str());
  }
  std::vector<SweepLevel> levels;
  nlohmann::json json = ResultHeader("sieve_bench_sweep", config.client, setup);
  json["config"] = {{"dataset", DatasetJson(config.dataset, 0)},
                    {"client", ClientJson(config.client, setup)},
                    {"concurrency", config.concurrency},
                    {"num_prompts_per_level", config.num_prompts_per_level}};
  json["levels"] = nlohmann::json::array();
  SIEVE_ASSIGN_OR_RETURN(std::vector<BenchPrompt> warmup_prompts,
                         MakeWarmupPrompts(config.dataset, *setup.tokenizer, config.client.warmup));
  for (int concurrency : config.concurrency) {
    const int num_prompts = PromptsForLevel(config, levels.size());
    SIEVE_ASSIGN_OR_RETURN(std::vector<BenchPrompt> prompts,
                           MakePrompts(config.dataset, *setup.tokenizer, num_prompts,
                                       config.dataset.seed + levels.size()));
    if (levels.empty()) SIEVE_RETURN_IF_ERROR(SendTestRequest(setup, warmup_prompts.front()));
    SIEVE_RETURN_IF_ERROR(
        Warmup(setup, warmup_prompts, config.client.warmup, concurrency, config.client.progress));
    setup.load.max_concurrency = concurrency;
    ProgressBar bar(fmt::format("concurrency {}", concurrency), static_cast<int>(prompts.size()),
                    config.client.progress);
    const std::optional<PrefixCacheCounters> cache_before = ReadPrefixCache(setup);
    SIEVE_ASSIGN_OR_RETURN(ServingLoadResult result,
                           RunServingLoad(setup.load, prompts, *setup.tokenizer, &bar));
    const PrefixCacheRun prefix_cache = PrefixCacheOfRun(cache_before, ReadPrefixCache(setup));
    SweepLevel level;
    level.concurrency = concurrency;
    level.num_prompts = static_cast<int>(prompts.size());
    level.metrics = ComputeMetrics(result.records, result.duration_s);
    const nlohmann::json errors = SummarizeErrors(result.records, kErrorsKept);
    std::fprintf(stderr,
                 "concurrency %d: %.1f output tok/s, TTFT P50 %.1f ms, TPOT P50 %.2f ms, %d "
                 "failed\n",
                 concurrency, level.metrics.output_throughput, level.metrics.ttft_ms.median,
                 level.metrics.tpot_ms.median, level.metrics.failed);
    std::fprintf(stderr, "concurrency %d: %s", concurrency,
                 FormatPrefixCacheLine(prefix_cache).c_str());
    nlohmann::json level_json = {
        {"concurrency", concurrency},
        {"num_prompts", level.num_prompts},
        {"metrics", MetricsToJson(level.metrics)},
        {"prefix_cache", PrefixCacheJson(prefix_cache)},
        {"errors", errors},
        {"requests", RecordsJson(result.records, config.client.save_texts)}};
    if (!bound_config.model_config.empty()) {
      SIEVE_ASSIGN_OR_RETURN(RunBound bound, BoundOfRun(bound_config, prompts, concurrency,
                                                        level.metrics.output_throughput));
      level.bound_output_throughput = bound.bound.output_tokens_per_s;
      level.roofline_output_throughput = bound.bound.roofline_output_tokens_per_s;
      level_json["bound"] = bound.json;
      std::fprintf(stderr, "concurrency %d: %s", concurrency,
                   BoundLine(bound_config, bound.bound, level.metrics.output_throughput).c_str());
    }
    json["levels"].push_back(std::move(level_json));
    levels.push_back(level);
    // Saved after every level: a long sweep stopped half-way keeps the levels it finished.
    if (!config.client.result_json.empty()) {
      SIEVE_RETURN_IF_ERROR(WriteJsonFile(config.client.result_json, json));
    }
  }
  std::printf("%s", FormatSweepTable(levels).c_str());
  std::fflush(stdout);
  if (!config.client.result_json.empty()) {
    std::fprintf(stderr, "wrote %s\n", config.client.result_json.c_str());
  }
  if (!config.plot.empty()) {
    const std::string title = (config.client.label.empty() ? "" : config.client.label + ": ") +
                              DatasetTitle(DatasetJson(config.dataset, 0));
    SIEVE_RETURN_IF_ERROR(WriteSvg(config.plot, SweepChartSvg({{"", levels}}, title)));
  }
  const bool any_completed = std::any_of(
      levels.begin(), levels.end(), [](const SweepLevel& l) { return l.metrics.completed > 0; });
  if (!any_completed) return UnavailableError("every request of every level failed");
  return Status::Ok();
}

Status RunBenchPlot(const PlotConfig& config) {
  if (config.result_jsons.empty()) return InvalidArgumentError("--result-json is required");
  if (config.plot.empty()) return InvalidArgumentError("--plot is required");
  SIEVE_RETURN_IF_ERROR(CheckPlotPath(config.plot));
  std::vector<SweepSeries> series;
  std::string title = config.title;
  for (const std::string& path : config.result_jsons) {
    SIEVE_ASSIGN_OR_RETURN(nlohmann::json json, ReadJsonFile(path));
    if (title.empty()) title = WorkloadTitle(json);
    auto one = SweepSeriesFromJson(json, path);
    if (!one.ok()) return one.status().WithContext(path);
    if (config.result_jsons.size() == 1 && json.value("label", std::string()).empty()) {
      one->label.clear();  // a single unlabelled sweep needs no legend naming its file
    }
    series.push_back(std::move(one).value());
  }
  SIEVE_RETURN_IF_ERROR(WriteSvg(config.plot, SweepChartSvg(series, title)));
  return Status::Ok();
}

}  // namespace sieve::bench
