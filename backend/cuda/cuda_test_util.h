// Shared by the CUDA comparison tests: skip without a GPU, move data between host f32 and device
// bf16, and compare against the CPU backend with a stated tolerance.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "core/dtype.h"
#include "core/testing.h"

namespace sieve::cuda::testing {

inline bool HaveGpu() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

#define SIEVE_REQUIRE_GPU()                                                         \
  if (!::sieve::cuda::testing::HaveGpu()) {                                         \
    GTEST_SKIP() << "no CUDA device: this comparison test runs on the GPU machine"; \
  }

// Owns a device buffer of `count` elements of T.
template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t count) : count_(count) {
    SIEVE_CUDA_CHECK(cudaMalloc(&data_, std::max<size_t>(1, count) * sizeof(T)));
  }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) {
    SIEVE_CUDA_CHECK(
        cudaMemcpy(data_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  ~DeviceBuffer() { cudaFree(data_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  T* get() const { return data_; }
  size_t size() const { return count_; }
  std::vector<T> ToHost() const {
    std::vector<T> host(count_);
    SIEVE_CUDA_CHECK(cudaDeviceSynchronize());
    SIEVE_CUDA_CHECK(cudaMemcpy(host.data(), data_, count_ * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }

 private:
  T* data_ = nullptr;
  size_t count_;
};

// f32 values rounded to bf16 (what the GPU sees) and the same values back as f32 (what the CPU
// reference gets), so both compute from identical inputs.
inline std::vector<__nv_bfloat16> ToBf16(const std::vector<float>& values) {
  std::vector<__nv_bfloat16> out(values.size());
  for (size_t index = 0; index < values.size(); ++index) {
    __nv_bfloat16_raw raw;
    raw.x = FloatToBf16(values[index]);
    out[index] = __nv_bfloat16(raw);
  }
  return out;
}
inline std::vector<float> ToFloat(const std::vector<__nv_bfloat16>& values) {
  std::vector<float> out(values.size());
  for (size_t index = 0; index < values.size(); ++index) {
    out[index] = Bf16ToFloat(static_cast<__nv_bfloat16_raw>(values[index]).x);
  }
  return out;
}
// Rounds in place to bf16-representable values.
inline void RoundToBf16(std::vector<float>& values) {
  for (float& value : values) value = Bf16ToFloat(FloatToBf16(value));
}

}  // namespace sieve::cuda::testing
