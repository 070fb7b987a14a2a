// The CUDA backend's dense and KV-write ops against the CPU backend on fresh random inputs.
// Inputs are rounded to bf16 first so both sides compute from identical values; tolerances are
// relative L2 errors: 1e-2 for bf16 outputs (one bf16 rounding of each output is 4e-3 alone),
// exact equality for pure copies.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <tuple>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_test_util.h"

namespace sieve {
namespace {

using cuda::testing::HaveGpu;

constexpr double kBf16Tolerance = 1e-2;

class CudaDenseTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HaveGpu()) GTEST_SKIP() << "no CUDA device: this comparison test runs on the GPU machine";
    gpu_ = std::move(MakeCudaBackend(0)).value();
    cpu_ = MakeCpuBackend();
    rng_ = sieve::testing::MakeRng();
  }

  // Random bf16-representable values.
  std::vector<float> Random(size_t count, float stddev = 1.0f) {
    std::vector<float> values(count);
    sieve::testing::FillRandom(values.data(), count, rng_, stddev);
    cuda::testing::RoundToBf16(values);
    return values;
  }
  Tensor Cpu(const std::vector<float>& values, std::vector<int64_t> shape) {
    Tensor tensor = Tensor::Empty(std::move(shape), DType::kF32);
    std::copy(values.begin(), values.end(), tensor.data_as<float>());
    return tensor;
  }
  Tensor Gpu(const std::vector<float>& values, std::vector<int64_t> shape) {
    return gpu_->UploadWeight(values.data(), DType::kF32, std::move(shape));
  }
  Tensor CpuInts(const std::vector<int32_t>& values, std::vector<int64_t> shape) {
    Tensor tensor = Tensor::Empty(std::move(shape), DType::kI32);
    std::copy(values.begin(), values.end(), tensor.data_as<int32_t>());
    return tensor;
  }
  Tensor GpuInts(const std::vector<int32_t>& values, std::vector<int64_t> shape) {
    Tensor tensor = gpu_->Allocate(std::move(shape), DType::kI32);
    gpu_->CopyFromHost(values.data(), values.size() * 4, tensor);
    return tensor;
  }
  std::vector<float> Download(const Tensor& tensor) {
    if (tensor.dtype() == DType::kF32) {
      std::vector<float> out(tensor.numel());
      gpu_->CopyToHost(tensor, out.data());
      return out;
    }
    std::vector<uint16_t> bits(tensor.numel());
    gpu_->CopyToHost(tensor, bits.data());
    std::vector<float> out(bits.size());
    for (size_t index = 0; index < bits.size(); ++index) out[index] = Bf16ToFloat(bits[index]);
    return out;
  }
  static std::vector<float> Values(const Tensor& cpu) {
    return std::vector<float>(cpu.data_as<float>(), cpu.data_as<float>() + cpu.numel());
  }
  static double RelL2(const std::vector<float>& actual, const std::vector<float>& expected) {
    return sieve::testing::RelativeL2Error(actual.data(), expected.data(), expected.size());
  }

  std::unique_ptr<Backend> gpu_;
  std::unique_ptr<Backend> cpu_;
  std::mt19937_64 rng_;
};

TEST_F(CudaDenseTest, EmbeddingAndGatherAreExactCopies) {
  const int vocab = 1000, width = 136, rows = 37;
  const auto table = Random(static_cast<size_t>(vocab) * width);
  std::vector<int32_t> ids(rows);
  for (int32_t& id : ids) id = static_cast<int32_t>(rng_() % vocab);
  Tensor cpu_out = Tensor::Empty({rows, width}, DType::kF32);
  cpu_->Embedding(Cpu(table, {vocab, width}), CpuInts(ids, {rows}), cpu_out);
  Tensor gpu_out = gpu_->Allocate({rows, width}, DType::kBF16);
  gpu_->Embedding(Gpu(table, {vocab, width}), GpuInts(ids, {rows}), gpu_out);
  EXPECT_EQ(Download(gpu_out), Values(cpu_out));

  std::vector<int32_t> pick = {5, 0, 36, 5};
  Tensor cpu_rows = Tensor::Empty({4, width}, DType::kF32);
  cpu_->GatherRows(cpu_out, CpuInts(pick, {4}), cpu_rows);
  Tensor gpu_rows = gpu_->Allocate({4, width}, DType::kBF16);
  gpu_->GatherRows(gpu_out, GpuInts(pick, {4}), gpu_rows);
  EXPECT_EQ(Download(gpu_rows), Values(cpu_rows));
}

