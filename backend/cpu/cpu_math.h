// Small fp32 kernels shared by the CPU backend's ops. Written so that GCC vectorises them at -O2
// and later (independent partial sums instead of one serial accumulator).
#pragma once

#include <cmath>
#include <cstdint>

namespace sieve::cpu {

inline float Dot(const float* a, const float* b, int64_t count) {
  constexpr int kLanes = 16;
  float partial[kLanes] = {};
  int64_t index = 0;
  for (; index + kLanes <= count; index += kLanes) {
    for (int lane = 0; lane < kLanes; ++lane) partial[lane] += a[index + lane] * b[index + lane];
  }
  float sum = 0.0f;
  for (int lane = 0; lane < kLanes; ++lane) sum += partial[lane];
  for (; index < count; ++index) sum += a[index] * b[index];
  return sum;
}

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

// y += alpha * x
inline void Axpy(float alpha, const float* x, float* y, int64_t count) {
  for (int64_t index = 0; index < count; ++index) y[index] += alpha * x[index];
}

}  // namespace sieve::cpu
