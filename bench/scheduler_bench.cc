// Host overhead of one engine step at 256 running sequences (Llama-3-8B shape: 32 layers, pages
// of 16): scheduling (Plan + Commit + Complete) and building + uploading the step's metadata
// (ModelRunner::PrepareStep), without the forward pass. Target: far below a GPU decode step
// (PERF.md: 5.7-19 ms); under 0.2 ms.
//   scheduler_bench [STEPS [POLICY]]   (default: 200 steps, both policies below)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "runtime/model_runner.h"
#include "sched/scheduler.h"

int main(int argc, char** argv) {
  using namespace sieve;
  constexpr int kSeqs = 256;
  constexpr int kLayers = 32;
  constexpr int kPrompt = 4000;
  constexpr double kTargetMs = 0.2;
  const int kSteps = argc > 1 ? std::atoi(argv[1]) : 200;
  if (kSteps <= 0) {
    std::fprintf(stderr, "usage: scheduler_bench [STEPS [POLICY]]: STEPS must be positive\n");
    return 2;
  }
  ModelConfig config;  // the shapes the runner sizes buffers for; a thin model keeps memory low
  config.architecture = "LlamaForCausalLM";
  config.vocab_size = 256;
  config.hidden_size = 8;
  config.intermediate_size = 8;
  config.num_layers = kLayers;
  config.num_heads = 1;
  config.num_kv_heads = 1;
  config.head_dim = 8;
  config.max_position_embeddings = 8192;
  auto backend = MakeCpuBackend();
  auto model = LlamaModel::Random(config, *backend, 1, 8192);
  const char* only = argc > 2 ? argv[2] : nullptr;
  for (const std::string spec : {"full", "full:0-2,pyramidkv:3-31"}) {
    if (only && spec != only) continue;
    KvPolicyOptions policy_options;
    policy_options.budget = 400;
    auto policy = KvPolicy::Parse(spec, kLayers, policy_options);
    KvCacheManager::Options kv_options;
    kv_options.page_size = 16;
    kv_options.num_layers = kLayers;
    kv_options.max_seqs = kSeqs;
    kv_options.max_pages_per_seq = 8192 / 16 + 2;
    kv_options.num_pages = kSeqs * kLayers * ((kPrompt + kSteps) / 16 + 4);
    KvCacheManager kv(kv_options);
    SchedulerOptions sched_options;
    sched_options.max_num_seqs = kSeqs;
    sched_options.max_num_batched_tokens = 8192;
    sched_options.max_model_len = 8192;
    Scheduler scheduler(sched_options, &kv);
    ModelRunnerOptions runner_options;
    runner_options.max_num_seqs = kSeqs;
    runner_options.max_num_batched_tokens = 8192;
    ModelRunner runner(*model, kv, runner_options);
    // 256 sequences already past their prompt: admit them and fake their prefill.
    for (int id = 0; id < kSeqs; ++id) {
      Sequence seq;
      seq.id = id;
      seq.arrival = id;
      seq.tokens.assign(kPrompt + 1, 1);
      seq.num_prompt_tokens = kPrompt;
      seq.max_total_tokens = 8000;
      seq.policy = &*policy;
      scheduler.Add(seq);
    }
    for (int id = 0; id < kSeqs; ++id) {
      Sequence* seq = scheduler.Find(id);
      seq->prefill_target = kPrompt;
      seq->num_computed = kPrompt;
      seq->state = SequenceState::kRunning;
    }
    // Commit their KV as the prompt left it (admission path skipped: the sequences are decoding).
    StepPlan admit;
    for (int id = 0; id < kSeqs; ++id) admit.Admit(id, /*cached_tokens=*/0, /*uncached=*/false);
    scheduler.Commit(admit);
    for (int id = 0; id < kSeqs; ++id) {
      const std::vector<int> after = policy->EntriesAfterPrompt(kPrompt);
      (void)kv.Grow(id, after);
      for (int layer = 0; layer < kLayers; ++layer) kv.SetLength(id, layer, after[layer]);
    }
    std::vector<SeqId> sample_ids;
    std::vector<double> schedule_ms, prepare_ms;
    StepPlan plan;  // reused, as the engine does
    for (int step = 0; step < kSteps; ++step) {
      const auto t0 = std::chrono::steady_clock::now();
      scheduler.Plan(plan);
      scheduler.Commit(plan);
      const auto t1 = std::chrono::steady_clock::now();
      runner.PrepareStep(plan, scheduler, sample_ids);
      const auto t2 = std::chrono::steady_clock::now();
      scheduler.Complete(plan);
      for (const SeqId id : sample_ids) scheduler.Find(id)->tokens.push_back(1);
      const auto t3 = std::chrono::steady_clock::now();
      schedule_ms.push_back(
          std::chrono::duration<double, std::milli>((t1 - t0) + (t3 - t2)).count());
      prepare_ms.push_back(std::chrono::duration<double, std::milli>(t2 - t1).count());
      if (plan.decodes.size() != static_cast<size_t>(kSeqs)) {
        std::printf("unexpected plan: %zu decodes\n", plan.decodes.size());
        return 1;
      }
    }
    std::sort(schedule_ms.begin(), schedule_ms.end());
    const size_t median = schedule_ms.size() / 2, p90 = schedule_ms.size() * 9 / 10;
    std::sort(prepare_ms.begin(), prepare_ms.end());
    const double total = schedule_ms[median] + prepare_ms[median];
    std::printf(
        "%-26s 256 decoding sequences x 32 layers: schedule %.3f ms + prepare step %.3f ms"
        " = %.3f ms per step (median of %d steps; p90 %.3f)   target < %.1f ms: %s\n",
        spec.c_str(), schedule_ms[median], prepare_ms[median], total, kSteps,
        schedule_ms[p90] + prepare_ms[p90], kTargetMs, total < kTargetMs ? "MET" : "MISSED");
  }
  return 0;
}
