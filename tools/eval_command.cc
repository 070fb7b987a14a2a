// sieve eval: accuracy of KV policies on long-context tasks, dense first as the baseline, then
// every --kv-policy x --kv-budget, in process or through an OpenAI-compatible server.
// tools/eval/README.md describes the design.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "core/logging.h"
#include "model/llama_model.h"
#include "model/model_config.h"
#include "runtime/engine.h"
#include "runtime/model_loader.h"
#include "sparsity/kv_policy.h"
#include "tokenizer/tokenizer_loader.h"
#include "tools/bench/progress_bar.h"
#include "tools/bench/server_info.h"
#include "tools/command_line.h"
#include "tools/commands.h"
#include "tools/engine_flags.h"
#include "tools/eval/engine_evaluator.h"
#include "tools/eval/eval_results.h"
#include "tools/eval/jsonl_dataset.h"
#include "tools/eval/perplexity_text.h"
#include "tools/eval/remote_evaluator.h"
#include "tools/eval/svg_chart.h"
#include "tools/eval/task_generator.h"
#include "tools/eval/text_source.h"
#include "tools/eval/two_turn.h"

#ifndef SIEVE_VERSION
#define SIEVE_VERSION "unknown"
#endif
#ifndef SIEVE_GIT_COMMIT
#define SIEVE_GIT_COMMIT ""
#endif

