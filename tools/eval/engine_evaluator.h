// Evaluation in process: every sample of one configuration added to the engine together
// (continuous batching), stepped until all finish; greedy, stop at EOS and "\n".
//
// The engine's default policy is fixed at Engine::Create, but a request may carry its own policy
// and knobs (Request::kv_policy, Request::kv_policy_options), so one loaded model evaluates every
// policy x budget: reloading per configuration would cost a model load each, and a second engine
// a second KV pool. The engine is created with eviction pools when any evaluated policy evicts
// during decode (EngineOptions::eviction_pools).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "runtime/engine.h"
#include "sparsity/kv_policy.h"
#include "tools/eval/eval_results.h"
#include "tools/eval/eval_sample.h"

namespace sieve::eval {

// `base` with one --kv-budget B applied to every kind the policy uses: SnapKV / PyramidKV keep
// C = B; StreamingLLM keeps sinks + recent = B; H2O keeps heavy = B / 2 and recent = B - B / 2
// (its paper's even split). InvalidArgument when B is not above the observation window (or, for
// StreamingLLM, the sinks).
Result<KvPolicyOptions> OptionsForBudget(const std::string& policy, KvPolicyOptions base,
                                         int budget);

// What the engine's statistics moved by during one configuration.
struct KvUsage {
  int64_t prompt_tokens = 0;                   // prompts that finished prefill
  std::vector<int64_t> entries_kept_by_layer;  // [L] over those prompts
  int64_t preemptions = 0;
  double seconds = 0;
  int64_t prefix_cache_queries = 0;  // prompt tokens looked up in the prefix cache
  int64_t prefix_cache_hits = 0;     // of those, found

  void Add(const KvUsage& other);  // the sum of two runs (a two-turn task's turns)
};

// Runs `samples` under `config` (`options`: its policy knobs; unset for dense) and returns one
// record per sample, in order. `progress(done)` is called as samples finish. Errors: a request
// the engine refuses (named by task, length and depth).
Result<std::vector<SampleRecord>> RunOnEngine(Engine& engine,
                                              const std::vector<const EvalSample*>& samples,
                                              const EvalConfig& config,
                                              const std::optional<KvPolicyOptions>& options,
                                              const std::function<void(int)>& progress,
                                              KvUsage& usage);

}  // namespace sieve::eval
