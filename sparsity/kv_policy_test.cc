#include "sparsity/kv_policy.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/testing.h"
#include "sparsity/kv_policy_json.h"

namespace sieve {
namespace {

constexpr PolicyKind kKinds[] = {PolicyKind::kFull, PolicyKind::kSnapKv, PolicyKind::kPyramidKv,
                                 PolicyKind::kStreamingLlm, PolicyKind::kH2o};

int Uniform(std::mt19937_64& rng, int low, int high) {
  return std::uniform_int_distribution<int>(low, high)(rng);
}

// Valid options for every kind, drawn at random.
KvPolicyOptions RandomOptions(std::mt19937_64& rng) {
  KvPolicyOptions options;
  options.budget = Uniform(rng, 2, 4096);
  options.window = Uniform(rng, 1, std::min(options.budget - 1, 256));
  options.pool = static_cast<PoolKind>(Uniform(rng, 0, 2));
  options.kernel = 2 * Uniform(rng, 0, 4) + 1;
  options.reduce = static_cast<GroupReduce>(Uniform(rng, 0, 1));
  options.beta = Uniform(rng, 1, 40);
  options.sinks = Uniform(rng, 0, 16);
  options.recent = Uniform(rng, 1, 2048);
  options.heavy = Uniform(rng, 0, 2048);
  return options;
}

std::string RangeText(int first, int last) {
  return first == last ? std::to_string(first) : std::to_string(first) + "-" + std::to_string(last);
}

std::vector<PolicyKind> KindsOf(const KvPolicy& policy) {
  std::vector<PolicyKind> kinds;
  for (int layer = 0; layer < policy.num_layers(); ++layer) kinds.push_back(policy.kind(layer));
  return kinds;
}

KvPolicy ParseOrDie(std::string_view spec, int num_layers, const KvPolicyOptions& options) {
  Result<KvPolicy> policy = KvPolicy::Parse(spec, num_layers, options);
  EXPECT_TRUE(policy.ok()) << spec << ": " << policy.status().ToString();
  return policy.ok() ? *policy : KvPolicy::Dense(num_layers);
}

// The part of ToString() before the knobs, which is itself a spec.
// Spec() is ToString() up to its knobs.
std::string SpecPart(const KvPolicy& policy) {
  const std::string text = policy.ToString();
  EXPECT_EQ(policy.Spec(), text.substr(0, text.find(' ')));
  return policy.Spec();
}

TEST(KvPolicyTest, BareKindCoversEveryLayer) {
  auto rng = testing::MakeRng();
  for (PolicyKind kind : kKinds) {
    const int num_layers = Uniform(rng, 1, 80);
    const KvPolicy policy = ParseOrDie(PolicyKindName(kind), num_layers, KvPolicyOptions());
    ASSERT_EQ(policy.num_layers(), num_layers);
    for (int layer = 0; layer < num_layers; ++layer) EXPECT_EQ(policy.kind(layer), kind);
    EXPECT_EQ(SpecPart(policy),
              std::string(PolicyKindName(kind)) + ":" + RangeText(0, num_layers - 1));
    EXPECT_EQ(policy.IsDense(), kind == PolicyKind::kFull);
  }
  EXPECT_EQ(ParseOrDie(" SnapKV ", 4, KvPolicyOptions()).kind(3), PolicyKind::kSnapKv);
}

TEST(KvPolicyTest, RandomRangeListsRoundTrip) {
  auto rng = testing::MakeRng();
  for (int trial = 0; trial < 200; ++trial) {
    const int num_layers = Uniform(rng, 1, 64);
    // A random partition of [0, num_layers) into runs of random kinds, listed in random order.
    std::vector<PolicyKind> expected(num_layers);
    std::vector<std::string> entries;
    for (int first = 0; first < num_layers;) {
      const int last = std::min(num_layers - 1, first + Uniform(rng, 0, 9));
      const PolicyKind kind = kKinds[Uniform(rng, 0, 4)];
      std::fill(expected.begin() + first, expected.begin() + last + 1, kind);
      const bool spaces = Uniform(rng, 0, 3) == 0;
      entries.push_back(std::string(spaces ? " " : "") + std::string(PolicyKindName(kind)) + ":" +
                        RangeText(first, last) + (spaces ? " " : ""));
      first = last + 1;
    }
    std::shuffle(entries.begin(), entries.end(), rng);
    std::string spec;
    for (const std::string& entry : entries) spec += (spec.empty() ? "" : ",") + entry;
    const KvPolicy policy = ParseOrDie(spec, num_layers, KvPolicyOptions());
    ASSERT_EQ(KindsOf(policy), expected) << spec;
    const KvPolicy again = ParseOrDie(SpecPart(policy), num_layers, KvPolicyOptions());
    EXPECT_EQ(KindsOf(again), expected) << policy.ToString();
  }
}

// Parse must fail with a message that contains `needle`.
void ExpectParseError(std::string_view spec, int num_layers, const KvPolicyOptions& options,
                      const std::string& needle) {
  Result<KvPolicy> policy = KvPolicy::Parse(spec, num_layers, options);
  ASSERT_FALSE(policy.ok()) << "'" << spec << "' parsed: " << policy->ToString();
  EXPECT_EQ(policy.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(policy.status().message().find(needle), std::string::npos)
      << "'" << spec << "': " << policy.status().message() << " lacks '" << needle << "'";
}

TEST(KvPolicyTest, RejectsBadSpecsNamingTheBadPart) {
  auto rng = testing::MakeRng();
  const KvPolicyOptions options;
  const int num_layers = Uniform(rng, 8, 80);
  const int last = num_layers - 1;
  const std::string all = "0-" + std::to_string(last);
  ExpectParseError("", num_layers, options, "empty KV policy");
  ExpectParseError("  ", num_layers, options, "empty KV policy");
  ExpectParseError("bogus", num_layers, options, "unknown policy 'bogus'");
  ExpectParseError("full:0-2,lru:3-" + std::to_string(last), num_layers, options,
                   "unknown policy 'lru'");
  ExpectParseError("snapkv," + std::string("full:") + all, num_layers, options,
                   "'snapkv' has no layer range");
  ExpectParseError("full:0-2,,snapkv:3-" + std::to_string(last), num_layers, options,
                   "empty entry");
  ExpectParseError("snapkv:" + all + ",", num_layers, options, "empty entry");
  ExpectParseError("snapkv:", num_layers, options, "bad layer range ''");
  ExpectParseError("snapkv:a-b", num_layers, options, "bad layer range 'a-b'");
  ExpectParseError("snapkv:-1-" + std::to_string(last), num_layers, options, "bad layer range");
  ExpectParseError("snapkv:0-3-" + std::to_string(last), num_layers, options, "bad layer range");
  ExpectParseError("snapkv:0-99999999999", num_layers, options, "bad layer range");
  ExpectParseError("snapkv:5-3,full:0-2,full:4", num_layers, options, "'5-3'");
  ExpectParseError("snapkv:0-" + std::to_string(num_layers), num_layers, options,
                   "layer " + std::to_string(num_layers) + " in 'snapkv:0-" +
                       std::to_string(num_layers) + "' is out of range");
  ExpectParseError("snapkv:" + all, 0, options, "0 layers");

  for (int trial = 0; trial < 50; ++trial) {
    // A gap of random position and width.
    const int gap_first = Uniform(rng, 0, last);
    const int gap_last = Uniform(rng, gap_first, last);
    std::string spec;
    if (gap_first > 0) spec += "full:" + RangeText(0, gap_first - 1);
    if (gap_last < last) {
      spec += std::string(spec.empty() ? "" : ",") + "snapkv:" + RangeText(gap_last + 1, last);
    }
    if (spec.empty()) continue;  // the gap is every layer
    ExpectParseError(spec, num_layers, options,
                     (gap_first == gap_last ? "layer " : "layers ") +
                         RangeText(gap_first, gap_last) +
                         (gap_first == gap_last ? " has" : " have") + " no policy");
    // An overlap: the second range starts inside the first.
    const int split = Uniform(rng, 1, last);
    const int overlap = Uniform(rng, 0, split - 1);
    ExpectParseError("full:0-" + std::to_string(split - 1) + ",h2o:" + RangeText(overlap, last),
                     num_layers, options, "layer " + std::to_string(overlap) + " covered twice");
  }
}

TEST(KvPolicyTest, ValidatesTheOptionsOfThePoliciesInUse) {
  auto rng = testing::MakeRng();
  const int num_layers = Uniform(rng, 1, 64);
  const KvPolicyOptions base = RandomOptions(rng);
  for (const char* spec : {"full", "snapkv", "pyramidkv", "streamingllm", "h2o"}) {
    EXPECT_TRUE(KvPolicy::Parse(spec, num_layers, base).ok()) << spec;
  }
  KvPolicyOptions options = base;
  options.window = options.budget + Uniform(rng, 0, 100);
  const std::string window_error =
      "window " + std::to_string(options.window) + " >= budget " + std::to_string(options.budget);
  ExpectParseError("snapkv", num_layers, options, window_error);
  ExpectParseError("pyramidkv", num_layers, options, window_error);
  // Knobs of policies that are not in use are not checked.
  EXPECT_TRUE(KvPolicy::Parse("full", num_layers, options).ok());
  EXPECT_TRUE(KvPolicy::Parse("h2o", num_layers, options).ok());

  options = base;
  options.window = -Uniform(rng, 0, 5);
  ExpectParseError("snapkv", num_layers, options, "window " + std::to_string(options.window));

  options = base;
  options.pool = Uniform(rng, 0, 1) ? PoolKind::kMax : PoolKind::kAvg;
  options.kernel = 2 * Uniform(rng, 1, 10);
  ExpectParseError("snapkv", num_layers, options,
                   "even pooling kernel " + std::to_string(options.kernel));
  EXPECT_TRUE(KvPolicy::Parse("streamingllm", num_layers, options).ok());
  options.kernel = -Uniform(rng, 0, 3);
  ExpectParseError("pyramidkv", num_layers, options, "pooling kernel");
  options.pool = PoolKind::kNone;  // no pooling: the kernel is unused
  EXPECT_TRUE(KvPolicy::Parse("snapkv", num_layers, options).ok());

  options = base;
  options.beta = -Uniform(rng, 0, 3);
  ExpectParseError("pyramidkv", num_layers, options, "beta");
  EXPECT_TRUE(KvPolicy::Parse("snapkv", num_layers, options).ok());

  options = base;
  options.sinks = -Uniform(rng, 1, 3);
  ExpectParseError("streamingllm", num_layers, options, "sinks");
  options = base;
  options.recent = -Uniform(rng, 0, 3);
  ExpectParseError("streamingllm", num_layers, options, "recent");
  ExpectParseError("h2o", num_layers, options, "recent");
  options = base;
  options.heavy = -Uniform(rng, 1, 3);
  ExpectParseError("h2o", num_layers, options, "heavy");

  options = base;
  options.decode_cap = -Uniform(rng, 1, 3);
  ExpectParseError("full", num_layers, options, "decode cap");
  options.decode_cap = Uniform(rng, 1, options.budget - 1);
  ExpectParseError("snapkv", num_layers, options, "decode cap");
  options.decode_cap = options.budget;
  EXPECT_TRUE(KvPolicy::Parse("snapkv", num_layers, options).ok());
  // Layer 0 of a long prompt gets the pyramid's largest budget, max_num + W.
  const int prefix = options.budget - options.window;
  const int top = std::max(options.budget, 2 * prefix - prefix / options.beta + options.window);
  options.decode_cap = top - 1;
  if (options.decode_cap > 0) ExpectParseError("pyramidkv", num_layers, options, "decode cap");
  options.decode_cap = top;
  EXPECT_TRUE(KvPolicy::Parse("pyramidkv", num_layers, options).ok());
  const std::vector<int> long_prompt =
      PyramidBudgets(options.budget, options.window, 1 << 20, num_layers, options.beta);
  EXPECT_EQ(long_prompt[0], top);
}

TEST(KvPolicyTest, PlansEachKind) {
  auto rng = testing::MakeRng();
  for (int trial = 0; trial < 100; ++trial) {
    const KvPolicyOptions options = RandomOptions(rng);
    const int num_layers = Uniform(rng, 1, 40);
    const bool pools = options.pool != PoolKind::kNone && options.kernel > 1;
    for (PolicyKind kind : kKinds) {
      const KvPolicy policy = ParseOrDie(PolicyKindName(kind), num_layers, options);
      const int n = Uniform(rng, 1, 10000);
      const std::vector<LayerPlan> plans = policy.PlanPrompt(n);
      ASSERT_EQ(plans.size(), static_cast<size_t>(num_layers));
      const std::vector<int> pyramid =
          PyramidBudgets(options.budget, options.window, n, num_layers, options.beta);
      for (int layer = 0; layer < num_layers; ++layer) {
        const LayerPlan& plan = plans[layer];
        SCOPED_TRACE(policy.ToString() + " n=" + std::to_string(n) + " layer " +
                     std::to_string(layer));
        switch (kind) {
          case PolicyKind::kFull:
            EXPECT_FALSE(plan.compress);
            EXPECT_EQ(plan.budget, n);
            EXPECT_EQ(plan.score_rows, 0);
            break;
          case PolicyKind::kSnapKv:
          case PolicyKind::kPyramidKv: {
            const int budget = kind == PolicyKind::kSnapKv ? options.budget : pyramid[layer];
            EXPECT_EQ(plan.compress, n > budget);
            EXPECT_EQ(plan.budget, budget);
            EXPECT_EQ(plan.window, options.window);
            EXPECT_EQ(plan.score_rows, options.window);
            EXPECT_EQ(plan.pool, pools ? options.pool : PoolKind::kNone);
            EXPECT_EQ(plan.kernel, pools ? options.kernel : 1);
            EXPECT_EQ(plan.reduce, options.reduce);
            EXPECT_EQ(plan.mode, SelectMode::kTopScores);
            break;
          }
          case PolicyKind::kStreamingLlm:
            EXPECT_EQ(plan.compress, n > options.sinks + options.recent);
            EXPECT_EQ(plan.budget, options.sinks + options.recent);
            EXPECT_EQ(plan.window, options.recent);
            EXPECT_EQ(plan.score_rows, 0);
            EXPECT_EQ(plan.pool, PoolKind::kNone);
            EXPECT_EQ(plan.mode, SelectMode::kFirstPositions);
            break;
          case PolicyKind::kH2o:
            // Always a job: when nothing is dropped it keeps all n and only scores them.
            EXPECT_TRUE(plan.compress);
            EXPECT_EQ(plan.budget, std::min(n, options.heavy + options.recent));
            EXPECT_EQ(plan.window, std::min(n, options.recent));
            EXPECT_EQ(plan.score_rows, n);
            EXPECT_EQ(plan.pool, PoolKind::kNone);
            EXPECT_EQ(plan.reduce, options.reduce);
            EXPECT_EQ(plan.mode, SelectMode::kTopScores);
            break;
        }
        if (plan.compress) {
          // What the backend ops require of a job.
          EXPECT_GE(plan.budget, plan.window);
          EXPECT_LE(plan.budget, n);
          if (kind != PolicyKind::kH2o) {
            EXPECT_LT(plan.budget, n);
          }
          EXPECT_LE(plan.score_rows, n);
        }
      }
    }
  }
}

TEST(KvPolicyTest, NoCompressionWhenThePromptFits) {
  auto rng = testing::MakeRng();
  const KvPolicyOptions options = RandomOptions(rng);
  const int num_layers = Uniform(rng, 2, 40);
  for (const char* spec : {"snapkv", "pyramidkv"}) {
    const KvPolicy policy = ParseOrDie(spec, num_layers, options);
    for (int n : {1, Uniform(rng, 1, options.budget), options.budget}) {
      for (const LayerPlan& plan : policy.PlanPrompt(n)) EXPECT_FALSE(plan.compress) << n;
      EXPECT_EQ(policy.EntriesAfterPrompt(n), std::vector<int>(num_layers, n));
      EXPECT_EQ(policy.FinalChunkRows(n), 0);
    }
    const int n = options.budget + Uniform(rng, 1, 1000);
    const std::vector<LayerPlan> plans = policy.PlanPrompt(n);
    EXPECT_TRUE(std::any_of(plans.begin(), plans.end(),
                            [](const LayerPlan& plan) { return plan.compress; }))
        << spec << " n=" << n;
  }
}

TEST(KvPolicyTest, PyramidIndexesOnlyPyramidLayers) {
  auto rng = testing::MakeRng();
  KvPolicyOptions options = RandomOptions(rng);
  const int n = Uniform(rng, options.budget, 20000);
  // Interleaved: pyramid layers 0-3 and 6-9 are l' = 0..7; full layers 4-5 do not count.
  const KvPolicy policy = ParseOrDie("pyramidkv:0-3,full:4-5,pyramidkv:6-9", 10, options);
  const std::vector<int> budgets =
      PyramidBudgets(options.budget, options.window, n, 8, options.beta);
  const std::vector<LayerPlan> plans = policy.PlanPrompt(n);
  const int pyramid_layers[] = {0, 1, 2, 3, 6, 7, 8, 9};
  for (int index = 0; index < 8; ++index) {
    EXPECT_EQ(plans[pyramid_layers[index]].budget, budgets[index]) << index;
  }
  EXPECT_FALSE(plans[4].compress);
  EXPECT_FALSE(plans[5].compress);
}

// The acceptance point of per-layer sparsity: with layers 0-2 full and a pyramid over 3-31, a
// 4000-token prompt at C = 400 holds about C entries per sparse layer on average.
TEST(KvPolicyTest, MixedSpecHoldsAboutTheBudgetPerSparseLayer) {
  auto rng = testing::MakeRng();
  KvPolicyOptions options = RandomOptions(rng);
  options.budget = 400;
  options.window = 32;
  options.beta = 20;
  const KvPolicy policy = ParseOrDie("full:0-2,pyramidkv:3-31", 32, options);
  const std::vector<int> entries = policy.EntriesAfterPrompt(4000);
  ASSERT_EQ(entries.size(), 32u);
  for (int layer = 0; layer < 3; ++layer) EXPECT_EQ(entries[layer], 4000);
  const int64_t sparse = std::accumulate(entries.begin() + 3, entries.end(), int64_t{0});
  EXPECT_EQ(sparse, 29 * 400);  // 700 = max_num - min_num divides evenly by 28 steps
  EXPECT_LE(sparse * 8, int64_t{29} * 4000);
  EXPECT_EQ(entries[3], 750);
  EXPECT_EQ(entries[31], 50);

  // Any long prompt: the sparse layers average C within the flooring slack, far below n.
  const int n = Uniform(rng, 4000, 100000);
  const std::vector<int> long_entries = policy.EntriesAfterPrompt(n);
  const int64_t long_sparse =
      std::accumulate(long_entries.begin() + 3, long_entries.end(), int64_t{0});
  EXPECT_GE(long_sparse, 29 * 400);
  EXPECT_LT(long_sparse, 29 * 400 + 29 * 28 / 2);
  for (int layer = 3; layer < 32; ++layer) EXPECT_LT(long_entries[layer], n);
}

TEST(KvPolicyTest, EntriesAfterPromptFollowPlans) {
  auto rng = testing::MakeRng();
  for (int trial = 0; trial < 50; ++trial) {
    const KvPolicyOptions options = RandomOptions(rng);
    const KvPolicy policy =
        ParseOrDie("full:0,snapkv:1-2,pyramidkv:3-5,streamingllm:6,h2o:7", 8, options);
    const int n = Uniform(rng, 1, 10000);
    const std::vector<LayerPlan> plans = policy.PlanPrompt(n);
    const std::vector<int> entries = policy.EntriesAfterPrompt(n);
    for (int layer = 0; layer < 8; ++layer) {
      EXPECT_EQ(entries[layer], plans[layer].compress ? plans[layer].budget : n);
      EXPECT_LE(entries[layer], n);
    }
  }
}

TEST(KvPolicyTest, DecodeLimits) {
  auto rng = testing::MakeRng();
  KvPolicyOptions options = RandomOptions(rng);
  const KvPolicy plain = ParseOrDie("full:0,snapkv:1,pyramidkv:2,streamingllm:3,h2o:4", 5, options);
  for (int layer : {0, 1, 2}) {
    const DecodeLimit limit = plain.DecodeLimitFor(layer);
    EXPECT_EQ(limit.max_entries, 0);
    EXPECT_EQ(limit.evict, DecodeLimit::Evict::kNone);
  }
  const DecodeLimit streaming = plain.DecodeLimitFor(3);
  EXPECT_EQ(streaming.max_entries, options.sinks + options.recent);
  EXPECT_EQ(streaming.evict, DecodeLimit::Evict::kOldest);
  EXPECT_EQ(streaming.sinks, options.sinks);
  EXPECT_EQ(streaming.protect_recent, 0);
  const DecodeLimit h2o = plain.DecodeLimitFor(4);
  EXPECT_EQ(h2o.max_entries, options.heavy + options.recent);
  EXPECT_EQ(h2o.evict, DecodeLimit::Evict::kLowestScore);
  EXPECT_EQ(h2o.protect_recent, options.recent);
  EXPECT_EQ(h2o.sinks, 0);

  const int prefix = options.budget - options.window;
  options.decode_cap =
      std::max(options.budget, 2 * prefix - prefix / options.beta + options.window) +
      Uniform(rng, 0, 1000);
  for (bool by_score : {true, false}) {
    options.decode_cap_by_score = by_score;
    const KvPolicy capped =
        ParseOrDie("full:0,snapkv:1,pyramidkv:2,streamingllm:3,h2o:4", 5, options);
    for (int layer : {0, 1, 2}) {
      const DecodeLimit limit = capped.DecodeLimitFor(layer);
      EXPECT_EQ(limit.max_entries, options.decode_cap);
      EXPECT_EQ(limit.evict,
                by_score ? DecodeLimit::Evict::kLowestScore : DecodeLimit::Evict::kOldest);
      EXPECT_EQ(limit.protect_recent, layer == 0 ? 0 : options.window);
      EXPECT_EQ(limit.sinks, 0);
    }
    // StreamingLLM and H2O keep their own limits.
    EXPECT_EQ(capped.DecodeLimitFor(3).max_entries, options.sinks + options.recent);
    EXPECT_EQ(capped.DecodeLimitFor(4).max_entries, options.heavy + options.recent);
  }
}

TEST(KvPolicyTest, FinalChunkRowsAndSidePools) {
  auto rng = testing::MakeRng();
  KvPolicyOptions options = RandomOptions(rng);
  const int num_layers = Uniform(rng, 2, 40);
  const int short_prompt = Uniform(rng, 1, options.window);
  const int long_prompt = Uniform(rng, 2 * options.budget, 20000);

  const KvPolicy snapkv = ParseOrDie("snapkv", num_layers, options);
  EXPECT_EQ(snapkv.FinalChunkRows(short_prompt), 0);
  EXPECT_EQ(snapkv.FinalChunkRows(long_prompt), options.window);
  EXPECT_FALSE(snapkv.NeedsScorePool());
  EXPECT_FALSE(snapkv.NeedsPositionPool());

  const KvPolicy streaming = ParseOrDie("streamingllm", num_layers, options);
  EXPECT_EQ(streaming.FinalChunkRows(options.sinks + options.recent + 1), 0);
  EXPECT_FALSE(streaming.NeedsScorePool());
  EXPECT_TRUE(streaming.NeedsPositionPool());

  // H2O scores every prompt row, so the whole prompt must be one chunk once it compresses.
  const std::string mixed = "snapkv:0,h2o:1-" + std::to_string(num_layers - 1);
  const KvPolicy h2o = ParseOrDie(mixed, num_layers, options);
  const int h2o_prompt = options.heavy + options.recent + Uniform(rng, 1, 1000);
  EXPECT_EQ(h2o.FinalChunkRows(h2o_prompt), std::max(h2o_prompt, options.window));
  // A prompt that fits H2O's budget is still scored in full (its rows seed the scores).
  EXPECT_EQ(h2o.FinalChunkRows(options.heavy + options.recent), options.heavy + options.recent);
  EXPECT_TRUE(h2o.NeedsScorePool());
  EXPECT_TRUE(h2o.NeedsPositionPool());

  options.decode_cap = 1 << 20;
  for (bool by_score : {true, false}) {
    options.decode_cap_by_score = by_score;
    const KvPolicy capped =
        ParseOrDie("full:0,snapkv:1-" + std::to_string(num_layers - 1), num_layers, options);
    EXPECT_EQ(capped.NeedsScorePool(), by_score);
    EXPECT_TRUE(capped.NeedsPositionPool());
    EXPECT_FALSE(capped.IsDense());
    // A cap does not change what the prompt leaves.
    EXPECT_EQ(
        capped.EntriesAfterPrompt(long_prompt),
        ParseOrDie(SpecPart(capped), num_layers, KvPolicyOptions{options.budget, options.window})
            .EntriesAfterPrompt(long_prompt));
    // The cap is ignored by StreamingLLM, so it needs no score pool.
    EXPECT_FALSE(ParseOrDie("streamingllm", num_layers, options).NeedsScorePool());
  }
}

TEST(KvPolicyTest, DenseKeepsEverything) {
  auto rng = testing::MakeRng();
  const int num_layers = Uniform(rng, 1, 80);
  const KvPolicy dense = KvPolicy::Dense(num_layers);
  EXPECT_TRUE(dense.IsDense());
  EXPECT_EQ(dense.num_layers(), num_layers);
  EXPECT_EQ(dense.ToString(), "full:" + RangeText(0, num_layers - 1));
  const int n = Uniform(rng, 1, 100000);
  EXPECT_EQ(dense.EntriesAfterPrompt(n), std::vector<int>(num_layers, n));
  EXPECT_EQ(dense.FinalChunkRows(n), 0);
  EXPECT_FALSE(dense.NeedsScorePool());
  EXPECT_FALSE(dense.NeedsPositionPool());
  for (int layer = 0; layer < num_layers; ++layer) {
    EXPECT_EQ(dense.DecodeLimitFor(layer).max_entries, 0);
  }
}

TEST(KvPolicyTest, ToStringNamesTheKnobsInUse) {
  KvPolicyOptions options;
  options.budget = 400;
  options.window = 32;
  const KvPolicy policy = ParseOrDie("pyramidkv:3-31, full:0-2", 32, options);
  EXPECT_EQ(policy.ToString(),
            "full:0-2,pyramidkv:3-31 (budget 400, window 32, maxpool 7, gqa mean, beta 20)");
  options.decode_cap = 1 << 20;
  options.decode_cap_by_score = false;
  EXPECT_EQ(ParseOrDie("streamingllm:0,h2o:1", 2, options).ToString(),
            "streamingllm:0,h2o:1 (gqa mean, sinks 4, heavy 1024, recent 1020, decode cap "
            "1048576 by age)");
}

// GET /server_info carries the engine's options as JSON and sieve bench reads them back.
TEST(KvPolicyTest, OptionsRoundTripThroughJson) {
  auto rng = testing::MakeRng();
  for (int trial = 0; trial < 100; ++trial) {
    KvPolicyOptions options = RandomOptions(rng);
    options.decode_cap =
        Uniform(rng, 0, 1) != 0 ? Uniform(rng, 1 << 16, 1 << 20) : 0;  // above any budget
    options.decode_cap_by_score = Uniform(rng, 0, 1) != 0;
    const nlohmann::json json = KvPolicyOptionsToJson(options);
    const Result<KvPolicyOptions> back = KvPolicyOptionsFromJson(json);
    ASSERT_TRUE(back.ok()) << back.status().ToString() << " " << json.dump();
    EXPECT_EQ(back->budget, options.budget);
    EXPECT_EQ(back->window, options.window);
    EXPECT_EQ(back->pool, options.pool);
    EXPECT_EQ(back->kernel, options.kernel);
    EXPECT_EQ(back->reduce, options.reduce);
    EXPECT_EQ(back->beta, options.beta);
    EXPECT_EQ(back->sinks, options.sinks);
    EXPECT_EQ(back->recent, options.recent);
    EXPECT_EQ(back->heavy, options.heavy);
    EXPECT_EQ(back->decode_cap, options.decode_cap);
    EXPECT_EQ(back->decode_cap_by_score, options.decode_cap_by_score);
    // A policy of every kind reads the same either way.
    const std::string spec = "full:0,snapkv:1,pyramidkv:2-3,streamingllm:4,h2o:5";
    EXPECT_EQ(ParseOrDie(spec, 6, *back).ToString(), ParseOrDie(spec, 6, options).ToString());
  }
  const Result<KvPolicyOptions> empty = KvPolicyOptionsFromJson(nlohmann::json::object());
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(KvPolicyOptionsToJson(*empty), KvPolicyOptionsToJson(KvPolicyOptions()));
}

TEST(KvPolicyTest, OptionsJsonErrorsNameTheKey) {
  const std::pair<nlohmann::json, std::string> bad[] = {
      {nlohmann::json::array(), "JSON object"},
      {{{"budget", "400"}}, "'budget'"},
      {{{"window", -1}}, "'window'"},
      {{{"decode_cap", 1.5}}, "'decode_cap'"},
      {{{"heavy", int64_t{1} << 40}}, "'heavy'"},
      {{{"pool", "median"}}, "'pool' must be one of none, max, avg"},
      {{{"group_reduce", 1}}, "'group_reduce'"},
      {{{"decode_cap_by", "age"}}, "'decode_cap_by'"},
      {{{"budgets", 400}}, "unknown KV policy option 'budgets'"},
  };
  for (const auto& [json, needle] : bad) {
    const Result<KvPolicyOptions> options = KvPolicyOptionsFromJson(json);
    ASSERT_FALSE(options.ok()) << json.dump();
    EXPECT_EQ(options.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(options.status().message().find(needle), std::string::npos)
        << options.status().message() << " lacks " << needle;
  }
}

}  // namespace
}  // namespace sieve
