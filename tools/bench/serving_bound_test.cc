// The serving bound against PERF.md's hand-computed numbers for the headline workload, and the
// directions it must move in (sparser KV, attention counted, more concurrency), the KV pool's
// limit, and its errors.
#include "tools/bench/serving_bound.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "core/fixtures.h"
#include "core/testing.h"
#include "sparsity/kv_policy_json.h"

namespace sieve::bench {
namespace {

BoundConfig Llama3Bound(const std::string& policy) {
  BoundConfig config;
  config.model_config = ProjectSourceDir() + "/configs/llama-3-8b";
  config.kv_policy = policy;
  config.kv_budget = 400;
  config.kv_window = 32;
  config.gemm_tflops = 790;  // PERF.md's ceilings
  config.copy_gbs = 4194;
  return config;
}

std::vector<BoundRequest> Requests(int count, int prompt_len, int output_len) {
  return std::vector<BoundRequest>(count, BoundRequest{prompt_len, output_len});
}

// PERF.md: at 4000/500 and C = 128 the end-to-end bound is ~3,300 output tok/s dense and ~5,200
// with 1/10 of the KV kept (prefill ~76 ms a prompt at 790 TFLOP/s, attention not counted).
TEST(ServingBoundTest, MatchesPerfMdHeadline) {
  const auto dense = ComputeServingBound(Llama3Bound("full"), Requests(256, 4000, 500), 128);
  ASSERT_TRUE(dense.ok()) << dense.status().ToString();
  EXPECT_NEAR(dense->output_tokens_per_s, 3300, 0.05 * 3300);
  EXPECT_NEAR(dense->prefill_s / 256, 0.0707, 0.006);  // s a prompt
  // Every layer keeping 400 of 4000 entries: a tenth of the KV.
  BoundConfig tenth = Llama3Bound("snapkv");
  const auto sparse = ComputeServingBound(tenth, Requests(256, 4000, 500), 128);
  ASSERT_TRUE(sparse.ok());
  EXPECT_NEAR(sparse->output_tokens_per_s, 5200, 0.06 * 5200);
  EXPECT_DOUBLE_EQ(sparse->prefill_s, dense->prefill_s);  // prefill is the same work
  EXPECT_LT(sparse->kv_bytes_read, 0.2 * dense->kv_bytes_read);
}

// A prompt's GEMMs: every layer's q, k, v for each of its n rows, the output projection and MLP
// for n rows in every layer but the last, which computes them for the sampled row only, as the
// LM head does (Llama-3-8B: d 4096, 32 heads and 8 KV heads of 128, MLP 14336, vocab 128256).
TEST(ServingBoundTest, PrefillCountsTheLastLayerPastAttentionForTheSampledRowOnly) {
  auto rng = ::sieve::testing::MakeRng();
  const int prompt = 1 + static_cast<int>(rng() % 8000);
  const auto bound = ComputeServingBound(Llama3Bound("full"), Requests(3, prompt, 10), 3);
  ASSERT_TRUE(bound.ok()) << bound.status().ToString();
  const double qkv = 4096.0 * (32 + 2 * 8) * 128, o = 4096.0 * 4096, mlp = 3 * 4096.0 * 14336,
               lm_head = 128256.0 * 4096;
  const double n = prompt;
  const double per_prompt = 2 * (n * 32 * qkv + (n * 31 + 1) * (o + mlp) + lm_head);
  EXPECT_NEAR(bound->prefill_gemm_flops, 3 * per_prompt, 1e-12 * per_prompt) << "n = " << prompt;
}

TEST(ServingBoundTest, MovesTheRightWay) {
  auto rng = ::sieve::testing::MakeRng();
  const int prompt = 1000 + static_cast<int>(rng() % 3000);
  const int output = 50 + static_cast<int>(rng() % 450);
  const auto requests = Requests(64, prompt, output);
  const auto at = [&](const BoundConfig& config, int concurrency) {
    auto bound = ComputeServingBound(config, requests, concurrency);
    SIEVE_CHECK(bound.ok()) << bound.status().ToString();
    return *bound;
  };
  const BoundConfig dense = Llama3Bound("full");
  const BoundConfig sparse = Llama3Bound("full:0-2,pyramidkv:3-31");
  BoundConfig with_attention = dense;
  with_attention.attention_tflops = 555;
  EXPECT_GT(at(sparse, 32).output_tokens_per_s, at(dense, 32).output_tokens_per_s);
  EXPECT_LT(at(with_attention, 32).output_tokens_per_s, at(dense, 32).output_tokens_per_s);
  // More sequences a step share one read of the weights.
  EXPECT_GT(at(dense, 32).output_tokens_per_s, at(dense, 4).output_tokens_per_s);
  EXPECT_GT(at(dense, 4).output_tokens_per_s, at(dense, 1).output_tokens_per_s);
  // 0: every request in one wave, as concurrency 64 here.
  EXPECT_DOUBLE_EQ(at(dense, 0).decode_s, at(dense, 64).decode_s);
  // Decode reads the weights once a step: one request of `output` tokens reads them `output`
  // times, and its KV grows by one entry a step.
  const auto one = ComputeServingBound(dense, Requests(1, prompt, output), 1);
  ASSERT_TRUE(one.ok());
  const double entry_bytes = 32.0 * 2 * 8 * 128 * 2;  // layers x (K, V) x heads x dim x bf16
  const double kv = entry_bytes * (static_cast<double>(prompt) * output +
                                   static_cast<double>(output) * (output + 1) / 2);
  EXPECT_NEAR(one->kv_bytes_read, kv, 1e-9 * kv);
  EXPECT_NEAR(one->decode_s, (output * one->weight_bytes + kv) / 4194e9, 1e-9);
}

// Tensor parallelism on the 70B shape: each rank does half the prefill FLOPs and reads half the
// split weights and KV, plus the replicated LM head, and the ranks' all-reduces are added.
TEST(ServingBoundTest, TensorParallelRanksShareTheWorkAndAddAllReduces) {
  BoundConfig one = Llama3Bound("full");
  one.model_config = ProjectSourceDir() + "/configs/llama-3-70b";
  one.attention_tflops = 600;
  BoundConfig two = one;
  two.tensor_parallel_size = 2;
  const auto requests = Requests(32, 4000, 500);
  const auto at_one = ComputeServingBound(one, requests, 16);
  const auto at_two = ComputeServingBound(two, requests, 16);
  ASSERT_TRUE(at_one.ok() && at_two.ok()) << at_two.status().ToString();
  const double lm_head = 128256.0 * 8192;
  // GEMM FLOPs: the layers' halve, the LM head's (2 per weight, once a prompt) stays.
  EXPECT_NEAR(at_two->prefill_gemm_flops,
              (at_one->prefill_gemm_flops - 32 * 2 * lm_head) / 2 + 32 * 2 * lm_head,
              1e-9 * at_one->prefill_gemm_flops);
  EXPECT_DOUBLE_EQ(at_two->prefill_attention_flops, at_one->prefill_attention_flops / 2);
  EXPECT_NEAR(at_two->weight_bytes, (at_one->weight_bytes - 2 * lm_head) / 2 + 2 * lm_head,
              1e-9 * at_one->weight_bytes);
  EXPECT_NEAR(at_two->kv_bytes_read, at_one->kv_bytes_read / 2, 1e-9 * at_one->kv_bytes_read);
  EXPECT_EQ(at_one->all_reduce_s, 0);
  // 160 all-reduces a prefill of 4000 rows and a decode step of 16 rows (2 waves x 500 steps),
  // each 8 us + 2 * 1/2 * rows x 8192 x 2 bytes at 370 GB/s.
  const auto one_all_reduce = [](double rows) { return 8e-6 + rows * 8192 * 2 / 370e9; };
  EXPECT_NEAR(at_two->all_reduce_s,
              160 * (32 * one_all_reduce(4000) + 2 * 500 * one_all_reduce(16)), 1e-9);
  EXPECT_GT(at_two->output_tokens_per_s, 1.5 * at_one->output_tokens_per_s);
  // Four ranks of 8 KV heads: 2 each; sixteen: a KV head replicated on 2 ranks, each with the
  // whole group's 8 query heads (the KV the same as at 8 ranks).
  BoundConfig sixteen = one;
  sixteen.tensor_parallel_size = 16;
  BoundConfig eight = one;
  eight.tensor_parallel_size = 8;
  const auto at_sixteen = ComputeServingBound(sixteen, requests, 16);
  const auto at_eight = ComputeServingBound(eight, requests, 16);
  ASSERT_TRUE(at_sixteen.ok() && at_eight.ok());
  EXPECT_DOUBLE_EQ(at_sixteen->kv_bytes_read, at_eight->kv_bytes_read);
  EXPECT_DOUBLE_EQ(at_sixteen->prefill_attention_flops, at_eight->prefill_attention_flops);
  BoundConfig three = one;
  three.tensor_parallel_size = 3;
  const Status bad = ValidateBoundConfig(three);
  EXPECT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("--bound-tensor-parallel-size"), std::string::npos) << bad.message();
}

// A pool that holds fewer sequences than the concurrency: the wave's steps are at least its
// page-steps (each sequence's pages of every layer, summed over its decode steps) over the pool's
// pages, and each added step reads the weights once more. Dense KV of long prompts hits it at
// high concurrency (PERF.md: past C ~ 200 on an H200), sparse KV of the same prompts does not.
TEST(ServingBoundTest, KvPoolLimitsHowManyDecodeAtOnce) {
  auto rng = ::sieve::testing::MakeRng();
  const int prompt = 2000 + static_cast<int>(rng() % 3000);
  const int output = 100 + static_cast<int>(rng() % 400);
  const int page_size = 16 << (rng() % 2);
  const int count = 64;
  const auto requests = Requests(count, prompt, output);
  BoundConfig dense = Llama3Bound("full");
  dense.page_size = page_size;
  // A sequence's pages at decode step t: 32 layers of prompt + t + 1 entries.
  int64_t page_steps = 0;
  for (int t = 0; t < output; ++t)
    page_steps += 32 * ((prompt + t + 1 + page_size - 1) / page_size);
  page_steps *= count;
  const int64_t last_pages = 32 * ((prompt + output + page_size - 1) / page_size);
  // Room for half the sequences at their longest (the sparse layout's take under 45% as many
  // pages).
  dense.kv_pool_pages = last_pages * count / 2;
  const auto unlimited_config = [&] {
    BoundConfig config = dense;
    config.kv_pool_pages = 0;
    return config;
  }();
  const auto limited = ComputeServingBound(dense, requests, count);
  const auto unlimited = ComputeServingBound(unlimited_config, requests, count);
  ASSERT_TRUE(limited.ok() && unlimited.ok()) << limited.status().ToString();
  const int64_t steps = (page_steps + dense.kv_pool_pages - 1) / dense.kv_pool_pages;
  ASSERT_GT(steps, output);
  EXPECT_EQ(limited->decode_steps, steps);
  EXPECT_EQ(limited->pool_limited_steps, steps - output);
  EXPECT_EQ(unlimited->decode_steps, output);
  EXPECT_EQ(unlimited->pool_limited_steps, 0);
  EXPECT_DOUBLE_EQ(limited->kv_bytes_read, unlimited->kv_bytes_read);  // the same entries read
  EXPECT_NEAR(limited->decode_s - unlimited->decode_s,
              (steps - output) * unlimited->weight_bytes / (dense.copy_gbs * 1e9), 1e-9);
  EXPECT_LT(limited->output_tokens_per_s, unlimited->output_tokens_per_s);
  // A pool that holds every sequence at its longest changes nothing.
  BoundConfig roomy = dense;
  roomy.kv_pool_pages = last_pages * count;
  const auto roomy_bound = ComputeServingBound(roomy, requests, count);
  ASSERT_TRUE(roomy_bound.ok());
  EXPECT_EQ(roomy_bound->decode_steps, output);
  EXPECT_DOUBLE_EQ(roomy_bound->decode_s, unlimited->decode_s);
  // The same pool holds the sparse layout's sequences (3 dense layers, 29 of about 400 entries).
  BoundConfig sparse = dense;
  sparse.kv_policy = "full:0-2,pyramidkv:3-31";
  const auto sparse_bound = ComputeServingBound(sparse, requests, count);
  ASSERT_TRUE(sparse_bound.ok());
  EXPECT_EQ(sparse_bound->pool_limited_steps, 0);
  EXPECT_EQ(sparse_bound->decode_steps, output);
}

// The roofline of decode: a step's GEMMs do 2 FLOPs a weight a row, so past GEMM rate / copy rate
// rows (790e12 / 4194e9 = 188 here) their FLOPs outlast their weight bytes. Below it the roofline
// is the bound; above it each step adds the difference; as requests finish, fewer rows remain.
TEST(ServingBoundTest, RooflineCountsDecodeGemmFlopsPastTheRidge) {
  auto rng = ::sieve::testing::MakeRng();
  const int prompt = 1000 + static_cast<int>(rng() % 3000);
  const BoundConfig config = Llama3Bound("full:0-2,pyramidkv:3-31");
  const double ridge_rows = config.gemm_tflops * 1e12 / (config.copy_gbs * 1e9);
  // Every request of a wave decoding every step, below and above the ridge.
  for (const int rows : {128, 256}) {
    const int output = 50 + static_cast<int>(rng() % 450);
    const auto bound = ComputeServingBound(config, Requests(rows, prompt, output), rows);
    ASSERT_TRUE(bound.ok()) << bound.status().ToString();
    const double weights = bound->weight_bytes / 2;  // bf16
    const double bytes_s = bound->weight_bytes / (config.copy_gbs * 1e9);
    const double flops_s = 2.0 * rows * weights / (config.gemm_tflops * 1e12);
    if (rows < ridge_rows) {
      EXPECT_LT(flops_s, bytes_s);
      EXPECT_EQ(bound->compute_bound_steps, 0);
      EXPECT_DOUBLE_EQ(bound->decode_roofline_s, bound->decode_s);
      EXPECT_DOUBLE_EQ(bound->roofline_output_tokens_per_s, bound->output_tokens_per_s);
    } else {
      EXPECT_GT(flops_s, bytes_s);
      EXPECT_EQ(bound->compute_bound_steps, output);
      EXPECT_NEAR(bound->decode_roofline_s - bound->decode_s, output * (flops_s - bytes_s), 1e-9);
      EXPECT_LT(bound->roofline_output_tokens_per_s, bound->output_tokens_per_s);
    }
  }
  // Output lengths drawn apart: step t runs the requests with more than t tokens to come, and
  // only the steps with more rows than the ridge add time.
  std::vector<BoundRequest> requests;
  for (int i = 0; i < 256; ++i) requests.push_back({prompt, 1 + static_cast<int>(rng() % 400)});
  const auto mixed = ComputeServingBound(config, requests, 256);
  ASSERT_TRUE(mixed.ok());
  const double weights = mixed->weight_bytes / 2;
  const double bytes_s = mixed->weight_bytes / (config.copy_gbs * 1e9);
  double added_s = 0;
  int64_t compute_bound = 0;
  for (int t = 0; t < 400; ++t) {
    const auto rows = std::count_if(requests.begin(), requests.end(),
                                    [&](const BoundRequest& r) { return r.output_len > t; });
    const double flops_s = 2.0 * static_cast<double>(rows) * weights / (config.gemm_tflops * 1e12);
    if (flops_s > bytes_s) {
      added_s += flops_s - bytes_s;
      ++compute_bound;
    }
  }
  ASSERT_GT(compute_bound, 0);
  EXPECT_LT(compute_bound, mixed->decode_steps);
  EXPECT_EQ(mixed->compute_bound_steps, compute_bound);
  EXPECT_NEAR(mixed->decode_roofline_s - mixed->decode_s, added_s, 1e-9);
}

// sieve bench takes the pool from the server's GET /server_info unless a flag gave one.
TEST(ServingBoundTest, KvPoolComesFromTheServerUnlessGiven) {
  auto rng = ::sieve::testing::MakeRng();
  const int64_t pages = 1 + static_cast<int64_t>(rng() % 1000000);
  const nlohmann::json info = {{"server_info", {{"kv_cache_pages", pages}, {"page_size", 32}}}};
  BoundConfig from_server = Llama3Bound("full");
  EXPECT_EQ(from_server.kv_pool_pages, BoundConfig::kPoolFromServer);
  EXPECT_NE(ResolveFromServer(info, from_server).find("pages of 32 entries (the server's"),
            std::string::npos);
  EXPECT_EQ(from_server.kv_pool_pages, pages);
  EXPECT_EQ(from_server.page_size, 32);
  BoundConfig given = Llama3Bound("full");
  given.kv_pool_pages = pages + 1;
  ResolveFromServer(info, given);
  EXPECT_EQ(given.kv_pool_pages, pages + 1);
  EXPECT_EQ(given.page_size, 16);
  // A server that does not say (another engine), or says nonsense: not limited, and the log says.
  for (const nlohmann::json& silent :
       {nlohmann::json::object(), nlohmann::json{{"server_info", "not json"}},
        nlohmann::json{{"server_info", {{"kv_cache_pages", -5}, {"page_size", 16}}}},
        nlohmann::json{{"server_info", {{"kv_cache_pages", "many"}, {"page_size", 16}}}},
        nlohmann::json{{"server_info", {{"kv_cache_pages", pages}}}}}) {
    BoundConfig config = Llama3Bound("full");
    EXPECT_NE(ResolveFromServer(silent, config).find("does not give its KV pool"),
              std::string::npos)
        << silent.dump();
    EXPECT_EQ(config.kv_pool_pages, 0) << silent.dump();
    EXPECT_TRUE(ComputeServingBound(config, Requests(4, 100, 10), 4).ok());
  }
  BoundConfig negative = Llama3Bound("full");
  negative.kv_pool_pages = -2;
  EXPECT_FALSE(ValidateBoundConfig(negative).ok());
}

// With no --bound-kv-policy the bound takes the server's policy and knobs; with one that is not
// the server's, the log warns.
TEST(ServingBoundTest, KvPolicyComesFromTheServerUnlessGiven) {
  auto rng = ::sieve::testing::MakeRng();
  KvPolicyOptions served;
  served.budget = 200 + static_cast<int>(rng() % 1000);
  served.window = 8 + static_cast<int>(rng() % 56);
  served.beta = 2 + static_cast<int>(rng() % 30);
  const std::string spec = "full:0-2,pyramidkv:3-31";
  const nlohmann::json info = {
      {"server_info", {{"kv_policy", spec}, {"kv_policy_options", KvPolicyOptionsToJson(served)}}}};
  BoundConfig taken = Llama3Bound("");
  taken.kv_budget = 0;
  taken.kv_window = 0;
  const std::string log = ResolveFromServer(info, taken);
  EXPECT_NE(log.find("(the server's GET /server_info)"), std::string::npos) << log;
  EXPECT_EQ(log.find("warning"), std::string::npos) << log;
  EXPECT_EQ(taken.kv_policy, spec);
  const auto bound = ComputeServingBound(taken, Requests(8, 4000, 50), 8);
  ASSERT_TRUE(bound.ok()) << bound.status().ToString();
  const auto expected = KvPolicy::Parse(spec, 32, served);
  ASSERT_TRUE(expected.ok());
  EXPECT_EQ(bound->kv_policy, expected->ToString());
  // The same as giving the server's policy by hand.
  BoundConfig by_hand = Llama3Bound(spec);
  by_hand.kv_policy_options = served;
  by_hand.kv_budget = served.budget;
  by_hand.kv_window = served.window;
  const auto by_hand_bound = ComputeServingBound(by_hand, Requests(8, 4000, 50), 8);
  ASSERT_TRUE(by_hand_bound.ok());
  EXPECT_DOUBLE_EQ(by_hand_bound->kv_bytes_read, bound->kv_bytes_read);
  EXPECT_EQ(ResolveFromServer(info, by_hand).find("warning"), std::string::npos);
  // A bound of another policy, or of the server's with another budget, says so.
  BoundConfig dense = Llama3Bound("full");
  EXPECT_NE(ResolveFromServer(info, dense).find("warning: the bound's KV policy (full:0-31)"),
            std::string::npos);
  BoundConfig other_budget = by_hand;
  other_budget.kv_budget = served.budget + 1;
  EXPECT_NE(ResolveFromServer(info, other_budget).find("is not the server's"), std::string::npos);
  // Another tensor-parallel size than the server's.
  nlohmann::json two_ranks = info;
  two_ranks["server_info"]["tensor_parallel_size"] = 2;
  BoundConfig one_rank = by_hand;
  EXPECT_NE(ResolveFromServer(two_ranks, one_rank)
                .find("tensor-parallel size (1) is not the "
                      "server's (2)"),
            std::string::npos);
  one_rank.tensor_parallel_size = 2;
  EXPECT_EQ(ResolveFromServer(two_ranks, one_rank).find("warning"), std::string::npos);
  // A server policy that does not fit the bound's model (another model served).
  const nlohmann::json small = {
      {"server_info",
       {{"kv_policy", "full:0-3"}, {"kv_policy_options", KvPolicyOptionsToJson(served)}}}};
  BoundConfig mismatch = Llama3Bound("full");
  EXPECT_NE(ResolveFromServer(small, mismatch).find("does not fit"), std::string::npos);
  // No policy from the server (another engine, or unreadable knobs): full, and the log says.
  for (const nlohmann::json& silent :
       {nlohmann::json::object(), nlohmann::json{{"server_info", {{"kv_policy", spec}}}},
        nlohmann::json{
            {"server_info", {{"kv_policy", spec}, {"kv_policy_options", {{"budget", "big"}}}}}}}) {
    BoundConfig config = Llama3Bound("");
    EXPECT_NE(ResolveFromServer(silent, config).find("does not give its KV policy"),
              std::string::npos)
        << silent.dump();
    EXPECT_EQ(config.kv_policy, "full");
  }
}

// FP8 weights (--quantization fp8): a decode step reads the layers' linear weights as e4m3, 1 byte
// a weight plus an f32 scale an output channel, and the LM head as bf16 (Llama-3-8B: 218,103,808
// weights and 43,008 output channels a layer); prefill runs the layers' GEMMs at the FP8 rate and
// the LM head's at the bf16 one.
TEST(ServingBoundTest, Fp8WeightsHalveTheLayersBytesAndRunPrefillAtTheFp8Rate) {
  auto rng = ::sieve::testing::MakeRng();
  const int prompt = 1000 + static_cast<int>(rng() % 4000);
  const int output = 50 + static_cast<int>(rng() % 450);
  const int count = 8 + static_cast<int>(rng() % 56);
  const auto requests = Requests(count, prompt, output);
  BoundConfig bf16 = Llama3Bound("full");
  bf16.attention_tflops = 555;
  BoundConfig fp8 = bf16;
  fp8.quantization = "fp8";
  fp8.fp8_gemm_tflops = 1.2 * bf16.gemm_tflops + static_cast<double>(rng() % 700);
  const auto dense = ComputeServingBound(bf16, requests, count);
  const auto quantized = ComputeServingBound(fp8, requests, count);
  ASSERT_TRUE(dense.ok() && quantized.ok()) << quantized.status().ToString();
  EXPECT_EQ(dense->quantization, "none");
  EXPECT_EQ(quantized->quantization, "fp8");
  const double layer_weights = 218103808, channels = 43008, lm_head = 128256.0 * 4096;
  EXPECT_DOUBLE_EQ(dense->weight_bytes, 2 * (32 * layer_weights + lm_head));
  EXPECT_DOUBLE_EQ(quantized->weight_bytes, 32 * (layer_weights + 4 * channels) + 2 * lm_head);
  EXPECT_LT(quantized->weight_bytes, 0.54 * dense->weight_bytes);
  // The same KV and steps: decode is shorter by the weight bytes no longer read.
  EXPECT_DOUBLE_EQ(quantized->kv_bytes_read, dense->kv_bytes_read);
  EXPECT_EQ(quantized->decode_steps, dense->decode_steps);
  EXPECT_NEAR(dense->decode_s - quantized->decode_s,
              output * (dense->weight_bytes - quantized->weight_bytes) / (bf16.copy_gbs * 1e9),
              1e-9);
  // The same FLOPs, the layers' at the FP8 rate; attention unchanged.
  EXPECT_DOUBLE_EQ(quantized->prefill_gemm_flops, dense->prefill_gemm_flops);
  EXPECT_EQ(dense->prefill_fp8_gemm_flops, 0);
  const double lm_head_flops = count * 2 * lm_head;
  EXPECT_NEAR(quantized->prefill_fp8_gemm_flops, dense->prefill_gemm_flops - lm_head_flops,
              1e-12 * dense->prefill_gemm_flops);
  const double attention_s = dense->prefill_attention_flops / 555e12;
  EXPECT_NEAR(dense->prefill_s, dense->prefill_gemm_flops / 790e12 + attention_s, 1e-9);
  EXPECT_NEAR(quantized->prefill_s,
              quantized->prefill_fp8_gemm_flops / (fp8.fp8_gemm_tflops * 1e12) +
                  lm_head_flops / 790e12 + attention_s,
              1e-9);
  EXPECT_GT(quantized->output_tokens_per_s, dense->output_tokens_per_s);
  // FP8 weights need the FP8 rate.
  BoundConfig no_rate = fp8;
  no_rate.fp8_gemm_tflops = 0;
  const auto refused = ComputeServingBound(no_rate, requests, count);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("--bound-fp8-gemm-tflops"), std::string::npos);
  BoundConfig odd = fp8;
  odd.quantization = "int4";
  EXPECT_FALSE(ValidateBoundConfig(odd).ok());
}

