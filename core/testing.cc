#include "core/testing.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace sieve::testing {

namespace {
uint64_t g_last_seed = 0;
}

std::mt19937_64 MakeRng() {
  uint64_t seed;
  if (const char* env = std::getenv("SIEVE_TEST_SEED"); env && *env) {
    seed = std::strtoull(env, nullptr, 10);
  } else {
    std::random_device device;
    seed = (static_cast<uint64_t>(device()) << 32) ^ device();
  }
  g_last_seed = seed;
  ::testing::Test::RecordProperty("seed", std::to_string(seed));
  std::printf("random seed %llu (replay with SIEVE_TEST_SEED=%llu)\n",
              static_cast<unsigned long long>(seed), static_cast<unsigned long long>(seed));
  return std::mt19937_64(seed);
}

uint64_t LastSeed() { return g_last_seed; }

void FillRandom(float* data, size_t count, std::mt19937_64& rng, float stddev) {
  std::normal_distribution<float> normal(0.0f, stddev);
  for (size_t index = 0; index < count; ++index) data[index] = normal(rng);
}

Tensor RandomTensor(std::vector<int64_t> shape, std::mt19937_64& rng, float stddev) {
  Tensor tensor = Tensor::Empty(std::move(shape), DType::kF32);
  FillRandom(tensor.data_as<float>(), static_cast<size_t>(tensor.numel()), rng, stddev);
  return tensor;
}

double RelativeL2Error(const float* actual, const float* expected, size_t count) {
  double diff = 0, ref = 0;
  for (size_t index = 0; index < count; ++index) {
    const double d = static_cast<double>(actual[index]) - expected[index];
    if (std::isnan(actual[index])) return INFINITY;
    diff += d * d;
    ref += static_cast<double>(expected[index]) * expected[index];
  }
  if (ref == 0) return diff == 0 ? 0 : INFINITY;
  return std::sqrt(diff / ref);
}

double MaxAbsError(const float* actual, const float* expected, size_t count) {
  double worst = 0;
  for (size_t index = 0; index < count; ++index) {
    if (std::isnan(actual[index])) return INFINITY;
    worst = std::max(worst, std::abs(static_cast<double>(actual[index]) - expected[index]));
  }
  return worst;
}

}  // namespace sieve::testing
