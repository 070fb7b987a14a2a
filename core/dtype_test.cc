#include "core/dtype.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "core/testing.h"

namespace sieve {
namespace {

TEST(DTypeTest, Bf16RoundTripIsWithinHalfUlp) {
  auto rng = testing::MakeRng();
  std::normal_distribution<float> normal(0.0f, 100.0f);
  for (int trial = 0; trial < 10000; ++trial) {
    const float value = normal(rng);
    const float back = Bf16ToFloat(FloatToBf16(value));
    EXPECT_LE(std::abs(back - value), std::abs(value) * (1.0f / 256.0f)) << value;
  }
}

TEST(DTypeTest, Bf16RoundsToNearestEven) {
  // 1 + 2^-8 lies exactly between two bf16 values (1 and 1 + 2^-7): ties go to even (1).
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(1.0f + std::ldexp(1.0f, -8))), 1.0f);
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(1.0f + 3 * std::ldexp(1.0f, -8))), 1.0f + std::ldexp(1.0f, -6));
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(std::numeric_limits<float>::quiet_NaN()))));
}

TEST(DTypeTest, F16RoundTripAndSpecials) {
  auto rng = testing::MakeRng();
  std::uniform_real_distribution<float> uniform(-60000.0f, 60000.0f);
  for (int trial = 0; trial < 10000; ++trial) {
    const float value = uniform(rng);
    const float back = F16ToFloat(FloatToF16(value));
    EXPECT_LE(std::abs(back - value), std::abs(value) * (1.0f / 1024.0f)) << value;
  }
  EXPECT_EQ(F16ToFloat(FloatToF16(65504.0f)), 65504.0f);
  EXPECT_TRUE(std::isinf(F16ToFloat(FloatToF16(1e6f))));
  EXPECT_EQ(F16ToFloat(FloatToF16(std::ldexp(1.0f, -24))), std::ldexp(1.0f, -24));  // subnormal
  EXPECT_EQ(F16ToFloat(0x3c00), 1.0f);
  EXPECT_EQ(F16ToFloat(0xc000), -2.0f);
}

TEST(DTypeTest, ParseNames) {
  EXPECT_EQ(*ParseDType("BF16"), DType::kBF16);
  EXPECT_EQ(*ParseDType("float32"), DType::kF32);
  EXPECT_FALSE(ParseDType("F8_E4M3").ok());
}

}  // namespace
}  // namespace sieve
