// The warp-level core shared by the flash-attention kernels (prefill_attention.cu,
// decode_attention.cu) and the window-score pass (sparsity_kernels.cu): cp.async copies into
// XOR-swizzled shared-memory tiles, ldmatrix fragment loads, bf16 mma.sync m16n8k16 with f32
// accumulation, and the online softmax of one warp's 16 query rows against a tile of keys.
// Everything here is sm_80 PTX, so the same code runs on A100, RTX 4090 and H100/H200.
//
// Fragment layouts (PTX ISA, "mma.m16n8k16"): with lane = 4 * g + t,
//   A (16 x 16, row-major)  a0: (g, 2t..2t+1)  a1: (g+8, 2t..)  a2: (g, 2t+8..)  a3: (g+8, 2t+8..)
//   B (16 x 8, k-major)     b0: (k 2t..2t+1, n g)             b1: (k 2t+8..2t+9, n g)
//   C (16 x 8, f32)         c0, c1: (g, 2t..2t+1)             c2, c3: (g+8, 2t..2t+1)
// So a lane owns rows g and g + 8 of its warp's 16 query rows; the 4 lanes of a quad share a row.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace sieve::cuda::flash {

// ---------------------------------------------------------------------------------------------
// Shared-memory tiles: rows of kHeadDim bf16, stored as 16-byte chunks. Chunk c of row r sits at
// chunk position c ^ (r & 7): the 8 rows one ldmatrix matrix reads (same logical chunk, 8
// consecutive rows) then land in 8 different groups of 4 banks, and a warp's cp.async writes of
// one row stay conflict-free too.
template <int kHeadDim>
__device__ __forceinline__ uint32_t TileOffset(int row, int chunk) {
  static_assert(kHeadDim % 64 == 0, "rows must span whole 128-byte swizzle periods");
  return static_cast<uint32_t>(row * kHeadDim * 2 + ((chunk ^ (row & 7)) << 4));
}

__device__ __forceinline__ uint32_t SharedAddress(const void* pointer) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(pointer));
}

// 16-byte asynchronous global -> shared copy; with `valid` false nothing is read and the 16 bytes
// are zero-filled (src must still be a mapped address: callers pass a row they know exists).
__device__ __forceinline__ void CpAsync16(uint32_t dst, const void* src, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void CpAsyncCommit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
// Waits until at most kPending of this thread's committed groups are still in flight. Other
// threads' copies become visible only after a barrier that follows.
template <int kPending>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

__device__ __forceinline__ void LdMatrixX4(uint32_t address, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address)
               : "memory");
}
__device__ __forceinline__ void LdMatrixX4Trans(uint32_t address, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address)
               : "memory");
}

// c += a * b for one m16n8k16 tile.
__device__ __forceinline__ void Mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats as bf16x2 (round to nearest even), `lo` in the low half: the order A fragments and
// memory both use.
__device__ __forceinline__ uint32_t PackBf16(float lo, float hi) {
  const __nv_bfloat162 pair = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&pair);
}

// One MUFU instruction; exp2(-inf) = +0, which is how masked scores drop out.
__device__ __forceinline__ float Exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Sum and max over the 4 lanes of a quad (the lanes that share a query row).
__device__ __forceinline__ float QuadSum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  x += __shfl_xor_sync(0xffffffffu, x, 2);
  return x;
}
__device__ __forceinline__ float QuadMax(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
  return x;
}

// Copies rows [0, kRows) of a [rows][row_stride] bf16 matrix into a swizzled tile with kThreads
// threads, 16 bytes per copy. Rows >= valid_rows are zero-filled without being read; `rows` must
// point at a readable row 0 (it stands in as the address of skipped copies).
template <int kHeadDim, int kRows, int kThreads>
__device__ __forceinline__ void LoadTileAsync(uint32_t tile, const __nv_bfloat16* rows,
                                              int64_t row_stride, int valid_rows) {
  constexpr int kChunks = kHeadDim / 8;
  static_assert((kRows * kChunks) % kThreads == 0, "copies must divide evenly among threads");
#pragma unroll
  for (int step = 0; step < kRows * kChunks / kThreads; ++step) {
    const int index = static_cast<int>(threadIdx.x) + step * kThreads;
    const int row = index / kChunks;
    const int chunk = index % kChunks;
    const bool valid = row < valid_rows;
    const __nv_bfloat16* src = rows + (valid ? row * row_stride : 0) + chunk * 8;
    CpAsync16(tile + TileOffset<kHeadDim>(row, chunk), src, valid);
  }
}

