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
#include "backend/cuda/e4m3_bits.h"
#include "backend/cuda/flash_warp.cuh"

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

// ---------------------------------------------------------------------------------------------
// Decode attention over an FP8 pool with the e4m3 bytes read straight into tensor-core fragments
// (DecodeAttentionKernel at d = 128). Converting a tile into bf16 in shared memory first cost
// four conversion instructions a pair of elements plus a shared-memory round trip, more than a
// tile of half the bytes leaves time for; here a pair costs about three integer operations and
// no shared-memory traffic beyond the ldmatrix that reads the e4m3 tile.
//
// An e4m3 byte s.eeee.mmm moved into a half's bits as s << 15 | eeee.mmm << 7 is an f16 whose
// exponent field is eeee and mantissa mmm0000000: the e4m3 value times 2^-8 exactly, subnormals
// included (exponent 0 is subnormal in both). So the tiles run f16 MMAs, with 2^8 folded into the
// K and V scales (kE4m3HalfBitsScale). The reordering this needs:
// - A ldmatrix of e4m3 rows seen as b16 gives a lane 4 consecutive bytes of a row; the even bytes
//   (0 and 2) become one f16 pair and the odd bytes (1 and 3) another, with no byte permutes.
// - K (S = Q K^T, k = the head dimension): within each 16 dimensions, the MMA's k indices 2t,
//   2t + 1 are dimensions 4t, 4t + 2 and its 2t + 8, 2t + 9 are 4t + 1, 4t + 3. Q's fragments are
//   loaded in the same order (E4m3WarpRows::LoadQ), so the sum over k is the dot product.
// - V (O += P V, k = the entries): ldmatrix.trans of b16 gives a lane two entries' bytes of
//   dimensions 2g and 2g + 1; the even bytes fill an 8-column output tile of even dimensions and
//   the odd ones a tile of odd dimensions. E4m3OutputColumn says which dimension an accumulator
//   column is.
// The stages hold e4m3 rows of kHeadDim bytes, 16-byte chunks swizzled as a bf16 tile of
// kHeadDim / 2 columns (flash::TileOffset), so ldmatrix reads them without bank conflicts.

// c += a * b for one m16n8k16 tile of f16 operands.
__device__ __forceinline__ void MmaF16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                       uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats as an f16 pair, `lo` in the low half, clamped to f16's finite range (a bf16 query
// past 65504 would otherwise become infinite; probabilities are in [0, 1]).
__device__ __forceinline__ uint32_t PackHalf(float lo, float hi) {
  constexpr float kMax = 65504.0f;
  const __half2 pair =
      __floats2half2_rn(fminf(fmaxf(lo, -kMax), kMax), fminf(fmaxf(hi, -kMax), kMax));
  return *reinterpret_cast<const uint32_t*>(&pair);
}

// The state of one warp's 16 query rows attending e4m3 tiles: f16 Q fragments in the order the
// K fragments come in, beside the softmax state (flash::WarpRows's, whose accumulator columns are
// permuted as E4m3OutputColumn says).
template <int kHeadDim>
struct E4m3WarpRows : flash::SoftmaxRows<kHeadDim> {
  static_assert(kHeadDim % 64 == 0, "e4m3 rows must span whole 128-byte swizzle periods");
  using flash::SoftmaxRows<kHeadDim>::acc;
  using flash::SoftmaxRows<kHeadDim>::m;
  using flash::SoftmaxRows<kHeadDim>::l;
  uint32_t q[kHeadDim / 16][4];  // A fragments of the 16 query rows, one per 16-wide k step

