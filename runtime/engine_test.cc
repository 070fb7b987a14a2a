// Engine behaviour on the CPU backend: greedy continuations equal transformers', batching and
// chunking never change greedy output, sparse policies whose budget covers the prompt are
// bitwise dense, real compression cuts KV entries as expected, bad requests are refused, teacher
// forcing scores tokens as a dense prefill does, and requests carry their own policy knobs.
#include "runtime/engine.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <numeric>
#include <set>
#include <span>

#include "core/testing.h"
#include "model/full_prefill.h"
#include "model/safetensors.h"
#include "runtime/engine_testing.h"
#include "runtime/model_loader.h"
#include "runtime/model_runner.h"

namespace sieve {
namespace {

using testing::MakeEngine;
using testing::RandomPrompt;
using testing::SmallConfig;
using testing::TestEngine;
using testing::TightPolicyOptions;

struct Completion {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;  // chosen-token logprobs, for bitwise comparisons
  FinishReason reason = FinishReason::kNone;
};

std::map<RequestId, Completion> RunToEnd(Engine& engine) {
  std::map<RequestId, Completion> done;
  std::map<RequestId, Completion> partial;
  while (engine.HasWork()) {
    for (const RequestOutput& output : engine.Step()) {
      Completion& c = partial[output.id];
      c.tokens.insert(c.tokens.end(), output.new_tokens.begin(), output.new_tokens.end());
      for (const SampleResult& s : output.new_logprobs) c.logprobs.push_back(s.logprob);
      if (output.finished) {
        c.reason = output.finish_reason;
        done[output.id] = c;
      }
    }
  }
  return done;
}

struct PromptAndParams {
  std::vector<int32_t> prompt;
  SamplingParams params;
};

// Adds every request (each must be accepted) and returns their ids in order.
std::vector<RequestId> AddAll(Engine& engine, const std::vector<PromptAndParams>& requests) {
  std::vector<RequestId> ids;
  for (const PromptAndParams& request : requests) {
    const auto id = engine.Add({request.prompt, request.params, ""});
    EXPECT_TRUE(id.ok()) << id.status().ToString();
    ids.push_back(id.ok() ? *id : -1);
  }
  return ids;
}

SamplingParams Greedy(int max_tokens) {
  SamplingParams params;
  params.temperature = 0;
  params.max_tokens = max_tokens;
  params.ignore_eos = true;
  params.logprobs = 0;
  return params;
}

// Bytes of one KV page of `page_size` entries of one layer on the CPU backend: K and V in f32, and
// the side pools (positions, scores).
int64_t PageBytes(const ModelConfig& config, int page_size) {
  return 2 * page_size * config.num_kv_heads * config.head_dim * 4 +
         2 * page_size * config.num_kv_heads * 4;
}

class GoldenGreedyTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenGreedyTest, ContinuationMatchesTransformers) {
  const std::string dir = TestDataDir() + "/models/" + GetParam();
  auto backend = MakeCpuBackend();
  LoadModelOptions load;
  load.model_dir = dir;
  auto loaded = LoadModel(load, *backend);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  auto golden = SafetensorsFile::Open(dir + "/golden.safetensors");
  ASSERT_TRUE(golden.ok());
  const auto* ids = static_cast<const int32_t*>((*golden)->Find("input_ids")->data);
  const auto* greedy = static_cast<const int32_t*>((*golden)->Find("greedy_ids")->data);
  const int n = static_cast<int>((*golden)->Find("input_ids")->shape[0]);
  const int steps = static_cast<int>((*golden)->Find("greedy_ids")->shape[0]);
  EngineOptions options;
  options.kv_memory_bytes = 64 << 20;
  options.max_model_len = 256;
  auto engine =
      Engine::Create(std::move(loaded->model), loaded->tokenizer.get(), loaded->eos_ids, options);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  Request request;
  request.prompt.assign(ids, ids + n);
  request.sampling = Greedy(steps);
  ASSERT_TRUE((*engine)->Add(request).ok());
  const auto done = RunToEnd(**engine);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done.begin()->second.tokens, std::vector<int32_t>(greedy, greedy + steps));
}

INSTANTIATE_TEST_SUITE_P(TinyModels, GoldenGreedyTest,
                         ::testing::Values("llama2_mha", "llama_gqa_bf16", "llama3_rope_sharded",
                                           "llama_tied", "mistral_gqa"));

// N prompts batched equal N single runs (greedy, dense), chunked and unchunked.
TEST(EngineTest, BatchedEqualsSingleRuns) {
  auto rng = testing::MakeRng();
  const ModelConfig config = SmallConfig();
  std::vector<std::vector<int32_t>> prompts;
  for (int index = 0; index < 6; ++index) {
    prompts.push_back(RandomPrompt(rng, 5 + static_cast<int>(rng() % 120)));
  }
  std::vector<Completion> singles;
  for (const auto& prompt : prompts) {
    EngineOptions options;
    TestEngine t = MakeEngine(config, options);
    ASSERT_TRUE(t.engine->Add({prompt, Greedy(12), ""}).ok());
    singles.push_back(RunToEnd(*t.engine).begin()->second);
  }
  for (const bool chunked : {false, true}) {
    EngineOptions options;
    options.enable_chunked_prefill = chunked;
    options.max_num_batched_tokens = chunked ? 48 : 2048;
    TestEngine t = MakeEngine(config, options);
    std::vector<RequestId> ids;
    for (const auto& prompt : prompts) ids.push_back(*t.engine->Add({prompt, Greedy(12), ""}));
    const auto done = RunToEnd(*t.engine);
    for (size_t index = 0; index < prompts.size(); ++index) {
      EXPECT_EQ(done.at(ids[index]).tokens, singles[index].tokens)
          << "prompt " << index << (chunked ? " chunked" : " unchunked");
    }
  }
}

// Decode batches padded to graph buckets (what the CUDA backend captures) give the same tokens,
// bitwise, as unpadded ones: padding rows touch only the padding slot.
TEST(EngineTest, PaddedDecodeBatchesAreBitwiseUnpadded) {
  auto rng = testing::MakeRng();
  const ModelConfig config = SmallConfig();
  std::vector<std::vector<int32_t>> prompts;
  for (int index = 0; index < 11; ++index) {
    prompts.push_back(RandomPrompt(rng, 3 + static_cast<int>(rng() % 40)));
  }
  const auto run = [&](bool pad) {
    EngineOptions options;
    options.pad_decode_batches = pad;
    options.max_num_batched_tokens = 64;  // prompts arrive over several steps: batch sizes vary
    TestEngine t = MakeEngine(config, options);
    std::vector<RequestId> ids;
    for (const auto& prompt : prompts) {
      ids.push_back(*t.engine->Add({prompt, Greedy(3 + static_cast<int>(ids.size())), ""}));
    }
    auto done = RunToEnd(*t.engine);
    EXPECT_EQ(t.engine->Stats().num_pages_used, 0);
    std::vector<Completion> out;
    for (const RequestId id : ids) out.push_back(done.at(id));
    return out;
  };
  const auto plain = run(false);
  const auto padded = run(true);
  for (size_t index = 0; index < prompts.size(); ++index) {
    EXPECT_EQ(padded[index].tokens, plain[index].tokens) << index;
    EXPECT_EQ(padded[index].logprobs, plain[index].logprobs) << index;
  }
}

// A decode graph's layer bound: whole 4096-entry pieces of the decode attention, never past the
// step's bound (max_model_len + 1), never zero.
TEST(ModelRunnerTest, GraphLayerBoundRoundsUpToWholePieces) {
  EXPECT_EQ(ModelRunner::GraphLayerBound(0, 8193), 4096);
  EXPECT_EQ(ModelRunner::GraphLayerBound(1, 8193), 4096);
  EXPECT_EQ(ModelRunner::GraphLayerBound(411, 8193), 4096);
  EXPECT_EQ(ModelRunner::GraphLayerBound(4096, 8193), 4096);
  EXPECT_EQ(ModelRunner::GraphLayerBound(4097, 8193), 8192);
  EXPECT_EQ(ModelRunner::GraphLayerBound(8193, 8193), 8193);
  EXPECT_EQ(ModelRunner::GraphLayerBound(300, 513), 513);
}

// Warm start: the decode buckets a warm-up captures are every size a batch pads to, and the layer
// bounds follow PrepareStep's (the step's token makes each layer one longer).
TEST(ModelRunnerTest, WarmUpBucketsAndBoundsAreThoseOfRealSteps) {
  const ModelConfig config = SmallConfig();
  auto backend = MakeCpuBackend();
  auto model = LlamaModel::Random(config, *backend, 3, 5000, 0.08f);
  KvCacheManager::Options kv_options;
  kv_options.num_pages = 64;
  kv_options.num_layers = config.num_layers;
  kv_options.max_seqs = 41;
  kv_options.max_pages_per_seq = 5000 / 16 + 2;
  KvCacheManager kv(kv_options);
  kv.ReservePaddingSlot();
  ModelRunnerOptions options;
  options.max_num_seqs = 40;
  options.max_model_len = 5000;
  options.pad_decode_batches = true;
  const ModelRunner runner(*model, kv, options);
  EXPECT_FALSE(runner.uses_graphs());  // the CPU backend has none
  EXPECT_EQ(runner.DecodeBuckets(), (std::vector<int>{1, 2, 4, 8, 16, 32, 48}));
  for (const int batch : {1, 3, 7, 9, 33, 40}) {
    const auto buckets = runner.DecodeBuckets();
    EXPECT_NE(std::find(buckets.begin(), buckets.end(), ModelRunner::BucketFor(batch)),
              buckets.end())
        << batch;
  }
  EXPECT_EQ(runner.GraphLayerBounds({0, 4095, 4096, 4999}),
            (std::vector<int32_t>{4096, 4096, 5001, 5001}));
}