// ---------------------------------------------------------------------------------------------
// The masking and online softmax of a warp's 16 rows against a tile of keys in accumulator (C
// fragment) layout: s[n][e] is the score of row g + 8 (e >> 1) and key 8n + 2t + (e & 1). The
// sm_80 warp tile below and the Hopper prefill kernel (prefill_attention_sm90.cu, whose wgmma
// accumulators have this layout per warp) share them.

// Drops key j of the tile (counted from its first key) for row g + 8 * half when j >
// key_limit[half].
template <int kBlocks>
__device__ __forceinline__ void MaskKeysPast(float (&s)[kBlocks][4], const int (&key_limit)[2]) {
  const int t = static_cast<int>(threadIdx.x) & 3;
#pragma unroll
  for (int n = 0; n < kBlocks; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int key = n * 8 + 2 * t + (e & 1);
      if (key > key_limit[e >> 1]) s[n][e] = -INFINITY;
    }
  }
}

// Row g + 8 * half: the running max m becomes the tile's, the scores become exp2(s * scale_log2 -
// m * scale_log2) in place, the lane's share of the running sum l is rescaled and grows by its
// terms. Returns alpha, the factor the output accumulated so far must be multiplied by. Scores
// stay raw and the exponent is one FFMA (scale_log2 = log2(e) / sqrt(d)).
template <int kBlocks>
__device__ __forceinline__ float OnlineSoftmaxRow(float (&s)[kBlocks][4], int half, float& m,
                                                  float& l, float scale_log2) {
  float row_max = m;
#pragma unroll
  for (int n = 0; n < kBlocks; ++n) {
    row_max = fmaxf(row_max, fmaxf(s[n][2 * half], s[n][2 * half + 1]));
  }
  row_max = QuadMax(row_max);
  // A row that has seen only masked keys keeps max -inf; exponentiating against 0 instead keeps
  // every term exactly 0 rather than NaN (-inf - -inf).
  const float max_scaled = (row_max == -INFINITY ? 0.0f : row_max) * scale_log2;
  const float alpha = Exp2(m * scale_log2 - max_scaled);  // 0 when m was -inf
  m = row_max;
  float row_sum = 0.0f;
#pragma unroll
  for (int n = 0; n < kBlocks; ++n) {
#pragma unroll
    for (int e = 2 * half; e < 2 * half + 2; ++e) {
      s[n][e] = Exp2(fmaf(s[n][e], scale_log2, -max_scaled));
      row_sum += s[n][e];
    }
  }
  l = l * alpha + row_sum;
  return alpha;
}

// ---------------------------------------------------------------------------------------------
// The online-softmax state of a warp's 16 query rows (also the Hopper prefill kernel's, per warp
// of its warpgroups).
template <int kHeadDim>
struct SoftmaxRows {
  float acc[kHeadDim / 8][4];  // unnormalised output, one C fragment per 8 output columns
  float m[2];                  // running max of the raw scores of rows g and g + 8
  float l[2];                  // this lane's share of the running sums (a quad holds the row)

  __device__ __forceinline__ void Reset() {
#pragma unroll
    for (int n = 0; n < kHeadDim / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[n][e] = 0.0f;
    }
    m[0] = m[1] = -INFINITY;
    l[0] = l[1] = 0.0f;
  }
};

// S = Q K^T of a warp's 16 query rows (their A fragments, one per 16-wide k step) against keys
// [key0, key0 + kKeys) of a swizzled K tile (key0 a multiple of 16, the row index inside the
// tile), in accumulator layout: s[n][e] is row g + 8 (e >> 1), key key0 + 8n + 2t + (e & 1).
// B[k][n] = K[n][k] is K's rows as stored, so plain ldmatrix. One x4 gives b0, b1 of two 8-key
// tiles: matrices (keys 0-7, k 0-7), (keys 0-7, k 8-15), (keys 8-15, k 0-7), (keys 8-15, k 8-15).
template <int kHeadDim, int kKeys>
__device__ __forceinline__ void ScoreTile(const uint32_t (&q)[kHeadDim / 16][4], uint32_t k_tile,
                                          int key0, float (&s)[kKeys / 8][4]) {
  static_assert(kKeys % 16 == 0);
  const int lane = static_cast<int>(threadIdx.x) & 31;
#pragma unroll
  for (int n = 0; n < kKeys / 8; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) s[n][e] = 0.0f;
  }
#pragma unroll
  for (int kk = 0; kk < kHeadDim / 16; ++kk) {
#pragma unroll
    for (int np = 0; np < kKeys / 16; ++np) {
      const int row = key0 + np * 16 + (lane & 7) + ((lane >> 4) << 3);
      const int chunk = 2 * kk + ((lane >> 3) & 1);
      uint32_t b[4];
      LdMatrixX4(k_tile + TileOffset<kHeadDim>(row, chunk), b);
      Mma(s[2 * np], q[kk], b[0], b[1]);
      Mma(s[2 * np + 1], q[kk], b[2], b[3]);
    }
  }
}

