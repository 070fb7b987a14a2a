// The CPU ops behind folded norms (model/README.md "Folded norms") on fresh random inputs, each
// against a straightforward double-precision reference: LinearAdd is out + x w^T, ScaleColumns
// is w diag(scale), SiluMul with a RowRms is silu(s gate) (s up) with s = 1 / sqrt(mean(x^2) +
// eps) of the norm row, and RmsNorm (which shares s's helper) is x s g. SiluMul's s is bitwise
// RmsNorm's inverse RMS. RoPE with a RowRms is tested in cpu_rope_test.cc.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "core/testing.h"

namespace sieve {
namespace {

constexpr float kEps = 1e-5f;

std::vector<float> Values(const Tensor& tensor) {
  std::vector<float> values(static_cast<size_t>(tensor.dim(0)) * tensor.dim(1));
  for (int64_t row = 0; row < tensor.dim(0); ++row) {
    const float* data = tensor.data_as<float>() + row * tensor.stride(0);
    std::copy(data, data + tensor.dim(1), values.begin() + row * tensor.dim(1));
  }
  return values;
}

// max |actual - expected| / max(1, |expected|).
double MaxRelError(const std::vector<float>& actual, const std::vector<double>& expected) {
  EXPECT_EQ(actual.size(), expected.size());
  double worst = 0;
  for (size_t index = 0; index < actual.size(); ++index) {
    if (std::isnan(actual[index])) return INFINITY;
    worst = std::max(worst, std::abs(actual[index] - expected[index]) /
                                std::max(1.0, std::abs(expected[index])));
  }
  return worst;
}

// [rows][width] N(0, 1) values, each row times its own factor in [e^-3, e^3]: rows of very
// different RMS, as a residual stream has.
Tensor ResidualRows(int64_t rows, int64_t width, std::mt19937_64& rng) {
  Tensor tensor = sieve::testing::RandomTensor({rows, width}, rng);
  std::uniform_real_distribution<double> log_scale(-3.0, 3.0);
  for (int64_t row = 0; row < rows; ++row) {
    const float factor = static_cast<float>(std::exp(log_scale(rng)));
    for (int64_t index = 0; index < width; ++index)
      tensor.data_as<float>()[row * width + index] *= factor;
  }
  return tensor;
}

// s of each row in double: 1 / sqrt(mean(x^2) + eps).
std::vector<double> InvRms(const Tensor& rows) {
  std::vector<double> scales(rows.dim(0));
  for (int64_t row = 0; row < rows.dim(0); ++row) {
    double sum_squares = 0;
    for (int64_t index = 0; index < rows.dim(1); ++index) {
      const double value = rows.data_as<float>()[row * rows.stride(0) + index];
      sum_squares += value * value;
    }
    scales[row] = 1.0 / std::sqrt(sum_squares / static_cast<double>(rows.dim(1)) + kEps);
  }
  return scales;
}

double Silu(double x) { return x / (1.0 + std::exp(-x)); }

TEST(CpuFoldedNormTest, LinearAddIsOutPlusProduct) {
  std::mt19937_64 rng = sieve::testing::MakeRng();
  auto cpu = MakeCpuBackend();
  constexpr int64_t kRows = 7, kInner = 200, kCols = 45;
  // x is a column view of a wider tensor (a row stride, as the q columns of qkv have).
  const Tensor wide = sieve::testing::RandomTensor({kRows, kInner + 24}, rng);
  const Tensor x = wide.Columns(8, 8 + kInner);
  const Tensor w = sieve::testing::RandomTensor({kCols, kInner}, rng);
  const Tensor out0 = sieve::testing::RandomTensor({kRows, kCols}, rng, 3.0f);
  Tensor out = cpu->Allocate({kRows, kCols}, DType::kF32);
  const std::vector<float> before = Values(out0);
  std::copy(before.begin(), before.end(), out.data_as<float>());
  cpu->LinearAdd(x, w, out);
  std::vector<double> expected(before.begin(), before.end());
  for (int64_t row = 0; row < kRows; ++row) {
    for (int64_t col = 0; col < kCols; ++col) {
      double sum = 0;
      for (int64_t k = 0; k < kInner; ++k) {
        sum += static_cast<double>(x.data_as<float>()[row * x.stride(0) + k]) *
               w.data_as<float>()[col * kInner + k];
      }
      expected[row * kCols + col] += sum;
    }
  }
  EXPECT_LE(MaxRelError(Values(out), expected), 1e-5);

  // Into zeros it is Linear, bitwise.
  Tensor zeros = cpu->Allocate({kRows, kCols}, DType::kF32);
  std::fill(zeros.data_as<float>(), zeros.data_as<float>() + zeros.numel(), 0.0f);
  Tensor product = cpu->Allocate({kRows, kCols}, DType::kF32);
  cpu->LinearAdd(x, w, zeros);
  cpu->Linear(x, w, product);
  EXPECT_EQ(Values(zeros), Values(product));
}

TEST(CpuFoldedNormTest, ScaleColumnsMultipliesEachColumn) {
  std::mt19937_64 rng = sieve::testing::MakeRng();
  auto cpu = MakeCpuBackend();
  constexpr int64_t kRows = 37, kCols = 53;
  Tensor w = sieve::testing::RandomTensor({kRows, kCols}, rng);
  const std::vector<float> before = Values(w);
  Tensor scale = cpu->Allocate({kCols}, DType::kF32);
  std::normal_distribution<float> normal(1.0f, 0.3f);
  for (int64_t col = 0; col < kCols; ++col) scale.data_as<float>()[col] = normal(rng);
  cpu->ScaleColumns(w, scale);
  // A double product of two floats is exact, so rounding it once is the f32 product: bitwise.
  std::vector<float> expected(before.size());
  for (int64_t row = 0; row < kRows; ++row) {
    for (int64_t col = 0; col < kCols; ++col) {
      expected[row * kCols + col] = static_cast<float>(
          static_cast<double>(before[row * kCols + col]) * scale.data_as<float>()[col]);
    }
  }
  EXPECT_EQ(Values(w), expected);
}

TEST(CpuFoldedNormTest, SiluMulScalesRowsByInverseRms) {
  std::mt19937_64 rng = sieve::testing::MakeRng();
  auto cpu = MakeCpuBackend();
  constexpr int64_t kRows = 9, kWidth = 70, kResidual = 96;
  const Tensor gate_up = ResidualRows(kRows, 2 * kWidth, rng);
  const Tensor residual = ResidualRows(kRows, kResidual, rng);
  const std::vector<double> s = InvRms(residual);
  for (const bool folded : {false, true}) {
    Tensor out = cpu->Allocate({kRows, kWidth}, DType::kF32);
    cpu->SiluMul(gate_up, out, folded ? RowRms{&residual, kEps} : RowRms{});
    std::vector<double> expected(kRows * kWidth);
    for (int64_t row = 0; row < kRows; ++row) {
      const double scale = folded ? s[row] : 1.0;
      for (int64_t index = 0; index < kWidth; ++index) {
        const double gate = gate_up.data_as<float>()[row * 2 * kWidth + index];
        const double up = gate_up.data_as<float>()[row * 2 * kWidth + kWidth + index];
        expected[row * kWidth + index] = Silu(scale * gate) * (scale * up);
      }
    }
    EXPECT_LE(MaxRelError(Values(out), expected), 1e-5) << (folded ? "folded" : "plain");
  }
}

// SiluMul's s is exactly RmsNorm's inverse RMS: with gate = up = x and norm rows x, SiluMul with
// the norm equals SiluMul of RmsNorm(x, 1) without one, bitwise (x s 1 is x s).
TEST(CpuFoldedNormTest, SiluMulScaleIsRmsNormsInverseRms) {
  std::mt19937_64 rng = sieve::testing::MakeRng();
  auto cpu = MakeCpuBackend();
  constexpr int64_t kRows = 11, kWidth = 64;
  const Tensor x = ResidualRows(kRows, kWidth, rng);
  Tensor ones = cpu->Allocate({kWidth}, DType::kF32);
  std::fill(ones.data_as<float>(), ones.data_as<float>() + kWidth, 1.0f);
  Tensor normed = cpu->Allocate({kRows, kWidth}, DType::kF32);
  cpu->RmsNorm(x, ones, kEps, normed);
  const auto twice = [&](const Tensor& rows) {
    Tensor both = cpu->Allocate({kRows, 2 * kWidth}, DType::kF32);
    for (int64_t row = 0; row < kRows; ++row) {
      const float* src = rows.data_as<float>() + row * kWidth;
      std::copy(src, src + kWidth, both.data_as<float>() + row * 2 * kWidth);
      std::copy(src, src + kWidth, both.data_as<float>() + row * 2 * kWidth + kWidth);
    }
    return both;
  };
  Tensor folded = cpu->Allocate({kRows, kWidth}, DType::kF32);
  Tensor plain = cpu->Allocate({kRows, kWidth}, DType::kF32);
  cpu->SiluMul(twice(x), folded, RowRms{&x, kEps});
  cpu->SiluMul(twice(normed), plain, RowRms{});
  EXPECT_EQ(Values(folded), Values(plain));
}

TEST(CpuFoldedNormTest, RmsNormMatchesDoubleReference) {
  std::mt19937_64 rng = sieve::testing::MakeRng();
  auto cpu = MakeCpuBackend();
  constexpr int64_t kRows = 6, kWidth = 80;
  const Tensor x = ResidualRows(kRows, kWidth, rng);
  Tensor weight = cpu->Allocate({kWidth}, DType::kF32);
  std::normal_distribution<float> normal(1.0f, 0.1f);
  for (int64_t index = 0; index < kWidth; ++index) weight.data_as<float>()[index] = normal(rng);
  const auto reference = [&](const Tensor& rows) {
    const std::vector<double> s = InvRms(rows);
    std::vector<double> expected(kRows * kWidth);
    for (int64_t row = 0; row < kRows; ++row) {
      for (int64_t index = 0; index < kWidth; ++index) {
        expected[row * kWidth + index] =
            s[row] * rows.data_as<float>()[row * kWidth + index] * weight.data_as<float>()[index];
      }
    }
    return expected;
  };
  Tensor out = cpu->Allocate({kRows, kWidth}, DType::kF32);
  cpu->RmsNorm(x, weight, kEps, out);
  EXPECT_LE(MaxRelError(Values(out), reference(x)), 1e-5);
}

}  // namespace
}  // namespace sieve