TEST_F(CudaDenseTest, RmsNormAndAddRmsNorm) {
  for (const int width : {64, 4096, 5120}) {
    const int rows = 1 + static_cast<int>(rng_() % 70);
    const auto x = Random(static_cast<size_t>(rows) * width, 3.0f);
    const auto residual = Random(static_cast<size_t>(rows) * width);
    const auto weight = Random(width);
    Tensor cpu_out = Tensor::Empty({rows, width}, DType::kF32);
    Tensor gpu_out = gpu_->Allocate({rows, width}, DType::kBF16);
    cpu_->RmsNorm(Cpu(x, {rows, width}), Cpu(weight, {width}), 1e-5f, cpu_out);
    gpu_->RmsNorm(Gpu(x, {rows, width}), Gpu(weight, {width}), 1e-5f, gpu_out);
    EXPECT_LE(RelL2(Download(gpu_out), Values(cpu_out)), kBf16Tolerance) << width;

    Tensor cpu_res = Cpu(residual, {rows, width});
    Tensor gpu_res = Gpu(residual, {rows, width});
    cpu_->AddRmsNorm(cpu_res, Cpu(x, {rows, width}), Cpu(weight, {width}), 1e-5f, cpu_out);
    gpu_->AddRmsNorm(gpu_res, Gpu(x, {rows, width}), Gpu(weight, {width}), 1e-5f, gpu_out);
    EXPECT_LE(RelL2(Download(gpu_res), Values(cpu_res)), kBf16Tolerance) << width;
    EXPECT_LE(RelL2(Download(gpu_out), Values(cpu_out)), kBf16Tolerance) << width;
  }
}

TEST_F(CudaDenseTest, LinearBf16AndF32OutputsWithStridedInput) {
  for (const auto& [rows, inner, cols] :
       std::vector<std::tuple<int, int, int>>{{1, 4096, 6144}, {7, 512, 384}, {300, 256, 1000}}) {
    // x is a column slice of a wider buffer, as q is of qkv.
    const int wide = inner + 64;
    const auto buffer = Random(static_cast<size_t>(rows) * wide);
    const auto w = Random(static_cast<size_t>(cols) * inner, 0.05f);
    Tensor cpu_x = Cpu(buffer, {rows, wide}).Columns(32, 32 + inner);
    Tensor gpu_x = Gpu(buffer, {rows, wide}).Columns(32, 32 + inner);
    Tensor cpu_out = Tensor::Empty({rows, cols}, DType::kF32);
    cpu_->Linear(cpu_x, Cpu(w, {cols, inner}), cpu_out);
    for (const DType out_dtype : {DType::kBF16, DType::kF32}) {
      Tensor gpu_out = gpu_->Allocate({rows, cols}, out_dtype);
      gpu_->Linear(gpu_x, Gpu(w, {cols, inner}), gpu_out);
      EXPECT_LE(RelL2(Download(gpu_out), Values(cpu_out)), kBf16Tolerance)
          << rows << "x" << inner << "x" << cols << " " << DTypeName(out_dtype);
    }
  }
}

TEST_F(CudaDenseTest, SiluMulAndScatter) {
  const int rows = 33, width = 1000;
  const auto gate_up = Random(static_cast<size_t>(rows) * 2 * width, 2.0f);
  Tensor cpu_out = Tensor::Empty({rows, width}, DType::kF32);
  cpu_->SiluMul(Cpu(gate_up, {rows, 2 * width}), cpu_out);
  Tensor gpu_out = gpu_->Allocate({rows, width}, DType::kBF16);
  gpu_->SiluMul(Gpu(gate_up, {rows, 2 * width}), gpu_out);
  EXPECT_LE(RelL2(Download(gpu_out), Values(cpu_out)), kBf16Tolerance);

  std::vector<int32_t> patches;
  std::vector<int32_t> expected(500, 0);
  for (int index = 0; index < 200; ++index) {
    const int32_t where = static_cast<int32_t>(rng_() % 500);
    const int32_t value = static_cast<int32_t>(rng_() % 100000);
    if (std::find(patches.begin(), patches.end(), where) != patches.end()) continue;
    patches.push_back(where);
    patches.push_back(value);
    expected[where] = value;
  }
  Tensor dst = GpuInts(std::vector<int32_t>(500, 0), {500});
  const int count = static_cast<int>(patches.size() / 2);
  gpu_->ScatterInt32(GpuInts(patches, {count, 2}), count, dst);
  std::vector<int32_t> got(500);
  gpu_->CopyToHost(dst, got.data());
  EXPECT_EQ(got, expected);
}

