// The FP8 KV cache on the CPU backend (the reference the CUDA kernels are compared with): what the
// pool stores is e4m3 of the value over its (layer, KV head) scale, exactly; the scales bound
// every entry a prompt makes; the pool holds four times the f32 entries in the same memory; and
// every policy, chunked prefill and decode-time eviction included, scores text close to the f32
// cache and returns every page.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <vector>

#include "core/float8.h"
#include "core/testing.h"
#include "model/full_prefill.h"
#include "model/kv_scales.h"
#include "runtime/engine.h"
#include "runtime/engine_testing.h"
#include "runtime/model_loader.h"

namespace sieve {
namespace {

using testing::MakeEngine;
using testing::RandomPrompt;
using testing::SmallConfig;
using testing::TestEngine;
using testing::TightPolicyOptions;

// One dense prefill of `ids` into an f32 pool and into an FP8 pool with the model's scales:
// layer 0's K and V of every entry, as the two pools hold them.
TEST(Fp8KvCacheTest, PoolStoresE4m3OfTheValueOverItsScale) {
  auto rng = testing::MakeRng();
  const ModelConfig config = SmallConfig();
  auto backend = MakeCpuBackend();
  auto model = LlamaModel::Random(config, *backend, rng(), 512, 0.08f);
  const std::vector<int32_t> ids = RandomPrompt(rng, 40 + static_cast<int>(rng() % 60));
  const KvCacheScales scales = ComputeKvCacheScales(*model);

  const auto prefill = [&](bool fp8) {
    testing::PrefillFixture f = testing::MakeFullPrefill(*backend, config, ids);
    if (fp8) {
      f.pool.k = backend->Allocate(f.pool.k.shape(), DType::kF8E4M3);
      f.pool.v = backend->Allocate(f.pool.v.shape(), DType::kF8E4M3);
      f.pool.k_scales = backend->Allocate({config.num_layers, config.num_kv_heads}, DType::kF32);
      f.pool.v_scales = backend->Allocate({config.num_layers, config.num_kv_heads}, DType::kF32);
      backend->CopyFromHost(scales.k.data(), scales.k.size() * 4, f.pool.k_scales);
      backend->CopyFromHost(scales.v.data(), scales.v.size() * 4, f.pool.v_scales);
    }
    ForwardWorkspace workspace;
    model->EnsureWorkspace(workspace, f.step.num_tokens, f.step.num_tokens, 1, 1, 1);
    f.step.num_sample_rows = 0;
    Tensor no_logits;
    model->Forward(f.step, f.pool, workspace, no_logits);
    return f;
  };
  const testing::PrefillFixture dense = prefill(false);
  const testing::PrefillFixture quantized = prefill(true);
  const int heads = config.num_kv_heads;
  const int d = config.head_dim;
  // Layer 0's pages are the first ones (MakeFullPrefill's table is the identity), and its input
  // is the same in both runs: the bytes must be exactly the rounding of the f32 values.
  const int64_t elements = static_cast<int64_t>(ids.size()) * heads * d;
  for (const bool is_k : {true, false}) {
    const float* values = (is_k ? dense.pool.k : dense.pool.v).data_as<float>();
    const uint8_t* bytes = (is_k ? quantized.pool.k : quantized.pool.v).data_as<uint8_t>();
    const std::vector<float>& scale = is_k ? scales.k : scales.v;
    int64_t mismatches = 0;
    for (int64_t index = 0; index < elements; ++index) {
      const int head = static_cast<int>(index / d % heads);
      const uint8_t expected = FloatToE4m3(values[index] * (1.0f / scale[head]));
      if (bytes[index] != expected) ++mismatches;
    }
    EXPECT_EQ(mismatches, 0) << (is_k ? "K" : "V") << " of " << elements;
  }
}

// Every entry of every layer of a prefill lies within scale * 448 of its (layer, head): the
// weight bound holds, so no prompt saturates the cache. And the bound is not absurdly loose.
TEST(Fp8KvCacheTest, ScalesBoundEveryEntry) {
  auto rng = testing::MakeRng();
  ModelConfig config = SmallConfig();
  config.num_layers = 4;
  auto backend = MakeCpuBackend();
  for (int trial = 0; trial < 3; ++trial) {
    auto model = LlamaModel::Random(config, *backend, rng(), 1024, 0.02f + 0.05f * trial);
    const KvCacheScales scales = ComputeKvCacheScales(*model);
    const std::vector<int32_t> ids = RandomPrompt(rng, 300);
    const testing::PrefillSample sample = testing::PrefillSamplingRows(*model, ids, {});
    const int heads = config.num_kv_heads;
    const int d = config.head_dim;
    const int64_t per_layer = (static_cast<int64_t>(ids.size()) + 15) / 16 * 16 * heads * d;
    for (const bool is_k : {true, false}) {
      const auto* values = reinterpret_cast<const float*>((is_k ? sample.k : sample.v).data());
      const std::vector<float>& scale = is_k ? scales.k : scales.v;
      for (int layer = 0; layer < config.num_layers; ++layer) {
        std::vector<float> amax(heads, 0.0f);
        for (int64_t token = 0; token < static_cast<int64_t>(ids.size()); ++token) {
          for (int index = 0; index < heads * d; ++index) {
            const float value = values[layer * per_layer + token * heads * d + index];
            amax[index / d] = std::max(amax[index / d], std::fabs(value));
          }
        }
        for (int head = 0; head < heads; ++head) {
          const float limit = scale[layer * heads + head] * kE4m3Max;
          EXPECT_LE(amax[head], limit * (1.0f + 1e-5f))
              << (is_k ? "K" : "V") << " layer " << layer << " head " << head;
          EXPECT_GE(amax[head], limit / 1024.0f)
              << (is_k ? "K" : "V") << " layer " << layer << " head " << head << ": bound " << limit
              << " against " << amax[head];
        }
      }
    }
  }
}

TEST(Fp8KvCacheTest, PoolHoldsFourTimesTheF32Entries) {
  const ModelConfig config = SmallConfig();
  EngineOptions options;
  options.kv_memory_bytes = int64_t{1} << 20;
  const int f32_pages = MakeEngine(config, options, 1).engine->Stats().num_pages;
  options.kv_cache_dtype = "fp8";
  const int fp8_pages = MakeEngine(config, options, 1).engine->Stats().num_pages;
  EXPECT_EQ(fp8_pages, 4 * f32_pages);
}

TEST(Fp8KvCacheTest, RefusesUnknownAndUnavailableDtypes) {
  EXPECT_EQ(ParseKvCacheDtype("bf16", DType::kF32).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseKvCacheDtype("fp16", DType::kBF16).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(*ParseKvCacheDtype("auto", DType::kF32), DType::kF32);
  EXPECT_EQ(*ParseKvCacheDtype("bf16", DType::kBF16), DType::kBF16);
  EXPECT_EQ(*ParseKvCacheDtype("fp8", DType::kF32), DType::kF8E4M3);
}

// Teacher-forced text under every policy, prompts prefilled in chunks, with the f32 cache and
// the FP8 one: the forced tokens' log-probabilities stay close, and every page comes back.
TEST(Fp8KvCacheTest, EveryPolicyScoresTextCloseToTheF32Cache) {
  auto rng = testing::MakeRng();
  const ModelConfig config = SmallConfig();
  const uint64_t seed = rng();
  std::vector<std::vector<int32_t>> prompts, forced;
  for (int index = 0; index < 3; ++index) {
    prompts.push_back(RandomPrompt(rng, 60 + static_cast<int>(rng() % 60)));
    forced.push_back(RandomPrompt(rng, 24));
  }
  const auto run = [&](const std::string& policy, const std::string& dtype) {
    EngineOptions options = TightPolicyOptions(policy);
    options.kv_cache_dtype = dtype;
    // Prompts prefill in chunks (H2O scores every prompt row in the prompt's last chunk).
    options.max_num_batched_tokens = policy == "h2o" ? 512 : 48;
    TestEngine t = MakeEngine(config, options, seed);
    std::vector<RequestId> ids;
    for (size_t index = 0; index < prompts.size(); ++index) {
      Request request{prompts[index], {}, ""};
      request.sampling.temperature = 0;
      request.sampling.max_tokens = static_cast<int>(forced[index].size());
      request.sampling.logprobs = -1;
      request.forced_tokens = forced[index];
      ids.push_back(*t.engine->Add(request));
    }
    std::map<RequestId, std::vector<float>> logprobs;
    while (t.engine->HasWork()) {
      for (const RequestOutput& output : t.engine->Step()) {
        for (const SampleResult& s : output.new_logprobs) logprobs[output.id].push_back(s.logprob);
      }
    }
    EXPECT_EQ(t.engine->Stats().num_pages_used, 0) << policy << " " << dtype << ": pages leaked";
    std::vector<float> all;
    for (const RequestId id : ids) all.insert(all.end(), logprobs[id].begin(), logprobs[id].end());
    return all;
  };
  for (const std::string policy :
       {"full", "snapkv", "pyramidkv", "full:0,snapkv:1-2", "streamingllm", "h2o"}) {
    const std::vector<float> reference = run(policy, "auto");
    const std::vector<float> fp8 = run(policy, "fp8");
    ASSERT_EQ(fp8.size(), reference.size()) << policy;
    double worst = 0, total = 0;
    for (size_t index = 0; index < fp8.size(); ++index) {
      const double difference = std::fabs(double(fp8[index]) - reference[index]);
      worst = std::max(worst, difference);
      total += difference;
    }
    std::printf(
        "%s: forced-token logprobs, FP8 cache against f32: mean |difference| %.4f, "
        "worst %.4f\n",
        policy.c_str(), total / fp8.size(), worst);
    // e4m3 keeps 3 mantissa bits (relative error up to 1/16 per element): where every entry is
    // kept, or kept by position (StreamingLLM) or by decode-time attention (H2O), the token
    // log-probabilities of this random model move by hundredths. Where the prefill's window
    // scores select (SnapKV, PyramidKV), a chunked prompt's earlier chunks are read back from the
    // cache, so near-tied scores may select other entries: larger moves, bounded loosely (a
    // broken cache moves them by whole units).
    const bool selects_by_score =
        policy.find("snapkv") != std::string::npos || policy.find("pyramidkv") != std::string::npos;
    EXPECT_LT(total / fp8.size(), selects_by_score ? 0.3 : 0.03) << policy;
    EXPECT_LT(worst, selects_by_score ? 1.5 : 0.2) << policy;
    EXPECT_GT(worst, 0.0) << policy << ": the FP8 cache changed nothing, so it was not used";
  }
}

}  // namespace
}  // namespace sieve