  // Rows [row0, row0 + 16) of a swizzled bf16 Q tile (shared address q_tile): lane (g, t) takes
  // dimensions 16 kk + 4t .. 4t + 3 of rows g and g + 8, (0, 2) as k 2t, 2t + 1 and (1, 3) as
  // k 2t + 8, 2t + 9.
  __device__ __forceinline__ void LoadQ(uint32_t q_tile, int row0) {
    const int lane = static_cast<int>(threadIdx.x) & 31;
    const int g = lane / 4;
    const int t = lane % 4;
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const uint32_t address =
            q_tile + flash::TileOffset<kHeadDim>(row0 + g + 8 * half, 2 * kk + t / 2) + (t % 2) * 8;
        uint32_t words[2];
        asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];\n"
                     : "=r"(words[0]), "=r"(words[1])
                     : "r"(address));
        const float d0 = __uint_as_float(words[0] << 16);
        const float d1 = __uint_as_float(words[0] & 0xffff0000u);
        const float d2 = __uint_as_float(words[1] << 16);
        const float d3 = __uint_as_float(words[1] & 0xffff0000u);
        q[kk][half] = PackHalf(d0, d2);
        q[kk][2 + half] = PackHalf(d1, d3);
      }
    }
  }

  // Attends the 16 rows to the 16 entries at row key0 of e4m3 K and V stages (shared addresses,
  // rows of kHeadDim bytes swizzled as above), as flash::WarpRows::AttendTile does a bf16 tile;
  // scale_log2 includes kE4m3HalfBitsScale.
  template <bool kMasked>
  __device__ __forceinline__ void AttendTile(uint32_t k_tile, uint32_t v_tile, int key0,
                                             float scale_log2, const int (&key_limit)[2]) {
    const int lane = static_cast<int>(threadIdx.x) & 31;
    // S = Q K^T. One ldmatrix.x4 per 32 dimensions: matrices (entries 0-7, k step 2j), (0-7,
    // 2j + 1), (8-15, 2j), (8-15, 2j + 1).
    float s[2][4];
#pragma unroll
    for (int n = 0; n < 2; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[n][e] = 0.0f;
    }
#pragma unroll
    for (int j = 0; j < kHeadDim / 32; ++j) {
      const int row = key0 + (lane & 7) + ((lane >> 4) << 3);
      const int chunk = 2 * j + ((lane >> 3) & 1);
      uint32_t r[4];
      flash::LdMatrixX4(k_tile + flash::TileOffset<kHeadDim / 2>(row, chunk), r);
      MmaF16(s[0], q[2 * j], E4m3EvenBytesToHalf2(r[0]), E4m3OddBytesToHalf2(r[0]));
      MmaF16(s[0], q[2 * j + 1], E4m3EvenBytesToHalf2(r[1]), E4m3OddBytesToHalf2(r[1]));
      MmaF16(s[1], q[2 * j], E4m3EvenBytesToHalf2(r[2]), E4m3OddBytesToHalf2(r[2]));
      MmaF16(s[1], q[2 * j + 1], E4m3EvenBytesToHalf2(r[3]), E4m3OddBytesToHalf2(r[3]));
    }

    if constexpr (kMasked) flash::MaskKeysPast(s, key_limit);

#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const float alpha = flash::OnlineSoftmaxRow(s, half, m[half], l[half], scale_log2);
#pragma unroll
      for (int n = 0; n < kHeadDim / 8; ++n) {
        acc[n][2 * half] *= alpha;
        acc[n][2 * half + 1] *= alpha;
      }
    }

    // O += P V. P's A fragment is S's two C fragments (entries 0-7 and 8-15 are k 0-7 and 8-15).
    // One ldmatrix.x4.trans per 32 dimensions: matrices (entries 0-7, dimensions 0-15), (8-15,
    // 0-15), (0-7, 16-31), (8-15, 16-31); each gives a lane entries 2t, 2t + 1 (or 2t + 8, 2t + 9)
    // of dimensions 2g and 2g + 1.
    const uint32_t a[4] = {PackHalf(s[0][0], s[0][1]), PackHalf(s[0][2], s[0][3]),
                           PackHalf(s[1][0], s[1][1]), PackHalf(s[1][2], s[1][3])};
#pragma unroll
    for (int j = 0; j < kHeadDim / 32; ++j) {
      const int row = key0 + (lane & 7) + (((lane >> 3) & 1) << 3);
      const int chunk = 2 * j + (lane >> 4);
      uint32_t r[4];
      flash::LdMatrixX4Trans(v_tile + flash::TileOffset<kHeadDim / 2>(row, chunk), r);
      MmaF16(acc[4 * j], a, E4m3EvenBytesToHalf2(r[0]), E4m3EvenBytesToHalf2(r[1]));
      MmaF16(acc[4 * j + 1], a, E4m3OddBytesToHalf2(r[0]), E4m3OddBytesToHalf2(r[1]));
      MmaF16(acc[4 * j + 2], a, E4m3EvenBytesToHalf2(r[2]), E4m3EvenBytesToHalf2(r[3]));
      MmaF16(acc[4 * j + 3], a, E4m3OddBytesToHalf2(r[2]), E4m3OddBytesToHalf2(r[3]));
    }
  }

  // Completes the row sums across each quad (call once, after the key loop).
  __device__ __forceinline__ void FinishSums() {
    l[0] = flash::QuadSum(l[0]);
    l[1] = flash::QuadSum(l[1]);
  }
};

}  // namespace sieve::cuda
