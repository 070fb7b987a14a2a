#include "tools/eval/engine_evaluator.h"

#include <algorithm>
#include <chrono>
#include <map>

#include "tools/eval/scoring.h"

namespace sieve::eval {

namespace {

// The kinds named in a policy string ("full:0-2,h2o:3-7" -> full, h2o), unvalidated: budgets
// are mapped to knobs before a model (and so its layer count, which KvPolicy::Parse needs) loads.
std::vector<std::string> PolicyKinds(const std::string& policy) {
  std::vector<std::string> kinds;
  size_t begin = 0;
  while (begin <= policy.size()) {
    size_t end = policy.find(',', begin);
    if (end == std::string::npos) end = policy.size();
    const std::string part = policy.substr(begin, end - begin);
    kinds.push_back(part.substr(0, part.find(':')));
    begin = end + 1;
  }
  return kinds;
}

}  // namespace

Result<KvPolicyOptions> OptionsForBudget(const std::string& policy, KvPolicyOptions base,
                                         int budget) {
  if (budget <= base.window) {
    return InvalidArgumentError("--kv-budget " + std::to_string(budget) +
                                " is not above the observation window (--kv-window " +
                                std::to_string(base.window) + ")");
  }
  base.budget = budget;
  bool h2o = false, streaming = false;
  for (const std::string& kind : PolicyKinds(policy)) {
    h2o = h2o || kind == "h2o";
    streaming = streaming || kind == "streamingllm";
  }
  if (h2o && streaming) {
    return InvalidArgumentError("policy '" + policy +
                                "' mixes h2o and streamingllm, whose budgets share --kv-recent: "
                                "evaluate them separately");
  }
  if (streaming) {
    if (budget <= base.sinks) {
      return InvalidArgumentError("--kv-budget " + std::to_string(budget) +
                                  " leaves no recent entries after --kv-sinks " +
                                  std::to_string(base.sinks));
    }
    base.recent = budget - base.sinks;
  }
  if (h2o) {
    base.heavy = budget / 2;
    base.recent = budget - budget / 2;
  }
  return base;
}

void KvUsage::Add(const KvUsage& other) {
  prompt_tokens += other.prompt_tokens;
  entries_kept_by_layer.resize(
      std::max(entries_kept_by_layer.size(), other.entries_kept_by_layer.size()));
  for (size_t layer = 0; layer < other.entries_kept_by_layer.size(); ++layer) {
    entries_kept_by_layer[layer] += other.entries_kept_by_layer[layer];
  }
  preemptions += other.preemptions;
  seconds += other.seconds;
  prefix_cache_queries += other.prefix_cache_queries;
  prefix_cache_hits += other.prefix_cache_hits;
}

Result<std::vector<SampleRecord>> RunOnEngine(Engine& engine,
                                              const std::vector<const EvalSample*>& samples,
                                              const EvalConfig& config,
                                              const std::optional<KvPolicyOptions>& options,
                                              const std::function<void(int)>& progress,
                                              KvUsage& usage) {
  const auto start = std::chrono::steady_clock::now();
  const EngineStats before = engine.Stats();
  std::vector<SampleRecord> records(samples.size());
  std::map<RequestId, size_t> index_of;
  for (size_t index = 0; index < samples.size(); ++index) {
    const EvalSample& sample = *samples[index];
    records[index].sample = &sample;
    records[index].config = config.label;
    Request request;
    request.prompt = sample.prompt_ids;
    request.sampling.temperature = 0;
    request.sampling.max_tokens = sample.max_tokens;
    if (sample.metric == Metric::kPerplexity) {
      request.forced_tokens = sample.forced_tokens;
    } else if (engine.tokenizer() != nullptr) {
      request.sampling.stop = {"\n"};
    }
    if (!sample.continuation.empty()) {
      request.forced_tokens = sample.continuation;
      request.sample_after_forced = true;
    }
    request.kv_policy = config.policy;
    request.kv_policy_options = options;
    auto id = engine.Add(std::move(request));
    if (!id.ok()) {
      // Requests already added would run into the next configuration: end them here.
      for (const auto& [added, unused] : index_of) engine.Abort(added);
      while (engine.HasWork()) engine.Step();
      return id.status().WithContext(config.label + ", " + sample.task + " at length " +
                                     std::to_string(sample.length));
    }
    index_of[*id] = index;
  }
  int done = 0;
  while (engine.HasWork()) {
    for (const RequestOutput& output : engine.Step()) {
      const auto it = index_of.find(output.id);
      if (it == index_of.end()) continue;
      SampleRecord& record = records[it->second];
      record.output += output.new_text;
      // A continuation's forced tokens come with log-probabilities too; only perplexity sums
      // them.
      if (record.sample->metric == Metric::kPerplexity) {
        for (const SampleResult& scored : output.new_logprobs) {
          record.score -= scored.logprob;
          ++record.scored_tokens;
        }
      }
      if (!output.finished) continue;
      if (record.sample->metric != Metric::kPerplexity) {
        record.score = ScoreOutput(*record.sample, record.output);
      }
      progress(++done);
    }
  }
  const EngineStats after = engine.Stats();
  usage.prompt_tokens = after.compressed_prompt_tokens - before.compressed_prompt_tokens;
  usage.entries_kept_by_layer.resize(after.entries_kept_by_layer.size());
  for (size_t layer = 0; layer < after.entries_kept_by_layer.size(); ++layer) {
    usage.entries_kept_by_layer[layer] =
        after.entries_kept_by_layer[layer] - before.entries_kept_by_layer[layer];
  }
  usage.preemptions = after.num_preemptions - before.num_preemptions;
  usage.prefix_cache_queries = after.prefix_cache_queries - before.prefix_cache_queries;
  usage.prefix_cache_hits = after.prefix_cache_hits - before.prefix_cache_hits;
  usage.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return records;
}

}  // namespace sieve::eval
