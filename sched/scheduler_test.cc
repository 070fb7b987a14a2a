// The scheduler's batch-invariant chunking (sched/README.md "Batch invariance"): a prompt is cut
// into the same prefill chunks alone as among other prompts and decodes competing for the step's
// budget, whatever the policy's scored rows and with a cached prefix; without the rule the cuts
// follow the budget that is left. Driven as the engine drives it: Plan, Commit, Complete, then a
// token appended to each sampled sequence.
#include "sched/scheduler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/testing.h"
#include "sparsity/kv_policy.h"

namespace sieve {
namespace {

constexpr int kLayers = 2;
constexpr int kPageSize = 4;

struct Chunk {
  int start = 0;
  int tokens = 0;
  bool operator==(const Chunk& other) const {
    return start == other.start && tokens == other.tokens;
  }
};

struct Arrival {
  int step = 0;  // added before this step is planned
  std::vector<int32_t> prompt;
  int max_new = 0;
};

// Runs the arrivals to the end; returns each one's prefill chunks (by arrival index) and whether
// any was preempted.
std::vector<std::vector<Chunk>> RunChunks(const SchedulerOptions& options, const KvPolicy& policy,
                                          const std::vector<Arrival>& arrivals) {
  KvCacheManager::Options kv_options;
  kv_options.num_pages = 100000;
  kv_options.page_size = kPageSize;
  kv_options.num_layers = kLayers;
  kv_options.max_seqs = options.max_num_seqs;
  kv_options.max_pages_per_seq = 2 * options.max_model_len / kPageSize + 2;
  KvCacheManager kv(kv_options);
  Scheduler scheduler(options, &kv);
  std::vector<std::vector<Chunk>> chunks(arrivals.size());
  std::map<SeqId, size_t> index_of;
  size_t added = 0;
  StepPlan plan;
  for (int step = 0; step < 100000; ++step) {
    while (added < arrivals.size() && arrivals[added].step <= step) {
      Sequence seq;
      seq.id = static_cast<SeqId>(added + 1);
      seq.arrival = static_cast<int64_t>(added);
      seq.tokens = arrivals[added].prompt;
      seq.num_prompt_tokens = static_cast<int>(seq.tokens.size());
      seq.max_total_tokens = seq.num_prompt_tokens + arrivals[added].max_new;
      seq.policy = &policy;
      index_of[seq.id] = added;
      scheduler.Add(std::move(seq));
      ++added;
    }
    if (!scheduler.HasWork()) {
      if (added == arrivals.size()) break;
      continue;
    }
    scheduler.Plan(plan);
    scheduler.Commit(plan);
    for (const ScheduledSequence& scheduled : plan.prefills) {
      chunks[index_of.at(scheduled.id)].push_back({scheduled.context_len, scheduled.num_tokens});
    }
    scheduler.Complete(plan);
    for (const auto* list : {&plan.prefills, &plan.decodes}) {
      for (const ScheduledSequence& scheduled : *list) {
        if (!scheduled.sample) continue;
        Sequence& seq = *scheduler.Find(scheduled.id);
        seq.tokens.push_back(7);
        if (static_cast<int>(seq.tokens.size()) >= seq.max_total_tokens) {
          scheduler.Remove(scheduled.id);
        }
      }
    }
  }
  EXPECT_FALSE(scheduler.HasWork()) << "the run did not end";
  return chunks;
}

std::vector<int32_t> RandomTokens(std::mt19937_64& rng, int length) {
  std::vector<int32_t> tokens(length);
  for (int32_t& token : tokens) token = static_cast<int32_t>(rng() % 200);
  return tokens;
}

TEST(SchedulerTest, BatchInvariantChunksAreThePromptsAloneWhateverTheBudgetLeft) {
  auto rng = testing::MakeRng();
  KvPolicyOptions knobs;
  knobs.budget = 24;
  knobs.window = 6;
  for (const std::string spec : {"full", "snapkv"}) {
    SCOPED_TRACE(spec);
    const Result<KvPolicy> policy = KvPolicy::Parse(spec, kLayers, knobs);
    ASSERT_TRUE(policy.ok()) << policy.status().ToString();
    for (const bool caching : {false, true}) {
      SCOPED_TRACE(caching ? "prefix caching" : "no prefix caching");
      SchedulerOptions options;
      options.max_num_seqs = 64;
      options.max_num_batched_tokens = 48;
      options.max_model_len = 400;
      options.enable_prefix_caching = caching;
      options.batch_invariant_chunk = 16;
      // The probe, a prompt of several chunks; the crowd arrives before and during it, some with
      // the probe's head (cached pages for it to find), some decoding long.
      // The probe arrives at step 10, after the crowd's first request (which has the probe's head
      // of 53 tokens: 13 whole pages, not a whole number of chunks) has been prefilled.
      const Arrival probe{10, RandomTokens(rng, 90 + static_cast<int>(rng() % 60)), 5};
      std::vector<Arrival> crowd;
      for (int index = 0; index < 30; ++index) {
        Arrival arrival{static_cast<int>(rng() % 20), {}, 1 + static_cast<int>(rng() % 40)};
        if (index % 4 == 0) {
          arrival.prompt.assign(probe.prompt.begin(), probe.prompt.begin() + 53);
        }
        const std::vector<int32_t> tail = RandomTokens(rng, 3 + static_cast<int>(rng() % 70));
        arrival.prompt.insert(arrival.prompt.end(), tail.begin(), tail.end());
        crowd.push_back(std::move(arrival));
      }
      crowd.front().step = 0;  // ahead of the probe, with its head: pages for it to find
      std::vector<Arrival> with_crowd = crowd;
      with_crowd.push_back(probe);
      // Arrival order is FCFS order: the probe comes after the crowd that came first.
      std::stable_sort(with_crowd.begin(), with_crowd.end(),
                       [](const Arrival& a, const Arrival& b) { return a.step < b.step; });
      const auto probe_at = static_cast<size_t>(
          std::find_if(with_crowd.begin(), with_crowd.end(),
                       [&](const Arrival& a) { return a.prompt == probe.prompt; }) -
          with_crowd.begin());

      const std::vector<Chunk> alone = RunChunks(options, *policy, {probe}).front();
      const std::vector<Chunk> crowded = RunChunks(options, *policy, with_crowd)[probe_at];
      // Each chunk but the last two ends on a multiple of the unit; none holds more than it,
      // and the final chunk holds the policy's scored rows.
      ASSERT_FALSE(alone.empty());
      int covered = 0;
      for (size_t index = 0; index < alone.size(); ++index) {
        EXPECT_EQ(alone[index].start, covered);
        covered += alone[index].tokens;
        EXPECT_LE(alone[index].tokens, 16);
        if (index + 2 < alone.size()) {
          EXPECT_EQ(covered % 16, 0) << "chunk " << index;
        }
      }
      EXPECT_EQ(covered, static_cast<int>(probe.prompt.size()));
      EXPECT_GE(alone.back().tokens, policy->FinalChunkRows(covered));
      // In the crowd: the same chunks, after a cached prefix that ends on a chunk boundary.
      ASSERT_FALSE(crowded.empty());
      const int cached = crowded.front().start;
      EXPECT_EQ(cached % 16, 0);
      if (caching) {
        EXPECT_GT(cached, 0) << "the probe found no cached page";
      }
      std::vector<Chunk> alone_after_cache;
      for (const Chunk& chunk : alone) {
        if (chunk.start >= cached) alone_after_cache.push_back(chunk);
      }
      EXPECT_EQ(crowded, alone_after_cache) << "cached " << cached;

      // Without the rule the crowd cuts the probe where the budget runs out.
      if (!caching && spec == std::string("full")) {
        SchedulerOptions free = options;
        free.batch_invariant_chunk = 0;
        const std::vector<Chunk> free_alone = RunChunks(free, *policy, {probe}).front();
        const std::vector<Chunk> free_crowded = RunChunks(free, *policy, with_crowd)[probe_at];
        EXPECT_NE(free_alone, free_crowded) << "the crowd did not move the budget's cuts";
      }
    }
  }
}

}  // namespace
}  // namespace sieve
