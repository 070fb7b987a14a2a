// Eight bf16 values in one 16-byte word and eight floats, both ways: the vector accesses of the
// element-wise kernels (dense_kernels.cu), the score pass (sparsity_kernels.cu) and the row RMS
// (row_rms.cuh). Element i of the floats is element i of the row.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace sieve::cuda {

__device__ __forceinline__ void Unpack8(const uint4& raw, float (&out)[8]) {
  const auto* pairs = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 pair = __bfloat1622float2(pairs[i]);
    out[2 * i] = pair.x;
    out[2 * i + 1] = pair.y;
  }
}

// Rounds each float to the nearest bf16.
__device__ __forceinline__ uint4 Pack8(const float (&in)[8]) {
  uint4 raw;
  auto* pairs = reinterpret_cast<__nv_bfloat162*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) pairs[i] = __floats2bfloat162_rn(in[2 * i], in[2 * i + 1]);
  return raw;
}

// SiluMul of eight pairs with a folded RMSNorm's row scale s: silu(gate s) (up s), rounded to bf16.
// One function for the SiLU kernel and the skinny GEMM's gated input, so both round the same bits.
__device__ __forceinline__ uint4 SiluMul8(const uint4& gate_raw, const uint4& up_raw, float s) {
  float g[8], u[8];
  Unpack8(gate_raw, g);
  Unpack8(up_raw, u);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const float gate = g[i] * s;
    g[i] = gate / (1.0f + __expf(-gate)) * (u[i] * s);
  }
  return Pack8(g);
}

}  // namespace sieve::cuda