// The roofline with FP8 weights: a step's row costs the layers' FLOPs at the FP8 rate and the LM
// head's at the bf16 one, against the step's (FP8) weight bytes at the copy rate.
TEST(ServingBoundTest, Fp8RooflineTakesTheLayersAtTheFp8Rate) {
  BoundConfig fp8 = Llama3Bound("full:0-2,pyramidkv:3-31");
  fp8.quantization = "fp8";
  fp8.fp8_gemm_tflops = 1300;
  const int rows = 256, output = 100;
  const auto bound = ComputeServingBound(fp8, Requests(rows, 2000, output), rows);
  ASSERT_TRUE(bound.ok()) << bound.status().ToString();
  const double layer_weights = 218103808, lm_head = 128256.0 * 4096;
  const double flops_s = rows * (2 * 32 * layer_weights / 1300e12 + 2 * lm_head / 790e12);
  const double bytes_s = bound->weight_bytes / 4194e9;
  ASSERT_GT(flops_s, bytes_s);
  EXPECT_EQ(bound->compute_bound_steps, output);
  EXPECT_NEAR(bound->decode_roofline_s - bound->decode_s, output * (flops_s - bytes_s), 1e-9);
}

// An FP8 KV cache (--kv-cache-dtype fp8): 1 byte a K or V element, so a step reads half the KV
// bytes, and the same memory holds twice the pages: a pool that limits bf16 KV decodes twice the
// sequences in FP8 in the same steps.
TEST(ServingBoundTest, Fp8KvHalvesKvBytesAndTheSameMemoryHoldsTwiceTheSequences) {
  auto rng = ::sieve::testing::MakeRng();
  const int prompt = 3000 + static_cast<int>(rng() % 2000);
  const int output = 100 + static_cast<int>(rng() % 400);
  const int count = 32;
  BoundConfig bf16 = Llama3Bound("full");
  bf16.kv_pool_pages = 0;
  BoundConfig fp8 = bf16;
  fp8.kv_cache_dtype = "fp8";
  const auto requests = Requests(count, prompt, output);
  const auto wide = ComputeServingBound(bf16, requests, count);
  const auto narrow = ComputeServingBound(fp8, requests, count);
  ASSERT_TRUE(wide.ok() && narrow.ok()) << narrow.status().ToString();
  EXPECT_EQ(wide->kv_cache_dtype, "bf16");
  EXPECT_EQ(narrow->kv_cache_dtype, "fp8");
  EXPECT_DOUBLE_EQ(narrow->kv_bytes_read, wide->kv_bytes_read / 2);
  EXPECT_DOUBLE_EQ(narrow->weight_bytes, wide->weight_bytes);
  EXPECT_NEAR(wide->decode_s - narrow->decode_s, wide->kv_bytes_read / 2 / 4194e9, 1e-9);
  // "auto" is the activation dtype, bf16.
  BoundConfig automatic = bf16;
  automatic.kv_cache_dtype = "auto";
  EXPECT_DOUBLE_EQ(ComputeServingBound(automatic, requests, count)->kv_bytes_read,
                   wide->kv_bytes_read);
  // A pool whose memory holds half the bf16 sequences at their longest (in pages of bf16 entries)
  // holds all of them in FP8 pages, and twice the sequences in the steps bf16 takes for half.
  const int64_t last_pages = 32 * ((prompt + output + 15) / 16);
  BoundConfig bf16_pool = bf16;
  bf16_pool.kv_pool_pages = last_pages * count / 2;
  BoundConfig fp8_pool = fp8;
  fp8_pool.kv_pool_pages = 2 * bf16_pool.kv_pool_pages;  // the same bytes
  const auto limited = ComputeServingBound(bf16_pool, requests, count);
  const auto roomy = ComputeServingBound(fp8_pool, requests, count);
  ASSERT_TRUE(limited.ok() && roomy.ok());
  EXPECT_GT(limited->pool_limited_steps, 0);
  EXPECT_EQ(roomy->pool_limited_steps, 0);
  EXPECT_EQ(roomy->decode_steps, output);
  const auto doubled =
      ComputeServingBound(fp8_pool, Requests(2 * count, prompt, output), 2 * count);
  ASSERT_TRUE(doubled.ok());
  EXPECT_EQ(doubled->decode_steps, limited->decode_steps);
  EXPECT_EQ(doubled->pool_limited_steps, limited->pool_limited_steps);
}