// A warm-up (here its prefill steps, which the CPU backend would skip: it plans nothing) leaves
// no trace: no pages held, no stats, and the same greedy tokens and log-probabilities after it
// as without it. Prefill rows past max_model_len run as several sequences.
TEST(EngineTest, WarmUpLeavesNoTrace) {
  auto rng = testing::MakeRng();
  const ModelConfig config = SmallConfig();
  std::vector<std::vector<int32_t>> prompts;
  for (int index = 0; index < 6; ++index) {
    prompts.push_back(RandomPrompt(rng, 3 + static_cast<int>(rng() % 40)));
  }
  const auto run = [&](bool warm_up) {
    EngineOptions options;
    options.pad_decode_batches = true;
    options.max_num_batched_tokens = 128;
    options.max_model_len = 60;
    options.max_num_seqs = 2;  // a warm-up step of 3 sequences, more than a decode bucket's rows
    options.kv_policy = "full:0,snapkv:1-2";
    options.kv_policy_options.budget = 16;
    options.kv_policy_options.window = 4;
    TestEngine t = MakeEngine(config, options);
    if (warm_up) {
      int calls = 0;
      const WarmUpReport report = t.engine->WarmUp(
          [&](int done, int total) {
            ++calls;
            EXPECT_EQ(done, calls);
            EXPECT_EQ(total, 8);
            return true;
          },
          /*plan_prefill_anyway=*/true);
      EXPECT_EQ(calls, 8);
      EXPECT_EQ(report.prefill_steps, 8);  // 1, 2, 4, ..., 128 rows
      EXPECT_EQ(report.decode_graphs, 0);
      EXPECT_FALSE(report.stopped);
      const EngineStats stats = t.engine->Stats();
      EXPECT_EQ(stats.steps, 0);
      EXPECT_EQ(stats.num_pages_used, 0);
      EXPECT_EQ(stats.prompt_tokens, 0);
    }
    std::vector<RequestId> ids;
    for (const auto& prompt : prompts) ids.push_back(*t.engine->Add({prompt, Greedy(12), ""}));
    auto done = RunToEnd(*t.engine);
    EXPECT_EQ(t.engine->Stats().num_pages_used, 0);
    std::vector<Completion> out;
    for (const RequestId id : ids) out.push_back(done.at(id));
    return out;
  };
  const auto cold = run(false);
  const auto warm = run(true);
  for (size_t index = 0; index < prompts.size(); ++index) {
    EXPECT_EQ(warm[index].tokens, cold[index].tokens) << index;
    EXPECT_EQ(warm[index].logprobs, cold[index].logprobs) << index;
  }
}

// A progress callback that returns false stops the warm-up after that piece.
TEST(EngineTest, WarmUpStopsWhenAsked) {
  EngineOptions options;
  options.pad_decode_batches = true;
  options.max_num_batched_tokens = 64;
  TestEngine t = MakeEngine(SmallConfig(), options);
  const WarmUpReport report =
      t.engine->WarmUp([](int done, int) { return done < 3; }, /*plan_prefill_anyway=*/true);
  EXPECT_TRUE(report.stopped);
  EXPECT_EQ(report.prefill_steps, 3);
}

// SPARSITY.md test 1: a budget that covers the prompt leaves the engine bitwise dense.
TEST(EngineTest, SparsePolicyWithCoveringBudgetIsBitwiseDense) {
  auto rng = testing::MakeRng();
  const ModelConfig config = SmallConfig();
  std::vector<std::vector<int32_t>> prompts;
  for (int index = 0; index < 4; ++index)
    prompts.push_back(RandomPrompt(rng, 20 + static_cast<int>(rng() % 100)));
  const auto run = [&](const std::string& policy) {
    EngineOptions options;
    options.kv_policy = policy;
    options.kv_policy_options.budget = 256;
    options.kv_policy_options.window = 8;
    options.kv_policy_options.heavy = 200;
    options.kv_policy_options.recent = 252;  // with 4 sinks, 256 for streamingllm
    TestEngine t = MakeEngine(config, options);
    std::vector<RequestId> ids;
    for (const auto& prompt : prompts) ids.push_back(*t.engine->Add({prompt, Greedy(10), ""}));
    auto done = RunToEnd(*t.engine);
    std::vector<Completion> out;
    for (const RequestId id : ids) out.push_back(done.at(id));
    return out;
  };
  const auto dense = run("full");
  for (const std::string policy :
       {"snapkv", "pyramidkv", "full:0,snapkv:1-2", "streamingllm", "h2o"}) {
    const auto sparse = run(policy);
    for (size_t index = 0; index < prompts.size(); ++index) {
      EXPECT_EQ(sparse[index].tokens, dense[index].tokens) << policy;
      EXPECT_EQ(sparse[index].logprobs, dense[index].logprobs) << policy << " (bitwise)";
    }
  }
}

// 4000-token prompts with budget 400: sparse layers hold at least 8x fewer entries.
TEST(EngineTest, CompressionCutsEntriesByTheBudgetRatio) {
  auto rng = testing::MakeRng();
  ModelConfig config = SmallConfig();
  config.num_layers = 4;
  config.num_heads = 2;
  config.num_kv_heads = 1;
  for (const std::string policy : {"snapkv", "full:0,pyramidkv:1-3"}) {
    EngineOptions options;
    options.kv_policy = policy;
    options.kv_policy_options.budget = 400;
    options.kv_policy_options.window = 32;
    options.max_num_batched_tokens = 4096;
    TestEngine t = MakeEngine(config, options);
    ASSERT_TRUE(t.engine->Add({RandomPrompt(rng, 4000), Greedy(3), ""}).ok());
    ASSERT_TRUE(t.engine->Add({RandomPrompt(rng, 4000), Greedy(3), ""}).ok());
    const auto done = RunToEnd(*t.engine);
    EXPECT_EQ(done.size(), 2u);
    const EngineStats stats = t.engine->Stats();
    const int first_sparse = policy == "snapkv" ? 0 : 1;
    int64_t sparse_entries = 0;
    for (int layer = first_sparse; layer < config.num_layers; ++layer) {
      sparse_entries += stats.entries_kept_by_layer[layer];
    }
    const int64_t dense_entries = int64_t{2} * 4000 * (config.num_layers - first_sparse);
    EXPECT_GE(dense_entries, 8 * sparse_entries) << policy << ": " << sparse_entries;
    if (first_sparse == 1) {
      EXPECT_EQ(stats.entries_kept_by_layer[0], 8000);
    }
    EXPECT_EQ(stats.num_pages_used, 0) << "pages leaked";
  }
}

