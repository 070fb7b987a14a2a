// Eight entries' elements of an FP8 KV pool (PoolView: e4m3 values with one scale per layer and
// KV head) and the bf16 or f32 values they stand for. Quantizing is the CPU twin's
// (backend/cpu/cpu_kv_pool.h) float for float: x * (1 / scale), rounded to nearest even and
// saturated at 448 (core/float8.h).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "backend/cuda/bf16x8.cuh"

namespace sieve::cuda {

// The e4m3 bytes of x[i] * inverse, element i in byte i (little end first).
__device__ __forceinline__ uint2 QuantizeE4m3x8(const float (&x)[8], float inverse) {
  uint32_t words[2] = {0, 0};
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const uint32_t byte =
        __nv_cvt_float_to_fp8(__fmul_rn(x[i], inverse), __NV_SATFINITE, __NV_E4M3);
    words[i / 4] |= byte << (8 * (i % 4));
  }
  return make_uint2(words[0], words[1]);
}

// The e4m3 values of eight bytes as floats, unscaled (exact: e4m3 is a subset of f16).
__device__ __forceinline__ void E4m3x8ToFloat(uint2 bytes, float (&out)[8]) {
  const uint32_t words[2] = {bytes.x, bytes.y};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const auto pair = static_cast<__nv_fp8x2_storage_t>(words[i / 2] >> (16 * (i % 2)));
    const __half2 halves(__nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3));
    const float2 values = __half22float2(halves);
    out[2 * i] = values.x;
    out[2 * i + 1] = values.y;
  }
}

// The e4m3 values of eight bytes as eight bf16 in one 16-byte word, unscaled (exact: e4m3 is a
// subset of bf16), for the tensor-core tiles of decode attention.
__device__ __forceinline__ uint4 E4m3x8ToBf16x8(uint2 bytes) {
  float values[8];
  E4m3x8ToFloat(bytes, values);
  return Pack8(values);
}

}  // namespace sieve::cuda
