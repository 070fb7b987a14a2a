#include "core/float8.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "core/tensor.h"
#include "core/testing.h"

namespace sieve {
namespace {

// The finite non-negative e4m3 values with their codes, ascending (0x00 .. 0x7e).
std::vector<std::pair<float, uint8_t>> FiniteMagnitudes() {
  std::vector<std::pair<float, uint8_t>> values;
  for (int code = 0; code <= 0x7e; ++code) {
    values.emplace_back(E4m3ToFloat(static_cast<uint8_t>(code)), static_cast<uint8_t>(code));
  }
  return values;
}

// The reference rounding, by search: the nearest finite value, ties to the even code (e4m3's
// mantissa's last bit is the code's), past 448 saturating.
uint8_t NearestE4m3(float value) {
  static const std::vector<std::pair<float, uint8_t>> magnitudes = FiniteMagnitudes();
  const uint8_t sign = std::signbit(value) ? 0x80 : 0x00;
  const float magnitude = std::fabs(value);
  if (magnitude >= kE4m3Max) return sign | 0x7e;
  auto above = std::lower_bound(magnitudes.begin(), magnitudes.end(), magnitude,
                                [](const auto& entry, float v) { return entry.first < v; });
  if (above->first == magnitude) return sign | above->second;
  const auto below = above - 1;
  const float down = magnitude - below->first;
  const float up = above->first - magnitude;
  if (down < up) return sign | below->second;
  if (up < down) return sign | above->second;
  return sign | ((below->second & 1) == 0 ? below->second : above->second);
}

TEST(Float8Test, TheCodesAreE4m3fn) {
  EXPECT_EQ(E4m3ToFloat(0x00), 0.0f);
  EXPECT_EQ(E4m3ToFloat(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(E4m3ToFloat(0x08), std::ldexp(1.0f, -6));  // smallest normal
  EXPECT_EQ(E4m3ToFloat(0x38), 1.0f);
  EXPECT_EQ(E4m3ToFloat(0x7e), 448.0f);
  EXPECT_EQ(E4m3ToFloat(0xfe), -448.0f);
  EXPECT_TRUE(std::isnan(E4m3ToFloat(0x7f)));
  EXPECT_TRUE(std::isnan(E4m3ToFloat(0xff)));
  // Strictly increasing over the finite non-negative codes.
  const auto magnitudes = FiniteMagnitudes();
  for (size_t index = 1; index < magnitudes.size(); ++index) {
    EXPECT_LT(magnitudes[index - 1].first, magnitudes[index].first) << index;
  }
}

TEST(Float8Test, EveryFiniteCodeRoundTrips) {
  for (int code = 0; code < 256; ++code) {
    if ((code & 0x7f) == 0x7f) continue;
    EXPECT_EQ(FloatToE4m3(E4m3ToFloat(static_cast<uint8_t>(code))), code) << code;
  }
}

TEST(Float8Test, RoundsToNearestEvenAndSaturates) {
  // Every midpoint between neighbours, and points just beside it.
  const auto magnitudes = FiniteMagnitudes();
  for (size_t index = 1; index < magnitudes.size(); ++index) {
    const float low = magnitudes[index - 1].first;
    const float high = magnitudes[index].first;
    const float middle = 0.5f * (low + high);
    for (const float value : {middle, std::nextafter(middle, 0.0f), std::nextafter(middle, 1e9f)}) {
      EXPECT_EQ(FloatToE4m3(value), NearestE4m3(value)) << value;
      EXPECT_EQ(FloatToE4m3(-value), NearestE4m3(-value)) << -value;
    }
  }
  // Fresh random values over the whole range, subnormals to past the largest.
  auto rng = testing::MakeRng();
  std::uniform_real_distribution<float> exponent(-14.0f, 10.0f);
  for (int trial = 0; trial < 200000; ++trial) {
    const float value = std::exp2(exponent(rng)) * (trial % 2 == 0 ? 1.0f : -1.0f);
    ASSERT_EQ(FloatToE4m3(value), NearestE4m3(value)) << value;
  }
  EXPECT_EQ(FloatToE4m3(464.0f), 0x7e);  // the tie above 448 would round to 480: saturates
  EXPECT_EQ(FloatToE4m3(1e30f), 0x7e);
  EXPECT_EQ(FloatToE4m3(std::numeric_limits<float>::infinity()), 0x7e);
  EXPECT_EQ(FloatToE4m3(-std::numeric_limits<float>::infinity()), 0xfe);
  EXPECT_EQ(FloatToE4m3(std::numeric_limits<float>::quiet_NaN()), 0x7f);
  EXPECT_EQ(FloatToE4m3(std::ldexp(1.0f, -11)), 0x00);  // a quarter of the smallest: to zero
  EXPECT_EQ(FloatToE4m3(-0.0f), 0x80);
}

TEST(Float8Test, QuantizedRowsReadBackWithinHalfAStep) {
  auto rng = testing::MakeRng();
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const float stddev : {1e-4f, 0.02f, 1.0f, 300.0f}) {
    std::vector<float> row(1000);
    for (float& value : row) value = normal(rng) * stddev;
    std::vector<uint8_t> codes(row.size());
    const float scale = QuantizeRowE4m3(row.data(), static_cast<int64_t>(row.size()), codes.data());
    float amax = 0.0f;
    for (const float value : row) amax = std::max(amax, std::fabs(value));
    EXPECT_EQ(scale, amax / kE4m3Max);
    bool hit_max = false;
    for (size_t index = 0; index < row.size(); ++index) {
      const float back = E4m3ToFloat(codes[index]) * scale;
      // e4m3 keeps 3 mantissa bits: within 2^-4 of the value for normals, and within half the
      // subnormal step (2^-10 of 448 units) below.
      EXPECT_LE(std::fabs(back - row[index]),
                std::max(std::fabs(row[index]) / 16.0f, std::ldexp(1.0f, -10) * scale) * 1.0001f)
          << row[index];
      hit_max |= (codes[index] & 0x7f) == 0x7e;
    }
    EXPECT_TRUE(hit_max) << "the row's largest magnitude maps to 448";
  }
  std::vector<float> zeros(16, 0.0f);
  std::vector<uint8_t> codes(16, 0xff);
  const float scale = QuantizeRowE4m3(zeros.data(), 16, codes.data());
  EXPECT_TRUE(std::isfinite(scale));
  EXPECT_GT(scale, 0.0f);
  for (const uint8_t code : codes) EXPECT_EQ(code, 0x00);
}

TEST(Float8Test, RowScalesFollowRowViews) {
  Tensor codes = Tensor::Empty({6, 4}, DType::kF8E4M3);
  Tensor scales = Tensor::Empty({6}, DType::kF32);
  for (int row = 0; row < 6; ++row) scales.data_as<float>()[row] = 0.5f + row;
  EXPECT_FALSE(codes.has_row_scales());
  const Tensor weight = codes.WithRowScales(scales);
  ASSERT_TRUE(weight.has_row_scales());
  const Tensor rows = weight.Rows(2, 5);
  ASSERT_TRUE(rows.has_row_scales());
  EXPECT_EQ(rows.row_scales().dim(0), 3);
  EXPECT_EQ(rows.row_scales().data_as<float>()[0], 2.5f);
  EXPECT_EQ(DTypeSize(DType::kF8E4M3), 1u);
  EXPECT_EQ(DTypeName(DType::kF8E4M3), "f8_e4m3");
}

}  // namespace
}  // namespace sieve
