// The forward pass against Hugging Face transformers: testdata/models/* were written by
// scripts/make_golden.py (random-weight tiny models; logits of every prompt position computed by
// transformers in fp32 with eager attention). Sieve's CPU backend must agree to fp32 precision.
#include "model/llama_model.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <numeric>

#include "core/testing.h"
#include "model/safetensors.h"

namespace sieve {
namespace {

// Max |logit difference| allowed against transformers. Logits are O(1..10); fp32 with different
// summation orders lands around 1e-6..1e-5.
constexpr double kLogitTolerance = 2e-4;

struct PrefillFixture {
  StepMeta step;
  KvPool pool;
};

// One sequence of n tokens prefilled in one step, logits of every row sampled.
PrefillFixture MakeFullPrefill(const ModelConfig& config, const std::vector<int32_t>& ids) {
  const int n = static_cast<int>(ids.size());
  const int layers = config.num_layers;
  PrefillFixture f;
  StepMeta& step = f.step;
  const auto i32 = [](std::vector<int32_t> values) {
    Tensor tensor = Tensor::Empty({static_cast<int64_t>(values.size())}, DType::kI32);
    std::copy(values.begin(), values.end(), tensor.data_as<int32_t>());
    return tensor;
  };
  std::vector<int32_t> rows(n);
  std::iota(rows.begin(), rows.end(), 0);
  step.num_tokens = step.num_prefill_tokens = n;
  step.num_seqs = step.num_prefill_seqs = 1;
  step.num_layers = layers;
  step.max_query_len = step.max_kv_len = n;
  step.num_prefill_keys = n;
  step.num_sample_rows = n;
  step.token_ids = i32(ids);
  step.positions = i32(rows);
  step.query_start = i32({0, n});
  step.key_start = i32({0, n});
  step.context_lens = i32({0});
  step.seq_slots = i32({0});
  step.write_start = i32(std::vector<int32_t>(layers, 0));
  step.sample_rows = i32(rows);
  step.job_begin.assign(layers + 1, 0);
  step.eviction_begin.assign(layers + 1, 0);
  KvPool& pool = f.pool;
  pool.page_size = 16;
  pool.max_seqs = 1;
  pool.max_pages_per_seq = (n + 15) / 16;
  pool.num_pages = pool.max_pages_per_seq * layers;
  pool.num_kv_heads = config.num_kv_heads;
  pool.head_dim = config.head_dim;
  pool.k = Tensor::Empty({pool.num_pages, 16, config.num_kv_heads, config.head_dim}, DType::kF32);
  pool.v = Tensor::Empty(pool.k.shape(), DType::kF32);
  std::vector<int32_t> table(pool.num_pages);
  std::iota(table.begin(), table.end(), 0);
  pool.page_table = i32(table).Reshape({layers, 1, pool.max_pages_per_seq});
  pool.kv_lens = i32(std::vector<int32_t>(layers, n));
  return f;
}

class GoldenLogitsTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenLogitsTest, EveryPositionMatchesTransformers) {
  const std::string dir = TestDataDir() + "/models/" + GetParam();
  ASSERT_TRUE(std::filesystem::exists(dir)) << dir;
  auto config = LoadModelConfig(dir);
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  auto checkpoint = SafetensorsCheckpoint::Open(dir);
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status().ToString();
  auto backend = MakeCpuBackend();
  auto model = LlamaModel::Load(*config, **checkpoint, *backend, 256);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  auto golden = SafetensorsFile::Open(dir + "/golden.safetensors");
  ASSERT_TRUE(golden.ok()) << golden.status().ToString();
  const SafetensorsTensor* ids_tensor = (*golden)->Find("input_ids");
  const SafetensorsTensor* logits_tensor = (*golden)->Find("logits");
  ASSERT_TRUE(ids_tensor && logits_tensor);
  const auto* ids_data = static_cast<const int32_t*>(ids_tensor->data);
  const std::vector<int32_t> ids(ids_data, ids_data + ids_tensor->shape[0]);
  const int n = static_cast<int>(ids.size());
  const int vocab = config->vocab_size;

  PrefillFixture fixture = MakeFullPrefill(*config, ids);
  ForwardWorkspace workspace;
  (*model)->EnsureWorkspace(workspace, n, n, n, 1, 1);
  Tensor logits = Tensor::Empty({n, vocab}, DType::kF32);
  (*model)->Forward(fixture.step, fixture.pool, workspace, logits);

  const auto* expected = static_cast<const float*>(logits_tensor->data);
  const double max_error =
      testing::MaxAbsError(logits.data_as<float>(), expected, static_cast<size_t>(n) * vocab);
  EXPECT_LE(max_error, kLogitTolerance) << GetParam();
  RecordProperty("max_abs_error", std::to_string(max_error));
  std::printf("%s: max |logit error| vs transformers = %.3g over %d x %d\n", GetParam().c_str(),
              max_error, n, vocab);
}

INSTANTIATE_TEST_SUITE_P(TinyModels, GoldenLogitsTest,
                         ::testing::Values("llama2_mha", "llama_gqa_bf16", "llama3_rope_sharded",
                                           "llama_tied", "mistral_gqa"));

}  // namespace
}  // namespace sieve
