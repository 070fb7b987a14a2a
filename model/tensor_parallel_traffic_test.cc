// The decode-step traffic and bound of one tensor-parallel rank (model/tensor_parallel.h) against
// sums written out by hand from the model's shapes.
#include <gtest/gtest.h>

#include "core/fixtures.h"
#include "model/model_config.h"
#include "model/tensor_parallel.h"

namespace sieve {
namespace {

ModelConfig Llama70bShape() {
  auto config = LoadModelConfig(ProjectSourceDir() + "/configs/llama-3-70b");
  SIEVE_CHECK(config.ok()) << config.status().ToString();
  return *config;
}

TEST(DecodeStepTrafficTest, OneRankReadsEveryWeightButTheEmbeddingTable) {
  const ModelConfig config = Llama70bShape();
  auto traffic = ComputeDecodeStepTraffic(config, 1, 64, 4097, DType::kBF16);
  ASSERT_TRUE(traffic.ok()) << traffic.status().ToString();
  const double d = config.hidden_size;
  const double embedding = static_cast<double>(config.vocab_size) * d;
  EXPECT_DOUBLE_EQ(traffic->weight_bytes,
                   2 * (static_cast<double>(config.NumParameters()) - embedding + 64 * d));
  EXPECT_DOUBLE_EQ(traffic->lm_head_bytes, 2 * embedding);
  EXPECT_DOUBLE_EQ(traffic->held_bytes, 2 * static_cast<double>(config.NumParameters()));
  EXPECT_DOUBLE_EQ(traffic->kv_bytes,
                   64.0 * 4097 * static_cast<double>(config.KvBytesPerToken(DType::kBF16)));
  EXPECT_EQ(traffic->all_reduces, 0);
  EXPECT_EQ(traffic->all_reduce_bytes, 0);
  // 70.6B parameters, of which 1.05B the embedding table.
  EXPECT_NEAR(traffic->weight_bytes / 1e9, 2 * 69.5, 0.2);
}

TEST(DecodeStepTrafficTest, RanksShareTheSplitWeightsAndKvAndAllReduceTwiceALayer) {
  const ModelConfig config = Llama70bShape();
  const double d = config.hidden_size;
  const double lm_head = 2.0 * config.vocab_size * d;
  const double batch_rows = 2.0 * 64 * d;
  const double replicated_norms = 2.0 * (2 * d * config.num_layers + d);
  auto one = ComputeDecodeStepTraffic(config, 1, 64, 1000, DType::kBF16);
  ASSERT_TRUE(one.ok());
  const double split_one = one->weight_bytes - lm_head - batch_rows - replicated_norms;
  for (const int size : {2, 4, 8}) {
    SCOPED_TRACE(size);
    auto rank = ComputeDecodeStepTraffic(config, size, 64, 1000, DType::kBF16);
    ASSERT_TRUE(rank.ok());
    EXPECT_DOUBLE_EQ(rank->weight_bytes - lm_head - batch_rows - replicated_norms,
                     split_one / size);
    EXPECT_DOUBLE_EQ(rank->kv_bytes, one->kv_bytes / size);
    EXPECT_EQ(rank->all_reduces, 2 * config.num_layers);
    EXPECT_DOUBLE_EQ(rank->all_reduce_bytes, 64 * d * 2);
    EXPECT_EQ(rank->logits_gather_bytes, 0);
    auto vocab_parallel =
        ComputeDecodeStepTraffic(config, size, 64, 1000, DType::kBF16, LmHeadSplit::kVocabParallel);
    ASSERT_TRUE(vocab_parallel.ok());
    EXPECT_DOUBLE_EQ(vocab_parallel->weight_bytes, rank->weight_bytes - lm_head + lm_head / size);
    EXPECT_DOUBLE_EQ(vocab_parallel->logits_gather_bytes, 64.0 * config.vocab_size * 4);
  }
}

TEST(DecodeStepTrafficTest, ReplicatedKvHeadsKeepOneHeadAndItsWholeGroupPerRank) {
  ModelConfig config = Llama70bShape();
  config.num_kv_heads = 2;  // 64 heads over 2 KV heads: groups of 32, 4 ranks on each KV head
  auto rank = ComputeDecodeStepTraffic(config, 8, 1, 100, DType::kBF16);
  ASSERT_TRUE(rank.ok());
  const double d = config.hidden_size;
  const double hd = config.head_dim;
  const double per_layer = (32 + 2) * hd * d      // q of the whole group, k and v of one head
                           + d * 8 * hd           // o over its own 8 output heads
                           + 3 * (28672 / 8) * d  // its MLP units
                           + 2 * d;               // the norms
  EXPECT_DOUBLE_EQ(rank->weight_bytes,
                   2 * (config.num_layers * per_layer + d + d + config.vocab_size * d));
  EXPECT_DOUBLE_EQ(rank->kv_bytes, 2.0 * config.num_layers * 100 * hd * 2);
}

TEST(DecodeStepTrafficTest, BadShapesAreErrors) {
  const ModelConfig config = Llama70bShape();
  EXPECT_FALSE(ComputeDecodeStepTraffic(config, 3, 64, 100, DType::kBF16).ok());
  EXPECT_FALSE(ComputeDecodeStepTraffic(config, 0, 64, 100, DType::kBF16).ok());
  EXPECT_FALSE(ComputeDecodeStepTraffic(config, 2, 0, 100, DType::kBF16).ok());
  EXPECT_FALSE(ComputeDecodeStepTraffic(config, 2, 64, 0, DType::kBF16).ok());
}

TEST(DecodeStepBoundTest, MemoryAtTheCopyRatePlusRingCollectives) {
  DecodeStepTraffic traffic;
  traffic.size = 4;
  traffic.weight_bytes = 30e9;
  traffic.kv_bytes = 10e9;
  traffic.all_reduces = 160;
  traffic.all_reduce_bytes = 1e6;
  DecodeStepRates rates{4e12, 400e9, 10e-6};
  DecodeStepBound bound = ComputeDecodeStepBound(traffic, rates);
  EXPECT_DOUBLE_EQ(bound.memory_s, 40e9 / 4e12);
  // Each all-reduce: 10 us + 2 * 3/4 * 1 MB at 400 GB/s = 10 + 3.75 us.
  EXPECT_NEAR(bound.collective_s, 160 * 13.75e-6, 1e-12);
  EXPECT_DOUBLE_EQ(bound.step_s, bound.memory_s + bound.collective_s);
  traffic.logits_gather_bytes = 8e6;  // + 10 us + 3/4 * 8 MB at 400 GB/s = 25 us
  EXPECT_NEAR(ComputeDecodeStepBound(traffic, rates).collective_s, 160 * 13.75e-6 + 25e-6, 1e-12);
  traffic.size = 1;  // one rank: no collectives whatever the counts say
  EXPECT_EQ(ComputeDecodeStepBound(traffic, rates).collective_s, 0);
}

}  // namespace
}  // namespace sieve
