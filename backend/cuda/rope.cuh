// Rotate-half RoPE of bf16 values, shared by the RoPE + cache-write kernel (kv_kernels.cu) and the
// fused RoPE of the decode attention kernel (decode_attention.cu). Both must write the same bits
// for the same token, so there is one formula, with the roundings spelled out: f32 products, one
// FMA, the result rounded to bf16 (round to nearest even).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace sieve::cuda::rope {

// Pair (a, b) = (x[i], x[i + d/2]) rotated by the angle whose cos and sin are c and s.
__device__ __forceinline__ void RotatePair(float a, float b, float c, float s, __nv_bfloat16& ra,
                                           __nv_bfloat16& rb) {
  ra = __float2bfloat16(__fmaf_rn(a, c, -__fmul_rn(b, s)));
  rb = __float2bfloat16(__fmaf_rn(b, c, __fmul_rn(a, s)));
}

// bf16 -> f32 is exact: the bf16 bits are the f32's upper half.
__device__ __forceinline__ float LowBf16(uint32_t word) { return __uint_as_float(word << 16); }
__device__ __forceinline__ float HighBf16(uint32_t word) {
  return __uint_as_float(word & 0xffff0000u);
}
__device__ __forceinline__ uint32_t PackPair(__nv_bfloat16 low, __nv_bfloat16 high) {
  return static_cast<uint32_t>(__bfloat16_as_ushort(low)) |
         (static_cast<uint32_t>(__bfloat16_as_ushort(high)) << 16);
}

// Two pairs: `low` holds x[i], x[i + 1] and `high` x[i + d/2], x[i + d/2 + 1]; cos_sin the cos and
// sin of pair i, then of pair i + 1. The values are first multiplied by `scale` (a folded RMSNorm's
// s, row_rms.cuh; 1 is exact).
__device__ __forceinline__ void RotateWords(uint32_t& low, uint32_t& high, const float* cos_sin,
                                            float scale) {
  __nv_bfloat16 a0, b0, a1, b1;
  RotatePair(__fmul_rn(LowBf16(low), scale), __fmul_rn(LowBf16(high), scale), cos_sin[0],
             cos_sin[1], a0, b0);
  RotatePair(__fmul_rn(HighBf16(low), scale), __fmul_rn(HighBf16(high), scale), cos_sin[2],
             cos_sin[3], a1, b1);
  low = PackPair(a0, a1);
  high = PackPair(b0, b1);
}

// Eight pairs: the 16-byte chunk `low` holds x[8c .. 8c + 8), `high` the chunk d/2 further on;
// cos_sin[2j], cos_sin[2j + 1] are the cos and sin of pair 8c + j.
__device__ __forceinline__ void RotateChunks(uint4& low, uint4& high, const float (&cos_sin)[16],
                                             float scale) {
  RotateWords(low.x, high.x, cos_sin + 0, scale);
  RotateWords(low.y, high.y, cos_sin + 4, scale);
  RotateWords(low.z, high.z, cos_sin + 8, scale);
  RotateWords(low.w, high.w, cos_sin + 12, scale);
}

// Eight values times `scale`, rounded back to bf16 (v of a folded RMSNorm; scale 1 is exact).
__device__ __forceinline__ uint4 ScaleChunk(uint4 chunk, float scale) {
  uint32_t* words = reinterpret_cast<uint32_t*>(&chunk);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    words[i] = PackPair(__float2bfloat16(__fmul_rn(LowBf16(words[i]), scale)),
                        __float2bfloat16(__fmul_rn(HighBf16(words[i]), scale)));
  }
  return chunk;
}

// The cos and sin of pairs 8 chunk .. 8 chunk + 7 at `position` from a table [max_pos][d/2][2]
// (16-byte aligned rows).
__device__ __forceinline__ void LoadChunkAngles(const float* table, int position, int head_dim,
                                                int chunk, float (&cos_sin)[16]) {
  const float4* src = reinterpret_cast<const float4*>(
      table + static_cast<int64_t>(position) * head_dim + chunk * 16);
#pragma unroll
  for (int index = 0; index < 4; ++index) {
    const float4 value = src[index];
    cos_sin[4 * index] = value.x;
    cos_sin[4 * index + 1] = value.y;
    cos_sin[4 * index + 2] = value.z;
    cos_sin[4 * index + 3] = value.w;
  }
}

}  // namespace sieve::cuda::rope
