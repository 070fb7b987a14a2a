// The CPU's FP8 weights (Backend::QuantizeWeightE4m3 and the linears over its result), on fresh
// random inputs, against a double-precision reference built from core/float8.h's row
// quantization: out[t][n] = sx[t] sw[n] sum_k e4m3(x)[t][k] e4m3(w)[n][k]. And quantized
// activations (RmsNorm and SiluMul into e4m3 with row scales): bit for bit the op into f32
// followed by that row quantization.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <tuple>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "core/float8.h"
#include "core/testing.h"

namespace sieve {
namespace {

struct Quantized {
  std::vector<uint8_t> codes;  // [rows][cols]
  std::vector<float> scales;   // [rows]
};

Quantized QuantizeRows(const Tensor& matrix) {
  const int64_t rows = matrix.dim(0);
  const int64_t cols = matrix.dim(1);
  Quantized q{std::vector<uint8_t>(static_cast<size_t>(rows * cols)),
              std::vector<float>(static_cast<size_t>(rows))};
  for (int64_t row = 0; row < rows; ++row) {
    q.scales[row] = QuantizeRowE4m3(matrix.data_as<float>() + row * matrix.stride(0), cols,
                                    q.codes.data() + row * cols);
  }
  return q;
}

std::vector<double> Reference(const Quantized& x, const Quantized& w, int64_t rows, int64_t cols,
                              int64_t inner) {
  std::vector<double> out(static_cast<size_t>(rows * cols));
  for (int64_t t = 0; t < rows; ++t) {
    for (int64_t n = 0; n < cols; ++n) {
      double sum = 0;
      for (int64_t k = 0; k < inner; ++k) {
        sum += static_cast<double>(E4m3ToFloat(x.codes[t * inner + k])) *
               E4m3ToFloat(w.codes[n * inner + k]);
      }
      out[t * cols + n] = sum * x.scales[t] * w.scales[n];
    }
  }
  return out;
}

double MaxRelError(const Tensor& actual, const std::vector<double>& expected) {
  double worst = 0;
  for (int64_t index = 0; index < actual.numel(); ++index) {
    const double value = actual.data_as<float>()[index];
    if (std::isnan(value)) return INFINITY;
    worst = std::max(worst,
                     std::abs(value - expected[index]) / std::max(1.0, std::abs(expected[index])));
  }
  return worst;
}

TEST(CpuFp8LinearTest, QuantizedWeightIsRowQuantization) {
  auto backend = MakeCpuBackend();
  auto rng = testing::MakeRng();
  const Tensor w = testing::RandomTensor({37, 96}, rng, 0.05f);
  const Tensor q = backend->QuantizeWeightE4m3(w);
  ASSERT_EQ(q.dtype(), DType::kF8E4M3);
  ASSERT_TRUE(q.has_row_scales());
  const Quantized expected = QuantizeRows(w);
  EXPECT_TRUE(std::equal(expected.codes.begin(), expected.codes.end(), q.data_as<uint8_t>()));
  EXPECT_TRUE(
      std::equal(expected.scales.begin(), expected.scales.end(), q.row_scales().data_as<float>()));
}

// A checkpoint's codes and row scales uploaded as they are (UploadWeightE4m3) are the weight the
// backend holds, bit for bit, and Linear over it is the scaled e4m3 product of those codes.
TEST(CpuFp8LinearTest, UploadedWeightIsTheCheckpointsCodesAndScales) {
  auto backend = MakeCpuBackend();
  auto rng = testing::MakeRng();
  const Tensor w_f32 = testing::RandomTensor({45, 80}, rng, 0.05f);
  const Quantized stored = QuantizeRows(w_f32);
  const Tensor w = backend->UploadWeightE4m3(stored.codes.data(), stored.scales.data(), 45, 80);
  ASSERT_EQ(w.dtype(), DType::kF8E4M3);
  ASSERT_TRUE(w.has_row_scales());
  EXPECT_TRUE(std::equal(stored.codes.begin(), stored.codes.end(), w.data_as<uint8_t>()));
  EXPECT_TRUE(
      std::equal(stored.scales.begin(), stored.scales.end(), w.row_scales().data_as<float>()));
  const Tensor x = testing::RandomTensor({6, 80}, rng, 3.0f);
  Tensor out = Tensor::Empty({6, 45}, DType::kF32);
  backend->Linear(x, w, out);
  EXPECT_LE(MaxRelError(out, Reference(QuantizeRows(x), stored, 6, 45, 80)), 1e-5);
}

// Linear and LinearAdd over an e4m3 weight are the scaled e4m3 product (f32 sums: 1e-5
// relative), within FP8's rounding of the unquantized product (relative L2 under 6%: e4m3 keeps
// 3 mantissa bits, ~3.6% rms each for x and w), and a row's result does not depend on the batch.
TEST(CpuFp8LinearTest, LinearIsTheScaledE4m3Product) {
  auto backend = MakeCpuBackend();
  auto rng = testing::MakeRng();
  const std::vector<std::tuple<int64_t, int64_t, int64_t>> shapes = {
      {1, 40, 64}, {7, 33, 128}, {70, 96, 272}};
  for (const auto& [rows, cols, inner] : shapes) {
    SCOPED_TRACE(::testing::Message() << rows << " x " << cols << " x " << inner);
    const Tensor x = testing::RandomTensor({rows, inner}, rng, 3.0f);
    const Tensor w_f32 = testing::RandomTensor({cols, inner}, rng, 0.05f);
    const Tensor w = backend->QuantizeWeightE4m3(w_f32);
    const std::vector<double> expected =
        Reference(QuantizeRows(x), QuantizeRows(w_f32), rows, cols, inner);

    Tensor out = Tensor::Empty({rows, cols}, DType::kF32);
    backend->Linear(x, w, out);
    EXPECT_LE(MaxRelError(out, expected), 1e-5);

    Tensor dense = Tensor::Empty({rows, cols}, DType::kF32);
    backend->Linear(x, w_f32, dense);
    const double fp8_error = testing::RelativeL2Error(out.data_as<float>(), dense.data_as<float>(),
                                                      static_cast<size_t>(out.numel()));
    EXPECT_LE(fp8_error, 0.06);
    EXPECT_GT(fp8_error, 0.0) << "the FP8 product is not the unquantized one";

    const Tensor base = testing::RandomTensor({rows, cols}, rng);
    Tensor sum = Tensor::Empty({rows, cols}, DType::kF32);
    std::copy(base.data_as<float>(), base.data_as<float>() + base.numel(), sum.data_as<float>());
    backend->LinearAdd(x, w, sum);
    std::vector<double> expected_sum(expected);
    for (size_t index = 0; index < expected_sum.size(); ++index) {
      expected_sum[index] += base.data_as<float>()[index];
    }
    EXPECT_LE(MaxRelError(sum, expected_sum), 1e-5);

    // The last row alone: bitwise its row of the batch.
    Tensor alone = Tensor::Empty({1, cols}, DType::kF32);
    backend->Linear(x.Rows(rows - 1, rows), w, alone);
    EXPECT_TRUE(std::equal(alone.data_as<float>(), alone.data_as<float>() + cols,
                           out.data_as<float>() + (rows - 1) * cols));
  }
}

// A quantized activation buffer of `rows` rows, [rows][cols] e4m3 with row scales, filled with
// random codes and scales so that an op that leaves any of it unwritten shows.
Tensor QuantizedActivation(int64_t rows, int64_t cols, std::mt19937_64& rng) {
  Tensor codes = Tensor::Empty({rows, cols}, DType::kF8E4M3);
  Tensor scales = Tensor::Empty({rows}, DType::kF32);
  for (int64_t index = 0; index < codes.numel(); ++index) {
    codes.data_as<uint8_t>()[index] = static_cast<uint8_t>(rng() & 0x77);
  }
  for (int64_t row = 0; row < rows; ++row) scales.data_as<float>()[row] = 1.0f + row;
  return codes.WithRowScales(scales);
}

// `actual`'s codes and row scales are `expected`'s bit for bit.
void ExpectQuantizedRows(const Tensor& actual, const Quantized& expected) {
  const int64_t rows = actual.dim(0);
  const int64_t cols = actual.dim(1);
  int mismatches = 0;
  for (int64_t row = 0; row < rows; ++row) {
    EXPECT_EQ(actual.row_scales().data_as<float>()[row], expected.scales[row]) << "row " << row;
    for (int64_t col = 0; col < cols; ++col) {
      mismatches += actual.data_as<uint8_t>()[row * actual.stride(0) + col] !=
                    expected.codes[row * cols + col];
    }
  }
  EXPECT_EQ(mismatches, 0);
}

// SiluMul into a quantized activation is SiluMul into f32 followed by the GEMM's row
// quantization, bit for bit, with and without a folded norm's row scale, into the first rows of a
// larger buffer (as the model's workspace is used).
TEST(CpuFp8ActivationTest, SiluMulIntoE4m3IsSiluMulThenQuantization) {
  auto backend = MakeCpuBackend();
  auto rng = testing::MakeRng();
  for (const auto& [rows, width] :
       std::vector<std::pair<int64_t, int64_t>>{{1, 64}, {9, 1000}, {70, 272}}) {
    for (const bool folded : {false, true}) {
      SCOPED_TRACE(::testing::Message() << rows << " x " << width << (folded ? ", folded" : ""));
      const Tensor gate_up = testing::RandomTensor({rows, 2 * width}, rng, 2.0f);
      const Tensor residual = testing::RandomTensor({rows, 96}, rng, 3.0f);
      const RowRms norm = folded ? RowRms{&residual, 1e-5f} : RowRms{};
      Tensor plain = Tensor::Empty({rows, width}, DType::kF32);
      backend->SiluMul(gate_up, plain, norm);
      Tensor buffer = QuantizedActivation(rows + 5, width, rng);
      Tensor fused = buffer.Rows(0, rows);
      backend->SiluMul(gate_up, fused, norm);
      ExpectQuantizedRows(fused, QuantizeRows(plain));
    }
  }
}

// RmsNorm into a quantized activation is RmsNorm into f32 followed by the row quantization.
TEST(CpuFp8ActivationTest, RmsNormIntoE4m3IsRmsNormThenQuantization) {
  auto backend = MakeCpuBackend();
  auto rng = testing::MakeRng();
  for (const auto& [rows, width] :
       std::vector<std::pair<int64_t, int64_t>>{{1, 64}, {13, 400}, {70, 256}}) {
    SCOPED_TRACE(::testing::Message() << rows << " x " << width);
    const Tensor x = testing::RandomTensor({rows, width}, rng, 3.0f);
    const Tensor weight = testing::RandomTensor({width}, rng, 1.0f);
    Tensor plain = Tensor::Empty({rows, width}, DType::kF32);
    backend->RmsNorm(x, weight, 1e-5f, plain);
    Tensor buffer = QuantizedActivation(rows + 3, width, rng);
    Tensor fused = buffer.Rows(0, rows);
    backend->RmsNorm(x, weight, 1e-5f, fused);
    ExpectQuantizedRows(fused, QuantizeRows(plain));
  }
}

// Linear, LinearAdd and LinearSiluMul over e4m3 weights take a quantized activation as it is:
// the MLP with its norm and SiLU into e4m3 gives the unfused MLP's output (each op into f32, each
// GEMM quantizing its input) bit for bit.
TEST(CpuFp8ActivationTest, LinearOverAQuantizedActivationIsTheUnfusedLinear) {
  auto backend = MakeCpuBackend();
  auto rng = testing::MakeRng();
  for (const auto& [rows, hidden, ffn] :
       std::vector<std::tuple<int64_t, int64_t, int64_t>>{{1, 64, 96}, {11, 128, 272}}) {
    SCOPED_TRACE(::testing::Message() << rows << " x " << hidden << " x " << ffn);
    const Tensor x = testing::RandomTensor({rows, hidden}, rng, 3.0f);
    const Tensor norm_weight = testing::RandomTensor({hidden}, rng, 1.0f);
    const Tensor gate_up_w =
        backend->QuantizeWeightE4m3(testing::RandomTensor({2 * ffn, hidden}, rng, 0.05f));
    const Tensor down_w =
        backend->QuantizeWeightE4m3(testing::RandomTensor({hidden, ffn}, rng, 0.05f));
    const Tensor base = testing::RandomTensor({rows, hidden}, rng);
    const RowRms folded{&x, 1e-5f};

    Tensor normed = Tensor::Empty({rows, hidden}, DType::kF32);
    backend->RmsNorm(x, norm_weight, 1e-5f, normed);
    Tensor gate_up = Tensor::Empty({rows, 2 * ffn}, DType::kF32);
    Tensor act = Tensor::Empty({rows, ffn}, DType::kF32);
    backend->LinearSiluMul(normed, gate_up_w, gate_up, act, folded);
    Tensor expected = Tensor::Empty({rows, hidden}, DType::kF32);
    std::copy(base.data_as<float>(), base.data_as<float>() + base.numel(),
              expected.data_as<float>());
    backend->LinearAdd(act, down_w, expected);

    Tensor normed_e4m3 = QuantizedActivation(rows, hidden, rng);
    backend->RmsNorm(x, norm_weight, 1e-5f, normed_e4m3);
    Tensor act_e4m3 = QuantizedActivation(rows, ffn, rng);
    backend->LinearSiluMul(normed_e4m3, gate_up_w, gate_up, act_e4m3, folded);
    Tensor got = Tensor::Empty({rows, hidden}, DType::kF32);
    std::copy(base.data_as<float>(), base.data_as<float>() + base.numel(), got.data_as<float>());
    backend->LinearAdd(act_e4m3, down_w, got);
    EXPECT_TRUE(std::equal(got.data_as<float>(), got.data_as<float>() + got.numel(),
                           expected.data_as<float>()));

    Tensor plain = Tensor::Empty({rows, hidden}, DType::kF32);
    backend->Linear(act, down_w, plain);
    Tensor quantized = Tensor::Empty({rows, hidden}, DType::kF32);
    backend->Linear(act_e4m3, down_w, quantized);
    EXPECT_TRUE(std::equal(quantized.data_as<float>(),
                           quantized.data_as<float>() + quantized.numel(), plain.data_as<float>()));
  }
}

}  // namespace
}  // namespace sieve