// Loads the A fragments of rows [row0, row0 + 16) of a swizzled tile, one per 16-wide k step.
template <int kHeadDim>
__device__ __forceinline__ void LoadRowFragments(uint32_t tile, int row0,
                                                 uint32_t (&a)[kHeadDim / 16][4]) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
#pragma unroll
  for (int kk = 0; kk < kHeadDim / 16; ++kk) {
    // Matrices 0..3 = (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15), (rows 8-15,
    // k 8-15): a0..a3. Lane i gives the address of row i % 8 of matrix i / 8.
    const int row = row0 + (lane & 15);
    const int chunk = 2 * kk + (lane >> 4);
    LdMatrixX4(tile + TileOffset<kHeadDim>(row, chunk), a[kk]);
  }
}

// The state of one warp's 16 query rows during the key loop: their Q fragments beside the softmax
// state.
template <int kHeadDim>
struct WarpRows : SoftmaxRows<kHeadDim> {
  using SoftmaxRows<kHeadDim>::acc;
  using SoftmaxRows<kHeadDim>::m;
  using SoftmaxRows<kHeadDim>::l;
  uint32_t q[kHeadDim / 16][4];  // A fragments of the 16 query rows, one per 16-wide k step

  // Loads the A fragments of rows [row0, row0 + 16) of a swizzled Q tile.
  __device__ __forceinline__ void LoadQ(uint32_t q_tile, int row0) {
    LoadRowFragments<kHeadDim>(q_tile, row0, q);
  }

  // Attends the 16 rows to keys [key0, key0 + kKeys) of swizzled K and V tiles (key0 a multiple
  // of 16, the row index inside the tiles). With kMasked, key j (counted from key0) is dropped
  // for row g + 8 * half when j > key_limit[half]. scale_log2 = log2(e) / sqrt(d): scores stay
  // raw and the exponent is one FFMA, exp2(s * scale_log2 - m * scale_log2).
  template <int kKeys, bool kMasked>
  __device__ __forceinline__ void AttendTile(uint32_t k_tile, uint32_t v_tile, int key0,
                                             float scale_log2, const int (&key_limit)[2]) {
    const int lane = static_cast<int>(threadIdx.x) & 31;
    // S = Q K^T.
    float s[kKeys / 8][4];
    ScoreTile<kHeadDim, kKeys>(q, k_tile, key0, s);

    if constexpr (kMasked) MaskKeysPast(s, key_limit);

      // Online softmax: new row max, rescale what was accumulated, exponentiate this tile.
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const float alpha = OnlineSoftmaxRow(s, half, m[half], l[half], scale_log2);
#pragma unroll
      for (int n = 0; n < kHeadDim / 8; ++n) {
        acc[n][2 * half] *= alpha;
        acc[n][2 * half + 1] *= alpha;
      }
    }

    // O += P V: P's A fragment for keys 16 kb.. is the C fragments of 8-key tiles 2 kb, 2 kb + 1
    // (same rows, same columns per lane). B[k][n] = V[k][n] needs V's columns: ldmatrix.trans.
    // Matrices (keys 0-7, d 0-7), (keys 8-15, d 0-7), (keys 0-7, d 8-15), (keys 8-15, d 8-15)
    // give b0, b1 of two 8-column output tiles.
#pragma unroll
    for (int kb = 0; kb < kKeys / 16; ++kb) {
      const uint32_t a[4] = {PackBf16(s[2 * kb][0], s[2 * kb][1]),
                             PackBf16(s[2 * kb][2], s[2 * kb][3]),
                             PackBf16(s[2 * kb + 1][0], s[2 * kb + 1][1]),
                             PackBf16(s[2 * kb + 1][2], s[2 * kb + 1][3])};
#pragma unroll
      for (int dp = 0; dp < kHeadDim / 16; ++dp) {
        const int row = key0 + kb * 16 + (lane & 15);
        const int chunk = 2 * dp + (lane >> 4);
        uint32_t b[4];
        LdMatrixX4Trans(v_tile + TileOffset<kHeadDim>(row, chunk), b);
        Mma(acc[2 * dp], a, b[0], b[1]);
        Mma(acc[2 * dp + 1], a, b[2], b[3]);
      }
    }
  }

  // Completes the row sums across each quad (call once, after the key loop).
  __device__ __forceinline__ void FinishSums() {
    l[0] = QuadSum(l[0]);
    l[1] = QuadSum(l[1]);
  }
};

}  // namespace sieve::cuda::flash
