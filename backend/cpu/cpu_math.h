// Small fp32 helpers shared by the CPU backend's ops (its dot products and weighted sums are in
// cpu_kernels.h).
#pragma once

#include <cmath>
#include <cstdint>

#include "backend/cpu/cpu_kernels.h"  // Dot

namespace sieve::cpu {

// 1 / sqrt(mean(x^2) + eps), the inverse RMS of one row as RmsNorm and the RowRms scaling of
// the folded-norm ops (SiluMul, RopeAndCacheWrite) both compute it: the sum of squares in double,
// the mean rounded to f32, then eps added, the square root taken and the reciprocal formed in f32.
inline float InvRms(const float* x, int64_t width, float eps) {
  double sum_squares = 0.0;
  for (int64_t index = 0; index < width; ++index) {
    sum_squares += static_cast<double>(x[index]) * x[index];
  }
  return 1.0f / std::sqrt(static_cast<float>(sum_squares / static_cast<double>(width)) + eps);
}

}  // namespace sieve::cpu