namespace sieve {

namespace {

using eval::EvalConfig;
using eval::EvalSample;

struct EvalFlags {
  EngineFlags engine;
  CLI::Option* max_batched_option = nullptr;
  std::vector<std::string> tasks = {"passkey",         "niah",         "niah-multikey",
                                    "niah-multivalue", "kv-retrieval", "variable-tracking",
                                    "common-words"};
  std::vector<int> lengths = {1000, 2000, 4000};  // + answers within a 4096 context
  std::vector<double> depths = {0, 0.25, 0.5, 0.75, 1};
  int samples = 4;
  uint64_t seed = 0;
  std::vector<std::string> policies;
  std::vector<int> budgets;
  std::string result_json;
  std::string plot_dir;
  bool no_progress = false;
  std::string haystack;
  std::string prompt_suffix;
  std::string text;
  int ppl_tokens = 256;
  std::string data;
  std::string prompt_template = "{context}\n\n{input}";
  std::string metric = "substring";
  int max_tokens = 32;
  std::string base_url;
  std::string api_key;
  std::string served_model_name;
  int max_concurrency = 16;
  std::string label;
  std::string second_turn = "prefill";
};

// An error from outside input: a message and exit code 2 (bad flags) or 1 (anything else).
struct Failure {
  int code;
  std::string message;
};

int Fail(int code, const std::string& message) {
  std::cerr << "error: " << message << "\n";
  return code;
}

std::optional<Failure> CheckFlags(EvalFlags& flags) {
  const auto bad = [](std::string message) { return Failure{2, std::move(message)}; };
  if (flags.tasks.empty()) return bad("--task needs at least one task");
  std::vector<std::string> tasks;
  for (const std::string& task : flags.tasks) {
    const auto& known = eval::AllTaskNames();
    if (std::find(known.begin(), known.end(), task) == known.end()) {
      std::string names;
      for (const std::string& name : known) names += (names.empty() ? "" : ", ") + name;
      return bad("unknown task '" + task + "' (known: " + names + ")");
    }
    if (std::find(tasks.begin(), tasks.end(), task) == tasks.end()) tasks.push_back(task);
  }
  flags.tasks = tasks;
  if (flags.lengths.empty()) return bad("--lengths needs at least one length");
  for (const int length : flags.lengths) {
    if (length < 16)
      return bad("--lengths must be at least 16 tokens, not " + std::to_string(length));
  }
  std::sort(flags.lengths.begin(), flags.lengths.end());
  flags.lengths.erase(std::unique(flags.lengths.begin(), flags.lengths.end()), flags.lengths.end());
  if (flags.depths.empty()) return bad("--depths needs at least one depth");
  for (const double depth : flags.depths) {
    if (!(depth >= 0.0 && depth <= 1.0)) {
      return bad(fmt::format("--depths must be in [0, 1], not {}", depth));
    }
  }
  std::sort(flags.depths.begin(), flags.depths.end());
  flags.depths.erase(std::unique(flags.depths.begin(), flags.depths.end()), flags.depths.end());
  if (flags.samples < 1) return bad("--samples must be at least 1");
  if (flags.ppl_tokens < 1) return bad("--ppl-tokens must be at least 1");
  if (flags.max_tokens < 1) return bad("--max-tokens must be at least 1");
  if (flags.max_concurrency < 1) return bad("--max-concurrency must be at least 1");
  if (auto metric = eval::ParseJsonlMetric(flags.metric); !metric.ok()) {
    return bad("--metric: " + metric.status().message());
  }
  const auto has = [&](const char* task) {
    return std::find(flags.tasks.begin(), flags.tasks.end(), task) != flags.tasks.end();
  };
  if (has("perplexity") && flags.text.empty()) {
    return bad("--task perplexity needs --text FILE|DIR (held-out text)");
  }
  if (has("jsonl") && flags.data.empty()) return bad("--task jsonl needs --data FILE");
  auto second_turn = eval::ParseSecondTurn(flags.second_turn);
  if (!second_turn.ok()) return bad(second_turn.status().message());
  if (*second_turn == eval::SecondTurn::kReuse && !flags.base_url.empty()) {
    return bad(
        "--second-turn reuse continues a request on its own KV cache, which only the "
        "in-process engine can do: drop --base-url or use --second-turn prefill");
  }
  for (const int budget : flags.budgets) {
    if (budget < 1) return bad("--kv-budget must be positive, not " + std::to_string(budget));
  }
  for (const std::string& policy : flags.policies) {
    if (policy.empty()) return bad("--kv-policy must not be empty");
    // Budgets against the window and sinks before a model loads (Parse checks the rest later).
    for (const int budget : flags.budgets) {
      auto options = eval::OptionsForBudget(policy, flags.engine.engine.kv_policy_options, budget);
      if (policy != "full" && !options.ok()) return bad(options.status().message());
    }
  }
  if (!flags.base_url.empty()) {
    if (has("perplexity")) {
      return bad(
          "--task perplexity needs the in-process engine (teacher forcing); drop "
          "--base-url");
    }
    if (!flags.policies.empty() || !flags.budgets.empty()) {
      return bad(
          "with --base-url the server's own KV policy is evaluated (one configuration, "
          "--label); --kv-policy and --kv-budget apply to the in-process engine only");
    }
  }
  return std::nullopt;
}

// Dense first, then every policy x budget. "full" takes no budget (and is already the baseline).
Result<std::vector<EvalConfig>> MakeConfigs(const EvalFlags& flags, const KvPolicyOptions& base) {
  std::vector<EvalConfig> configs;
  if (!flags.base_url.empty()) {
    configs.push_back({flags.label.empty() ? "remote" : flags.label, "", std::nullopt});
    return configs;
  }
  configs.push_back({flags.label.empty() ? "full" : flags.label, "full", std::nullopt});
  const std::vector<int> budgets =
      flags.budgets.empty() ? std::vector<int>{base.budget} : flags.budgets;
  for (const std::string& policy : flags.policies) {
    if (policy == "full") continue;
    for (const int budget : budgets) {
      SIEVE_RETURN_IF_ERROR(eval::OptionsForBudget(policy, base, budget).status());
      configs.push_back({policy + "@" + std::to_string(budget), policy, budget});
    }
  }
  return configs;
}

// The in-process configurations, each checked against the model before anything loads or runs:
// its budget's knobs, its policy parsed for the model's layers, and what it asks of the engine.
struct CheckedConfigs {
  std::vector<EvalConfig> configs;
  std::vector<std::optional<KvPolicyOptions>> options;  // [configs]; dense: none
  bool evicts_during_decode = false;
  int final_chunk_rows = 0;  // the most prompt rows one configuration scores in one step
};

Result<CheckedConfigs> CheckConfigs(const EvalFlags& flags, int longest_sequence) {
  std::string dir = flags.engine.load.model_dir;
  if (dir.empty()) {
    SIEVE_ASSIGN_OR_RETURN(dir, FindDefaultModelDir());
  }
  SIEVE_ASSIGN_OR_RETURN(const ModelConfig model, LoadModelConfig(dir));
  const KvPolicyOptions& base = flags.engine.engine.kv_policy_options;
  CheckedConfigs checked;
  SIEVE_ASSIGN_OR_RETURN(checked.configs, MakeConfigs(flags, base));
  for (const EvalConfig& config : checked.configs) {
    KvPolicyOptions options = base;
    if (config.budget) {
      SIEVE_ASSIGN_OR_RETURN(options, eval::OptionsForBudget(config.policy, base, *config.budget));
    }
    auto policy = KvPolicy::Parse(config.policy, model.num_layers, options);
    if (!policy.ok()) return policy.status().WithContext("--kv-policy " + config.label);
    checked.evicts_during_decode =
        checked.evicts_during_decode || policy->NeedsScorePool() || policy->NeedsPositionPool();
    checked.final_chunk_rows =
        std::max(checked.final_chunk_rows, policy->FinalChunkRows(longest_sequence));
    checked.options.push_back(config.budget ? std::optional(options) : std::nullopt);
  }
  return checked;
}

// Room MaxTaskTokens leaves for a two-turn task's second question.
constexpr int kFollowUpTokens = 64;

int MaxTaskTokens(const EvalFlags& flags) {
  const eval::TaskSpec& spec = eval::TaskSpec::Embedded();
  int most = 1;
  for (const std::string& task : flags.tasks) {
    if (task == "perplexity") most = std::max(most, flags.ppl_tokens);
    if (task == "jsonl" || task == "heldout") most = std::max(most, flags.max_tokens);
    if (task == "passkey") most = std::max(most, spec.Int("passkey", "max_tokens"));
    if (task == "niah" || task == "niah-multikey")
      most = std::max(most, spec.Int("niah", "max_tokens"));
    // Turn 2 follows turn 1's answer and a question of a few dozen tokens (checked against each
    // sample's own lengths once they are tokenized).
    if (task == "niah-two-turn") {
      most = std::max(most, 2 * spec.Int("niah", "max_tokens") + kFollowUpTokens);
    }
    if (task == "niah-multivalue") most = std::max(most, spec.Int("niah", "max_tokens_all"));
    if (task == "kv-retrieval") most = std::max(most, spec.Int("kv_retrieval", "max_tokens"));
    if (task == "variable-tracking") {
      most = std::max(most, spec.Int("variable_tracking", "max_tokens"));
    }
    if (task == "common-words") most = std::max(most, spec.Int("common_words", "max_tokens"));
  }
  return most;
}

std::string SanitizeFileName(const std::string& text) {
  std::string out;
  for (const char c : text) {
    out +=
        std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.' ? c : '_';
  }
  return out;
}

Status WriteFile(const std::filesystem::path& path, const std::string& content) {
  std::ofstream out(path, std::ios::binary);
  out << content;
  out.close();
  if (!out) return UnavailableError("cannot write " + path.string());
  return Status::Ok();
}

Status WritePlots(const EvalFlags& flags, const eval::EvalResults& results) {
  std::error_code error;
  std::filesystem::create_directories(flags.plot_dir, error);
  if (error) return UnavailableError("--plot-dir: cannot create " + flags.plot_dir);
  const std::vector<eval::EvalCell> cells = results.Cells();
  const std::vector<eval::EvalCell> summary = results.Summary();
  int written = 0;
  for (const std::string& task : flags.tasks) {
    if (!eval::HasDepthAxis(task)) continue;
    for (const EvalConfig& config : results.configs()) {
      std::vector<std::vector<std::optional<double>>> scores(
          flags.depths.size(), std::vector<std::optional<double>>(flags.lengths.size()));
      for (const eval::EvalCell& cell : cells) {
        if (cell.task != task || cell.config != config.label || !cell.depth) continue;
        const auto row = std::find(flags.depths.begin(), flags.depths.end(), *cell.depth);
        const auto column = std::find(flags.lengths.begin(), flags.lengths.end(), cell.length);
        if (row == flags.depths.end() || column == flags.lengths.end()) continue;
        scores[row - flags.depths.begin()][column - flags.lengths.begin()] = cell.value();
      }
      SIEVE_RETURN_IF_ERROR(WriteFile(
          std::filesystem::path(flags.plot_dir) /
              ("needle_" + task + "_" + SanitizeFileName(config.label) + ".svg"),
          eval::NeedleHeatmapSvg(task + ": " + config.label, flags.lengths, flags.depths, scores)));
      ++written;
    }
  }
  // Score against budget: needs budgets, i.e. policies evaluated in process.
  std::vector<int> budgets;
  std::vector<std::string> policies;
  for (const EvalConfig& config : results.configs()) {
    if (!config.budget) continue;
    if (std::find(budgets.begin(), budgets.end(), *config.budget) == budgets.end()) {
      budgets.push_back(*config.budget);
    }
    if (std::find(policies.begin(), policies.end(), config.policy) == policies.end()) {
      policies.push_back(config.policy);
    }
  }
  std::sort(budgets.begin(), budgets.end());
  if (!budgets.empty()) {
    for (const std::string& task : flags.tasks) {
      const bool perplexity = task == "perplexity";
      const auto value_of = [&](const std::string& label) -> std::optional<double> {
        for (const eval::EvalCell& cell : summary) {
          if (cell.task == task && cell.config == label) {
            return perplexity ? cell.value() : 100.0 * cell.value();
          }
        }
        return std::nullopt;
      };
      std::vector<eval::ChartSeries> series;
      for (const std::string& policy : policies) {
        eval::ChartSeries line{policy, {}};
        for (const int budget : budgets) {
          line.values.push_back(value_of(policy + "@" + std::to_string(budget)));
        }
        series.push_back(std::move(line));
      }
      SIEVE_RETURN_IF_ERROR(
          WriteFile(std::filesystem::path(flags.plot_dir) / ("budget_" + task + ".svg"),
                    eval::BudgetChartSvg(task + ": score vs KV budget",
                                         perplexity ? "perplexity" : "score (%)", budgets, series,
                                         value_of(results.configs().front().label), !perplexity)));
      ++written;
    }
  }
  std::fprintf(stderr, "wrote %d charts to %s\n", written, flags.plot_dir.c_str());
  return Status::Ok();
}

nlohmann::json OptionsJson(const KvPolicyOptions& options) {
  return {{"budget", options.budget}, {"window", options.window},        {"sinks", options.sinks},
          {"recent", options.recent}, {"heavy", options.heavy},          {"kernel", options.kernel},
          {"beta", options.beta},     {"decode_cap", options.decode_cap}};
}

// Everything that happens after the flags are known to be well-formed.
int Run(EvalFlags& flags) {
  if (auto failure = CheckFlags(flags)) return Fail(failure->code, failure->message);
  const bool remote = !flags.base_url.empty();
  const auto has = [&](const char* task) {
    return std::find(flags.tasks.begin(), flags.tasks.end(), task) != flags.tasks.end();
  };
  // Outside files first: a wrong path fails before a model loads.
  std::vector<std::string> sentences;
  if (!flags.haystack.empty()) {
    auto text = eval::ReadTextSource(flags.haystack, "--haystack");
    if (!text.ok()) return Fail(1, text.status().message());
    sentences = eval::SplitSentences(*text);
    if (sentences.empty()) {
      return Fail(1, "--haystack " + flags.haystack + " has no sentences of 20..400 characters");
    }
  }
  std::string ppl_text;
  if (has("perplexity")) {
    auto text = eval::ReadTextSource(flags.text, "--text");
    if (!text.ok()) return Fail(1, text.status().message());
    ppl_text = std::move(text).value();
  }
  std::vector<eval::JsonlRecord> records;
  if (has("jsonl")) {
    auto parsed = eval::ReadJsonl(flags.data);
    if (!parsed.ok()) return Fail(1, parsed.status().message());
    records = std::move(parsed).value();
  }
  // The held-out set's records at the lengths asked for (each record is fitted to its length).
  std::string heldout_path;
  std::vector<eval::JsonlRecord> heldout_records;
  if (has("heldout")) {
    auto path = eval::FindHeldoutSet();
    if (!path.ok()) return Fail(1, path.status().message());
    heldout_path = *path;
    auto parsed = eval::ReadJsonl(heldout_path);
    if (!parsed.ok()) return Fail(1, parsed.status().message());
    std::set<int> lengths;
    for (eval::JsonlRecord& record : *parsed) {
      if (!record.length) continue;
      lengths.insert(*record.length);
      if (std::find(flags.lengths.begin(), flags.lengths.end(), *record.length) !=
          flags.lengths.end()) {
        heldout_records.push_back(std::move(record));
      }
    }
    if (heldout_records.empty()) {
      std::string known;
      for (const int length : lengths) known += (known.empty() ? "" : ",") + std::to_string(length);
      return Fail(2, "--task heldout has records at --lengths " + known + " only");
    }
  }
  const int max_task_tokens = MaxTaskTokens(flags);
  const int longest = flags.lengths.back();

  // The model (in process) or the server, and a tokenizer.
  std::optional<EngineBundle> bundle;
  std::vector<EvalConfig> configs;
  std::vector<std::optional<KvPolicyOptions>> config_options;  // [configs]; dense: none
  int checked_rows = 0;
  std::unique_ptr<Tokenizer> own_tokenizer;
  const Tokenizer* tokenizer = nullptr;
  eval::RemoteOptions remote_options;
  KvPolicyOptions base_options = flags.engine.engine.kv_policy_options;
  std::string model_description;
  std::string device;
  // In process: what the weights, activations and KV cache were held in (the record says so,
  // since the command line leaves auto to the backend).
  std::optional<WeightQuantization> quantization;
  std::optional<DType> activation_dtype;
  std::optional<DType> kv_cache_dtype;
  if (remote) {
    auto url = bench::ParseHttpUrl(flags.base_url);
    if (!url.ok()) return Fail(2, "--base-url: " + url.status().message());
    remote_options.base_url = *url;
    remote_options.api_key = flags.api_key;
    remote_options.max_concurrency = flags.max_concurrency;
    const std::string& path = !flags.engine.load.tokenizer_path.empty()
                                  ? flags.engine.load.tokenizer_path
                                  : flags.engine.load.model_dir;
    if (path.empty()) {
      std::fprintf(stderr,
                   "note: no --tokenizer: prompts are sized with Sieve's byte-level tokenizer "
                   "(one token per byte); pass the served model's for token-exact lengths\n");
      own_tokenizer = MakeEmbeddedByteTokenizer();
    } else {
      auto loaded = LoadTokenizer(path);
      if (!loaded.ok()) return Fail(1, "loading --tokenizer: " + loaded.status().message());
      own_tokenizer = std::move(loaded).value();
    }
    tokenizer = own_tokenizer.get();
    auto info = bench::FetchServerInfo(remote_options.base_url, flags.api_key,
                                       std::chrono::milliseconds(10000));
    if (!info.ok()) return Fail(1, "cannot reach the server: " + info.status().message());
    remote_options.model = flags.served_model_name;
    if (remote_options.model.empty()) {
      auto first = bench::FirstModelId(*info);
      if (!first.ok()) return Fail(1, "GET /v1/models: " + first.status().message());
      remote_options.model = *first;
    }
    model_description = remote_options.model;
    device = "remote " + remote_options.base_url.ToString();
  } else {
    EngineOptions& options = flags.engine.engine;
    options.kv_policy = "full";  // requests carry the configuration's policy
    auto checked = CheckConfigs(flags, longest + max_task_tokens - 1);
    if (!checked.ok()) return Fail(2, checked.status().message());
    configs = std::move(checked->configs);
    config_options = std::move(checked->options);
    checked_rows = checked->final_chunk_rows;
    // The policies decide what the engine is created with: eviction pools when one evicts during
    // decode, and steps that hold the prompt rows one scores at once (unless told otherwise).
    options.eviction_pools = options.eviction_pools || checked->evicts_during_decode;
    if (flags.max_batched_option->count() == 0) {
      options.max_num_batched_tokens =
          std::max(options.max_num_batched_tokens, checked->final_chunk_rows);
    }
    auto built = BuildEngine(flags.engine);
    if (!built.ok()) return Fail(1, built.status().message());
    bundle = std::move(built).value();
    tokenizer = bundle->loaded.tokenizer.get();
    if (tokenizer == nullptr) return Fail(1, "the model has no tokenizer; pass --tokenizer");
    if (bundle->loaded.default_model) {
      std::fprintf(stderr, "note: %s\n", bundle->loaded.description.c_str());
    }
    base_options = bundle->engine->default_policy().options();
    model_description = bundle->loaded.description;
    device = bundle->backend->name();
    quantization = bundle->engine->model().quantization();
    activation_dtype = bundle->backend->activation_dtype();
    auto kv_dtype = ParseKvCacheDtype(options.kv_cache_dtype, *activation_dtype);
    if (!kv_dtype.ok()) return Fail(2, kv_dtype.status().message());
    kv_cache_dtype = *kv_dtype;
    const int max_len = bundle->engine->max_model_len();
    if (longest + max_task_tokens > max_len) {
      return Fail(2, "--lengths " + std::to_string(longest) + " plus up to " +
                         std::to_string(max_task_tokens) +
                         " generated tokens exceeds the engine's max model length " +
                         std::to_string(max_len) + " (see --max-model-len)");
    }
  }
  if (remote) {
    auto made = MakeConfigs(flags, base_options);
    if (!made.ok()) return Fail(2, made.status().message());
    configs = std::move(made).value();
    config_options.assign(configs.size(), std::nullopt);
  } else if (bundle->engine->options().enable_chunked_prefill &&
             checked_rows > bundle->engine->options().max_num_batched_tokens) {
    return Fail(2, "a configuration scores " + std::to_string(checked_rows) +
                       " prompt rows in one step but --max-num-batched-tokens is " +
                       std::to_string(bundle->engine->options().max_num_batched_tokens));
  }

  // The samples: the same for every configuration.
  std::vector<std::unique_ptr<EvalSample>> samples;
  {
    eval::TaskGenerator generator(eval::TaskSpec::Embedded(), *tokenizer, sentences);
    generator.set_prompt_suffix(flags.prompt_suffix);
    std::optional<eval::PerplexityText> perplexity;
    if (has("perplexity")) {
      auto made = eval::PerplexityText::Create(ppl_text, *tokenizer);
      if (!made.ok()) return Fail(1, "--text: " + made.status().message());
      perplexity = std::move(made).value();
    }
    for (const std::string& task : flags.tasks) {
      if (task == "jsonl" || task == "heldout") {
        const bool heldout = task == "heldout";
        eval::JsonlOptions options;
        // "\\n" typed on a command line means a newline. The held-out records were fitted to
        // their length with the default template, so they keep it.
        if (!heldout) options.prompt_template = flags.prompt_template;
        for (size_t at = options.prompt_template.find("\\n"); at != std::string::npos;
             at = options.prompt_template.find("\\n", at + 1)) {
          options.prompt_template.replace(at, 2, "\n");
        }
        options.metric = *eval::ParseJsonlMetric(flags.metric);
        options.max_tokens = flags.max_tokens;
        options.max_prompt_tokens = longest;
        options.buckets = flags.lengths;
        const std::vector<eval::JsonlRecord>& from = heldout ? heldout_records : records;
        for (size_t index = 0; index < from.size(); ++index) {
          auto sample =
              eval::MakeJsonlSample(from[index], static_cast<int>(index), options, *tokenizer);
          if (!sample.ok()) {
            return Fail(1,
                        (heldout ? heldout_path : flags.data) + ": " + sample.status().message());
          }
          sample->task = task;
          samples.push_back(std::make_unique<EvalSample>(std::move(sample).value()));
        }
        continue;
      }
      for (const int length : flags.lengths) {
        std::vector<std::optional<double>> depths = {std::nullopt};
        if (eval::HasDepthAxis(task)) depths.assign(flags.depths.begin(), flags.depths.end());
        for (const std::optional<double>& depth : depths) {
          for (int index = 0; index < flags.samples; ++index) {
            auto sample = task == "perplexity"
                              ? perplexity->Sample(length, flags.ppl_tokens, index, flags.seed)
                              : generator.Generate(task, length, depth, index, flags.seed);
            if (!sample.ok()) return Fail(1, sample.status().message());
            samples.push_back(std::make_unique<EvalSample>(std::move(sample).value()));
          }
        }
      }
    }
  }
  std::vector<const EvalSample*> sample_list;
  int truncated = 0;
  int two_turn_samples = 0;
  for (const auto& sample : samples) {
    sample_list.push_back(sample.get());
    truncated += sample->truncated ? 1 : 0;
    if (sample->follow_up.empty()) continue;
    ++two_turn_samples;
    // Turn 2 holds the prompt, turn 1's answer, the new question and turn 2's answer.
    const int turn_two =
        static_cast<int>(sample->prompt_ids.size() + sample->follow_up_ids.size()) +
        2 * sample->max_tokens;
    if (!remote && turn_two > bundle->engine->max_model_len()) {
      return Fail(
          2, fmt::format("{} at length {}: turn 2 comes to {} tokens, past the engine's "
                         "max model length {} (see --max-model-len)",
                         sample->task, sample->length, turn_two, bundle->engine->max_model_len()));
    }
  }
  if (truncated > 0) {
    std::fprintf(stderr,
                 "note: %d of %zu --data / heldout prompts were longer than %d tokens and were "
                 "cut in the middle\n",
                 truncated, records.size() + heldout_records.size(), longest);
  }
  std::fprintf(stderr, "%zu samples x %zu configurations\n", sample_list.size(), configs.size());

  const eval::SecondTurn second_turn = *eval::ParseSecondTurn(flags.second_turn);
  eval::EvalResults results(flags.tasks, configs);
  nlohmann::json config_json = nlohmann::json::array();
  for (size_t index = 0; index < configs.size(); ++index) {
    const EvalConfig& config = configs[index];
    bench::ProgressBar bar(config.label, static_cast<int>(sample_list.size()), !flags.no_progress);
    const auto progress = [&bar](int done) { bar.Update(done, 0, 0); };
    nlohmann::json item = {
        {"label", config.label},
        {"policy", config.policy},
        {"budget", config.budget ? nlohmann::json(*config.budget) : nlohmann::json(nullptr)}};
    eval::KvUsage usage;
    std::vector<eval::KvUsage> turns;
    const auto run_samples = [&](const std::vector<const EvalSample*>& list,
                                 const std::function<void(int)>& on_done) {
      if (remote) return eval::RunOnServer(remote_options, list, config, on_done);
      eval::KvUsage turn;
      auto records =
          eval::RunOnEngine(*bundle->engine, list, config, config_options[index], on_done, turn);
      usage.Add(turn);
      turns.push_back(std::move(turn));
      return records;
    };
    Result<std::vector<eval::SampleRecord>> run = run_samples(sample_list, progress);
    bar.Finish();
    if (!run.ok()) return Fail(1, run.status().message());
    if (two_turn_samples > 0) {
      // Turn 2 of the two-turn samples, once every turn 1 has its answer.
      auto second = eval::SecondTurnSamples(sample_list, *run, second_turn, *tokenizer);
      if (!second.ok()) return Fail(1, "turn 2: " + second.status().message());
      std::vector<const EvalSample*> second_list;
      for (const auto& turn : *second) {
        if (turn) second_list.push_back(turn.get());
      }
      bench::ProgressBar turn_bar(config.label + ", turn 2", static_cast<int>(second_list.size()),
                                  !flags.no_progress);
      auto second_run =
          run_samples(second_list, [&turn_bar](int done) { turn_bar.Update(done, 0, 0); });
      turn_bar.Finish();
      if (!second_run.ok()) return Fail(1, "turn 2: " + second_run.status().message());
      eval::MergeSecondTurn(*run, *second, *second_run);
    }
    if (!remote) {
      int64_t kept = 0;
      for (const int64_t entries : usage.entries_kept_by_layer) kept += entries;
      const double dense = static_cast<double>(usage.prompt_tokens) *
                           static_cast<double>(usage.entries_kept_by_layer.size());
      item["options"] = OptionsJson(config_options[index].value_or(base_options));
      item["kv"] = {{"prompt_tokens", usage.prompt_tokens},
                    {"entries_kept_by_layer", usage.entries_kept_by_layer},
                    {"kept_fraction", dense > 0 ? static_cast<double>(kept) / dense : 1.0},
                    {"preemptions", usage.preemptions},
                    {"seconds", usage.seconds},
                    {"prefix_cache_queries", usage.prefix_cache_queries},
                    {"prefix_cache_hits", usage.prefix_cache_hits}};
      if (turns.size() > 1) {
        nlohmann::json by_turn = nlohmann::json::array();
        for (const eval::KvUsage& turn : turns) {
          by_turn.push_back({{"seconds", turn.seconds},
                             {"prompt_tokens", turn.prompt_tokens},
                             {"prefix_cache_queries", turn.prefix_cache_queries},
                             {"prefix_cache_hits", turn.prefix_cache_hits}});
        }
        item["kv"]["turns"] = std::move(by_turn);
      }
    }
    int errors = 0;
    std::string first_error;
    for (eval::SampleRecord& record : *run) {
      if (!record.error.empty() && errors++ == 0) first_error = record.error;
      results.Add(std::move(record));
    }
    if (errors > 0) {
      std::fprintf(stderr, "%s: %d of %zu requests failed (scored 0), first: %s\n",
                   config.label.c_str(), errors, sample_list.size(), first_error.c_str());
    }
    if (errors == static_cast<int>(sample_list.size())) {
      return Fail(1, "every request failed: " + first_error);
    }
    config_json.push_back(std::move(item));
  }

  const std::string kv_cache =
      kv_cache_dtype ? ", KV cache " + std::string(DTypeName(*kv_cache_dtype)) : "";
  std::printf("sieve eval: %s on %s%s, %d sample(s) per cell, seed %llu, haystack %s\n",
              model_description.c_str(), device.c_str(), kv_cache.c_str(), flags.samples,
              static_cast<unsigned long long>(flags.seed),
              sentences.empty() ? "noise sentence" : flags.haystack.c_str());
  for (const nlohmann::json& item : config_json) {
    if (item.contains("kv")) {
      std::printf("  %-28s KV entries kept after prompts: %5.1f%% of dense, %.1f s\n",
                  item["label"].get<std::string>().c_str(),
                  100.0 * item["kv"]["kept_fraction"].get<double>(),
                  item["kv"]["seconds"].get<double>());
    }
  }
  std::fputs(results.Table().c_str(), stdout);
  std::fflush(stdout);

  if (!flags.result_json.empty()) {
    nlohmann::json json = results.ToJson();
    nlohmann::json settings;
    settings["command"] = CommandLine();
    settings["model"] = model_description;
    settings["model_dir"] = flags.engine.load.model_dir;
    settings["device"] = device;
    settings["tasks"] = flags.tasks;
    settings["lengths"] = flags.lengths;
    settings["depths"] = flags.depths;
    settings["samples"] = flags.samples;
    settings["seed"] = flags.seed;
    settings["haystack"] = sentences.empty() ? "noise" : flags.haystack;
    settings["prompt_suffix"] = flags.prompt_suffix;
    settings["policies"] = flags.policies;
    settings["budgets"] = flags.budgets;
    settings["sieve_version"] = SIEVE_VERSION;
    settings["sieve_commit"] = SIEVE_GIT_COMMIT;
    if (has("perplexity")) {
      settings["text"] = flags.text;
      settings["ppl_tokens"] = flags.ppl_tokens;
    }
    if (has("heldout")) settings["heldout"] = heldout_path;
    if (two_turn_samples > 0) settings["second_turn"] = eval::SecondTurnName(second_turn);
    if (has("jsonl")) {
      settings["data"] = flags.data;
      settings["prompt_template"] = flags.prompt_template;
      settings["metric"] = flags.metric;
      settings["max_tokens"] = flags.max_tokens;
      settings["truncated"] = truncated;
    }
    if (remote) {
      settings["base_url"] = remote_options.base_url.ToString();
      settings["served_model_name"] = remote_options.model;
    } else {
      settings["max_model_len"] = bundle->engine->max_model_len();
      settings["quantization"] = WeightQuantizationName(*quantization);
      settings["activation_dtype"] = DTypeName(*activation_dtype);
      settings["kv_cache_dtype"] = DTypeName(*kv_cache_dtype);
      settings["window"] = base_options.window;
      settings["kv_options"] = OptionsJson(base_options);
    }
    nlohmann::json ordered;
    ordered["settings"] = std::move(settings);
    ordered["configs"] = std::move(config_json);
    ordered["cells"] = std::move(json["cells"]);
    ordered["summary"] = std::move(json["summary"]);
    ordered["records"] = std::move(json["records"]);
    const Status written =
        WriteFile(flags.result_json,
                  ordered.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
    if (!written.ok()) return Fail(1, "--result-json: " + written.message());
  }
  if (!flags.plot_dir.empty()) {
    const Status plotted = WritePlots(flags, results);
    if (!plotted.ok()) return Fail(1, plotted.message());
  }
  return 0;
}

}  // namespace

CommandRunner AddEvalCommand(CLI::App& app) {
  auto flags = std::make_shared<EvalFlags>();
  AddEngineFlags(app, flags->engine, /*policy_flags=*/false);
  flags->max_batched_option = app.get_option("--max-num-batched-tokens");
  app.add_option(
         "--task", flags->tasks,
         "Tasks, comma-separated: passkey, niah, niah-multikey, niah-multivalue, "
         "kv-retrieval, variable-tracking, common-words (synthetic, RULER-style, wording in "
         "tools/eval/tasks.json), niah-two-turn (a conversation: turn 1 asks one needle, turn 2 "
         "another of the same context, scored; see --second-turn), perplexity (needs --text), "
         "jsonl (needs --data), heldout (needles in words training never saw: "
         "testdata/eval/heldout_needles.jsonl, the records at --lengths)")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--lengths", flags->lengths,
                 "Prompt lengths in tokens (BOS included), comma-separated: each prompt is as long "
                 "as fits; jsonl: length buckets, the largest also the prompt limit")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--depths", flags->depths,
                 "Needle depths in [0, 1] (passkey, niah, niah-multikey, kv-retrieval), "
                 "comma-separated")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--samples", flags->samples,
                 "Samples per (task, length, depth) cell (jsonl: every record once)")
      ->capture_default_str();
  app.add_option("--seed", flags->seed,
                 "Seed of the samples (each from seed, task, length, depth, "
                 "index)")
      ->capture_default_str();
  app.add_option("--kv-policy", flags->policies,
                 "A KV policy to evaluate after dense, repeatable: full | snapkv | pyramidkv | "
                 "streamingllm | h2o, or per layer range, e.g. \"full:0-2,pyramidkv:3-7\"");
  app.add_option("--kv-budget", flags->budgets,
                 "Budgets to evaluate each policy at, repeatable or comma-separated (default: "
                 "1024): entries kept per sparse layer. SnapKV C = B, PyramidKV average C = B, "
                 "StreamingLLM --kv-sinks + recent = B, H2O heavy = recent = B/2; must exceed "
                 "--kv-window")
      ->delimiter(',');
  app.add_option("--result-json", flags->result_json,
                 "Write settings, configurations (with KV entries kept), every cell, summaries "
                 "and per-sample records as JSON");
  app.add_option("--plot-dir", flags->plot_dir,
                 "Write SVG charts here: a needle heatmap per depth task and configuration, a "
                 "score-vs-budget chart per task");
  app.add_flag("--no-progress", flags->no_progress, "No progress bar on stderr");
  app.add_option("--haystack", flags->haystack,
                 "niah haystack: a text file or a directory of .txt files, cut into sentences "
                 "(default: the noise sentence)");
  app.add_option("--prompt-suffix", flags->prompt_suffix,
                 "Synthetic tasks: text appended to every prompt after its question, within "
                 "its length. \" \" ends each prompt with the space before the answer, so the "
                 "token whose query retrieves the answer is in the prompt (and in a policy's "
                 "observation window)");
  app.add_option("--text", flags->text,
                 "perplexity: held-out text, a file or a directory of .txt files");
  app.add_option("--ppl-tokens", flags->ppl_tokens,
                 "perplexity: tokens scored after each context, teacher-forced through decode "
                 "steps")
      ->capture_default_str();
  app.add_option("--data", flags->data,
                 "jsonl: records {\"context\", \"input\", \"answers\": [...], optional "
                 "\"length\", \"metric\"}, one per line (LongBench / RULER style)");
  app.add_option("--prompt-template", flags->prompt_template,
                 "jsonl: the prompt, with {context} and {input}; \\n is a newline (default: "
                 "\"{context}\\n\\n{input}\")");
  app.add_option("--metric", flags->metric,
                 "jsonl: exact | substring | f1 (SQuAD-normalised; best over answers) for records "
                 "without their own")
      ->capture_default_str();
  app.add_option("--second-turn", flags->second_turn,
                 "niah-two-turn: how turn 2 runs. prefill: a new request holding the whole "
                 "conversation, compressed under turn 2's own question (with prefix caching on, "
                 "turn 1's prompt pages are reused exactly); reuse: turn 2 continues on the KV "
                 "cache turn 1's policy left, compressed under turn 1's question (in process "
                 "only; its tokens run as decode steps)")
      ->capture_default_str();
  app.add_option("--max-tokens", flags->max_tokens, "jsonl, heldout: new tokens at most per answer")
      ->capture_default_str();
  app.add_option("--base-url", flags->base_url,
                 "Evaluate an OpenAI-compatible server instead (http://host:port): "
                 "POST /v1/completions, greedy, stop at newline; its own KV policy is one "
                 "configuration");
  app.add_option("--api-key", flags->api_key, "With --base-url: sent as a Bearer token");
  app.add_option("--served-model-name", flags->served_model_name,
                 "With --base-url: the model field (default: the first of GET /v1/models)");
  app.add_option("--max-concurrency", flags->max_concurrency,
                 "With --base-url: requests in flight at once")
      ->capture_default_str();
  app.add_option("--label", flags->label,
                 "Name of the first configuration in tables and files (default: full; with "
                 "--base-url: remote)");
  return [flags]() { return Run(*flags); };
}

}  // namespace sieve