// The weights' and the KV cache's dtypes come from the server's GET /server_info unless given:
// its "quantization" and "kv_cache_dtype" fields, else (the KV) its pool's bytes an entry; a
// flag that is not the server's gets a warning.
TEST(ServingBoundTest, PrecisionComesFromTheServerUnlessGiven) {
  auto rng = ::sieve::testing::MakeRng();
  const int64_t pages = 1000 + static_cast<int64_t>(rng() % 1000000);
  // A page: 16 entries of one layer, K and V of 8 heads of 128.
  const double elements = static_cast<double>(pages) * 16 * 2 * 8 * 128;
  const auto server = [&](double bytes_per_element, const nlohmann::json& fields) {
    nlohmann::json info = {{"kv_cache_pages", pages},
                           {"page_size", 16},
                           {"kv_cache_bytes", static_cast<int64_t>(elements * bytes_per_element)}};
    info.update(fields);
    return nlohmann::json{{"server_info", info}};
  };
  const auto resolve = [](const nlohmann::json& info, BoundConfig& config) {
    return ResolveFromServer(info, config);
  };
  // Said by the server.
  BoundConfig said = Llama3Bound("full");
  said.fp8_gemm_tflops = 1000;
  std::string log =
      resolve(server(1.00002, {{"quantization", "fp8"}, {"kv_cache_dtype", "fp8"}}), said);
  EXPECT_EQ(said.quantization, "fp8");
  EXPECT_EQ(said.kv_cache_dtype, "fp8");
  EXPECT_EQ(log.find("warning"), std::string::npos) << log;
  EXPECT_NE(log.find("weights fp8 (the server's GET /server_info)"), std::string::npos) << log;
  // The KV dtype from the pool's bytes an entry (FP8 with its scales, bf16); the weights not said.
  for (const auto& [bytes, dtype] : {std::pair{1.00002, "fp8"}, std::pair{2.0, "bf16"}}) {
    BoundConfig config = Llama3Bound("full");
    log = resolve(server(bytes, nlohmann::json::object()), config);
    EXPECT_EQ(config.kv_cache_dtype, dtype) << log;
    EXPECT_NE(log.find("bytes an entry"), std::string::npos) << log;
    EXPECT_EQ(config.quantization, "none");
    EXPECT_NE(log.find("does not give its weights' quantization"), std::string::npos) << log;
  }
  // Nothing said, and no pool: bf16 both, and the log says.
  BoundConfig silent = Llama3Bound("full");
  log = resolve(nlohmann::json::object(), silent);
  EXPECT_EQ(silent.quantization, "none");
  EXPECT_EQ(silent.kv_cache_dtype, "bf16");
  EXPECT_NE(log.find("does not give its KV cache dtype"), std::string::npos) << log;
  // Given: kept; a warning where the server says otherwise ("auto" is bf16).
  BoundConfig given = Llama3Bound("full");
  given.quantization = "fp8";
  given.fp8_gemm_tflops = 1000;
  given.kv_cache_dtype = "auto";
  log = resolve(server(2.0, {{"quantization", "none"}}), given);
  EXPECT_EQ(given.quantization, "fp8");
  EXPECT_EQ(given.kv_cache_dtype, "auto");
  EXPECT_NE(log.find("warning: the bound's weights (fp8) are not the server's (none)"),
            std::string::npos)
      << log;
  EXPECT_EQ(log.find("KV cache dtype (bf16) is not"), std::string::npos) << log;
  BoundConfig wrong_kv = Llama3Bound("full");
  wrong_kv.kv_cache_dtype = "bf16";
  log = resolve(server(1.00002, nlohmann::json::object()), wrong_kv);
  EXPECT_NE(log.find("warning: the bound's KV cache dtype (bf16) is not the server's (fp8"),
            std::string::npos)
      << log;
}

TEST(ServingBoundTest, BadConfigsAreClearErrors) {
  BoundConfig missing = Llama3Bound("full");
  missing.model_config = "/nonexistent/model";
  EXPECT_FALSE(ValidateBoundConfig(missing).ok());
  BoundConfig policy = Llama3Bound("full:0-2");  // layers 3-31 uncovered
  const Status bad_policy = ValidateBoundConfig(policy);
  EXPECT_FALSE(bad_policy.ok());
  EXPECT_NE(bad_policy.message().find("--bound-kv-policy"), std::string::npos)
      << bad_policy.message();
  BoundConfig rates = Llama3Bound("full");
  rates.copy_gbs = 0;
  EXPECT_FALSE(ValidateBoundConfig(rates).ok());
  EXPECT_TRUE(ValidateBoundConfig(BoundConfig{}).ok());  // no bound asked for
  const auto negative =
      ComputeServingBound(Llama3Bound("full"), {{4000, 500}, {4000, -1}}, /*concurrency=*/2);
  ASSERT_FALSE(negative.ok());
  EXPECT_NE(negative.status().message().find("negative"), std::string::npos);
}

}  // namespace
}  // namespace sieve::bench