TEST(EngineTest, RefusesBadRequests) {
  const ModelConfig config = SmallConfig();
  EngineOptions options;
  options.max_model_len = 64;
  TestEngine t = MakeEngine(config, options);
  const auto too_long = t.engine->Add({std::vector<int32_t>(64, 1), Greedy(4), ""});
  EXPECT_EQ(too_long.status().code(), StatusCode::kOutOfRange);
  EXPECT_NE(too_long.status().message().find("context"), std::string::npos);
  EXPECT_EQ(t.engine->Add({{1, 2, 999}, Greedy(4), ""}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_FALSE(t.engine->Add({{}, Greedy(4), ""}).ok());
  SamplingParams bad = Greedy(4);
  bad.top_p = 0;
  EXPECT_FALSE(t.engine->Add({{1, 2}, bad, ""}).ok());
  EXPECT_FALSE(t.engine->Add({{1, 2}, Greedy(4), "nonsense:0-1"}).ok());
  // A prompt that fits gets max_tokens clipped to the context.
  auto id = t.engine->Add({std::vector<int32_t>(60, 1), Greedy(100), ""});
  ASSERT_TRUE(id.ok());
  const auto done = RunToEnd(*t.engine);
  EXPECT_EQ(done.at(*id).tokens.size(), 4u);
  EXPECT_EQ(done.at(*id).reason, FinishReason::kLength);
}

TEST(EngineTest, SeededSamplingIsReproducibleAcrossBatches) {
  auto rng = testing::MakeRng();
  const ModelConfig config = SmallConfig();
  SamplingParams params;
  params.temperature = 1.0f;
  params.top_k = 50;
  params.top_p = 0.9f;
  params.max_tokens = 16;
  params.ignore_eos = true;
  params.seed = rng();
  const auto prompt = RandomPrompt(rng, 30);
  EngineOptions options;
  TestEngine alone = MakeEngine(config, options);
  ASSERT_TRUE(alone.engine->Add({prompt, params, ""}).ok());
  const auto first = RunToEnd(*alone.engine).begin()->second.tokens;
  TestEngine crowd = MakeEngine(config, options);
  for (int index = 0; index < 5; ++index) {
    SamplingParams other = params;
    other.seed = rng();
    ASSERT_TRUE(crowd.engine->Add({RandomPrompt(rng, 40), other, ""}).ok());
  }
  const RequestId id = *crowd.engine->Add({prompt, params, ""});
  EXPECT_EQ(RunToEnd(*crowd.engine).at(id).tokens, first);
}

// A crowd for the preemption tests under `policy`: 8 requests of 40-79 prompt tokens and 30-49
// new ones (every third seeded on the host sampler, with logprobs), each first answered alone on
// an engine of its own with room to spare, and the most pages one of them held then.
struct PreemptionCrowd {
  EngineOptions options;
  std::vector<PromptAndParams> requests;
  std::vector<Completion> alone;
  int peak_pages = 0;

  // Answers each request alone, on an engine of its own with `options` (their pool to spare),
  // into `alone`, and notes the most pages one of them held.
  void AnswerAlone(const ModelConfig& config) {
    for (const PromptAndParams& request : requests) {
      TestEngine t = MakeEngine(config, options);
      EXPECT_TRUE(t.engine->Add({request.prompt, request.params, ""}).ok());
      const auto done = RunToEnd(*t.engine);
      EXPECT_EQ(done.size(), 1u);
      alone.push_back(done.empty() ? Completion{} : done.begin()->second);
      const EngineStats stats = t.engine->Stats();
      EXPECT_EQ(stats.num_preemptions, 0);
      peak_pages = std::max(peak_pages, static_cast<int>(stats.peak_pages_used));
    }
  }

  // A pool for `pools` times the largest request alone (and a few pages more): small enough that
  // the crowd preempts, never too small for one request.
  int64_t PoolBytes(const ModelConfig& config, double pools) const {
    return PageBytes(config, options.page_size) * (static_cast<int64_t>(pools * peak_pages) + 4);
  }

  // Runs the whole crowd at once on an engine with `engine_options`, expects each answer, token
  // for token and logprob for logprob, to be its answer alone and no page to be left used, and
  // returns the engine's stats.
  EngineStats RunAsAlone(const ModelConfig& config, const EngineOptions& engine_options) const {
    TestEngine t = MakeEngine(config, engine_options);
    const std::vector<RequestId> ids = AddAll(*t.engine, requests);
    const auto done = RunToEnd(*t.engine);
    const EngineStats stats = t.engine->Stats();
    EXPECT_EQ(stats.num_pages_used, 0);
    for (size_t index = 0; index < requests.size(); ++index) {
      const Completion& got = done.at(ids[index]);
      EXPECT_EQ(got.tokens, alone[index].tokens) << "request " << index;
      EXPECT_EQ(got.logprobs, alone[index].logprobs) << "request " << index;
    }
    return stats;
  }
};

PreemptionCrowd MakePreemptionCrowd(std::mt19937_64& rng, const ModelConfig& config,
                                    const std::string& policy) {
  PreemptionCrowd crowd;
  crowd.options = TightPolicyOptions(policy);
  crowd.options.max_num_seqs = 8;
  // Prompts prefilled over several steps, so that admitted sequences still grow and policies
  // whose decode never grows (streamingllm) are preempted too; h2o scores every prompt row in
  // one step.
  crowd.options.max_num_batched_tokens = policy == "h2o" ? 128 : 24;
  for (int index = 0; index < 8; ++index) {
    SamplingParams params = Greedy(30 + static_cast<int>(rng() % 20));
    if (index % 3 == 2) {  // seeded sampling on the host (logprobs ask for it)
      params.temperature = 0.9f;
      params.seed = rng();
      params.logprobs = 1;
    }
    crowd.requests.push_back({RandomPrompt(rng, 40 + static_cast<int>(rng() % 40)), params});
  }
  crowd.AnswerAlone(config);
  return crowd;
}

// A request's answer does not depend on whether it was preempted, sparse policies included: a
// crowd of requests in a pool that forces preemptions answers each one as it is answered alone,
// token for token and logprob for logprob, greedy and seeded alike (the host sampler's random
// stream too: replayed tokens are not sampled again).
TEST(EngineTest, PreemptedRequestsAnswerAsAlone) {
  auto rng = testing::MakeRng();
  const ModelConfig config = SmallConfig();
  for (const std::string policy :
       {"full", "snapkv", "pyramidkv", "streamingllm", "h2o", "full:0,snapkv:1-2"}) {
    SCOPED_TRACE(policy);
    const PreemptionCrowd crowd = MakePreemptionCrowd(rng, config, policy);
    // Pools for about two of them at their largest, then tighter, until one preempts (how many
    // it takes depends on the prompts' lengths); each holds the largest alone, so nobody waits
    // forever. Every crowd answers each request as it was answered alone.
    int64_t preemptions = 0;
    for (const double pools : {2.0, 1.5, 1.2}) {
      if (preemptions > 0) break;
      SCOPED_TRACE("pool " + std::to_string(pools));
      EngineOptions tight = crowd.options;
      tight.kv_memory_bytes = crowd.PoolBytes(config, pools);
      preemptions = crowd.RunAsAlone(config, tight).num_preemptions;
    }
    EXPECT_GT(preemptions, 0) << "no pool was tight enough to preempt";
  }
}

// Preemption by swap (sched/README.md "Preemption"): a crowd in a pool that forces preemptions
// answers every request as it is answered alone, bitwise, dense and under every sparse policy,
// with every preemption a swap: nothing is prefilled twice and no generated token is replayed.
// The same crowd by recompute replays the sparse requests' generated tokens. No page and no swap
// slot is left held.
TEST(EngineTest, SwappedRequestsAnswerAsAlone) {
  auto rng = testing::MakeRng();
  const ModelConfig config = SmallConfig();
  for (const std::string policy : {"full", "snapkv", "pyramidkv", "streamingllm", "h2o"}) {
    SCOPED_TRACE(policy);
    const PreemptionCrowd crowd = MakePreemptionCrowd(rng, config, policy);
    int64_t swapped = 0;
    for (const double pools : {2.0, 1.5, 1.2}) {
      if (swapped > 0) break;
      EngineOptions tight = crowd.options;
      tight.kv_memory_bytes = crowd.PoolBytes(config, pools);
      for (const PreemptionMode mode : {PreemptionMode::kSwap, PreemptionMode::kRecompute}) {
        SCOPED_TRACE(std::string(PreemptionModeName(mode)) + " pool " + std::to_string(pools));
        tight.preemption_mode = mode;
        tight.swap_space_bytes = int64_t{64} << 20;
        const EngineStats stats = crowd.RunAsAlone(config, tight);
        EXPECT_EQ(stats.num_swapped, 0);
        EXPECT_EQ(stats.num_swap_slots_used, 0);
        if (mode == PreemptionMode::kSwap) {
          swapped = stats.num_swapped_out;
          EXPECT_EQ(stats.num_preemptions, stats.num_swapped_out);
          // Every swapped request came back, or finished in the step in flight when it went.
          EXPECT_EQ(stats.num_swapped_in + stats.num_swapped_removed, stats.num_swapped_out);
          EXPECT_EQ(stats.num_swap_fallbacks, 0);
          EXPECT_EQ(stats.num_replayed_tokens, 0);
          if (swapped == 0) break;  // not tight enough: try a smaller pool
        } else {
          EXPECT_GT(stats.num_preemptions, 0);
          EXPECT_EQ(stats.num_swapped_out, 0);
          EXPECT_EQ(stats.num_swap_fallbacks, 0);
          // A recomputed sparse request replays what it had generated; a dense one prefills it.
          // (The crowds of H2O and StreamingLLM, whose decode does not grow, peak while prompts
          // are whole and are preempted in or right after prefill, before a token to replay.)
          if (policy == "full") {
            EXPECT_EQ(stats.num_replayed_tokens, 0);
          } else if (policy == "snapkv" || policy == "pyramidkv") {
            EXPECT_GT(stats.num_replayed_tokens, 0);
          }
        }
      }
    }
    EXPECT_GT(swapped, 0) << "no pool was tight enough to preempt";
  }
}

// Swap space too small for a request's pages: that preemption recomputes instead (counted), and
// answers stay exact. With room for some, swaps and fallbacks mix.
TEST(EngineTest, SwapSpaceTooSmallFallsBackToRecompute) {
  auto rng = testing::MakeRng();
  const ModelConfig config = SmallConfig();
  for (const std::string policy : {"full", "snapkv"}) {
    SCOPED_TRACE(policy);
    PreemptionCrowd crowd;
    crowd.options = TightPolicyOptions(policy);
    crowd.options.max_num_seqs = 6;
    crowd.options.max_num_batched_tokens = 24;
    crowd.options.preemption_mode = PreemptionMode::kSwap;
    for (int index = 0; index < 6; ++index) {
      crowd.requests.push_back({RandomPrompt(rng, 50 + static_cast<int>(rng() % 30)),
                                Greedy(30 + static_cast<int>(rng() % 20))});
    }
    crowd.AnswerAlone(config);
    // A slot holds one page of one layer: 2 slots hold no request's pages (each has >= 3 layers),
    // 0 bytes no slot at all.
    for (const int64_t slots : {0, 2}) {
      SCOPED_TRACE("slots " + std::to_string(slots));
      EngineOptions tight = crowd.options;
      tight.kv_memory_bytes = PageBytes(config, tight.page_size) * config.num_layers * 40;
      tight.swap_space_bytes = PageBytes(config, tight.page_size) * slots;
      const EngineStats stats = crowd.RunAsAlone(config, tight);
      EXPECT_GT(stats.num_preemptions, 0);
      EXPECT_EQ(stats.num_swapped_out, 0);
      EXPECT_EQ(stats.num_swap_fallbacks, stats.num_preemptions);
      EXPECT_EQ(stats.num_swap_slots_used, 0);
    }
  }
}

// Requests aborted while swapped out (every request still going is aborted once one is swapped
// out) give back their swap slots, and the pool ends empty.
TEST(EngineTest, AbortWhileSwappedOutLeaksNothing) {
  auto rng = testing::MakeRng();
  const ModelConfig config = SmallConfig();
  for (const std::string policy : {"full", "snapkv"}) {
    SCOPED_TRACE(policy);
    EngineOptions options = TightPolicyOptions(policy);
    options.max_num_seqs = 6;
    options.max_num_batched_tokens = 24;
    options.preemption_mode = PreemptionMode::kSwap;
    options.swap_space_bytes = int64_t{16} << 20;
    options.kv_memory_bytes = PageBytes(config, options.page_size) * config.num_layers * 40;
    TestEngine t = MakeEngine(config, options);
    std::vector<PromptAndParams> requests;
    for (int index = 0; index < 6; ++index) {
      requests.push_back({RandomPrompt(rng, 50 + static_cast<int>(rng() % 30)),
                          Greedy(40 + static_cast<int>(rng() % 20))});
    }
    const std::vector<RequestId> ids = AddAll(*t.engine, requests);
    std::map<RequestId, bool> finished;
    int aborted = 0;
    while (t.engine->HasWork()) {
      for (const RequestOutput& output : t.engine->Step()) {
        if (output.finished) finished[output.id] = true;
      }
      const EngineStats stats = t.engine->Stats();
      if (stats.num_swapped > 0 && aborted == 0) {
        EXPECT_GT(stats.num_swap_slots_used, 0);
        // Abort every request still going: the swapped ones among them.
        for (const RequestId id : ids) {
          if (!finished.count(id) && t.engine->Abort(id)) ++aborted;
        }
        EXPECT_EQ(t.engine->Stats().num_swapped, 0);
        EXPECT_EQ(t.engine->Stats().num_swap_slots_used, 0);
      }
    }
    EXPECT_GT(aborted, 0) << "nothing was swapped out";
    const EngineStats stats = t.engine->Stats();
    EXPECT_GT(stats.num_swapped_removed, 0) << "no request was removed while swapped out";
    EXPECT_EQ(stats.num_swapped_in + stats.num_swapped_removed, stats.num_swapped_out);
    EXPECT_EQ(stats.num_pages_used, 0);
    EXPECT_EQ(stats.num_swapped, 0);
    EXPECT_EQ(stats.num_swap_slots_used, 0);
  }
}

// Swap mode with the prefix cache on: requests sharing a prompt prefix (their pages attached,
// shared, keyed) are swapped out and back into private pages, and answer as alone; pages shared
// with a swapped request stay correct for the others.
TEST(EngineTest, SwapWithPrefixCachingAnswersAsAlone) {
  auto rng = testing::MakeRng();
  const ModelConfig config = SmallConfig();
  for (const std::string policy : {"full", "snapkv"}) {
    SCOPED_TRACE(policy);
    PreemptionCrowd crowd;
    crowd.options = TightPolicyOptions(policy);
    crowd.options.max_num_seqs = 8;
    crowd.options.max_num_batched_tokens = 24;
    crowd.options.enable_prefix_caching = true;
    crowd.options.preemption_mode = PreemptionMode::kSwap;
    crowd.options.swap_space_bytes = int64_t{64} << 20;
    const std::vector<int32_t> prefix = RandomPrompt(rng, 32);
    for (int index = 0; index < 8; ++index) {
      std::vector<int32_t> prompt = prefix;
      const std::vector<int32_t> suffix = RandomPrompt(rng, 16 + static_cast<int>(rng() % 30));
      prompt.insert(prompt.end(), suffix.begin(), suffix.end());
      crowd.requests.push_back({prompt, Greedy(30 + static_cast<int>(rng() % 20))});
    }
    crowd.AnswerAlone(config);
    int64_t swapped = 0;
    for (const double pools : {2.0, 1.5, 1.2}) {
      if (swapped > 0) break;
      SCOPED_TRACE("pool " + std::to_string(pools));
      EngineOptions tight = crowd.options;
      tight.kv_memory_bytes = crowd.PoolBytes(config, pools);
      const EngineStats stats = crowd.RunAsAlone(config, tight);
      swapped = stats.num_swapped_out;
      EXPECT_GT(stats.prefix_cache_hits, 0);
      EXPECT_EQ(stats.num_swap_slots_used, 0);
      // Every swapped request came back, or finished in the step in flight when it went.
      EXPECT_EQ(stats.num_swapped_in + stats.num_swapped_removed, stats.num_swapped_out);
      EXPECT_EQ(stats.num_replayed_tokens, 0);
    }
    EXPECT_GT(swapped, 0) << "no pool was tight enough to preempt";
  }
}

// Bad swap settings are errors, not aborts.
TEST(EngineTest, RejectsBadSwapSettings) {
  EXPECT_FALSE(ParsePreemptionMode("swapped").ok());
  EXPECT_EQ(*ParsePreemptionMode("swap"), PreemptionMode::kSwap);
  EXPECT_EQ(*ParsePreemptionMode("recompute"), PreemptionMode::kRecompute);
  const ModelConfig config = SmallConfig();
  auto backend = MakeCpuBackend();
  EngineOptions options = TightPolicyOptions("full");
  options.kv_memory_bytes = int64_t{1} << 20;
  options.preemption_mode = PreemptionMode::kSwap;
  options.swap_space_bytes = -1;
  auto model = LlamaModel::Random(config, *backend, 7, options.max_model_len, 0.08f);
  const auto engine = Engine::Create(std::move(model), nullptr, {257}, options);
  ASSERT_FALSE(engine.ok());
  EXPECT_NE(engine.status().ToString().find("--swap-space"), std::string::npos);
}

// --batch-invariant (runtime/README.md "Batch invariance"): a crowd answers every request
// bitwise as it is answered alone, dense and sparse, greedy and seeded, with the prefix cache on
// (requests share a prompt prefix) and off, in a roomy pool and in pools tight enough to preempt
// by recompute (a dense request then replays its generated tokens as decode steps, as a sparse one
// does) and by swap. The CPU backend computes every row the same way whatever the batch, so this
// checks the engine's side: fixed chunks, cached prefixes cut at chunk boundaries, dense replay.
TEST(EngineTest, BatchInvariantCrowdAnswersAsAlone) {
  auto rng = testing::MakeRng();
  const ModelConfig config = SmallConfig();
  for (const std::string policy : {"full", "snapkv", "full:0,pyramidkv:1-2", "h2o"}) {
    SCOPED_TRACE(policy);
    PreemptionCrowd crowd;
    crowd.options = TightPolicyOptions(policy);
    crowd.options.batch_invariant = true;
    crowd.options.batch_invariant_chunk = 12;  // three 4-entry pages
    crowd.options.max_num_seqs = 8;
    // Room for a few chunks beside the decodes; h2o scores every prompt row in its final chunk.
    crowd.options.max_num_batched_tokens = policy == "h2o" ? 128 : 40;
    crowd.options.enable_prefix_caching = true;
    const std::vector<int32_t> prefix = RandomPrompt(rng, 20 + static_cast<int>(rng() % 12));
    for (int index = 0; index < 8; ++index) {
      std::vector<int32_t> prompt =
          index % 2 == 0 ? prefix : RandomPrompt(rng, 10 + static_cast<int>(rng() % 20));
      const std::vector<int32_t> suffix = RandomPrompt(rng, 15 + static_cast<int>(rng() % 30));
      prompt.insert(prompt.end(), suffix.begin(), suffix.end());
      SamplingParams params = Greedy(25 + static_cast<int>(rng() % 20));
      if (index % 3 == 1) {  // seeded sampling
        params.temperature = 0.8f;
        params.seed = rng();
        params.logprobs = index % 2;  // on the host (logprobs) or as the device path would
      }
      crowd.requests.push_back({prompt, params});
    }
    crowd.AnswerAlone(config);
    for (const bool caching : {true, false}) {
      EngineOptions roomy = crowd.options;
      roomy.enable_prefix_caching = caching;
      SCOPED_TRACE(caching ? "prefix caching" : "no prefix caching");
      const EngineStats stats = crowd.RunAsAlone(config, roomy);
      EXPECT_EQ(stats.num_preemptions, 0);
      if (caching && policy != "h2o") {
        EXPECT_GT(stats.prefix_cache_hits, 0);
      }
    }
    for (const PreemptionMode mode : {PreemptionMode::kRecompute, PreemptionMode::kSwap}) {
      int64_t preemptions = 0;
      int64_t replayed = 0;
      for (const double pools : {1.5, 1.2, 1.0}) {
        SCOPED_TRACE(std::string(PreemptionModeName(mode)) + " pool " + std::to_string(pools));
        EngineOptions tight = crowd.options;
        tight.kv_memory_bytes = crowd.PoolBytes(config, pools);
        tight.preemption_mode = mode;
        tight.swap_space_bytes = int64_t{64} << 20;
        const EngineStats stats = crowd.RunAsAlone(config, tight);
        preemptions += stats.num_preemptions;
        replayed += stats.num_replayed_tokens;
      }
      // H2O's decode does not grow: its crowd peaks while prompts are whole, where the pool
      // admits them one by one instead of preempting.
      if (policy == "h2o") continue;
      EXPECT_GT(preemptions, 0) << "no pool was tight enough to preempt";
      // Recomputed, a request prefills its prompt only and replays what it had generated as
      // decode steps, dense ones too (swapped, it replays nothing).
      if (mode == PreemptionMode::kRecompute) {
        EXPECT_GT(replayed, 0);
      } else {
        EXPECT_EQ(replayed, 0);
      }
    }
  }
}

// --batch-invariant's chunk is whole pages within a step's budget, and GPU-style tensor
// parallelism aside, every backend here accepts it.
TEST(EngineTest, BatchInvariantChunkIsWholePagesWithinTheBudget) {
  const ModelConfig config = SmallConfig();
  EngineOptions options = TightPolicyOptions("full");
  options.batch_invariant = true;
  options.batch_invariant_chunk = 10;  // rounds up to 12 (4-entry pages)
  options.max_num_batched_tokens = 64;
  TestEngine t = MakeEngine(config, options);
  EXPECT_NE(t.engine->Describe().find("prefill chunks of 12 tokens"), std::string::npos)
      << t.engine->Describe();
  options.max_num_batched_tokens = 9;  // below the chunk: rounded down to 8
  TestEngine small = MakeEngine(config, options);
  EXPECT_NE(small.engine->Describe().find("prefill chunks of 8 tokens"), std::string::npos)
      << small.engine->Describe();
  auto backend = MakeCpuBackend();
  options.max_num_batched_tokens = 3;  // less than a page
  auto model = LlamaModel::Random(config, *backend, 7, options.max_model_len, 0.08f);
  const auto refused = Engine::Create(std::move(model), nullptr, {257}, options);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().ToString().find("--batch-invariant"), std::string::npos);
}

// Overlapped steps (each planned and launched before the samples of the one before are read,
// the device feeding them) answer every request as steps one at a time do, bitwise: with
// sparse and evicting policies, chunked prefill, a pool tight enough to preempt, requests that
// stop on a token (the step launched ahead computed a row nobody reads), and host-sampled
// requests among them (those steps run one at a time). No page leaks.
TEST(EngineTest, OverlappedStepsAnswerAsOneAtATime) {
  auto rng = testing::MakeRng();
  const ModelConfig config = SmallConfig();
  for (const std::string policy : {"full", "pyramidkv", "h2o"}) {
    SCOPED_TRACE(policy);
    EngineOptions options = TightPolicyOptions(policy);
    options.max_num_seqs = 6;
    options.max_num_batched_tokens = policy == "h2o" ? 128 : 32;
    options.kv_memory_bytes = PageBytes(config, options.page_size) * config.num_layers * 60;
    std::vector<PromptAndParams> requests;
    for (int index = 0; index < 10; ++index) {
      SamplingParams params = Greedy(20 + static_cast<int>(rng() % 30));
      if (index == 4) {  // sampled on the host: its steps run one at a time
        params.temperature = 0.8f;
        params.seed = rng();
        params.logprobs = 2;
      }
      requests.push_back({RandomPrompt(rng, 10 + static_cast<int>(rng() % 60)), params});
    }
    const auto run = [&](bool overlap, std::vector<Completion>& completions) {
      EngineOptions run_options = options;
      run_options.overlap_steps = overlap;
      TestEngine t = MakeEngine(config, run_options);
      const std::vector<RequestId> ids = AddAll(*t.engine, requests);
      const auto done = RunToEnd(*t.engine);
      for (const RequestId id : ids) completions.push_back(done.at(id));
      const EngineStats stats = t.engine->Stats();
      EXPECT_EQ(stats.num_pages_used, 0);
      return stats;
    };
    // One at a time first, to find a token each even-numbered request meets mid-way: it stops
    // there in the runs compared.
    std::vector<Completion> first;
    run(false, first);
    for (size_t index = 0; index < requests.size(); index += 2) {
      const std::vector<int32_t>& tokens = first[index].tokens;
      requests[index].params.stop_token_ids = {tokens[tokens.size() / 2]};
    }
    std::vector<Completion> apart, overlapped;
    const EngineStats apart_stats = run(false, apart);
    const EngineStats overlapped_stats = run(true, overlapped);
    EXPECT_EQ(apart_stats.steps_launched_ahead, 0);
    EXPECT_GT(overlapped_stats.steps_launched_ahead, 0);
    EXPECT_EQ(overlapped_stats.generation_tokens, apart_stats.generation_tokens);
    int stopped = 0;
    for (size_t index = 0; index < requests.size(); ++index) {
      SCOPED_TRACE("request " + std::to_string(index));
      EXPECT_EQ(overlapped[index].tokens, apart[index].tokens);
      EXPECT_EQ(overlapped[index].logprobs, apart[index].logprobs);
      EXPECT_EQ(overlapped[index].reason, apart[index].reason);
      stopped += apart[index].reason == FinishReason::kStop ? 1 : 0;
    }
    EXPECT_GE(stopped, 5) << "the even-numbered requests stop on their stop token";
    std::printf("%s: %lld of %lld steps launched ahead, %lld preemptions\n", policy.c_str(),
                static_cast<long long>(overlapped_stats.steps_launched_ahead),
                static_cast<long long>(overlapped_stats.steps),
                static_cast<long long>(overlapped_stats.num_preemptions));
  }
}

// An engine destroyed with a step in flight reads its samples first: the backend (which outlives
// engines) must not keep them, or the next engine on it would take them for its own.
TEST(EngineTest, EngineDestroyedWithAStepInFlightLeavesTheBackendClean) {
  auto rng = testing::MakeRng();
  const ModelConfig config = SmallConfig();
  const std::vector<int32_t> prompt = RandomPrompt(rng, 40);
  EngineOptions options;
  options.max_model_len = 512;
  options.kv_memory_bytes = int64_t{64} << 20;
  const auto run = [&](Backend& backend, int steps) {
    auto engine =
        Engine::Create(LlamaModel::Random(config, backend, 7, 512, 0.08f), nullptr, {}, options);
    SIEVE_CHECK(engine.ok()) << engine.status().ToString();
    EXPECT_TRUE((*engine)->Add({prompt, Greedy(12), ""}).ok());
    std::vector<int32_t> tokens;
    for (int step = 0; (*engine)->HasWork() && (steps < 0 || step < steps); ++step) {
      for (const RequestOutput& output : (*engine)->Step()) {
        tokens.insert(tokens.end(), output.new_tokens.begin(), output.new_tokens.end());
      }
    }
    return tokens;
  };
  auto fresh = MakeCpuBackend();
  const std::vector<int32_t> expected = run(*fresh, -1);
  ASSERT_EQ(expected.size(), 12u);
  auto shared = MakeCpuBackend();
  for (int round = 0; round < 3; ++round) {
    const std::vector<int32_t> partial = run(*shared, 3);  // left with a step in flight
    EXPECT_LT(partial.size(), expected.size());
  }
  EXPECT_EQ(run(*shared, -1), expected);
}

// Random add / step / abort traffic with random policies and a small pool (so preemption
// happens): no page leaks or double frees, every finished request got exactly its tokens.
TEST(EngineTest, RandomTrafficKeepsInvariants) {
  auto rng = testing::MakeRng();
  const ModelConfig config = SmallConfig();
  const std::vector<std::string> policies = {
      "full", "snapkv", "pyramidkv", "streamingllm", "h2o", "full:0,snapkv:1-2", "full:0-1,h2o:2"};
  int64_t preemptions = 0;
  for (int round = 0; round < 10; ++round) {
    EngineOptions options = TightPolicyOptions(policies[rng() % policies.size()]);
    options.kv_policy_options.decode_cap = rng() % 2 ? 0 : 48;
    options.max_num_seqs = 6;
    options.max_num_batched_tokens = 32 + static_cast<int>(rng() % 64);
    options.enable_chunked_prefill = rng() % 3 != 0;
    // A pool small enough that sequences must be preempted.
    options.kv_memory_bytes = PageBytes(config, options.page_size) *
                              (config.num_layers * 40 + static_cast<int>(rng() % 60));
    TestEngine t = MakeEngine(config, options, rng());
    std::map<RequestId, int> expected_tokens;
    std::map<RequestId, size_t> received;
    std::set<RequestId> aborted, finished;
    for (int step = 0; step < 300; ++step) {
      const int action = static_cast<int>(rng() % 10);
      if (action < 3) {
        const int length = 1 + static_cast<int>(rng() % 100);
        SamplingParams params = Greedy(1 + static_cast<int>(rng() % 30));
        auto id = t.engine->Add({RandomPrompt(rng, length), params, ""});
        if (id.ok()) expected_tokens[*id] = params.max_tokens;
      } else if (action == 3 && !expected_tokens.empty()) {
        auto it = expected_tokens.begin();
        std::advance(it, rng() % expected_tokens.size());
        if (!finished.count(it->first) && t.engine->Abort(it->first)) aborted.insert(it->first);
      }
      for (const RequestOutput& output : t.engine->Step()) {
        received[output.id] += output.new_tokens.size();
        if (output.finished) {
          ASSERT_FALSE(finished.count(output.id)) << "finished twice";
          finished.insert(output.id);
          if (output.finish_reason != FinishReason::kAbort) {
            EXPECT_EQ(static_cast<int>(received[output.id]), expected_tokens.at(output.id));
            EXPECT_EQ(output.num_generated_tokens, expected_tokens.at(output.id));
          }
        }
      }
    }
    while (t.engine->HasWork()) {
      for (const RequestOutput& output : t.engine->Step()) {
        received[output.id] += output.new_tokens.size();
        if (output.finished) {
          finished.insert(output.id);
          if (output.finish_reason != FinishReason::kAbort) {
            EXPECT_EQ(static_cast<int>(received[output.id]), expected_tokens.at(output.id));
          }
        }
      }
    }
    EXPECT_EQ(finished.size(), expected_tokens.size()) << "a request was lost";
    const EngineStats stats = t.engine->Stats();
    EXPECT_EQ(stats.num_pages_used, 0) << "pages leaked with " << options.kv_policy;
    preemptions += stats.num_preemptions;
  }
  RecordProperty("preemptions", std::to_string(preemptions));
  std::printf("%lld preemptions over the rounds\n", static_cast<long long>(preemptions));
  EXPECT_GT(preemptions, 0) << "the pool was never tight enough to preempt";
}

// A dense engine whose steps take 40 tokens, so that 50-90-token prompts prefill in chunks.
TestEngine MakeChunkingEngine(const ModelConfig& config, uint64_t seed) {
  EngineOptions options;
  options.max_num_batched_tokens = 40;
  return MakeEngine(config, options, seed);
}

// Teacher forcing: each forced token comes out in order (an EOS among them does not stop the
// request), and its logprob equals the log-softmax of a dense prefill of the whole sequence at the
// position before it. Batched with other requests, chunked, dense policy.
TEST(EngineTest, ForcedTokensAreEmittedWithDenseLogprobs) {
  auto rng = testing::MakeRng();
  const ModelConfig config = SmallConfig();
  const uint64_t seed = rng();
  TestEngine t = MakeChunkingEngine(config, seed);
  const std::vector<int32_t> prompt = RandomPrompt(rng, 50 + static_cast<int>(rng() % 40));
  std::vector<int32_t> forced = RandomPrompt(rng, 16);
  forced[5] = 257;  // an EOS id of the engine: forced text is scored to its end
  Request request{prompt, Greedy(100), ""};
  request.sampling.logprobs = -1;  // forced logprobs come without asking
  request.sampling.ignore_eos = false;
  request.forced_tokens = forced;
  const RequestId id = *t.engine->Add(request);
  for (int other = 0; other < 3; ++other) {
    ASSERT_TRUE(t.engine->Add({RandomPrompt(rng, 30), Greedy(8), ""}).ok());
  }
  const auto done = RunToEnd(*t.engine);
  const Completion& result = done.at(id);
  EXPECT_EQ(result.tokens, forced);
  EXPECT_EQ(result.reason, FinishReason::kLength);
  ASSERT_EQ(result.logprobs.size(), forced.size());

  auto backend = MakeCpuBackend();
  std::vector<int32_t> whole = prompt;
  whole.insert(whole.end(), forced.begin(), forced.end() - 1);
  auto model = LlamaModel::Random(config, *backend, seed, config.max_position_embeddings, 0.08f);
  const std::vector<float> logits = testing::FullPrefillLogits(*model, whole);
  const int vocab = config.vocab_size;
  // Decode attention and prefill attention sum in different orders: f32 rounding only.
  constexpr double kTolerance = 1e-4;
  for (size_t index = 0; index < forced.size(); ++index) {
    const float* row = logits.data() + (prompt.size() - 1 + index) * vocab;
    const float max = *std::max_element(row, row + vocab);
    double sum = 0;
    for (int token = 0; token < vocab; ++token) sum += std::exp(double(row[token]) - max);
    const double expected = row[forced[index]] - max - std::log(sum);
    EXPECT_NEAR(result.logprobs[index], expected, kTolerance) << "forced token " << index;
  }
}

// Forced tokens, then sampling (Request::sample_after_forced): the forced tokens come out first
// with their logprobs, then max_tokens greedy tokens, each the argmax of a dense prefill of
// everything before it (up to f32 rounding between the decode and prefill paths), and neither an
// EOS nor a stop token among the forced ones ends the request. Under SnapKV the forced tokens run
// on the compressed cache: the request keeps the policy's entries plus them, as a conversation's
// next turn on its last turn's cache would.
TEST(EngineTest, SamplingAfterForcedTokensContinuesTheirSequence) {
  auto rng = testing::MakeRng();
  const ModelConfig config = SmallConfig();
  const uint64_t seed = rng();
  TestEngine t = MakeChunkingEngine(config, seed);
  const std::vector<int32_t> prompt = RandomPrompt(rng, 50 + static_cast<int>(rng() % 40));
  std::vector<int32_t> forced = RandomPrompt(rng, 12);
  forced[3] = 257;  // an EOS id of the engine
  forced[7] = 200;
  constexpr int kSampled = 6;
  Request request{prompt, Greedy(kSampled), ""};
  request.sampling.logprobs = -1;
  request.sampling.ignore_eos = false;
  request.sampling.stop_token_ids = {200};
  request.forced_tokens = forced;
  request.sample_after_forced = true;
  const RequestId id = *t.engine->Add(request);
  for (int other = 0; other < 3; ++other) {
    ASSERT_TRUE(t.engine->Add({RandomPrompt(rng, 30), Greedy(8), ""}).ok());
  }
  const Completion result = RunToEnd(*t.engine).at(id);
  ASSERT_GE(result.tokens.size(), forced.size() + 1);
  ASSERT_LE(result.tokens.size(), forced.size() + kSampled);
  EXPECT_EQ(std::vector<int32_t>(result.tokens.begin(), result.tokens.begin() + forced.size()),
            forced);
  EXPECT_EQ(result.logprobs.size(), forced.size()) << "sampled tokens' logprobs were not asked";
  const std::vector<int32_t> sampled(result.tokens.begin() + forced.size(), result.tokens.end());
  // A sampled EOS or stop token may end it early; the forced ones did not.
  if (result.reason == FinishReason::kLength) {
    EXPECT_EQ(sampled.size(), static_cast<size_t>(kSampled));
  } else {
    EXPECT_EQ(result.reason, FinishReason::kStop);
  }

  auto backend = MakeCpuBackend();
  auto model = LlamaModel::Random(config, *backend, seed, config.max_position_embeddings, 0.08f);
  std::vector<int32_t> whole = prompt;
  whole.insert(whole.end(), result.tokens.begin(), result.tokens.end() - 1);
  const std::vector<float> logits = testing::FullPrefillLogits(*model, whole);
  const int vocab = config.vocab_size;
  for (size_t index = 0; index < sampled.size(); ++index) {
    const float* row = logits.data() + (prompt.size() + forced.size() - 1 + index) * vocab;
    const float max = *std::max_element(row, row + vocab);
    EXPECT_GE(row[sampled[index]], max - 1e-4f) << "sampled token " << index << " is not greedy";
  }

  // SnapKV: the forced tokens are appended to the compressed prompt, not re-prefilled with it.
  EngineOptions sparse_options;
  sparse_options.kv_policy = "snapkv";
  sparse_options.kv_policy_options.budget = 24;
  sparse_options.kv_policy_options.window = 8;
  TestEngine sparse = MakeEngine(config, sparse_options, seed);
  Request compressed{prompt, Greedy(kSampled), ""};
  compressed.sampling.ignore_eos = true;
  compressed.forced_tokens = forced;
  compressed.sample_after_forced = true;
  ASSERT_TRUE(sparse.engine->Add(compressed).ok());
  const Completion on_cache = RunToEnd(*sparse.engine).begin()->second;
  EXPECT_EQ(on_cache.tokens.size(), forced.size() + kSampled);
  const std::vector<int64_t> kept = sparse.engine->Stats().entries_kept_by_layer;
  for (const int64_t entries : kept) EXPECT_EQ(entries, 24) << "the prompt was compressed once";
  EXPECT_EQ(sparse.engine->Stats().num_pages_used, 0);

  Request missing{prompt, Greedy(4), ""};
  missing.sample_after_forced = true;
  EXPECT_EQ(t.engine->Add(missing).status().code(), StatusCode::kInvalidArgument);
}

// A request may carry its own policy knobs: one engine (created dense, with eviction pools)
// runs SnapKV at two budgets and H2O; entries kept follow each request's budget.
TEST(EngineTest, PerRequestPolicyOptions) {
  auto rng = testing::MakeRng();
  const ModelConfig config = SmallConfig();
  const int n = 100 + static_cast<int>(rng() % 50);
  {
    EngineOptions options;
    TestEngine plain = MakeEngine(config, options);
    Request h2o{RandomPrompt(rng, n), Greedy(4), "h2o"};
    EXPECT_FALSE(plain.engine->Add(h2o).ok()) << "no eviction pools: H2O is refused";
  }
  EngineOptions options;
  options.eviction_pools = true;
  TestEngine t = MakeEngine(config, options);
  const auto kept_after = [&](Request request) {
    const std::vector<int64_t> before = t.engine->Stats().entries_kept_by_layer;
    EXPECT_TRUE(t.engine->Add(std::move(request)).ok());
    RunToEnd(*t.engine);
    const std::vector<int64_t> after = t.engine->Stats().entries_kept_by_layer;
    return after[0] - before[0];
  };
  KvPolicyOptions small = t.engine->default_policy().options();
  small.budget = 24;
  small.window = 4;
  KvPolicyOptions large = small;
  large.budget = 64;
  Request dense{RandomPrompt(rng, n), Greedy(4), ""};
  Request snap_small{RandomPrompt(rng, n), Greedy(4), "snapkv"};
  snap_small.kv_policy_options = small;
  Request snap_large{RandomPrompt(rng, n), Greedy(4), "snapkv"};
  snap_large.kv_policy_options = large;
  KvPolicyOptions heavy = small;
  heavy.heavy = 10;
  heavy.recent = 10;
  Request h2o{RandomPrompt(rng, n), Greedy(4), "h2o"};
  h2o.kv_policy_options = heavy;
  EXPECT_EQ(kept_after(dense), n);
  EXPECT_EQ(kept_after(snap_small), 24);
  EXPECT_EQ(kept_after(snap_large), 64);
  EXPECT_EQ(kept_after(h2o), 20);
  KvPolicyOptions bad = small;
  bad.budget = 4;  // not above the window
  Request refused{RandomPrompt(rng, n), Greedy(4), "snapkv"};
  refused.kv_policy_options = bad;
  const auto status = t.engine->Add(refused).status();
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("window"), std::string::npos) << status.message();
  EXPECT_EQ(t.engine->Stats().num_pages_used, 0);
}

}  // namespace
}  // namespace sieve

