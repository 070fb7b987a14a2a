// The CUDA backend's dense and KV-write ops against the CPU backend on fresh random inputs.
// Inputs are rounded to bf16 first so both sides compute from identical values; tolerances are
// relative L2 errors: 1e-2 for bf16 outputs (one bf16 rounding of each output is 4e-3 alone),
// exact equality for pure copies.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <tuple>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_test_util.h"
#include "backend/cuda/device_image.h"
#include "backend/cuda/fp8_gemm.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/skinny_gemm.h"
#include "core/float8.h"

namespace sieve {
namespace {

using cuda::testing::HaveGpu;

constexpr double kBf16Tolerance = 1e-2;

// An FP8 GEMM case (CudaDenseTest::MakeQuantizedGemmCase): w quantized on the GPU, x's rows
// quantized on the GPU (codes, scales), and the CPU twin's out = x w^T and base + x w^T.
struct QuantizedGemmCase {
  QuantizedGemmCase(int rows, int inner) : codes(static_cast<size_t>(rows) * inner), scales(rows) {}
  Tensor gpu_w;
  cuda::testing::DeviceBuffer<uint8_t> codes;
  cuda::testing::DeviceBuffer<float> scales;
  std::vector<float> base;
  Tensor cpu_out, cpu_sum;
};

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
  // Random x [rows][inner] and w [cols][inner], quantized as the FP8 GEMM's operands.
  std::unique_ptr<QuantizedGemmCase> MakeQuantizedGemmCase(int rows, int inner, int cols) {
    auto test = std::make_unique<QuantizedGemmCase>(rows, inner);
    const auto x = Random(static_cast<size_t>(rows) * inner, 2.0f);
    const auto w = Random(static_cast<size_t>(cols) * inner, 0.05f);
    test->gpu_w = gpu_->QuantizeWeightE4m3(Gpu(w, {cols, inner}));
    const Tensor cpu_w = cpu_->QuantizeWeightE4m3(Cpu(w, {cols, inner}));
    Tensor gpu_x = Gpu(x, {rows, inner});
    gpu_->Synchronize();
    cuda::QuantizeRowsE4m3(static_cast<const __nv_bfloat16*>(gpu_x.data()), inner, rows, inner,
                           test->codes.get(), inner, test->scales.get(), nullptr);
    test->cpu_out = Tensor::Empty({rows, cols}, DType::kF32);
    cpu_->Linear(Cpu(x, {rows, inner}), cpu_w, test->cpu_out);
    test->base = Random(static_cast<size_t>(rows) * cols);
    test->cpu_sum = Cpu(test->base, {rows, cols});
    cpu_->LinearAdd(Cpu(x, {rows, inner}), cpu_w, test->cpu_sum);
    SIEVE_CHECK(cudaDeviceSynchronize() == cudaSuccess);
    return test;
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

  // A fused gate_up + SiLU path against the unfused pair: `fused` computes out [rows][f] from x
  // [rows][k] and w [2f][k] (gate rows, then up rows) on the GPU, with the folded norm of x's own
  // rows or none; this checks it on fresh random inputs against the GPU's Linear then SiluMul
  // (equal but for a rare bf16 rounding of gate or up that the GEMMs' order of summation moves)
  // and the CPU's LinearSiluMul.
  void ExpectSwiGluMatchesUnfused(int rows, int f, int k, bool norm,
                                  const std::function<void(const Tensor& x, const Tensor& w,
                                                           Tensor& out, RowRms scale)>& fused) {
    SCOPED_TRACE(std::to_string(rows) + " x " + std::to_string(f) + " x " + std::to_string(k) +
                 (norm ? ", with a norm" : ""));
    const float eps = 1e-5f;
    const auto x = Random(static_cast<size_t>(rows) * k, 2.0f);
    const auto w = Random(static_cast<size_t>(2 * f) * k, 0.05f);
    Tensor cpu_x = Cpu(x, {rows, k});
    Tensor gpu_x = Gpu(x, {rows, k});
    Tensor gpu_w = Gpu(w, {2 * f, k});
    Tensor out = gpu_->Allocate({rows, f}, DType::kBF16);
    fused(gpu_x, gpu_w, out, norm ? RowRms{&gpu_x, eps} : RowRms{});
    Tensor gate_up = gpu_->Allocate({rows, 2 * f}, DType::kBF16);
    Tensor unfused = gpu_->Allocate({rows, f}, DType::kBF16);
    gpu_->Linear(gpu_x, gpu_w, gate_up);
    gpu_->SiluMul(gate_up, unfused, norm ? RowRms{&gpu_x, eps} : RowRms{});
    Tensor cpu_gate_up = Tensor::Empty({rows, 2 * f}, DType::kF32);
    Tensor cpu_out = Tensor::Empty({rows, f}, DType::kF32);
    cpu_->LinearSiluMul(cpu_x, Cpu(w, {2 * f, k}), cpu_gate_up, cpu_out,
                        norm ? RowRms{&cpu_x, eps} : RowRms{});
    const std::vector<float> got = Download(out);
    EXPECT_LE(RelL2(got, Download(unfused)), 1e-3);
    EXPECT_LE(RelL2(got, Values(cpu_out)), kBf16Tolerance);
  }

  std::unique_ptr<Backend> gpu_;
  std::unique_ptr<Backend> cpu_;
  std::mt19937_64 rng_;
};

// Width 136 takes the 16-byte copies, 130 the element-wise ones.
class CudaCopyRowsTest : public CudaDenseTest, public ::testing::WithParamInterface<int> {};

TEST_P(CudaCopyRowsTest, EmbeddingAndGatherAreExactCopies) {
  const int vocab = 1000, width = GetParam(), rows = 37;
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

INSTANTIATE_TEST_SUITE_P(Widths, CudaCopyRowsTest, ::testing::Values(136, 130));

// Copy: a column block of a wider matrix into rows of another (how a tensor-parallel rank cuts
// its slice out of a full dummy weight), exact.
TEST_F(CudaDenseTest, CopyOfStridedBlocksIsExact) {
  const int rows = 1 + static_cast<int>(rng_() % 50), wide = 200, cols = 72, offset = 40;
  const auto source = Random(static_cast<size_t>(rows) * wide);
  const auto destination = Random(static_cast<size_t>(rows + 7) * (cols + 24));
  Tensor cpu_out = Cpu(destination, {rows + 7, cols + 24});
  Tensor gpu_out = Gpu(destination, {rows + 7, cols + 24});
  Tensor cpu_block = cpu_out.Rows(3, 3 + rows).Columns(8, 8 + cols);
  Tensor gpu_block = gpu_out.Rows(3, 3 + rows).Columns(8, 8 + cols);
  cpu_->Copy(Cpu(source, {rows, wide}).Columns(offset, offset + cols), cpu_block);
  gpu_->Copy(Gpu(source, {rows, wide}).Columns(offset, offset + cols), gpu_block);
  const std::vector<float> copied = Values(cpu_out);
  EXPECT_EQ(Download(gpu_out), copied);
  // The CPU twin itself: the block holds the source's columns, the rest is untouched.
  for (int row = 0; row < rows + 7; ++row) {
    for (int col = 0; col < cols + 24; ++col) {
      const bool inside = row >= 3 && row < 3 + rows && col >= 8 && col < 8 + cols;
      const float expected = inside ? source[static_cast<size_t>(row - 3) * wide + offset + col - 8]
                                    : destination[static_cast<size_t>(row) * (cols + 24) + col];
      ASSERT_EQ(copied[static_cast<size_t>(row) * (cols + 24) + col], expected)
          << row << ", " << col;
    }
  }
}

TEST_F(CudaDenseTest, RmsNorm) {
  for (const int width : {64, 4096, 5120}) {
    const int rows = 1 + static_cast<int>(rng_() % 70);
    const auto x = Random(static_cast<size_t>(rows) * width, 3.0f);
    const auto weight = Random(width);
    Tensor cpu_out = Tensor::Empty({rows, width}, DType::kF32);
    Tensor gpu_out = gpu_->Allocate({rows, width}, DType::kBF16);
    cpu_->RmsNorm(Cpu(x, {rows, width}), Cpu(weight, {width}), 1e-5f, cpu_out);
    gpu_->RmsNorm(Gpu(x, {rows, width}), Gpu(weight, {width}), 1e-5f, gpu_out);
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
  cpu_->SiluMul(Cpu(gate_up, {rows, 2 * width}), cpu_out, RowRms{});
  Tensor gpu_out = gpu_->Allocate({rows, width}, DType::kBF16);
  gpu_->SiluMul(Gpu(gate_up, {rows, 2 * width}), gpu_out, RowRms{});
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

// Sampling begun without waiting (the engine's overlapped steps): two outstanding at once, taken
// in order, each row's token and raw log-probability as the CPU twin gives them (greedy rows;
// the CPU samples no other kind on its "device"), the tokens left on the device for the next
// step; then GatherInt32 feeds them into a step's token ids as the CPU's does.
TEST_F(CudaDenseTest, BeginSamplingTakesInOrderAndLeavesTokensForTheNextStep) {
  const int rows = 37, vocab = 32000;
  std::vector<std::vector<float>> logits;
  std::vector<Tensor> gpu_logits;
  for (int batch = 0; batch < 2; ++batch) {
    logits.push_back(Random(static_cast<size_t>(rows) * vocab, 3.0f));
    gpu_logits.push_back(gpu_->Allocate({rows, vocab}, DType::kF32));
    gpu_->CopyFromHost(logits.back().data(), logits.back().size() * 4, gpu_logits.back());
  }
  std::vector<Backend::DeviceSamplingRow> greedy(rows, {0.0f, 0, 1.0f, 0.0f, 1, 0});
  std::vector<Tensor> gpu_tokens, cpu_tokens;
  for (int batch = 0; batch < 2; ++batch) {
    gpu_tokens.push_back(gpu_->Allocate({rows + 3}, DType::kI32));
    cpu_tokens.push_back(CpuInts(std::vector<int32_t>(rows + 3, -1), {rows + 3}));
    ASSERT_TRUE(gpu_->BeginSampling(gpu_logits[batch], greedy, gpu_tokens[batch]));
    ASSERT_TRUE(cpu_->BeginSampling(Cpu(logits[batch], {rows, vocab}), greedy, cpu_tokens[batch]));
  }
  for (int batch = 0; batch < 2; ++batch) {
    std::vector<int32_t> gpu_taken, cpu_taken;
    std::vector<float> gpu_logprobs, cpu_logprobs;
    gpu_->TakeSamples(gpu_taken, gpu_logprobs);
    cpu_->TakeSamples(cpu_taken, cpu_logprobs);
    EXPECT_EQ(gpu_taken, cpu_taken) << "batch " << batch;
    ASSERT_EQ(gpu_logprobs.size(), cpu_logprobs.size());
    for (int row = 0; row < rows; ++row) {
      EXPECT_NEAR(gpu_logprobs[row], cpu_logprobs[row], 1e-4)
          << "batch " << batch << " row " << row;
    }
    std::vector<int32_t> on_device(rows + 3);
    gpu_->CopyToHost(gpu_tokens[batch], on_device.data());
    on_device.resize(rows);
    EXPECT_EQ(on_device, gpu_taken) << "batch " << batch;
  }
  // Feed some of the second batch's tokens into a step's ids.
  std::vector<int32_t> ids(300), pairs;
  for (int32_t& id : ids) id = static_cast<int32_t>(rng_() % 100000);
  for (int index = 0; index < 300; index += 1 + static_cast<int>(rng_() % 7)) {
    pairs.push_back(index);
    pairs.push_back(static_cast<int32_t>(rng_() % rows));
  }
  const int count = static_cast<int>(pairs.size() / 2);
  Tensor gpu_ids = GpuInts(ids, {300});
  Tensor cpu_ids = CpuInts(ids, {300});
  gpu_->GatherInt32(gpu_tokens[1], GpuInts(pairs, {count, 2}), count, gpu_ids);
  cpu_->GatherInt32(cpu_tokens[1], CpuInts(pairs, {count, 2}), count, cpu_ids);
  std::vector<int32_t> got(300);
  gpu_->CopyToHost(gpu_ids, got.data());
  EXPECT_EQ(got,
            std::vector<int32_t>(cpu_ids.data_as<int32_t>(), cpu_ids.data_as<int32_t>() + 300));
  EXPECT_NE(got, ids) << "nothing was fed";
  // The CPU's device sampler takes greedy rows only.
  std::vector<Backend::DeviceSamplingRow> sampled = greedy;
  sampled[3].temperature = 0.7f;
  EXPECT_FALSE(cpu_->BeginSampling(Cpu(logits[0], {rows, vocab}), sampled, cpu_tokens[0]));
}

// A folded RMSNorm's scale in SiLU: silu(s g) (s u) with s from a residual row, every launch
// (decode-size steps: a row over several blocks; long prefills, over 256 rows: a block a row; the
// scalar fallback), against the CPU.
TEST_F(CudaDenseTest, SiluMulScalesByRowRms) {
  for (const auto& [rows, width] : std::vector<std::pair<int, int>>{
           {19, 1024}, {19, 1000}, {19, 999}, {300, 1000}, {300, 14336}, {257, 16392}}) {
    SCOPED_TRACE(std::to_string(rows) + " rows");
    const int hidden = 4096;
    const float eps = 1e-5f;
    const auto residual = Random(static_cast<size_t>(rows) * hidden, 3.0f);
    Tensor cpu_residual = Cpu(residual, {rows, hidden});
    Tensor gpu_residual = Gpu(residual, {rows, hidden});
    const auto gate_up = Random(static_cast<size_t>(rows) * 2 * width, 2.0f);
    Tensor cpu_out = Tensor::Empty({rows, width}, DType::kF32);
    cpu_->SiluMul(Cpu(gate_up, {rows, 2 * width}), cpu_out, RowRms{&cpu_residual, eps});
    Tensor gpu_out = gpu_->Allocate({rows, width}, DType::kBF16);
    gpu_->SiluMul(Gpu(gate_up, {rows, 2 * width}), gpu_out, RowRms{&gpu_residual, eps});
    const std::vector<float> got = Download(gpu_out);
    EXPECT_LE(RelL2(got, Values(cpu_out)), kBf16Tolerance) << width;
    // The scale matters here: the unscaled product is far from it.
    Tensor plain = Tensor::Empty({rows, width}, DType::kF32);
    cpu_->SiluMul(Cpu(gate_up, {rows, 2 * width}), plain, RowRms{});
    EXPECT_GT(RelL2(got, Values(plain)), 0.1) << width;
  }
}

// A kernel launched by hand, as the backend would: its bf16 pointers and the folded norm's view.
__nv_bfloat16* Bits(const Tensor& tensor) { return static_cast<__nv_bfloat16*>(tensor.data()); }
cuda::RowRmsView ViewOf(const RowRms& norm) {
  if (norm.rows == nullptr) return {};
  const Tensor& rows = *norm.rows;
  return {Bits(rows), rows.stride(0), static_cast<int>(rows.dim(1)), norm.eps};
}

// The MLP's gate_up GEMM and SiLU as one op, through the backend: one row (the gated skinny
// kernel), and more rows (the unfused pair), with and without a folded norm.
TEST_F(CudaDenseTest, LinearSiluMulMatchesCpuAndUnfused) {
  for (const auto& [rows, f, k, norm] :
       std::vector<std::tuple<int, int, int, bool>>{{1, 1000, 4096, true},
                                                    {1, 384, 200, false},
                                                    {2, 384, 512, true},
                                                    {40, 384, 512, true}}) {
    Tensor gate_up = gpu_->Allocate({rows, 2 * f}, DType::kBF16);  // scratch
    ExpectSwiGluMatchesUnfused(rows, f, k, norm,
                               [&](const Tensor& x, const Tensor& w, Tensor& out, RowRms view) {
                                 gpu_->LinearSiluMul(x, w, gate_up, out, view);
                               });
  }
}

// The gated skinny kernel (skinny_gemm.h) alone at 1 to kSkinnyGemmSwiGluMaxRows rows (rows past
// m in its tile), odd F (a CTA's columns past F), k not a multiple of its 32-k blocks, with and
// without row scales.
TEST_F(CudaDenseTest, SkinnyGemmSwiGluMatchesUnfused) {
  for (const auto& [rows, f, k] : std::vector<std::tuple<int, int, int>>{
           {1, 14336 / 8, 4096}, {1, 1001, 264}, {3, 384, 4096}, {8, 100, 512}, {5, 1001, 264}}) {
    for (const bool norm : {false, true}) {
      ExpectSwiGluMatchesUnfused(
          rows, f, k, norm, [&](const Tensor& x, const Tensor& w, Tensor& out, RowRms view) {
            gpu_->Synchronize();
            cuda::SkinnyGemmSwiGlu(x.dim(0), out.dim(1), x.dim(1), Bits(w), Bits(x), x.stride(0),
                                   ViewOf(view), Bits(out), out.stride(0), nullptr);
            SIEVE_CUDA_CHECK(cudaDeviceSynchronize());
          });
    }
  }
}

// out += x w^T: the residual add fused into the GEMM, planned without touching `out` (its first
// call plans; both calls must add exactly once).
TEST_F(CudaDenseTest, LinearAddAccumulatesOnce) {
  for (const auto& [rows, inner, cols] :
       std::vector<std::tuple<int, int, int>>{{64, 4096, 4096}, {5, 512, 1000}, {300, 256, 384}}) {
    const auto x = Random(static_cast<size_t>(rows) * inner);
    const auto w = Random(static_cast<size_t>(cols) * inner, 0.05f);
    const auto start = Random(static_cast<size_t>(rows) * cols, 4.0f);
    Tensor cpu_out = Cpu(start, {rows, cols});
    Tensor gpu_out = Gpu(start, {rows, cols});
    for (int call = 0; call < 2; ++call) {
      cpu_->LinearAdd(Cpu(x, {rows, inner}), Cpu(w, {cols, inner}), cpu_out);
      gpu_->LinearAdd(Gpu(x, {rows, inner}), Gpu(w, {cols, inner}), gpu_out);
      EXPECT_LE(RelL2(Download(gpu_out), Values(cpu_out)), kBf16Tolerance)
          << rows << "x" << inner << "x" << cols << " call " << call;
    }
  }
}

TEST_F(CudaDenseTest, ScaleColumnsMatchesCpu) {
  const int rows = 300, cols = 520;
  const auto w = Random(static_cast<size_t>(rows) * cols);
  const auto scale = Random(cols, 0.5f);
  Tensor cpu_w = Cpu(w, {rows, cols});
  Tensor gpu_w = Gpu(w, {rows, cols});
  cpu_->ScaleColumns(cpu_w, Cpu(scale, {cols}));
  gpu_->ScaleColumns(gpu_w, Gpu(scale, {cols}));
  // One bf16 rounding of an exact product of two bf16 values.
  EXPECT_LE(RelL2(Download(gpu_w), Values(cpu_w)), 4e-3);
  EXPECT_GT(RelL2(Download(gpu_w), w), 0.1);
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

// RoPE + cache write, the prefill K/V gather and RopeDecodeAttention, on a mixed step: two
// prefill sequences (one continuing a chunked prompt from its pages) and two decode tokens,
// random page tables.
class CudaDenseRopeTest : public CudaDenseTest {
 protected:
  static constexpr int kHeads = 8, kKvHeads = 2, kHeadDim = 128, kLayers = 2, kPageSize = 16;
  static constexpr int kMaxSeqs = 4, kMaxPages = 8, kNumPages = 64, kLayer = 1;
  static constexpr int kWidth = (kHeads + 2 * kKvHeads) * kHeadDim;
  static constexpr int kHidden = 1024;  // residual rows of a folded RMSNorm
  static constexpr float kEps = 1e-5f;

  // No scaling, or a folded RMSNorm's (RowRms) from the fixture's residual rows.
  RowRms Norm(bool on_gpu, bool folded) const {
    if (!folded) return RowRms{};
    return RowRms{on_gpu ? &gpu_residual_ : &cpu_residual_, kEps};
  }

  void SetUp() override {
    CudaDenseTest::SetUp();
    if (IsSkipped()) return;
    // Random distinct pages per (layer, slot).
    std::vector<int32_t> pages(kNumPages);
    std::iota(pages.begin(), pages.end(), 0);
    std::shuffle(pages.begin(), pages.end(), rng_);
    table_.assign(static_cast<size_t>(kLayers) * kMaxSeqs * kMaxPages, -1);
    int next = 0;
    for (int l = 0; l < kLayers; ++l) {
      for (int slot = 0; slot < kMaxSeqs; ++slot) {
        for (int p = 0; p < 7; ++p)
          table_[(l * kMaxSeqs + slot) * kMaxPages + p] = pages[next++ % kNumPages];
      }
    }
    for (int seq = 0; seq < 4; ++seq) {
      for (int i = 0; i < chunk_[seq]; ++i) positions_.push_back(context_[seq] + i);
      query_start_.push_back(query_start_.back() + chunk_[seq]);
      if (seq < 2) key_start_.push_back(key_start_.back() + context_[seq] + chunk_[seq]);
    }
    tokens_ = query_start_.back();
    prefill_tokens_ = chunk_[0] + chunk_[1];
    // The decode sequences hold their context and this step's entry in kLayer.
    kv_lens_.assign(kLayers * kMaxSeqs, 0);
    for (int seq = 2; seq < 4; ++seq) kv_lens_[kLayer * kMaxSeqs + slots_[seq]] = context_[seq] + 1;
    qkv_ = Random(static_cast<size_t>(tokens_) * kWidth);
    residual_ = Random(static_cast<size_t>(tokens_) * kHidden, 2.0f);
    cpu_residual_ = Cpu(residual_, {tokens_, kHidden});
    gpu_residual_ = Gpu(residual_, {tokens_, kHidden});
    k_pool_ = Random(static_cast<size_t>(kNumPages) * kPageSize * kKvHeads * kHeadDim);
    v_pool_ = Random(k_pool_.size());
    scores_.resize(static_cast<size_t>(kNumPages) * kPageSize * kKvHeads);
    std::uniform_real_distribution<float> uniform(0.1f, 1.0f);
    for (float& score : scores_) score = uniform(rng_);
    rope_.resize(static_cast<size_t>(256) * kHeadDim);
    for (int p = 0; p < 256; ++p) {
      for (int i = 0; i < kHeadDim / 2; ++i) {
        const double angle = p * std::pow(10000.0, -2.0 * i / kHeadDim);
        rope_[(p * kHeadDim / 2 + i) * 2] = static_cast<float>(std::cos(angle));
        rope_[(p * kHeadDim / 2 + i) * 2 + 1] = static_cast<float>(std::sin(angle));
      }
    }
    cpu_rope_ = Cpu(rope_, {256, kHeadDim / 2, 2});
    gpu_rope_ = gpu_->Allocate({256, kHeadDim / 2, 2}, DType::kF32);
    gpu_->CopyFromHost(rope_.data(), rope_.size() * 4, gpu_rope_);
  }

  // Fresh copies of the step, pool and qkv on one side; `scores` adds the H2O side pool.
  void Build(bool on_gpu, bool scores, StepMeta& step, KvPool& pool, Tensor& qkv) {
    const auto ints = [&](const std::vector<int32_t>& v, std::vector<int64_t> shape) {
      return on_gpu ? GpuInts(v, std::move(shape)) : CpuInts(v, std::move(shape));
    };
    const auto floats = [&](const std::vector<float>& v, std::vector<int64_t> shape) {
      return on_gpu ? Gpu(v, std::move(shape)) : Cpu(v, std::move(shape));
    };
    step.num_tokens = tokens_;
    step.num_prefill_tokens = prefill_tokens_;
    step.num_seqs = 4;
    step.num_prefill_seqs = 2;
    step.num_layers = kLayers;
    step.max_query_len = 37;
    step.max_kv_len = 71;
    step.num_prefill_keys = key_start_.back();
    step.positions = ints(positions_, {tokens_});
    step.token_ids = ints(positions_, {tokens_});
    step.query_start = ints(query_start_, {5});
    step.key_start = ints(key_start_, {3});
    step.context_lens = ints(std::vector<int32_t>(context_.begin(), context_.end()), {4});
    step.seq_slots = ints(slots_, {4});
    step.write_start = ints(write_start_, {kLayers * 4});
    step.compression_jobs = ints({0}, {1});
    step.eviction_jobs = ints({0}, {1});
    pool.page_size = kPageSize;
    pool.num_pages = kNumPages;
    pool.max_seqs = kMaxSeqs;
    pool.max_pages_per_seq = kMaxPages;
    pool.num_kv_heads = kKvHeads;
    pool.head_dim = kHeadDim;
    pool.k = floats(k_pool_, {kNumPages, kPageSize, kKvHeads, kHeadDim});
    pool.v = floats(v_pool_, {kNumPages, kPageSize, kKvHeads, kHeadDim});
    pool.page_table = ints(table_, {kLayers, kMaxSeqs, kMaxPages});
    pool.kv_lens = ints(kv_lens_, {kLayers, kMaxSeqs});
    pool.positions = ints(std::vector<int32_t>(kNumPages * kPageSize * kKvHeads, -7),
                          {kNumPages * kPageSize, kKvHeads});
    if (scores) {
      if (on_gpu) {
        pool.scores = gpu_->Allocate({kNumPages * kPageSize, kKvHeads}, DType::kF32);
        gpu_->CopyFromHost(scores_.data(), scores_.size() * 4, pool.scores);
      } else {
        pool.scores = Cpu(scores_, {kNumPages * kPageSize, kKvHeads});
      }
    }
    qkv = on_gpu ? Gpu(qkv_, {tokens_, kWidth}) : Cpu(qkv_, {tokens_, kWidth});
  }

  // The GPU pool against the CPU's: K within bf16 rounding (the GPU rounds rotated values before
  // writing), V copied exactly, positions and scores.
  // V is copied exactly, or with a folded RMSNorm scaled and rounded once like K.
  void ExpectPoolMatches(const KvPool& gpu_pool, const KvPool& cpu_pool, const std::string& what,
                         bool folded) {
    EXPECT_LE(RelL2(Download(gpu_pool.k), Values(cpu_pool.k)), 5e-3) << what;
    if (folded) {
      EXPECT_LE(RelL2(Download(gpu_pool.v), Values(cpu_pool.v)), 5e-3) << what;
      EXPECT_NE(Download(gpu_pool.v), v_pool_) << what << ": no V entry written";
    } else {
      EXPECT_EQ(Download(gpu_pool.v), Values(cpu_pool.v)) << what;
    }
    std::vector<int32_t> gpu_positions(cpu_pool.positions.numel());
    gpu_->CopyToHost(gpu_pool.positions, gpu_positions.data());
    EXPECT_TRUE(std::equal(gpu_positions.begin(), gpu_positions.end(),
                           cpu_pool.positions.data_as<int32_t>()))
        << what;
    if (cpu_pool.scores.defined()) {
      // What the step added, exp(q.k - lse), from bf16-rounded rotated q and k on the GPU and
      // f32 on the CPU: a bf16 tolerance on the added amounts (an absolute 1e-4 on the totals
      // failed at 1.1e-4 on the H200).
      std::vector<float> gpu_added = Download(gpu_pool.scores);
      std::vector<float> cpu_added = Values(cpu_pool.scores);
      for (size_t i = 0; i < scores_.size(); ++i) {
        gpu_added[i] -= scores_[i];
        cpu_added[i] -= scores_[i];
      }
      EXPECT_LE(RelL2(gpu_added, cpu_added), kBf16Tolerance) << what;
    }
  }

  std::vector<float> residual_;
  Tensor cpu_residual_;
  Tensor gpu_residual_;
  const std::vector<int> chunk_ = {37, 20, 1, 1};
  const std::vector<int> context_ = {0, 45, 70, 16};
  const std::vector<int32_t> slots_ = {2, 0, 3, 1};
  // [L][S]: in layer 0 only sequence 0 is not written; in kLayer every sequence is.
  const std::vector<int32_t> write_start_ = {-1, 45, 70, 16, 0, 45, 70, 16};
  std::vector<int32_t> table_, positions_, query_start_ = {0}, key_start_ = {0}, kv_lens_;
  std::vector<float> qkv_, k_pool_, v_pool_, scores_, rope_;
  int tokens_ = 0;
  int prefill_tokens_ = 0;
  Tensor cpu_rope_, gpu_rope_;
};

// Each token range against the CPU; tokens outside the range keep their q, k, v bit for bit.
TEST_F(CudaDenseRopeTest, RopeCacheWriteRangesMatchCpu) {
  for (int variant = 0; variant < 6; ++variant) {
    const RopeTokens tokens = variant % 3 == 0   ? RopeTokens::kAll
                              : variant % 3 == 1 ? RopeTokens::kPrefill
                                                 : RopeTokens::kDecode;
    const bool folded = variant >= 3;
    const std::string what = std::string(tokens == RopeTokens::kAll       ? "all"
                                         : tokens == RopeTokens::kPrefill ? "prefill"
                                                                          : "decode") +
                             (folded ? ", folded RMSNorm" : "");
    StepMeta cpu_step, gpu_step;
    KvPool cpu_pool, gpu_pool;
    Tensor cpu_qkv, gpu_qkv;
    Build(false, false, cpu_step, cpu_pool, cpu_qkv);
    Build(true, false, gpu_step, gpu_pool, gpu_qkv);
    cpu_->RopeAndCacheWrite(cpu_qkv, cpu_rope_, kHeads, cpu_step, kLayer, cpu_pool, tokens,
                            Norm(false, folded));
    gpu_->RopeAndCacheWrite(gpu_qkv, gpu_rope_, kHeads, gpu_step, kLayer, gpu_pool, tokens,
                            Norm(true, folded));
    // The GPU rounds the rotated values to bf16 before writing; compare against the CPU's f32.
    const std::vector<float> qkv_after = Download(gpu_qkv);
    EXPECT_LE(RelL2(qkv_after, Values(cpu_qkv)), 5e-3) << what;
    ExpectPoolMatches(gpu_pool, cpu_pool, what, folded);
    const size_t split_at = static_cast<size_t>(prefill_tokens_) * kWidth;
    if (tokens == RopeTokens::kPrefill) {
      EXPECT_TRUE(
          std::equal(qkv_after.begin() + split_at, qkv_after.end(), qkv_.begin() + split_at))
          << "decode rows moved";
    }
    if (tokens == RopeTokens::kDecode) {
      EXPECT_TRUE(std::equal(qkv_after.begin(), qkv_after.begin() + split_at, qkv_.begin()))
          << "prefill rows moved";
    }
    if (tokens != RopeTokens::kAll) continue;

    const int keys = key_start_.back();
    Tensor cpu_k = Tensor::Empty({keys, kKvHeads, kHeadDim}, DType::kF32);
    Tensor cpu_v = Tensor::Empty({keys, kKvHeads, kHeadDim}, DType::kF32);
    Tensor gpu_k = gpu_->Allocate({keys, kKvHeads, kHeadDim}, DType::kBF16);
    Tensor gpu_v = gpu_->Allocate({keys, kKvHeads, kHeadDim}, DType::kBF16);
    // Gather from the rounded state on both sides: reset the CPU inputs to the GPU's bf16 values.
    std::copy(qkv_after.begin(), qkv_after.end(), cpu_qkv.data_as<float>());
    const auto k_after = Download(gpu_pool.k);
    std::copy(k_after.begin(), k_after.end(), cpu_pool.k.data_as<float>());
    cpu_->GatherPrefillKv(cpu_qkv, kHeads, cpu_step, kLayer, cpu_pool, cpu_k, cpu_v);
    gpu_->GatherPrefillKv(gpu_qkv, kHeads, gpu_step, kLayer, gpu_pool, gpu_k, gpu_v);
    EXPECT_EQ(Download(gpu_k), Values(cpu_k));
    EXPECT_EQ(Download(gpu_v), Values(cpu_v));
  }
}

// The model's order: the prefill range, then RopeDecodeAttention (fused on the GPU without H2O
// scores, two kernels with them) against the CPU's (RopeAndCacheWrite(kDecode), DecodeAttention).
TEST_F(CudaDenseRopeTest, RopeDecodeAttentionMatchesCpu) {
  const int64_t q_width = static_cast<int64_t>(kHeads) * kHeadDim;
  for (int variant = 0; variant < 4; ++variant) {
    const bool scores = variant % 2 == 1;
    const bool folded = variant >= 2;
    const std::string what = std::string(scores ? "two kernels (H2O scores)" : "fused") +
                             (folded ? ", folded RMSNorm" : "");
    StepMeta cpu_step, gpu_step;
    KvPool cpu_pool, gpu_pool;
    Tensor cpu_qkv, gpu_qkv;
    Build(false, scores, cpu_step, cpu_pool, cpu_qkv);
    Build(true, scores, gpu_step, gpu_pool, gpu_qkv);
    const std::vector<float> nan_rows(static_cast<size_t>(tokens_) * q_width, NAN);
    Tensor cpu_out = Cpu(nan_rows, {tokens_, q_width});
    Tensor gpu_out = Gpu(nan_rows, {tokens_, q_width});
    for (Backend* backend : {cpu_.get(), gpu_.get()}) {
      const bool on_gpu = backend == gpu_.get();
      Tensor& qkv = on_gpu ? gpu_qkv : cpu_qkv;
      const Tensor& rope = on_gpu ? gpu_rope_ : cpu_rope_;
      StepMeta& step = on_gpu ? gpu_step : cpu_step;
      KvPool& pool = on_gpu ? gpu_pool : cpu_pool;
      backend->RopeAndCacheWrite(qkv, rope, kHeads, step, kLayer, pool, RopeTokens::kPrefill,
                                 Norm(on_gpu, folded));
      backend->RopeDecodeAttention(qkv, rope, kHeads, step, kLayer, pool,
                                   on_gpu ? gpu_out : cpu_out, Norm(on_gpu, folded));
    }
    const std::vector<float> out = Download(gpu_out);
    const std::vector<float> ref = Values(cpu_out);
    const size_t split_at = static_cast<size_t>(prefill_tokens_) * q_width;
    EXPECT_TRUE(std::all_of(out.begin(), out.begin() + split_at,
                            [](float value) { return std::isnan(value); }))
        << what << ": wrote into prefill rows";
    EXPECT_LE(RelL2(std::vector<float>(out.begin() + split_at, out.end()),
                    std::vector<float>(ref.begin() + split_at, ref.end())),
              kBf16Tolerance)
        << what;
    ExpectPoolMatches(gpu_pool, cpu_pool, what, folded);
  }
}

// FP8 weights (fp8_gemm.h): the device's row quantization is the CPU's (core/float8.h) bit for
// bit, on rows of every magnitude, strided input included.
TEST_F(CudaDenseTest, QuantizedRowsAreTheCpusBitForBit) {
  if (!cuda::Fp8GemmRunner::DeviceSupportsFp8()) GTEST_SKIP() << "no FP8 on this GPU";
  const int rows = 300;
  const int cols = 1000;
  const int wide = cols + 24;
  std::vector<float> buffer = Random(static_cast<size_t>(rows) * wide);
  // Row r scaled by 2^(r % 40 - 20): amax from ~1e-6 to ~1e6, subnormal e4m3 codes included.
  for (int row = 0; row < rows; ++row) {
    for (int col = 0; col < wide; ++col)
      buffer[row * wide + col] *= std::ldexp(1.0f, row % 40 - 20);
  }
  for (int col = 0; col < wide; ++col) buffer[7 * wide + col] = 0.0f;  // an all-zero row
  Tensor gpu_x = Gpu(buffer, {rows, wide}).Columns(8, 8 + cols);
  std::vector<uint8_t> codes(static_cast<size_t>(rows) * cols);
  std::vector<float> scales(rows);
  {
    gpu_->Synchronize();  // the upload ran on the backend's stream
    cuda::testing::DeviceBuffer<uint8_t> device_codes(codes.size());
    cuda::testing::DeviceBuffer<float> device_scales(scales.size());
    cuda::QuantizeRowsE4m3(static_cast<const __nv_bfloat16*>(gpu_x.data()), gpu_x.stride(0), rows,
                           cols, device_codes.get(), cols, device_scales.get(), nullptr);
    codes = device_codes.ToHost();
    scales = device_scales.ToHost();
  }
  int mismatches = 0;
  std::vector<uint8_t> expected(cols);
  for (int row = 0; row < rows; ++row) {
    const float scale = QuantizeRowE4m3(buffer.data() + row * wide + 8, cols, expected.data());
    EXPECT_EQ(scales[row], scale) << "row " << row;
    for (int col = 0; col < cols; ++col) mismatches += codes[row * cols + col] != expected[col];
  }
  EXPECT_EQ(mismatches, 0);
}

// Linear and LinearAdd over an FP8 weight against the CPU twin on the same (bf16-representable)
// inputs: both quantize alike, so only the f32 sums' order and the bf16 output differ (relative
// L2 within kBf16Tolerance), at decode and prefill row counts, with strided input.
TEST_F(CudaDenseTest, Fp8LinearMatchesTheCpu) {
  if (!cuda::Fp8GemmRunner::DeviceSupportsFp8()) GTEST_SKIP() << "no FP8 on this GPU";
  for (const auto& [rows, inner, cols] : std::vector<std::tuple<int, int, int>>{
           {1, 4096, 6144}, {8, 512, 384}, {64, 1024, 2048}, {300, 256, 1000}, {1500, 512, 768}}) {
    SCOPED_TRACE(std::to_string(rows) + " x " + std::to_string(inner) + " x " +
                 std::to_string(cols));
    const int wide = inner + 64;
    const auto buffer = Random(static_cast<size_t>(rows) * wide, 2.0f);
    const auto w = Random(static_cast<size_t>(cols) * inner, 0.05f);
    Tensor cpu_x = Cpu(buffer, {rows, wide}).Columns(32, 32 + inner);
    Tensor gpu_x = Gpu(buffer, {rows, wide}).Columns(32, 32 + inner);
    const Tensor cpu_w = cpu_->QuantizeWeightE4m3(Cpu(w, {cols, inner}));
    const Tensor gpu_w = gpu_->QuantizeWeightE4m3(Gpu(w, {cols, inner}));
    ASSERT_EQ(gpu_w.dtype(), DType::kF8E4M3);
    ASSERT_TRUE(gpu_w.has_row_scales());
    Tensor cpu_out = Tensor::Empty({rows, cols}, DType::kF32);
    cpu_->Linear(cpu_x, cpu_w, cpu_out);
    for (const DType out_dtype : {DType::kBF16, DType::kF32}) {
      Tensor gpu_out = gpu_->Allocate({rows, cols}, out_dtype);
      gpu_->Linear(gpu_x, gpu_w, gpu_out);
      EXPECT_LE(RelL2(Download(gpu_out), Values(cpu_out)), kBf16Tolerance) << DTypeName(out_dtype);
    }
    const auto base = Random(static_cast<size_t>(rows) * cols);
    Tensor cpu_sum = Cpu(base, {rows, cols});
    Tensor gpu_sum = Gpu(base, {rows, cols});
    cpu_->LinearAdd(cpu_x, cpu_w, cpu_sum);
    gpu_->LinearAdd(gpu_x, gpu_w, gpu_sum);
    EXPECT_LE(RelL2(Download(gpu_sum), Values(cpu_sum)), kBf16Tolerance);
    // Against the unquantized product: FP8's own error, well above bf16's and below 6%.
    Tensor dense = Tensor::Empty({rows, cols}, DType::kF32);
    cpu_->Linear(cpu_x, Cpu(w, {cols, inner}), dense);
    const double fp8_error = RelL2(Values(cpu_out), Values(dense));
    EXPECT_GT(fp8_error, 1e-3);
    EXPECT_LE(fp8_error, 0.06);
  }
}

// A published FP8 checkpoint's weight uploaded as it is (Backend::UploadWeightE4m3): the device
// holds the CPU twin's codes and row scales bit for bit, and Linear over it matches the CPU's
// within kBf16Tolerance, at decode and prefill row counts.
TEST_F(CudaDenseTest, UploadedE4m3WeightIsTheCpusBitForBit) {
  if (!cuda::Fp8GemmRunner::DeviceSupportsFp8()) GTEST_SKIP() << "no FP8 on this GPU";
  std::mt19937_64& rng = rng_;
  for (const auto& [rows, inner, cols] :
       std::vector<std::tuple<int, int, int>>{{1, 4096, 1536}, {64, 1024, 768}, {700, 512, 384}}) {
    SCOPED_TRACE(std::to_string(rows) + " x " + std::to_string(inner) + " x " +
                 std::to_string(cols));
    std::vector<uint8_t> codes(static_cast<size_t>(cols) * inner);
    for (uint8_t& code : codes) {
      do code = static_cast<uint8_t>(rng());
      while ((code & 0x7f) == 0x7f);  // no NaN codes
    }
    std::vector<float> scales(cols);
    std::uniform_real_distribution<float> spread(-2.0f, 2.0f);
    for (float& scale : scales) scale = 1e-4f * std::exp2(spread(rng));
    const Tensor cpu_w = cpu_->UploadWeightE4m3(codes.data(), scales.data(), cols, inner);
    const Tensor gpu_w = gpu_->UploadWeightE4m3(codes.data(), scales.data(), cols, inner);
    ASSERT_EQ(gpu_w.dtype(), DType::kF8E4M3);
    ASSERT_TRUE(gpu_w.has_row_scales());
    std::vector<uint8_t> gpu_codes(codes.size());
    std::vector<float> gpu_scales(scales.size());
    gpu_->CopyToHost(gpu_w, gpu_codes.data());
    gpu_->CopyToHost(gpu_w.row_scales(), gpu_scales.data());
    EXPECT_TRUE(gpu_codes == codes);
    EXPECT_TRUE(gpu_scales == scales);
    const auto x = Random(static_cast<size_t>(rows) * inner, 2.0f);
    Tensor cpu_out = Tensor::Empty({rows, cols}, DType::kF32);
    cpu_->Linear(Cpu(x, {rows, inner}), cpu_w, cpu_out);
    Tensor gpu_out = gpu_->Allocate({rows, cols}, DType::kBF16);
    gpu_->Linear(Gpu(x, {rows, inner}), gpu_w, gpu_out);
    EXPECT_LE(RelL2(Download(gpu_out), Values(cpu_out)), kBf16Tolerance);
  }
}

// The skinny kernel's e4m3 form (skinny_gemm.h) at every k split and row tile, plain and
// accumulating, against the CPU twin (same quantization; f32 sums in another order, bf16 out).
TEST_F(CudaDenseTest, SkinnyE4m3MatchesTheCpuAtEverySplit) {
  if (!cuda::Fp8GemmRunner::DeviceSupportsFp8()) GTEST_SKIP() << "no FP8 on this GPU";
  for (const auto& [rows, inner, cols] : std::vector<std::tuple<int, int, int>>{
           {1, 4096, 1000}, {5, 2048, 512}, {16, 1024, 768}, {32, 14336, 256}}) {
    const std::unique_ptr<QuantizedGemmCase> test = MakeQuantizedGemmCase(rows, inner, cols);
    ASSERT_TRUE(cuda::SkinnyGemmE4m3Supports(rows, inner, test->gpu_w.data_as<uint8_t>(), inner,
                                             test->codes.get(), inner));
    for (const int splits : cuda::SkinnyGemmE4m3Splits(inner)) {
      SCOPED_TRACE(std::to_string(rows) + " x " + std::to_string(inner) + " x " +
                   std::to_string(cols) + ", k split " + std::to_string(splits));
      Tensor out = gpu_->Allocate({rows, cols}, DType::kBF16);
      Tensor sum = Gpu(test->base, {rows, cols});
      gpu_->Synchronize();
      for (const bool accumulate : {false, true}) {
        cuda::SkinnyGemmE4m3(rows, cols, inner, test->gpu_w.data_as<uint8_t>(), inner,
                             test->gpu_w.row_scales().data_as<float>(), test->codes.get(), inner,
                             test->scales.get(), accumulate ? sum.data() : out.data(), cols,
                             /*out_f32=*/false, accumulate, splits, nullptr);
      }
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      EXPECT_LE(RelL2(Download(out), Values(test->cpu_out)), kBf16Tolerance);
      EXPECT_LE(RelL2(Download(sum), Values(test->cpu_sum)), kBf16Tolerance);
    }
  }
}

// Every candidate of the FP8 GEMM runner (cuBLASLt with the scales in its epilogue, cuBLASLt's
// unscaled product rescaled by our kernel, the skinny kernel at each split), plain into bf16 and
// f32 and accumulating into bf16, against the CPU twin (same quantization; f32 sums in another
// order). At least the scaled form must exist on sm_90 (the prefill GEMMs' path), and the rescaled
// one at decode sizes.
TEST_F(CudaDenseTest, Fp8GemmCandidatesMatchTheCpu) {
  if (!cuda::Fp8GemmRunner::DeviceSupportsFp8()) GTEST_SKIP() << "no FP8 on this GPU";
  int major = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0), cudaSuccess);
  cuda::Fp8GemmRunner runner(nullptr);
  for (const auto& [rows, inner, cols] : std::vector<std::tuple<int, int, int>>{{7, 1024, 384},
                                                                                {64, 4096, 512},
                                                                                {256, 1024, 1000},
                                                                                {300, 2048, 768},
                                                                                {1500, 512, 256}}) {
    const std::unique_ptr<QuantizedGemmCase> test = MakeQuantizedGemmCase(rows, inner, cols);
    const auto* weight = test->gpu_w.data_as<uint8_t>();
    const auto* weight_scales = test->gpu_w.row_scales().data_as<float>();
    for (const auto& [out_f32, accumulate] :
         std::vector<std::pair<bool, bool>>{{false, false}, {true, false}, {false, true}}) {
      const std::vector<int> candidates = runner.Candidates(
          rows, cols, inner, weight, inner, test->codes.get(), inner, cols, out_f32, accumulate);
      const auto offers = [&](int candidate) {
        return std::find(candidates.begin(), candidates.end(), candidate) != candidates.end();
      };
      if (major == 9 && !out_f32) {
        EXPECT_TRUE(offers(cuda::Fp8GemmRunner::kScaled)) << rows << " rows";
        EXPECT_EQ(offers(cuda::Fp8GemmRunner::kRescaled),
                  rows <= cuda::Fp8GemmRunner::kRescaleMaxRows)
            << rows << " rows";
      }
      for (const int candidate : candidates) {
        SCOPED_TRACE(std::to_string(rows) + " x " + std::to_string(inner) + " x " +
                     std::to_string(cols) + (out_f32 ? " f32" : "") + (accumulate ? " +=" : "") +
                     ", candidate " + std::to_string(candidate));
        Tensor out = accumulate
                         ? Gpu(test->base, {rows, cols})
                         : gpu_->Allocate({rows, cols}, out_f32 ? DType::kF32 : DType::kBF16);
        gpu_->Synchronize();
        runner.RunCandidate(candidate, rows, cols, inner, weight, inner, weight_scales,
                            test->codes.get(), inner, test->scales.get(), out.data(), cols, out_f32,
                            accumulate);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        EXPECT_LE(RelL2(Download(out), Values(accumulate ? test->cpu_sum : test->cpu_out)),
                  kBf16Tolerance)
            << runner.last_plan();
      }
    }
  }
}

// ---- Quantized activations (backend.h): RmsNorm and SiluMul into e4m3 with row scales ----

// Codes and row scales of a quantized activation on the host.
struct HostE4m3Rows {
  std::vector<uint8_t> codes;  // [rows][cols]
  std::vector<float> scales;   // [rows]
};

// A code's place on the number line: codes of one sign are ordered by their low 7 bits, so
// neighbouring e4m3 values are one apart (+0 and -0 both 0).
int E4m3Ordinal(uint8_t code) { return (code & 0x80) != 0 ? -(code & 0x7f) : (code & 0x7f); }

class CudaE4m3ActivationTest : public CudaDenseTest {
 protected:
  void SetUp() override {
    CudaDenseTest::SetUp();
    if (IsSkipped()) return;
    if (!cuda::Fp8GemmRunner::DeviceSupportsFp8()) GTEST_SKIP() << "no FP8 on this GPU";
  }

  // A [rows][cols] quantized activation on the GPU: columns [offset, offset + cols) of a buffer
  // `pad` codes wider (row stride and start not multiples of 8 where offset and pad are not),
  // filled with random codes and scales so that anything left unwritten shows.
  Tensor GpuE4m3(int rows, int cols, int offset = 0, int pad = 0) {
    const int wide = cols + pad;
    std::vector<uint8_t> codes(static_cast<size_t>(rows) * wide);
    for (uint8_t& code : codes) code = static_cast<uint8_t>(rng_() & 0x77);
    std::vector<float> scales(rows, 3.0f);
    Tensor buffer = gpu_->Allocate({rows, wide}, DType::kF8E4M3);
    gpu_->CopyFromHost(codes.data(), codes.size(), buffer);
    Tensor row_scales = gpu_->Allocate({rows}, DType::kF32);
    gpu_->CopyFromHost(scales.data(), scales.size() * 4, row_scales);
    return buffer.Columns(offset, offset + cols).WithRowScales(row_scales);
  }
  // `tensor`'s codes (its columns only) and scales.
  HostE4m3Rows DownloadE4m3(const Tensor& tensor) {
    const int64_t rows = tensor.dim(0);
    const int64_t cols = tensor.dim(1);
    HostE4m3Rows host{std::vector<uint8_t>(static_cast<size_t>(rows * cols)),
                      std::vector<float>(static_cast<size_t>(rows))};
    gpu_->Synchronize();
    SIEVE_CUDA_CHECK(cudaMemcpy2D(host.codes.data(), cols, tensor.data(), tensor.stride(0), cols,
                                  rows, cudaMemcpyDeviceToHost));
    gpu_->CopyToHost(tensor.row_scales(), host.scales.data());
    return host;
  }
  // The unfused path: a bf16 activation quantized by the FP8 GEMM's own pass (QuantizeRowsE4m3).
  HostE4m3Rows QuantizeOnGpu(const Tensor& bf16_rows) {
    const int64_t rows = bf16_rows.dim(0);
    const int64_t cols = bf16_rows.dim(1);
    cuda::testing::DeviceBuffer<uint8_t> codes(static_cast<size_t>(rows * cols));
    cuda::testing::DeviceBuffer<float> scales(static_cast<size_t>(rows));
    gpu_->Synchronize();
    cuda::QuantizeRowsE4m3(static_cast<const __nv_bfloat16*>(bf16_rows.data()), bf16_rows.stride(0),
                           rows, cols, codes.get(), cols, scales.get(), nullptr);
    return {codes.ToHost(), scales.ToHost()};
  }
  static HostE4m3Rows HostOf(const Tensor& cpu) {
    const int64_t rows = cpu.dim(0);
    const int64_t cols = cpu.dim(1);
    HostE4m3Rows host{std::vector<uint8_t>(static_cast<size_t>(rows * cols)),
                      std::vector<float>(static_cast<size_t>(rows))};
    for (int64_t row = 0; row < rows; ++row) {
      std::copy(cpu.data_as<uint8_t>() + row * cpu.stride(0),
                cpu.data_as<uint8_t>() + row * cpu.stride(0) + cols,
                host.codes.begin() + row * cols);
      host.scales[row] = cpu.row_scales().data_as<float>()[row];
    }
    return host;
  }
  static Tensor CpuE4m3(int rows, int cols) {
    return Tensor::Empty({rows, cols}, DType::kF8E4M3)
        .WithRowScales(Tensor::Empty({rows}, DType::kF32));
  }

  // The fused op's output equals the unfused pass's bit for bit.
  static void ExpectBitForBit(const HostE4m3Rows& fused, const HostE4m3Rows& unfused) {
    EXPECT_TRUE(fused.scales == unfused.scales) << "row scales differ";
    size_t mismatches = 0;
    for (size_t index = 0; index < fused.codes.size(); ++index) {
      mismatches += fused.codes[index] != unfused.codes[index];
    }
    EXPECT_EQ(mismatches, 0u) << "of " << fused.codes.size() << " codes";
  }
  // Against the CPU twin, which quantizes its f32 row where the GPU quantizes the row rounded to
  // bf16: each scale within the bf16 rounding of the row's amax (2^-8, stated as 5e-3), each
  // code at most one e4m3 step from the CPU's (the two rows cross a rounding boundary of e4m3
  // between them in ~2% of elements), and the dequantized rows within relative L2 3e-2 (each
  // step 6-12% of its element: ~0.015 measured on the host with emulated bf16 rounding).
  static void ExpectNearTheCpu(const HostE4m3Rows& gpu, const HostE4m3Rows& cpu, int cols) {
    for (size_t row = 0; row < gpu.scales.size(); ++row) {
      EXPECT_NEAR(gpu.scales[row] / cpu.scales[row], 1.0f, 5e-3) << "row " << row;
    }
    int worst_step = 0;
    std::vector<float> gpu_values(gpu.codes.size());
    std::vector<float> cpu_values(cpu.codes.size());
    for (size_t index = 0; index < gpu.codes.size(); ++index) {
      worst_step = std::max(
          worst_step, std::abs(E4m3Ordinal(gpu.codes[index]) - E4m3Ordinal(cpu.codes[index])));
      gpu_values[index] = E4m3ToFloat(gpu.codes[index]) * gpu.scales[index / cols];
      cpu_values[index] = E4m3ToFloat(cpu.codes[index]) * cpu.scales[index / cols];
    }
    EXPECT_LE(worst_step, 1);
    EXPECT_LE(RelL2(gpu_values, cpu_values), 3e-2);
  }
};

// SiluMul into a quantized activation, at every launch: decode rows and a long prefill (a block
// a row either way, vectors held in registers), a width past the vector kernel's reach and an
// odd width (the scalar kernel), codes at a row stride and start not multiples of 8 (byte
// stores); with and without a folded norm's scale. Bit for bit the bf16 SiluMul followed by the
// GEMM's quantizing pass, and near the CPU twin (ExpectNearTheCpu).
TEST_F(CudaE4m3ActivationTest, SiluMulIntoE4m3IsTheUnfusedPassBitForBit) {
  struct Case {
    int rows, width, offset, pad;
    bool norm;
  };
  for (const Case& c : std::vector<Case>{{1, 14336, 0, 0, true},
                                         {64, 14336, 0, 0, true},
                                         {300, 14336, 0, 0, true},
                                         {19, 1000, 0, 0, false},
                                         {19, 999, 0, 0, true},
                                         {3, 20000, 0, 0, true},
                                         {5, 1024, 4, 12, true}}) {
    SCOPED_TRACE(std::to_string(c.rows) + " x " + std::to_string(c.width) +
                 (c.norm ? ", folded norm" : "") + (c.pad > 0 ? ", strided codes" : ""));
    const int hidden = 4096;
    const float eps = 1e-5f;
    const auto residual = Random(static_cast<size_t>(c.rows) * hidden, 3.0f);
    const auto gate_up = Random(static_cast<size_t>(c.rows) * 2 * c.width, 2.0f);
    Tensor cpu_residual = Cpu(residual, {c.rows, hidden});
    Tensor gpu_residual = Gpu(residual, {c.rows, hidden});
    const RowRms gpu_norm = c.norm ? RowRms{&gpu_residual, eps} : RowRms{};
    const RowRms cpu_norm = c.norm ? RowRms{&cpu_residual, eps} : RowRms{};
    Tensor gpu_gate_up = Gpu(gate_up, {c.rows, 2 * c.width});

    Tensor fused = GpuE4m3(c.rows, c.width, c.offset, c.pad);
    gpu_->SiluMul(gpu_gate_up, fused, gpu_norm);
    Tensor bf16_out = gpu_->Allocate({c.rows, c.width}, DType::kBF16);
    gpu_->SiluMul(gpu_gate_up, bf16_out, gpu_norm);
    const HostE4m3Rows got = DownloadE4m3(fused);
    ExpectBitForBit(got, QuantizeOnGpu(bf16_out));

    Tensor cpu_out = CpuE4m3(c.rows, c.width);
    cpu_->SiluMul(Cpu(gate_up, {c.rows, 2 * c.width}), cpu_out, cpu_norm);
    ExpectNearTheCpu(got, HostOf(cpu_out), c.width);
  }
}

// RmsNorm into a quantized activation at each of the bf16 RmsNorm's kernels (16-byte vectors
// at 1, 2 and 4 a thread; the shared-memory row past that and at odd widths), strided codes
// included: bit for bit the bf16 RmsNorm followed by the GEMM's quantizing pass, and near the
// CPU twin.
TEST_F(CudaE4m3ActivationTest, RmsNormIntoE4m3IsTheUnfusedPassBitForBit) {
  struct Case {
    int rows, width, offset, pad;
  };
  for (const Case& c : std::vector<Case>{{1, 4096, 0, 0},
                                         {37, 2048, 0, 0},
                                         {300, 4096, 0, 0},
                                         {7, 1000, 0, 0},
                                         {7, 8200, 0, 0},
                                         {5, 999, 0, 0},
                                         {5, 1024, 4, 12}}) {
    SCOPED_TRACE(std::to_string(c.rows) + " x " + std::to_string(c.width) +
                 (c.pad > 0 ? ", strided codes" : ""));
    const auto x = Random(static_cast<size_t>(c.rows) * c.width, 3.0f);
    const auto weight = Random(c.width);
    Tensor gpu_x = Gpu(x, {c.rows, c.width});
    Tensor gpu_weight = Gpu(weight, {c.width});

    Tensor fused = GpuE4m3(c.rows, c.width, c.offset, c.pad);
    gpu_->RmsNorm(gpu_x, gpu_weight, 1e-5f, fused);
    Tensor bf16_out = gpu_->Allocate({c.rows, c.width}, DType::kBF16);
    gpu_->RmsNorm(gpu_x, gpu_weight, 1e-5f, bf16_out);
    const HostE4m3Rows got = DownloadE4m3(fused);
    ExpectBitForBit(got, QuantizeOnGpu(bf16_out));

    Tensor cpu_out = CpuE4m3(c.rows, c.width);
    cpu_->RmsNorm(Cpu(x, {c.rows, c.width}), Cpu(weight, {c.width}), 1e-5f, cpu_out);
    ExpectNearTheCpu(got, HostOf(cpu_out), c.width);
  }
}

// The MLP's down half with FP8 weights as the model runs it: LinearSiluMul into a quantized
// activation, then LinearAdd over it, at one row (where bf16 weights take the gated skinny
// kernel), decode and prefill rows. The GEMM takes the quantized activation as it is: its output
// is the unfused path's (bf16 SiLU, the GEMM quantizing it: the same codes through the same
// plan; relative L2 1e-6), and the CPU twin's within kBf16Tolerance.
TEST_F(CudaE4m3ActivationTest, Fp8MlpOverAQuantizedActivationIsTheUnfusedMlp) {
  for (const auto& [rows, f, d] : std::vector<std::tuple<int, int, int>>{
           {1, 1024, 512}, {16, 1024, 512}, {64, 2048, 1024}, {600, 1024, 512}}) {
    SCOPED_TRACE(std::to_string(rows) + " x " + std::to_string(f) + " x " + std::to_string(d));
    const float eps = 1e-5f;
    const auto x = Random(static_cast<size_t>(rows) * d, 2.0f);
    const auto gate_up_w = Random(static_cast<size_t>(2 * f) * d, 0.05f);
    const auto down_w = Random(static_cast<size_t>(d) * f, 0.05f);
    const auto base = Random(static_cast<size_t>(rows) * d);
    Tensor gpu_x = Gpu(x, {rows, d});
    const Tensor gpu_gate_up_w = gpu_->QuantizeWeightE4m3(Gpu(gate_up_w, {2 * f, d}));
    const Tensor gpu_down_w = gpu_->QuantizeWeightE4m3(Gpu(down_w, {d, f}));
    Tensor gate_up = gpu_->Allocate({rows, 2 * f}, DType::kBF16);
    {
      // A shape's first call plans its GEMM (timing candidates on that call): planned here, both
      // paths below run the same plans.
      Tensor act = gpu_->Allocate({rows, f}, DType::kBF16);
      gpu_->LinearSiluMul(gpu_x, gpu_gate_up_w, gate_up, act, RowRms{&gpu_x, eps});
      Tensor sink = Gpu(base, {rows, d});
      gpu_->LinearAdd(act, gpu_down_w, sink);
    }

    Tensor act_e4m3 = GpuE4m3(rows, f);
    gpu_->LinearSiluMul(gpu_x, gpu_gate_up_w, gate_up, act_e4m3, RowRms{&gpu_x, eps});
    Tensor fused = Gpu(base, {rows, d});
    gpu_->LinearAdd(act_e4m3, gpu_down_w, fused);

    Tensor act = gpu_->Allocate({rows, f}, DType::kBF16);
    gpu_->LinearSiluMul(gpu_x, gpu_gate_up_w, gate_up, act, RowRms{&gpu_x, eps});
    ExpectBitForBit(DownloadE4m3(act_e4m3), QuantizeOnGpu(act));
    Tensor unfused = Gpu(base, {rows, d});
    gpu_->LinearAdd(act, gpu_down_w, unfused);
    const std::vector<float> got = Download(fused);
    EXPECT_LE(RelL2(got, Download(unfused)), 1e-6);

    Tensor cpu_x = Cpu(x, {rows, d});
    const Tensor cpu_gate_up_w = cpu_->QuantizeWeightE4m3(Cpu(gate_up_w, {2 * f, d}));
    const Tensor cpu_down_w = cpu_->QuantizeWeightE4m3(Cpu(down_w, {d, f}));
    Tensor cpu_gate_up = Tensor::Empty({rows, 2 * f}, DType::kF32);
    Tensor cpu_act = CpuE4m3(rows, f);
    cpu_->LinearSiluMul(cpu_x, cpu_gate_up_w, cpu_gate_up, cpu_act, RowRms{&cpu_x, eps});
    Tensor cpu_out = Cpu(base, {rows, d});
    cpu_->LinearAdd(cpu_act, cpu_down_w, cpu_out);
    // The CPU quantizes its f32 activation, the GPU the bf16 one: codes a step apart at rounding
    // boundaries, as in the quantized rows' test above (its 3e-2); 0.013-0.017 in record
    // 2026-12-07-h100-fp8-fused-activations-tests.
    EXPECT_LE(RelL2(got, Values(cpu_out)), 3e-2);
  }
}

// The device code the GPU loaded (device_image.h) is of its own family or older, and the
// features the launch paths choose by agree with it: a build that runs sm_90a code on an sm_90
// device takes the Hopper prefill kernel and k splits; older code takes neither.
TEST(CudaDeviceImageTest, LoadedImageMatchesTheDeviceAndThePathsChosen) {
  SIEVE_REQUIRE_GPU();
  int device = 0;
  ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
  cudaDeviceProp props{};
  ASSERT_EQ(cudaGetDeviceProperties(&props, device), cudaSuccess);
  const int arch = cuda::LoadedImageArch();
  EXPECT_GE(arch, 800);
  EXPECT_LE(arch, props.major * 100 + props.minor * 10);
  EXPECT_EQ(arch % 10, 0);
  if (cuda::LoadedImageIsSm90a()) {
    EXPECT_EQ(arch, 900);
  }
  EXPECT_EQ(cuda::PrefillAttentionSm90Supported(),
            props.major == 9 && props.minor == 0 && cuda::LoadedImageIsSm90a());
  const std::vector<int> splits = cuda::SkinnyGemmSplits(4096);
  EXPECT_EQ(splits.front(), 1);
  EXPECT_EQ(splits.size() > 1, arch >= 900);
  std::printf("device sm_%d%d runs code built for sm_%d%s\n", props.major, props.minor, arch / 10,
              cuda::LoadedImageIsSm90a() ? "a" : "");
}

// Batch invariance (Backend::SetBatchInvariant; README_gemm.md "Batch invariance"): through the
// backend's ops, a row gives the same output bits alone (1 row, the first or any), among 37 and
// among 300 as among 1024: Linear over bf16 and (where the GPU has FP8) e4m3 weights, LinearAdd,
// and LinearSiluMul with a folded norm, whose one-row fused form is off in this mode.
TEST_F(CudaDenseTest, BatchInvariantOpsGiveEachRowTheSameBitsAtAnyRowCount) {
  ASSERT_TRUE(gpu_->SetBatchInvariant(true).ok());
  constexpr int kRows = 1024, kInner = 1024, kCols = 1536, kFfn = 1408;
  const Tensor x = Gpu(Random(static_cast<size_t>(kRows) * kInner), {kRows, kInner});
  const Tensor w = Gpu(Random(static_cast<size_t>(kCols) * kInner, 0.05f), {kCols, kInner});
  const Tensor gate_up_w =
      Gpu(Random(static_cast<size_t>(2 * kFfn) * kInner, 0.05f), {2 * kFfn, kInner});
  const std::vector<float> base = Random(static_cast<size_t>(kRows) * kCols);
  std::vector<std::pair<std::string, std::function<Tensor(const Tensor&, int, int)>>> ops;
  ops.emplace_back("Linear", [&](const Tensor& rows, int, int m) {
    Tensor out = gpu_->Allocate({m, kCols}, DType::kBF16);
    gpu_->Linear(rows, w, out);
    return out;
  });
  ops.emplace_back("Linear f32 out", [&](const Tensor& rows, int, int m) {
    Tensor out = gpu_->Allocate({m, kCols}, DType::kF32);
    gpu_->Linear(rows, w, out);
    return out;
  });
  ops.emplace_back("LinearAdd", [&](const Tensor& rows, int first, int m) {
    Tensor out = Gpu(std::vector<float>(base.begin() + static_cast<int64_t>(first) * kCols,
                                        base.begin() + static_cast<int64_t>(first + m) * kCols),
                     {m, kCols});
    gpu_->LinearAdd(rows, w, out);
    return out;
  });
  ops.emplace_back("LinearSiluMul", [&](const Tensor& rows, int, int m) {
    Tensor gate_up = gpu_->Allocate({m, 2 * kFfn}, DType::kBF16);
    Tensor out = gpu_->Allocate({m, kFfn}, DType::kBF16);
    gpu_->LinearSiluMul(rows, gate_up_w, gate_up, out, RowRms{&rows, 1e-5f});
    return out;
  });
  Tensor fp8_w;
  if (cuda::Fp8GemmRunner::DeviceSupportsFp8()) {
    fp8_w = gpu_->QuantizeWeightE4m3(w);
    ops.emplace_back("Linear e4m3", [&](const Tensor& rows, int, int m) {
      Tensor out = gpu_->Allocate({m, kCols}, DType::kBF16);
      gpu_->Linear(rows, fp8_w, out);
      return out;
    });
  }
  const int picked = static_cast<int>(rng_() % kRows);
  for (const auto& [name, op] : ops) {
    SCOPED_TRACE(name);
    const std::vector<float> all = Download(op(x, 0, kRows));
    const int64_t width = static_cast<int64_t>(all.size()) / kRows;
    for (const auto& [first, m] : std::vector<std::pair<int, int>>{
             {0, 1}, {picked, 1}, {kRows - 1, 1}, {0, 37}, {kRows - 300, 300}}) {
      const std::vector<float> some = Download(op(x.Rows(first, first + m), first, m));
      ASSERT_EQ(static_cast<int64_t>(some.size()), width * m);
      for (int row = 0; row < m; ++row) {
        ASSERT_TRUE(std::equal(some.begin() + row * width, some.begin() + (row + 1) * width,
                               all.begin() + (first + row) * width))
            << "row " << first + row << " among " << m << " differs from it among " << kRows;
      }
    }
  }
}

}  // namespace
}  // namespace sieve