TEST_F(CudaDenseTest, FillRandomIsSeededAndNormal) {
  Tensor a = gpu_->Allocate({1 << 20}, DType::kBF16);
  Tensor b = gpu_->Allocate({1 << 20}, DType::kBF16);
  gpu_->FillRandom(a, 42, 0.5f);
  gpu_->FillRandom(b, 42, 0.5f);
  const auto va = Download(a);
  EXPECT_EQ(va, Download(b));
  double sum = 0, sum_squares = 0;
  for (const float value : va) {
    sum += value;
    sum_squares += value * value;
  }
  EXPECT_NEAR(sum / va.size(), 0.0, 0.01);
  EXPECT_NEAR(std::sqrt(sum_squares / va.size()), 0.5, 0.01);
}

// RoPE + cache write and the prefill K/V gather, on a mixed step: two prefill sequences (one
// continuing a chunked prompt from its pages) and two decode tokens, random page tables.
TEST_F(CudaDenseTest, RopeCacheWriteAndGatherMatchCpu) {
  const int heads = 8, kv_heads = 2, head_dim = 128, layers = 2, page_size = 16;
  const int max_seqs = 4, max_pages = 8, num_pages = 64;
  const int width = (heads + 2 * kv_heads) * head_dim;
  const std::vector<int> chunk = {37, 20, 1, 1};
  const std::vector<int> context = {0, 45, 70, 16};
  const int tokens = std::accumulate(chunk.begin(), chunk.end(), 0);
  const int layer = 1;
  // Random distinct pages per (layer, slot).
  std::vector<int32_t> pages(num_pages);
  std::iota(pages.begin(), pages.end(), 0);
  std::shuffle(pages.begin(), pages.end(), rng_);
  std::vector<int32_t> table(static_cast<size_t>(layers) * max_seqs * max_pages, -1);
  int next = 0;
  for (int l = 0; l < layers; ++l) {
    for (int slot = 0; slot < max_seqs; ++slot) {
      for (int p = 0; p < 7; ++p)
        table[(l * max_seqs + slot) * max_pages + p] = pages[next++ % num_pages];
    }
  }
  std::vector<int32_t> positions, query_start = {0}, key_start = {0}, slots = {2, 0, 3, 1};
  for (int seq = 0; seq < 4; ++seq) {
    for (int i = 0; i < chunk[seq]; ++i) positions.push_back(context[seq] + i);
    query_start.push_back(query_start.back() + chunk[seq]);
    if (seq < 2) key_start.push_back(key_start.back() + context[seq] + chunk[seq]);
  }
  std::vector<int32_t> write_start = {-1, 45, 70, 16,
                                      0,  45, 70, 16};  // [L][S]: seq 0 layer 0 writes
  write_start[layer * 4 + 0] = 0;
  const auto qkv = Random(static_cast<size_t>(tokens) * width);
  const auto k_pool = Random(static_cast<size_t>(num_pages) * page_size * kv_heads * head_dim);
  const auto v_pool = Random(k_pool.size());
  std::vector<float> rope(static_cast<size_t>(256) * head_dim);
  for (int p = 0; p < 256; ++p) {
    for (int i = 0; i < head_dim / 2; ++i) {
      const double angle = p * std::pow(10000.0, -2.0 * i / head_dim);
      rope[(p * head_dim / 2 + i) * 2] = static_cast<float>(std::cos(angle));
      rope[(p * head_dim / 2 + i) * 2 + 1] = static_cast<float>(std::sin(angle));
    }
  }
  const auto build = [&](bool on_gpu, StepMeta& step, KvPool& pool) {
    const auto ints = [&](const std::vector<int32_t>& v, std::vector<int64_t> shape) {
      return on_gpu ? GpuInts(v, std::move(shape)) : CpuInts(v, std::move(shape));
    };
    const auto floats = [&](const std::vector<float>& v, std::vector<int64_t> shape) {
      return on_gpu ? Gpu(v, std::move(shape)) : Cpu(v, std::move(shape));
    };
    step.num_tokens = tokens;
    step.num_prefill_tokens = chunk[0] + chunk[1];
    step.num_seqs = 4;
    step.num_prefill_seqs = 2;
    step.num_layers = layers;
    step.max_query_len = 37;
    step.max_kv_len = 71;
    step.num_prefill_keys = key_start.back();
    step.positions = ints(positions, {tokens});
    step.token_ids = ints(positions, {tokens});
    step.query_start = ints(query_start, {5});
    step.key_start = ints(key_start, {3});
    step.context_lens = ints(std::vector<int32_t>(context.begin(), context.end()), {4});
    step.seq_slots = ints(slots, {4});
    step.write_start = ints(write_start, {layers * 4});
    step.compression_jobs = ints({0}, {1});
    step.eviction_jobs = ints({0}, {1});
    pool.page_size = page_size;
    pool.num_pages = num_pages;
    pool.max_seqs = max_seqs;
    pool.max_pages_per_seq = max_pages;
    pool.num_kv_heads = kv_heads;
    pool.head_dim = head_dim;
    pool.k = floats(k_pool, {num_pages, page_size, kv_heads, head_dim});
    pool.v = floats(v_pool, {num_pages, page_size, kv_heads, head_dim});
    pool.page_table = ints(table, {layers, max_seqs, max_pages});
    pool.kv_lens = ints(std::vector<int32_t>(layers * max_seqs, 0), {layers, max_seqs});
    pool.positions = ints(std::vector<int32_t>(num_pages * page_size * kv_heads, -7),
                          {num_pages * page_size, kv_heads});
  };
  StepMeta cpu_step, gpu_step;
  KvPool cpu_pool, gpu_pool;
  build(false, cpu_step, cpu_pool);
  build(true, gpu_step, gpu_pool);
  Tensor cpu_qkv = Cpu(qkv, {tokens, width});
  Tensor gpu_qkv = Gpu(qkv, {tokens, width});
  Tensor cpu_rope = Cpu(rope, {256, head_dim / 2, 2});
  Tensor gpu_rope = gpu_->Allocate({256, head_dim / 2, 2}, DType::kF32);
  gpu_->CopyFromHost(rope.data(), rope.size() * 4, gpu_rope);
  cpu_->RopeAndCacheWrite(cpu_qkv, cpu_rope, heads, cpu_step, layer, cpu_pool);
  gpu_->RopeAndCacheWrite(gpu_qkv, gpu_rope, heads, gpu_step, layer, gpu_pool);
  // The GPU rounds the rotated values to bf16 before writing; compare against the CPU's f32.
  EXPECT_LE(RelL2(Download(gpu_qkv), Values(cpu_qkv)), 5e-3);
  EXPECT_LE(RelL2(Download(gpu_pool.k), Values(cpu_pool.k)), 5e-3);
  EXPECT_EQ(Download(gpu_pool.v), Values(cpu_pool.v));  // V is copied, never rounded twice
  std::vector<int32_t> gpu_positions(cpu_pool.positions.numel());
  gpu_->CopyToHost(gpu_pool.positions, gpu_positions.data());
  EXPECT_TRUE(std::equal(gpu_positions.begin(), gpu_positions.end(),
                         cpu_pool.positions.data_as<int32_t>()));

  const int keys = key_start.back();
  Tensor cpu_k = Tensor::Empty({keys, kv_heads, head_dim}, DType::kF32);
  Tensor cpu_v = Tensor::Empty({keys, kv_heads, head_dim}, DType::kF32);
  Tensor gpu_k = gpu_->Allocate({keys, kv_heads, head_dim}, DType::kBF16);
  Tensor gpu_v = gpu_->Allocate({keys, kv_heads, head_dim}, DType::kBF16);
  // Gather from the rounded state on both sides: reset the CPU inputs to the GPU's bf16 values.
  const auto qkv_after = Download(gpu_qkv);
  std::copy(qkv_after.begin(), qkv_after.end(), cpu_qkv.data_as<float>());
  const auto k_after = Download(gpu_pool.k);
  std::copy(k_after.begin(), k_after.end(), cpu_pool.k.data_as<float>());
  cpu_->GatherPrefillKv(cpu_qkv, heads, cpu_step, layer, cpu_pool, cpu_k, cpu_v);
  gpu_->GatherPrefillKv(gpu_qkv, heads, gpu_step, layer, gpu_pool, gpu_k, gpu_v);
  EXPECT_EQ(Download(gpu_k), Values(cpu_k));
  EXPECT_EQ(Download(gpu_v), Values(cpu_v));
}

}  // namespace
}  // namespace sieve