namespace sieve {
namespace {

// Adds `requests` to the engine, runs them to their end and returns their completions in order;
// no page stays in use.
std::vector<Completion> RunAll(Engine& engine, std::span<const Request> requests) {
  std::vector<RequestId> ids;
  for (const Request& request : requests) {
    const auto id = engine.Add(request);
    EXPECT_TRUE(id.ok()) << id.status().ToString();
    ids.push_back(id.ok() ? *id : -1);
  }
  const auto done = RunToEnd(engine);
  std::vector<Completion> out;
  for (const RequestId id : ids) out.push_back(done.at(id));
  EXPECT_EQ(engine.Stats().num_pages_used, 0);
  return out;
}

void ExpectBitwiseEqual(const std::vector<Completion>& cached,
                        const std::vector<Completion>& cold) {
  ASSERT_EQ(cached.size(), cold.size());
  for (size_t index = 0; index < cold.size(); ++index) {
    EXPECT_EQ(cached[index].tokens, cold[index].tokens) << "request " << index;
    EXPECT_EQ(cached[index].logprobs, cold[index].logprobs) << "request " << index;
  }
}

// `prefix` followed by `suffix_tokens` random tokens, the first of them `first` when given: prompts
// of one prefix with distinct firsts share no page past the prefix, so their hits are exact (two
// random suffixes' first tokens match one time in the vocabulary's size).
std::vector<int32_t> WithRandomSuffix(std::mt19937_64& rng, const std::vector<int32_t>& prefix,
                                      int suffix_tokens, int32_t first = -1) {
  std::vector<int32_t> prompt = prefix;
  const std::vector<int32_t> suffix = RandomPrompt(rng, suffix_tokens);
  prompt.insert(prompt.end(), suffix.begin(), suffix.end());
  if (first >= 0) prompt[prefix.size()] = first;
  return prompt;
}

// `requests` on an engine of `options` with the prefix cache off, then on: the completions and the
// engine's stats of each. `first_alone`: the first request runs to its end before the rest are
// added together (it leaves the pages they look up).
struct CacheRuns {
  std::vector<Completion> cold, cached;
  EngineStats cold_stats, cached_stats;
};
CacheRuns RunWithCacheOffThenOn(const ModelConfig& config, EngineOptions options,
                                std::span<const Request> requests, bool first_alone) {
  CacheRuns runs;
  for (const bool caching : {false, true}) {
    options.enable_prefix_caching = caching;
    TestEngine t = MakeEngine(config, options);
    std::vector<Completion> out = RunAll(*t.engine, requests.first(first_alone ? 1 : 0));
    const std::vector<Completion> rest = RunAll(*t.engine, requests.subspan(first_alone ? 1 : 0));
    out.insert(out.end(), rest.begin(), rest.end());
    (caching ? runs.cached : runs.cold) = std::move(out);
    (caching ? runs.cached_stats : runs.cold_stats) = t.engine->Stats();
  }
  ExpectBitwiseEqual(runs.cached, runs.cold);
  return runs;
}

// Prefix caching (EngineOptions::enable_prefix_caching): requests that share a prompt prefix with
// earlier ones attach its cached pages and prefill only the rest, and answer bitwise as on a cold
// cache (the CPU's kernels give a row the same bits whatever else is in its step). A request of
// prompt logprobs in the mix neither reuses nor leaves pages. Runs one request first (it leaves
// the prefix), then the rest together, in chunks of 48 tokens, with 4-entry pages.
TEST(EngineTest, PrefixCacheHitsAnswerAsOnAColdCache) {
  auto rng = testing::MakeRng();
  const ModelConfig config = SmallConfig();
  const std::vector<int32_t> prefix = RandomPrompt(rng, 61);
  std::vector<Request> requests;
  for (int index = 0; index < 7; ++index) {
    const int suffix_tokens = 1 + static_cast<int>(rng() % 30);
    requests.push_back(
        {WithRandomSuffix(rng, prefix, suffix_tokens, index), Greedy(6 + index), ""});
  }
  requests[6].sampling.prompt_logprobs = 2;
  requests[5].prompt = requests[0].prompt;  // request 0's prompt exactly
  EngineOptions options = TightPolicyOptions("full");
  options.max_num_batched_tokens = 48;
  const auto [cold, cached, cold_stats, cached_stats] =
      RunWithCacheOffThenOn(config, options, requests, /*first_alone=*/true);
  EXPECT_EQ(cold_stats.prefix_cache_hits, 0);
  EXPECT_EQ(cold_stats.prefix_cache_queries, 0);
  // Requests 1-4 each find the prefix's 15 whole pages (60 tokens); request 5 (request 0's prompt)
  // finds every whole page of it that leaves its last token to compute.
  const int64_t hits = 4 * 60 + (static_cast<int64_t>(requests[0].prompt.size()) - 1) / 4 * 4;
  EXPECT_EQ(cached_stats.prefix_cache_hits, hits);
  int64_t dense_prompt_tokens = 0;
  for (size_t index = 0; index < 6; ++index) dense_prompt_tokens += requests[index].prompt.size();
  EXPECT_EQ(cached_stats.prefix_cache_queries, dense_prompt_tokens);
  EXPECT_EQ(cached_stats.prompt_tokens, cold_stats.prompt_tokens - hits);
  EXPECT_GT(cached_stats.num_cached_pages, 0);
}

// The same under every policy, chunked (48-token steps) and not. A sparse layer's prompt pages
// are keyed and kept as computed, its kept entries written to pages of its own; a request that
// hits prefills only its suffix against them and scores its own window, so its kept entries, and
// its answer, are bitwise the cold cache's. H2O scores every prompt row: it never hits. Each
// policy runs one request first, then the rest together (request 4 repeats request 0's prompt).
TEST(EngineTest, PrefixCacheHitsAnswerAsOnAColdCacheUnderEveryPolicy) {
  auto rng = testing::MakeRng();
  const ModelConfig config = SmallConfig();
  for (const std::string policy :
       {"snapkv", "pyramidkv", "streamingllm", "h2o", "full:0,snapkv:1-2"}) {
    for (const int step_tokens : {48, 256}) {
      // H2O scores every prompt row in its last chunk: its prompts must fit one step.
      if (policy == "h2o" && step_tokens == 48) continue;
      SCOPED_TRACE(policy + ", " + std::to_string(step_tokens) + "-token steps");
      const std::vector<int32_t> prefix = RandomPrompt(rng, 40 + static_cast<int>(rng() % 30));
      std::vector<Request> requests;
      for (int index = 0; index < 5; ++index) {
        const int suffix_tokens = 5 + static_cast<int>(rng() % 30);
        requests.push_back(
            {WithRandomSuffix(rng, prefix, suffix_tokens, index), Greedy(8 + index), ""});
      }
      requests[4].prompt = requests[0].prompt;
      EngineOptions options = TightPolicyOptions(policy);
      options.max_num_batched_tokens = step_tokens;
      const CacheRuns runs = RunWithCacheOffThenOn(config, options, requests, true);
      const EngineStats& cold_stats = runs.cold_stats;
      const EngineStats& cached_stats = runs.cached_stats;
      EXPECT_EQ(cached_stats.prompt_tokens,
                cold_stats.prompt_tokens - cached_stats.prefix_cache_hits);
      if (policy == "h2o") {
        EXPECT_EQ(cached_stats.prefix_cache_queries, 0);
        EXPECT_EQ(cached_stats.num_cached_pages, 0);
      } else {
        // Requests 1-3 find the prefix's whole pages, request 4 every whole page of its prompt
        // that leaves the window (4 rows; streamingllm scores none: 1 row) to compute.
        const int window = policy == "streamingllm" ? 1 : 4;
        const int64_t hits = 3 * (static_cast<int64_t>(prefix.size()) / 4 * 4) +
                             (static_cast<int64_t>(requests[0].prompt.size()) - window) / 4 * 4;
        EXPECT_EQ(cached_stats.prefix_cache_hits, hits);
        EXPECT_GT(cached_stats.num_cached_pages, 0);
      }
      if (HasFailure()) return;
    }
  }
}

// Requests sent together with one prompt (n > 1 copies) or one prefix: the first computes it,
// the rest wait for its pages rather than computing them beside it, then all hit at once; answers
// bitwise as on a cold cache, dense and sparse.
TEST(EngineTest, PrefixCacheSharesAPromptAmongRequestsSentTogether) {
  auto rng = testing::MakeRng();
  const ModelConfig config = SmallConfig();
  for (const std::string policy : {"full", "snapkv"}) {
    SCOPED_TRACE(policy);
    const int length = 4 * (10 + static_cast<int>(rng() % 8)) + 1 + static_cast<int>(rng() % 3);
    const std::vector<int32_t> prompt = RandomPrompt(rng, length);
    std::vector<Request> requests;
    for (int copy = 0; copy < 4; ++copy) requests.push_back({prompt, Greedy(5 + copy), ""});
    for (int other = 0; other < 2; ++other) {
      const int suffix_tokens = 5 + static_cast<int>(rng() % 10);
      requests.push_back({WithRandomSuffix(rng, prompt, suffix_tokens, other), Greedy(7), ""});
    }
    const EngineStats cached_stats =
        RunWithCacheOffThenOn(config, TightPolicyOptions(policy), requests, false).cached_stats;
    // Copies 2-4 find the prompt's whole pages that leave the last row (SnapKV: its 4-row window)
    // to compute; the longer prompts every whole page of it.
    const int window = policy == "full" ? 1 : 4;
    const int64_t hits = 3 * ((length - window) / 4 * 4) + 2 * (length / 4 * 4);
    EXPECT_EQ(cached_stats.prefix_cache_hits, hits);
  }
}

// A sparse prompt whose pages and kept entries together would pass its page-table row (a long
// prompt near --max-model-len) runs without the cache, as with it off; a shorter one beside it
// still caches.
TEST(EngineTest, PrefixCacheLeavesASparsePromptItsRowCannotHold) {
  auto rng = testing::MakeRng();
  const ModelConfig config = SmallConfig();
  // Rows of 42 pages of 4 without spare entries (max_model_len 160): 150 tokens and 24 kept take
  // 38 + 6.
  const std::vector<int32_t> prefix = RandomPrompt(rng, 140);
  std::vector<Request> requests;
  for (int index = 0; index < 3; ++index) {
    requests.push_back({WithRandomSuffix(rng, prefix, 10, index), Greedy(5), ""});
  }
  requests.push_back({RandomPrompt(rng, 60), Greedy(5), ""});
  EngineOptions narrow = TightPolicyOptions("snapkv");
  narrow.prefix_cache_row_entries = 0;
  const EngineStats narrow_stats =
      RunWithCacheOffThenOn(config, narrow, requests, false).cached_stats;
  EXPECT_EQ(narrow_stats.prefix_cache_queries, 60);  // the short prompt alone looks up
  EXPECT_EQ(narrow_stats.prefix_cache_hits, 0);
  // The default rows have max_model_len's entries to spare: the same prompts are cached, the
  // later two sharing the first's 35 whole pages of the prefix (they leave its last four rows,
  // which SnapKV's window of 4 scores, to compute).
  const EngineStats wide_stats =
      RunWithCacheOffThenOn(config, TightPolicyOptions("snapkv"), requests, true).cached_stats;
  EXPECT_EQ(wide_stats.prefix_cache_hits, 2 * 140);
  EngineOptions wrong = TightPolicyOptions("snapkv");
  wrong.prefix_cache_row_entries = -2;
  wrong.enable_prefix_caching = true;
  auto backend = MakeCpuBackend();
  EXPECT_FALSE(
      Engine::Create(LlamaModel::Random(config, *backend, 1, 160, 0.08f), nullptr, {}, wrong).ok());
}

// A conversation: turn 2's prompt is turn 1's prompt, its answer and a new question. Dense, turn
// 1's pages of generated tokens are keyed too, so turn 2 prefills only its question and the page
// tails; sparse, turn 2 prefills turn 1's answer and its question against turn 1's prompt pages.
// Either way its answer is bitwise the cold cache's (the CPU's decode and prefill give a token's
// K/V the same bits).
TEST(EngineTest, PrefixCacheCarriesAConversationsAnswerIntoItsNextTurn) {
  auto rng = testing::MakeRng();
  const ModelConfig config = SmallConfig();
  for (const std::string policy : {"full", "snapkv"}) {
    SCOPED_TRACE(policy);
    const std::vector<int32_t> turn1 = RandomPrompt(rng, 30 + static_cast<int>(rng() % 20));
    const int answer_tokens = 17 + static_cast<int>(rng() % 10);
    const auto run = [&](bool caching, EngineStats* stats) {
      EngineOptions options = TightPolicyOptions(policy);
      options.enable_prefix_caching = caching;
      TestEngine t = MakeEngine(config, options);
      const RequestId first = *t.engine->Add({turn1, Greedy(answer_tokens), ""});
      const Completion answer = RunToEnd(*t.engine).at(first);
      std::vector<int32_t> turn2 = turn1;
      turn2.insert(turn2.end(), answer.tokens.begin(), answer.tokens.end());
      const std::vector<int32_t> question = RandomPrompt(rng, 9);
      turn2.insert(turn2.end(), question.begin(), question.end());
      const RequestId second = *t.engine->Add({turn2, Greedy(12), ""});
      const Completion reply = RunToEnd(*t.engine).at(second);
      *stats = t.engine->Stats();
      return std::make_pair(answer, reply);
    };
    const auto state = rng();
    EngineStats cold_stats, cached_stats;
    rng.seed(state);
    const auto cold = run(false, &cold_stats);
    rng.seed(state);
    const auto cached = run(true, &cached_stats);
    EXPECT_EQ(cached.first.tokens, cold.first.tokens);
    EXPECT_EQ(cached.second.tokens, cold.second.tokens);
    EXPECT_EQ(cached.second.logprobs, cold.second.logprobs);
    // Dense: turn 1 computed its prompt and every answer token but the last, those whole pages.
    // Sparse: its compressed layers keyed their prompt's pages only (answer tokens were computed
    // against the kept entries, not the whole prompt).
    const int computed = policy == "full" ? static_cast<int>(turn1.size()) + answer_tokens - 1
                                          : static_cast<int>(turn1.size());
    EXPECT_EQ(cached_stats.prefix_cache_hits, computed / 4 * 4);
  }
}

// A pool that forces preemptions: with the cache on, dense requests sharing a prefix answer as with
// it off, preempted ones find their own prompt's pages again, cached pages give way to running
// requests (nothing is refused), and no page leaks.
// Dense and sparse (a sparse sequence preempted prefills its prompt again, finding its own prompt
// pages, and replays its generated tokens).
TEST(EngineTest, PrefixCacheUnderPreemptionAnswersAsOnAColdCache) {
  auto rng = testing::MakeRng();
  const ModelConfig config = SmallConfig();
  // Pages per layer of each policy's pool: small enough to preempt.
  for (const auto& [policy, pages] :
       {std::pair<std::string, int>{"full", 70}, std::pair<std::string, int>{"snapkv", 60}}) {
    SCOPED_TRACE(policy);
    const std::vector<int32_t> prefix = RandomPrompt(rng, 40);
    std::vector<Request> requests;
    for (int index = 0; index < 12; ++index) {
      const std::vector<int32_t> start = index % 3 == 0 ? RandomPrompt(rng, 20) : prefix;
      const int suffix_tokens = 5 + static_cast<int>(rng() % 20);
      const std::vector<int32_t> prompt = WithRandomSuffix(rng, start, suffix_tokens);
      requests.push_back({prompt, Greedy(20 + static_cast<int>(rng() % 30)), ""});
    }
    EngineOptions options = TightPolicyOptions(policy);
    options.kv_memory_bytes = pages * config.num_layers * PageBytes(config, 4);
    const CacheRuns runs = RunWithCacheOffThenOn(config, options, requests, false);
    const EngineStats& cold_stats = runs.cold_stats;
    const EngineStats& cached_stats = runs.cached_stats;
    EXPECT_GT(cold_stats.num_preemptions, 0) << "the pool is meant to preempt";
    EXPECT_GT(cached_stats.num_preemptions, 0) << "the pool is meant to preempt";
    EXPECT_GT(cached_stats.prefix_cache_hits, 0);
    EXPECT_LE(cached_stats.num_cached_pages, cached_stats.num_pages);
  }
}

}  // namespace
}  // namespace sieve
