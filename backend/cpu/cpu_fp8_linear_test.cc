// The CPU's FP8 weights (Backend::QuantizeWeightE4m3 and the linears over its result), on fresh
// random inputs, against a double-precision reference built from core/float8.h's row
// quantization: out[t][n] = sx[t] sw[n] sum_k e4m3(x)[t][k] e4m3(w)[n][k].
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <tuple>
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

}  // namespace
}  // namespace sieve
