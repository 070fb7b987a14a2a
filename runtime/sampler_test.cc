#include "runtime/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <numeric>

#include "core/testing.h"

namespace sieve {
namespace {

std::vector<float> RandomLogits(std::mt19937_64& rng, int vocab) {
  std::vector<float> logits(vocab);
  testing::FillRandom(logits.data(), logits.size(), rng, 2.0f);
  return logits;
}

TEST(SamplerTest, GreedyPicksTheArgmaxLowestIdOnTies) {
  auto rng = testing::MakeRng();
  auto logits = RandomLogits(rng, 100);
  const int best =
      static_cast<int>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  SamplingParams params;
  params.temperature = 0;
  EXPECT_EQ(Sampler::Sample(logits, params, {}, 0, rng).token, best);
  std::vector<float> tied(10, 1.0f);
  EXPECT_EQ(Sampler::Sample(tied, params, {}, 0, rng).token, 0);
}

TEST(SamplerTest, TopKAndTopPAndMinPRestrictTheSupport) {
  auto rng = testing::MakeRng();
  const auto base = RandomLogits(rng, 50);
  std::vector<int> order(50);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return base[a] > base[b]; });
  SamplingParams params;
  params.top_k = 3;
  for (int trial = 0; trial < 300; ++trial) {
    auto logits = base;
    const int token = Sampler::Sample(logits, params, {}, 0, rng).token;
    EXPECT_TRUE(token == order[0] || token == order[1] || token == order[2]);
  }
  params.top_k = 0;
  params.min_p = 1.0f;  // only tokens as likely as the best survive
  for (int trial = 0; trial < 50; ++trial) {
    auto logits = base;
    EXPECT_EQ(Sampler::Sample(logits, params, {}, 0, rng).token, order[0]);
  }
  params.min_p = 0;
  params.top_p = 1e-6f;  // the nucleus is the top token alone
  auto logits = base;
  EXPECT_EQ(Sampler::Sample(logits, params, {}, 0, rng).token, order[0]);
}

TEST(SamplerTest, SamplingFollowsTheSoftmax) {
  auto rng = testing::MakeRng();
  const std::vector<float> base = {0.0f, 1.0f, 2.0f};
  std::map<int, int> counts;
  SamplingParams params;
  const int trials = 30000;
  for (int trial = 0; trial < trials; ++trial) {
    auto logits = base;
    ++counts[Sampler::Sample(logits, params, {}, 0, rng).token];
  }
  const double z = 1 + std::exp(1.0) + std::exp(2.0);
  for (int token = 0; token < 3; ++token) {
    EXPECT_NEAR(counts[token] / double(trials), std::exp(double(token)) / z, 0.015);
  }
}

TEST(SamplerTest, PenaltiesAndLogprobs) {
  auto rng = testing::MakeRng();
  std::vector<float> logits = {2.0f, -1.0f, 1.9f, 0.5f};
  SamplingParams params;
  params.temperature = 0;
  params.repetition_penalty = 2.0f;  // token 0 seen: 2.0 -> 1.0, so token 2 wins
  params.logprobs = 2;
  const std::vector<int32_t> history = {0, 1};
  const SampleResult result = Sampler::Sample(logits, params, history, 2, rng);
  EXPECT_EQ(result.token, 2);
  // Logprobs are of the raw distribution.
  const double z = std::exp(2.0) + std::exp(-1.0) + std::exp(1.9) + std::exp(0.5);
  EXPECT_NEAR(result.logprob, 1.9 - std::log(z), 1e-5);
  ASSERT_EQ(result.top_logprobs.size(), 2u);
  EXPECT_EQ(result.top_logprobs[0].token, 0);
  EXPECT_EQ(result.top_logprobs[1].token, 2);
  std::vector<float> again = {1.0f, 1.2f};
  SamplingParams presence;
  presence.temperature = 0;
  presence.presence_penalty = 0.5f;  // token 1 was generated: 1.2 - 0.5 < 1.0
  EXPECT_EQ(Sampler::Sample(again, presence, std::vector<int32_t>{1}, 0, rng).token, 0);
}

TEST(SamplerTest, SameSeedSameTokens) {
  auto rng = testing::MakeRng();
  const auto base = RandomLogits(rng, 1000);
  SamplingParams params;
  std::mt19937_64 a(42), b(42);
  for (int trial = 0; trial < 100; ++trial) {
    auto la = base, lb = base;
    EXPECT_EQ(Sampler::Sample(la, params, {}, 0, a).token,
              Sampler::Sample(lb, params, {}, 0, b).token);
  }
}

}  // namespace
}  // namespace sieve
