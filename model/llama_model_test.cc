// The forward pass against Hugging Face transformers: testdata/models/* were written by
// scripts/make_golden.py (random-weight tiny models; logits of every prompt position computed by
// transformers in fp32 with eager attention). Sieve's CPU backend must agree to fp32 precision.
#include "model/llama_model.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <numeric>

#include "core/testing.h"
#include "model/safetensors.h"

#ifdef SIEVE_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace sieve {
namespace {

// Max |logit difference| allowed against transformers. Logits are O(1..10); fp32 with different
// summation orders lands around 1e-6..1e-5.
constexpr double kLogitTolerance = 2e-4;

struct PrefillFixture {
  StepMeta step;
  KvPool pool;
};

// One sequence of n tokens prefilled in one step, logits of every row sampled, on `backend`.
PrefillFixture MakeFullPrefill(Backend& backend, const ModelConfig& config,
                               const std::vector<int32_t>& ids) {
  const int n = static_cast<int>(ids.size());
  const int layers = config.num_layers;
  PrefillFixture f;
  StepMeta& step = f.step;
  const auto i32 = [&](std::vector<int32_t> values, std::vector<int64_t> shape = {}) {
    if (shape.empty()) shape = {static_cast<int64_t>(values.size())};
    Tensor tensor = backend.Allocate(std::move(shape), DType::kI32);
    backend.CopyFromHost(values.data(), values.size() * sizeof(int32_t), tensor);
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
  step.compression_jobs = i32({0});
  step.eviction_jobs = i32({0});
  step.job_begin.assign(layers + 1, 0);
  step.eviction_begin.assign(layers + 1, 0);
  KvPool& pool = f.pool;
  pool.page_size = 16;
  pool.max_seqs = 1;
  pool.max_pages_per_seq = (n + 15) / 16;
  pool.num_pages = pool.max_pages_per_seq * layers;
  pool.num_kv_heads = config.num_kv_heads;
  pool.head_dim = config.head_dim;
  pool.k = backend.Allocate({pool.num_pages, 16, config.num_kv_heads, config.head_dim},
                            backend.activation_dtype());
  pool.v = backend.Allocate(pool.k.shape(), backend.activation_dtype());
  std::vector<int32_t> table(pool.num_pages);
  std::iota(table.begin(), table.end(), 0);
  pool.page_table = i32(table, {layers, 1, pool.max_pages_per_seq});
  pool.kv_lens = i32(std::vector<int32_t>(layers, n), {layers, 1});
  return f;
}

struct GoldenCase {
  std::vector<int32_t> ids;
  std::vector<float> logits;  // [n][V]
};

GoldenCase ReadGolden(const std::string& dir) {
  auto golden = SafetensorsFile::Open(dir + "/golden.safetensors");
  SIEVE_CHECK(golden.ok()) << golden.status().ToString();
  const SafetensorsTensor* ids = (*golden)->Find("input_ids");
  const SafetensorsTensor* logits = (*golden)->Find("logits");
  GoldenCase out;
  const auto* id_data = static_cast<const int32_t*>(ids->data);
  out.ids.assign(id_data, id_data + ids->shape[0]);
  const auto* logit_data = static_cast<const float*>(logits->data);
  out.logits.assign(logit_data, logit_data + logits->nbytes / sizeof(float));
  return out;
}

// Runs the golden prompt through the model on `backend`; returns logits [n][V] on the host.
std::vector<float> ForwardAllRows(Backend& backend, const std::string& dir,
                                  const std::vector<int32_t>& ids) {
  auto config = LoadModelConfig(dir);
  SIEVE_CHECK(config.ok()) << config.status().ToString();
  auto checkpoint = SafetensorsCheckpoint::Open(dir);
  SIEVE_CHECK(checkpoint.ok()) << checkpoint.status().ToString();
  auto model = LlamaModel::Load(*config, **checkpoint, backend, 256);
  SIEVE_CHECK(model.ok()) << model.status().ToString();
  const int n = static_cast<int>(ids.size());
  PrefillFixture fixture = MakeFullPrefill(backend, *config, ids);
  ForwardWorkspace workspace;
  (*model)->EnsureWorkspace(workspace, n, n, n, 1, 1);
  Tensor logits = backend.Allocate({n, config->vocab_size}, DType::kF32);
  (*model)->Forward(fixture.step, fixture.pool, workspace, logits);
  std::vector<float> host(static_cast<size_t>(n) * config->vocab_size);
  backend.CopyToHost(logits, host.data());
  return host;
}

class GoldenLogitsTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenLogitsTest, EveryPositionMatchesTransformers) {
  const std::string dir = TestDataDir() + "/models/" + GetParam();
  ASSERT_TRUE(std::filesystem::exists(dir)) << dir;
  const GoldenCase golden = ReadGolden(dir);
  auto backend = MakeCpuBackend();
  const std::vector<float> logits = ForwardAllRows(*backend, dir, golden.ids);
  const double max_error = testing::MaxAbsError(logits.data(), golden.logits.data(), logits.size());
  EXPECT_LE(max_error, kLogitTolerance) << GetParam();
  RecordProperty("max_abs_error", std::to_string(max_error));
  std::printf("%s: max |logit error| vs transformers = %.3g over %zu logits\n", GetParam().c_str(),
              max_error, logits.size());
}

INSTANTIATE_TEST_SUITE_P(TinyModels, GoldenLogitsTest,
                         ::testing::Values("llama2_mha", "llama_gqa_bf16", "llama3_rope_sharded",
                                           "llama_tied", "mistral_gqa"));

#ifdef SIEVE_HAVE_CUDA
// The same on the GPU, for models with the head dims the CUDA kernels support (generated on the
// GPU machine by scripts/gpu_check.sh into testdata/models_gpu). bf16 weights and activations, so
// the bound is bf16's: relative L2 of the logits within 3e-2.
class GpuGoldenLogitsTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GpuGoldenLogitsTest, MatchesTransformersWithinBf16) {
  auto gpu = MakeCudaBackend(0);
  if (!gpu.ok()) GTEST_SKIP() << "no CUDA device: " << gpu.status().message();
  const std::string dir = TestDataDir() + "/models_gpu/" + GetParam();
  if (!std::filesystem::exists(dir)) {
    GTEST_SKIP() << dir << " is missing: scripts/gpu_check.sh generates it with transformers";
  }
  const GoldenCase golden = ReadGolden(dir);
  const std::vector<float> logits = ForwardAllRows(**gpu, dir, golden.ids);
  const double rel = testing::RelativeL2Error(logits.data(), golden.logits.data(), logits.size());
  const double max_error = testing::MaxAbsError(logits.data(), golden.logits.data(), logits.size());
  std::printf("%s on GPU: logits rel L2 %.3g, max abs %.3g vs transformers fp32\n",
              GetParam().c_str(), rel, max_error);
  EXPECT_LE(rel, 3e-2) << GetParam();
}

INSTANTIATE_TEST_SUITE_P(GpuModels, GpuGoldenLogitsTest,
                         ::testing::Values("gpu_llama3_d64", "gpu_mistral_d128",
                                           "gpu_llama_mha_d128_tied"));
#endif

}  // namespace
}  // namespace sieve
