// Helpers for Sieve's tests: fixture lookup that skips cleanly, fresh random inputs, and the
// error metrics every comparison test states its tolerance in.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "core/fixtures.h"
#include "core/tensor.h"

namespace sieve::testing {

// A generator seeded from the test's name and a fresh random device value, logged so that a
// failure can be replayed with SIEVE_TEST_SEED.
std::mt19937_64 MakeRng();
uint64_t LastSeed();

// A host f32 tensor of N(0, stddev) values.
Tensor RandomTensor(std::vector<int64_t> shape, std::mt19937_64& rng, float stddev = 1.0f);
void FillRandom(float* data, size_t count, std::mt19937_64& rng, float stddev = 1.0f);

// ||a - b|| / ||b|| over `count` floats (b is the reference); 0 when both are zero.
double RelativeL2Error(const float* actual, const float* expected, size_t count);
double MaxAbsError(const float* actual, const float* expected, size_t count);

}  // namespace sieve::testing
