// Small fp32 kernels shared by the CPU backend's ops. Written so that GCC vectorises them at -O2
// and later (independent partial sums instead of one serial accumulator).
#pragma once

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

// y += alpha * x
inline void Axpy(float alpha, const float* x, float* y, int64_t count) {
  for (int64_t index = 0; index < count; ++index) y[index] += alpha * x[index];
}

}  // namespace sieve::cpu
