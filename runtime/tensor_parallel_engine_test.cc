// Tensor parallelism through the engine on the CPU: one engine (scheduler, KV manager, sampling)
// driving N ranks, each a CPU backend with its model shard and its own KV pool, joined by the
// in-process communicator. Greedy tokens on 2, 4 and 8 ranks must equal one rank's, dense and
// under every KV policy (SnapKV, PyramidKV, StreamingLLM, H2O, a full + SnapKV mix, a
// score-capped decode), with batched and chunked prefills, padded decode batches and preemption
// (dense, and sparse, which replays generated tokens), on random models (MHA; GQA with 2 KV heads,
// replicated on 4 ranks; 8 ranks of MHA 8/8 and GQA 16/4) and on checkpoints loaded sharded (the
// fixtures and the trained default model). The chosen tokens' log-probabilities
// must agree within 1e-4 (f32: the ranks' partial sums are added in another order, ~1e-6). Bad
// splits are clear errors at load.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/in_process_communicator.h"
#include "core/testing.h"
#include "core/thread_pool.h"
#include "model/safetensors.h"
#include "model/tensor_parallel_testing.h"
#include "runtime/engine.h"
#include "runtime/model_loader.h"
#include "sparsity/kv_policy.h"

namespace sieve {
namespace {

constexpr double kLogprobTolerance = 1e-4;
// Where decode evicts by accumulated score (H2O, a decode cap by score), a near-tie between two
// entries' scores can fall the other way on N ranks (the residual all-reduce sums in another
// order), another entry goes, and later logits move by far more than the sums do: 0.015 in one
// run of the MHA case (snapkv with decode cap 36, 4 ranks, at the 11th token). Such cases get
// this bound, still far below what a wrong slice of a head or layer gives (logits off by ~1).
constexpr double kEvictionLogprobTolerance = 0.1;

// The ranks' backends and communicators, which must outlive the engine.
struct Ranks {
  std::vector<std::unique_ptr<ThreadPool>> thread_pools;
  std::vector<std::unique_ptr<Backend>> backends;
  std::vector<std::unique_ptr<Communicator>> communicators;
  std::unique_ptr<Engine> engine;  // last: destroyed first
};

using testing::ModelFactory;

// An engine over `size` CPU ranks of one thread each.
Ranks MakeEngine(int size, const ModelFactory& factory, const EngineOptions& options) {
  Ranks ranks;
  ranks.communicators = MakeInProcessCommunicators(size);
  std::unique_ptr<LlamaModel> first;
  std::vector<std::unique_ptr<LlamaModel>> others;
  for (int rank = 0; rank < size; ++rank) {
    ranks.thread_pools.push_back(std::make_unique<ThreadPool>(1));
    ranks.backends.push_back(std::make_unique<CpuBackend>(ranks.thread_pools.back().get()));
    auto model = factory(*ranks.backends.back(), {rank, size}, ranks.communicators[rank].get());
    SIEVE_CHECK(model.ok()) << model.status().ToString();
    (rank == 0 ? first : others.emplace_back()) = std::move(model).value();
  }
  auto engine = Engine::Create(std::move(first), nullptr, {}, options, std::move(others));
  SIEVE_CHECK(engine.ok()) << engine.status().ToString();
  ranks.engine = std::move(engine).value();
  return ranks;
}

struct Completion {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  std::vector<float> gaps;  // top-1 minus top-2 log-probability at each step
};

std::map<RequestId, Completion> RunToEnd(Engine& engine) {
  std::map<RequestId, Completion> done;
  while (engine.HasWork()) {
    for (const RequestOutput& output : engine.Step()) {
      Completion& completion = done[output.id];
      completion.tokens.insert(completion.tokens.end(), output.new_tokens.begin(),
                               output.new_tokens.end());
      for (const SampleResult& sample : output.new_logprobs) {
        completion.logprobs.push_back(sample.logprob);
        const auto& top = sample.top_logprobs;
        completion.gaps.push_back(top.size() >= 2 ? top[0].logprob - top[1].logprob : 1e9f);
      }
    }
  }
  return done;
}

SamplingParams Greedy(int max_tokens) {
  SamplingParams params;
  params.temperature = 0;
  params.max_tokens = max_tokens;
  params.ignore_eos = true;
  params.logprobs = 2;  // the top two: how near a tie each step was
  return params;
}

EngineOptions SmallEngine(const std::string& policy) {
  EngineOptions options;
  options.kv_policy = policy;
  options.kv_policy_options.budget = 32;
  options.kv_policy_options.window = 8;
  options.kv_policy_options.sinks = 4;
  options.kv_policy_options.recent = 20;
  options.kv_policy_options.heavy = 12;
  options.page_size = 8;
  options.max_num_seqs = 4;
  options.max_num_batched_tokens = 256;  // H2O scores a whole prompt in its final chunk
  options.max_model_len = 256;
  options.kv_memory_bytes = int64_t{32} << 20;
  return options;
}

// Engine options of each case: every policy, plus a decode cap, padded decode batches, and a
// pool small enough to preempt.
std::vector<std::pair<std::string, EngineOptions>> EveryPolicy(int layers) {
  std::vector<std::pair<std::string, EngineOptions>> cases;
  for (const char* policy : {"full", "snapkv", "pyramidkv", "streamingllm", "h2o"}) {
    cases.emplace_back(policy, SmallEngine(policy));
  }
  const std::string mixed = "full:0-" + std::to_string(layers / 2 - 1) +
                            ",snapkv:" + std::to_string(layers / 2) + "-" +
                            std::to_string(layers - 1);
  cases.emplace_back(mixed, SmallEngine(mixed));
  EngineOptions capped = SmallEngine("snapkv");
  capped.kv_policy_options.decode_cap = 36;
  cases.emplace_back("snapkv, decode cap 36", capped);
  EngineOptions padded = SmallEngine("pyramidkv");
  padded.pad_decode_batches = true;
  cases.emplace_back("pyramidkv, padded decode batches", padded);
  EngineOptions tight = SmallEngine("full");
  tight.max_num_batched_tokens = 48;  // chunked prefills
  tight.page_size = 4;
  cases.emplace_back("full, chunked, preempting", tight);
  // Preempted sparse sequences replay their generated tokens as decode steps.
  EngineOptions tight_sparse = tight;
  tight_sparse.kv_policy = "pyramidkv";
  cases.emplace_back("pyramidkv, chunked, preempting", tight_sparse);
  // Preemption by swap: every rank copies its KV heads' share of the pages out and back.
  for (EngineOptions swapping : {tight, tight_sparse}) {
    swapping.preemption_mode = PreemptionMode::kSwap;
    swapping.swap_space_bytes = int64_t{16} << 20;
    cases.emplace_back(swapping.kv_policy + ", chunked, swapped, preempting", swapping);
  }
  return cases;
}

// Runs `prompts` greedily on one rank and on each of `sizes`, under every policy case.
void CheckGreedyTokens(const ModelConfig& config, const ModelFactory& factory,
                       const std::vector<int>& sizes, const std::string& name) {
  std::mt19937_64 rng = testing::MakeRng();
  double worst = 0;           // cases whose kept entries do not depend on scores during decode
  double worst_evicting = 0;  // cases that evict by score during decode
  for (const auto& policy_case : EveryPolicy(config.num_layers)) {
    // Named copies, not structured bindings: the lambda below captures them (clang 14).
    const std::string policy = policy_case.first;
    EngineOptions options = policy_case.second;
    const auto parsed =
        KvPolicy::Parse(options.kv_policy, config.num_layers, options.kv_policy_options);
    ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
    const bool evicts_by_score = parsed->NeedsScorePool();  // H2O or a decode cap by score
    const double tolerance = evicts_by_score ? kEvictionLogprobTolerance : kLogprobTolerance;
    std::vector<std::vector<int32_t>> prompts;
    for (const int length : {150, 97, 61, 120}) {
      std::vector<int32_t> prompt(length);
      for (int32_t& token : prompt) token = static_cast<int32_t>(rng() % config.vocab_size);
      prompts.push_back(std::move(prompt));
    }
    const bool preempting = policy.ends_with(", preempting");
    if (preempting) {
      // Dense: pages for about two sequences at a time, the others wait or are preempted. Sparse
      // (compressed to ~50 entries a layer): pages for the longest prompt's chunks and a little
      // more, so that a prefill preempts the compressed ones.
      const int64_t page_bytes = 2 * 4 * config.num_kv_heads * config.head_dim * 4;
      const int pages_a_layer = policy.starts_with("full") ? 2 * (170 / 4) : 48;
      options.kv_memory_bytes = page_bytes * config.num_layers * pages_a_layer;
    }
    const auto run = [&](int size) {
      EngineOptions rank_options = options;
      // A rank holds G / N KV heads (at least one): its pages are smaller, so the same memory
      // per rank holds more of them; the preempting case keeps the page count of one rank.
      if (preempting) {
        rank_options.kv_memory_bytes =
            options.kv_memory_bytes * std::max(1, config.num_kv_heads / size) / config.num_kv_heads;
      }
      Ranks ranks = MakeEngine(size, factory, rank_options);
      std::vector<RequestId> ids;
      for (const auto& prompt : prompts) {
        Request request;
        request.prompt = prompt;
        request.sampling = Greedy(14);
        auto id = ranks.engine->Add(std::move(request));
        SIEVE_CHECK(id.ok()) << id.status().ToString();
        ids.push_back(*id);
      }
      std::map<RequestId, Completion> done = RunToEnd(*ranks.engine);
      std::vector<Completion> ordered;
      for (const RequestId id : ids) ordered.push_back(done.at(id));
      return std::make_pair(ordered, ranks.engine->Stats());
    };
    const auto [expected, expected_stats] = run(1);
    if (preempting) {
      EXPECT_GT(expected_stats.num_preemptions, 0) << policy << ": the pool is meant to preempt";
    }
    const bool swapping = options.preemption_mode == PreemptionMode::kSwap;
    if (swapping) {
      EXPECT_EQ(expected_stats.num_swapped_out, expected_stats.num_preemptions) << policy;
      EXPECT_EQ(expected_stats.num_replayed_tokens, 0) << policy;
    }
    if (policy.rfind("full", 0) != 0 || policy.find("snapkv") != std::string::npos) {
      EXPECT_GT(expected_stats.compression_ratio(), 1.0) << policy << " is meant to compress";
    }
    for (const int size : sizes) {
      const auto [actual, stats] = run(size);
      const std::string what =
          name + ", " + policy + ", " + std::to_string(size) + " ranks against one";
      EXPECT_EQ(stats.num_pages, expected_stats.num_pages) << what;
      EXPECT_EQ(stats.num_swapped_out, expected_stats.num_swapped_out) << what;
      EXPECT_EQ(stats.num_pages_used, 0) << what;
      EXPECT_EQ(stats.num_swap_slots_used, 0) << what;
      EXPECT_EQ(stats.entries_kept_by_layer, expected_stats.entries_kept_by_layer) << what;
      for (size_t index = 0; index < expected.size(); ++index) {
        const Completion& want = expected[index];
        const Completion& got = actual[index];
        ASSERT_EQ(got.tokens.size(), want.tokens.size()) << what << ", prompt " << index;
        ASSERT_EQ(got.logprobs.size(), want.logprobs.size()) << what;
        // Sums in another order move logits by ~1e-6: a step whose top two are nearer than
        // the tolerance may take the other token (then the continuations part there), no
        // other step may.
        size_t same = 0;
        while (same < want.tokens.size() && got.tokens[same] == want.tokens[same]) ++same;
        if (same < want.tokens.size()) {
          EXPECT_LT(want.gaps[same], tolerance)
              << what << ", prompt " << index << ": tokens differ at step " << same
              << " where one rank's top two are " << want.gaps[same] << " apart";
        }
        double& case_worst = evicts_by_score ? worst_evicting : worst;
        for (size_t token = 0; token < same; ++token) {
          case_worst =
              std::max(case_worst,
                       static_cast<double>(std::fabs(got.logprobs[token] - want.logprobs[token])));
        }
      }
    }
  }
  EXPECT_LE(worst, kLogprobTolerance) << name;
  EXPECT_LE(worst_evicting, kEvictionLogprobTolerance) << name << ", evicting by score";
  std::printf(
      "%s: largest |logprob difference| against one rank %.3g (%.3g where decode evicts by "
      "score)\n",
      name.c_str(), worst, worst_evicting);
}

ModelConfig RandomConfig(int heads, int kv_heads) {
  ModelConfig config = TinyRandomModelConfig();
  config.hidden_size = 64;
  config.intermediate_size = 128;
  config.num_layers = 4;
  config.num_heads = heads;
  config.num_kv_heads = kv_heads;
  config.head_dim = 16;
  config.max_position_embeddings = 256;
  SIEVE_CHECK(config.Validate().ok());
  return config;
}

TEST(TensorParallelEngineTest, MhaGreedyTokensOnTwoAndFourRanksEqualOneRank) {
  const ModelConfig config = RandomConfig(4, 4);
  CheckGreedyTokens(config, testing::RandomShardFactory(config, testing::MakeRng()()), {2, 4},
                    "MHA 4/4");
}

// 2 KV heads: one per rank on 2 ranks, each replicated on 2 ranks of 4.
TEST(TensorParallelEngineTest, GqaWithTwoKvHeadsOnTwoAndFourRanksEqualsOneRank) {
  const ModelConfig config = RandomConfig(8, 2);
  CheckGreedyTokens(config, testing::RandomShardFactory(config, testing::MakeRng()()), {2, 4},
                    "GQA 8/2");
}

// Eight ranks, as a TP = 8 server of an 8-KV-head model runs: one KV head per rank (MHA 8/8),
// and 4 KV heads each replicated on 2 ranks with 2 query heads a rank (GQA 16/4).
TEST(TensorParallelEngineTest, MhaAndGqaOnEightRanksEqualOneRank) {
  const ModelConfig mha = RandomConfig(8, 8);
  CheckGreedyTokens(mha, testing::RandomShardFactory(mha, testing::MakeRng()()), {8}, "MHA 8/8");
  const ModelConfig gqa = RandomConfig(16, 4);
  CheckGreedyTokens(gqa, testing::RandomShardFactory(gqa, testing::MakeRng()()), {8}, "GQA 16/4");
}

// Prefix caching over 2 ranks (issue 60): each rank's pool holds its KV heads' slice of the same
// pages, which the one scheduler shares, keys and releases for all ranks. Requests that share a
// prefix with one run before them answer bitwise as with the cache off on the same ranks (the
// ranks' sums are added in one order whatever the batch), dense and sparse.
TEST(TensorParallelEngineTest, PrefixCacheOnTwoRanksAnswersAsWithoutIt) {
  auto rng = testing::MakeRng();
  const ModelConfig config = RandomConfig(4, 2);
  const ModelFactory factory = testing::RandomShardFactory(config, rng());
  std::vector<int32_t> prefix(90);
  for (int32_t& token : prefix) token = static_cast<int32_t>(rng() % config.vocab_size);
  std::vector<std::vector<int32_t>> prompts;
  for (int index = 0; index < 4; ++index) {
    std::vector<int32_t> prompt = prefix;
    for (int t = 0; t < 10 + static_cast<int>(rng() % 20); ++t) {
      prompt.push_back(static_cast<int32_t>(rng() % config.vocab_size));
    }
    prompts.push_back(prompt);
  }
  for (const std::string policy : {"full", "snapkv", "full:0-1,pyramidkv:2-3"}) {
    SCOPED_TRACE(policy);
    std::vector<Completion> runs[2];
    int64_t hits = 0;
    for (const bool caching : {false, true}) {
      EngineOptions options = SmallEngine(policy);
      options.enable_prefix_caching = caching;
      Ranks ranks = MakeEngine(2, factory, options);
      // The first alone (it leaves the prefix's pages), then the rest together.
      ASSERT_TRUE(ranks.engine->Add({prompts[0], Greedy(12), ""}).ok());
      std::map<RequestId, Completion> done = RunToEnd(*ranks.engine);
      for (size_t index = 1; index < prompts.size(); ++index) {
        ASSERT_TRUE(ranks.engine->Add({prompts[index], Greedy(12), ""}).ok());
      }
      done.merge(RunToEnd(*ranks.engine));
      for (const auto& [id, completion] : done) runs[caching].push_back(completion);
      if (caching) hits = ranks.engine->Stats().prefix_cache_hits;
    }
    ASSERT_EQ(runs[0].size(), prompts.size());
    ASSERT_EQ(runs[1].size(), prompts.size());
    for (size_t index = 0; index < runs[0].size(); ++index) {
      EXPECT_EQ(runs[1][index].tokens, runs[0][index].tokens) << "request " << index;
      EXPECT_EQ(runs[1][index].logprobs, runs[0][index].logprobs) << "request " << index;
    }
    EXPECT_GE(hits, 3 * 88) << "the three later prompts find the prefix's 11 whole pages of 8";
  }
}

// Checkpoints, each rank loading only its slices, on 2 and 4 ranks: the fixtures, GQA with 2 KV
// heads (bf16) and one KV head (tied embeddings), and Sieve's trained default model
// (models/sieve-tiny-10m: 4 query heads on 2 KV heads, bf16).
class TensorParallelFixtureEngineTest : public ::testing::TestWithParam<std::string> {};

TEST_P(TensorParallelFixtureEngineTest, GreedyTokensEqualOneRank) {
  const std::string dir = GetParam() == kDefaultModelName
                              ? ProjectSourceDir() + "/models/" + GetParam()
                              : TestDataDir() + "/models/" + GetParam();
  ASSERT_TRUE(std::filesystem::exists(dir)) << dir;
  auto config = LoadModelConfig(dir);
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  auto checkpoint = SafetensorsCheckpoint::Open(dir);
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status().ToString();
  const SafetensorsCheckpoint& weights = **checkpoint;
  const ModelConfig model_config = *config;
  const ModelFactory factory = [&weights, model_config](Backend& backend,
                                                        const TensorParallelShard& shard,
                                                        Communicator* communicator) {
    return LlamaModel::Load(model_config, weights, backend, 256, shard, communicator);
  };
  CheckGreedyTokens(model_config, factory, {2, 4}, GetParam());
}

INSTANTIATE_TEST_SUITE_P(FixtureModels, TensorParallelFixtureEngineTest,
                         ::testing::Values("llama_gqa_bf16", "llama_tied", kDefaultModelName),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name = info.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

// LoadModelShards: every rank's shard from one call, and the splits a model does not allow
// refused before any weight is read.
TEST(TensorParallelEngineTest, LoadModelShardsRefusesBadSplits) {
  for (const auto& [size, message] : std::vector<std::pair<int, std::string>>{
           {3, "does not divide the model's 4 attention heads"},
           {8, "exceeds the model's 4 attention heads"}}) {
    Ranks ranks;
    ranks.communicators = MakeInProcessCommunicators(size);
    std::vector<Backend*> backends;
    std::vector<Communicator*> communicators;
    for (int rank = 0; rank < size; ++rank) {
      ranks.backends.push_back(MakeCpuBackend());
      backends.push_back(ranks.backends.back().get());
      communicators.push_back(ranks.communicators[rank].get());
    }
    LoadModelOptions options;
    options.model_dir = TestDataDir() + "/models/llama2_mha";
    auto loaded = LoadModelShards(options, backends, communicators);
    ASSERT_FALSE(loaded.ok()) << size << " ranks";
    EXPECT_EQ(loaded.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(loaded.status().message().find(message), std::string::npos)
        << loaded.status().ToString();
  }
}

TEST(TensorParallelEngineTest, LoadModelShardsMakesEveryRank) {
  constexpr int kSize = 2;
  Ranks ranks;
  ranks.communicators = MakeInProcessCommunicators(kSize);
  std::vector<Backend*> backends;
  std::vector<Communicator*> communicators;
  for (int rank = 0; rank < kSize; ++rank) {
    ranks.backends.push_back(MakeCpuBackend());
    backends.push_back(ranks.backends.back().get());
    communicators.push_back(ranks.communicators[rank].get());
  }
  LoadModelOptions options;
  options.tiny_random = true;
  options.max_model_len = 256;
  auto loaded = LoadModelShards(options, backends, communicators);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  ASSERT_NE(loaded->model.model, nullptr);
  ASSERT_NE(loaded->model.tokenizer, nullptr);
  ASSERT_EQ(loaded->other_ranks.size(), 1u);
  EXPECT_EQ(loaded->model.model->shard().rank, 0);
  EXPECT_EQ(loaded->other_ranks[0]->shard().rank, 1);
  EXPECT_EQ(loaded->other_ranks[0]->layout().num_kv_heads, 1);
  auto engine =
      Engine::Create(std::move(loaded->model.model), loaded->model.tokenizer.get(),
                     loaded->model.eos_ids, SmallEngine("snapkv"), std::move(loaded->other_ranks));
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  Request request;
  request.prompt = std::vector<int32_t>(40, 65);
  request.sampling = Greedy(5);
  ASSERT_TRUE((*engine)->Add(std::move(request)).ok());
  const auto done = RunToEnd(**engine);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done.begin()->second.tokens.size(), 5u);
}

}  // namespace
}  // namespace sieve
