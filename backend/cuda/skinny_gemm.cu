// The decode-batch GEMM (skinny_gemm.h): out[m][n] (+)= x[m][k] . w[n][k]^T for m <= 32.
//
// A CTA computes 16 output columns (16 rows of w, the M of one mma.sync m16n8k16 tile) for every
// row of x; its 8 warps split k and add their partial sums in shared memory at the end. With
// `splits` > 1 a cluster of that many CTAs shares the 16 columns, each taking a share of k, and the
// cluster's first CTA adds the others' sums through distributed shared memory: more CTAs, and so
// more weight bytes in flight, where n / 16 CTAs do not fill the SMs (4096 columns: 256 CTAs). The
// rows of x are the mma's N: one n8 tile per 8 rows (kXTiles of them). Each lane reads 16 bytes of
// each of its two weight rows per 32 k, and 16 bytes of each x row it owns at the same k: the mma's
// k order within those 32 is permuted alike for w and x, so no shuffles are needed (Fragments
// below). The weights are read once, bypassing L1 (x comes from the L2, where the kernel before
// left it).
//
// Latency: a warp loads kGroup blocks of 32 k (kGroup KiB of weights per warp) before it needs any;
// with 3 CTAs (24 warps) on an SM that is ~96 KiB in flight per SM, past what the copy rate needs.
// The first group is loaded before PdlWait: it depends on no kernel, so it streams while the kernel
// before still runs.
#include "backend/cuda/skinny_gemm.h"

#include <cooperative_groups.h>

#include "backend/cuda/bf16x8.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/flash_warp.cuh"
#include "backend/cuda/pdl.cuh"
#include "core/check.h"

namespace sieve::cuda {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kColumns = 16;  // output columns (rows of w) per CTA
constexpr int kBlockK = 32;   // k per load: 16 bytes of a weight row per lane of a quad

// 16 bytes of weights, read once: not kept in L1, the L2 asked to fetch 256-byte blocks. Volatile
// keeps the loads before PdlWait where they are.
__device__ __forceinline__ uint4 LoadWeights(const bf16* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// Lane (g, t) holds, for one block of 32 k, w[g][8t .. 8t + 8) (`lo`), w[g + 8][8t ..) (`hi`) and
// x[row][8t ..) of its x row: words .x .y .z .w = k pairs 8t + {0,1}, {2,3}, {4,5}, {6,7}. The
// first mma takes the pairs {0,1} as its k 2t..2t+1 and {2,3} as its k 2t+8..2t+9, the second {4,5}
// and {6,7}: A and B see the same k at the same place, so each sums w . x over all 32 k.
__device__ __forceinline__ void MmaBlock(float (&acc)[4], const uint4& lo, const uint4& hi,
                                         const uint4& x) {
  const uint32_t first[4] = {lo.x, hi.x, lo.y, hi.y};
  const uint32_t second[4] = {lo.z, hi.z, lo.w, hi.w};
  flash::Mma(acc, first, x.x, x.y);
  flash::Mma(acc, second, x.z, x.w);
}

// x's 16 bytes at `offset` of `row` as the mma reads them: plain, or SiluMul8 of the gate and up
// chunks (kGated) with the row's scale.
template <bool kGated>
__device__ __forceinline__ uint4 LoadX(const bf16* x, int64_t ldx, int row, int offset,
                                       const SkinnyGemmExtras& extras, float scale) {
  const bf16* at = x + static_cast<int64_t>(row) * ldx + offset;
  if constexpr (kGated) {
    return SiluMul8(*reinterpret_cast<const uint4*>(at),
                    *reinterpret_cast<const uint4*>(at + extras.up_offset), scale);
  } else {
    return *reinterpret_cast<const uint4*>(at);
  }
}

template <int kXTiles, int kGroup, bool kOutF32, bool kAccumulate, bool kGated>
__global__ void __launch_bounds__(kThreads, 3)
    SkinnyGemmKernel(const bf16* __restrict__ w, int64_t ldw, const bf16* __restrict__ x,
                     int64_t ldx, void* __restrict__ out, int64_t ldo, int m, int n, int k,
                     SkinnyGemmExtras extras) {
  // Each warp's sums: [warp][row of x][column], padded against bank conflicts.
  __shared__ float partial[kWarps][kXTiles * 8][kColumns + 1];
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane / 4;
  const int t = lane % 4;
  const int column0 = static_cast<int>(blockIdx.x) * kColumns;
  // The cluster's CTAs (blockIdx.y) split k between them, then their warps.
  const int splits = static_cast<int>(gridDim.y);
  const int split_warp = static_cast<int>(blockIdx.y) * kWarps + warp;
  // Rows of w past n read the last row (in bounds); their sums are never stored.
  const bf16* w_lo = w + static_cast<int64_t>(min(column0 + g, n - 1)) * ldw + 8 * t;
  const bf16* w_hi = w + static_cast<int64_t>(min(column0 + g + 8, n - 1)) * ldw + 8 * t;
  const int blocks = (k + kBlockK - 1) / kBlockK;
  const int per_warp = (blocks + kWarps * splits - 1) / (kWarps * splits);
  const int begin = min(blocks, split_warp * per_warp);
  const int end = min(blocks, begin + per_warp);

  uint4 lo[kGroup];
  uint4 hi[kGroup];
  const auto load_weights = [&](int first) {
#pragma unroll
    for (int u = 0; u < kGroup; ++u) {
      const int offset = (first + u) * kBlockK;
      const bool valid = first + u < end && offset + 8 * t < k;
      lo[u] = valid ? LoadWeights(w_lo + offset) : make_uint4(0, 0, 0, 0);
      hi[u] = valid ? LoadWeights(w_hi + offset) : make_uint4(0, 0, 0, 0);
    }
  };
  load_weights(begin);  // depends on no kernel: streams while the kernel before finishes
  PdlWait();
  PdlLaunchDependents();
  if (extras.scale_out != nullptr && blockIdx.x == 0 && blockIdx.y == 0) {
    for (int row = warp; row < m; row += kWarps) {
      const float scale = WarpRowInvRms(extras.scale_norm, row);
      if (lane == 0) extras.scale_out[row] = scale;
    }
  }
  // The gated input's scale of each x row this lane reads.
  float row_scale[kXTiles];
#pragma unroll
  for (int tile = 0; tile < kXTiles; ++tile) {
    const int row = tile * 8 + g;
    row_scale[tile] = kGated && row < m ? extras.x_scale[row] : 1.0f;
  }

  float acc[kXTiles][4] = {};
  for (int first = begin; first < end; first += kGroup) {
    if (first != begin) load_weights(first);
    uint4 xs[kGroup][kXTiles];
#pragma unroll
    for (int u = 0; u < kGroup; ++u) {
      const int offset = (first + u) * kBlockK + 8 * t;
#pragma unroll
      for (int tile = 0; tile < kXTiles; ++tile) {
        const int row = tile * 8 + g;
        xs[u][tile] = row < m && first + u < end && offset < k
                          ? LoadX<kGated>(x, ldx, row, offset, extras, row_scale[tile])
                          : make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int u = 0; u < kGroup; ++u) {
#pragma unroll
      for (int tile = 0; tile < kXTiles; ++tile) MmaBlock(acc[tile], lo[u], hi[u], xs[u][tile]);
    }
  }

  // acc[tile]: c0, c1 = (column g, x rows 8 tile + 2t, + 1), c2, c3 = (column g + 8, same rows).
#pragma unroll
  for (int tile = 0; tile < kXTiles; ++tile) {
    const int row = tile * 8 + 2 * t;
    partial[warp][row][g] = acc[tile][0];
    partial[warp][row + 1][g] = acc[tile][1];
    partial[warp][row][g + 8] = acc[tile][2];
    partial[warp][row + 1][g + 8] = acc[tile][3];
  }
  __syncthreads();
  // This CTA's sums over its warps, into partial[0] (each entry read and written by one thread).
  for (int index = static_cast<int>(threadIdx.x); index < kXTiles * 8 * kColumns;
       index += kThreads) {
    const int row = index / kColumns;
    float sum = 0.0f;
#pragma unroll
    for (int from = 0; from < kWarps; ++from) sum += partial[from][row][index % kColumns];
    partial[0][row][index % kColumns] = sum;
  }
  namespace cg = cooperative_groups;
  if (splits > 1) {
    // The first CTA of the cluster adds the others' sums; they wait until it has read them.
    cg::this_cluster().sync();
    if (blockIdx.y != 0) {
      cg::this_cluster().sync();
      return;
    }
  } else {
    __syncthreads();
  }
  for (int index = static_cast<int>(threadIdx.x); index < kXTiles * 8 * kColumns;
       index += kThreads) {
    const int row = index / kColumns;
    const int column = column0 + index % kColumns;
    if (row >= m || column >= n) continue;
    float sum = partial[0][row][index % kColumns];
    for (int rank = 1; rank < splits; ++rank) {
      sum += *cg::this_cluster().map_shared_rank(&partial[0][row][index % kColumns], rank);
    }
    const int64_t at = static_cast<int64_t>(row) * ldo + column;
    if constexpr (kOutF32) {
      float* target = static_cast<float*>(out) + at;
      *target = kAccumulate ? *target + sum : sum;
    } else {
      bf16* target = static_cast<bf16*>(out) + at;
      *target = __float2bfloat16_rn(kAccumulate ? __bfloat162float(*target) + sum : sum);
    }
  }
  if (splits > 1) cg::this_cluster().sync();
}

template <int kXTiles, int kGroup, bool kGated = false>
void LaunchTiles(int64_t m, int64_t n, int64_t k, const bf16* w, int64_t ldw, const bf16* x,
                 int64_t ldx, void* out, int64_t ldo, bool out_f32, bool accumulate, int splits,
                 cudaStream_t stream, const SkinnyGemmExtras& extras) {
  const dim3 grid(static_cast<unsigned>((n + kColumns - 1) / kColumns), splits);
  const dim3 cluster(1, splits, 1);
  const dim3 block(kThreads);
  const auto launch = [&](auto kernel) {
    LaunchWithPdlInClusters(kernel, grid, cluster, block, 0, stream, w, ldw, x, ldx, out, ldo,
                            static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), extras);
  };
  if (out_f32) {
    accumulate ? launch(SkinnyGemmKernel<kXTiles, kGroup, true, true, kGated>)
               : launch(SkinnyGemmKernel<kXTiles, kGroup, true, false, kGated>);
  } else {
    accumulate ? launch(SkinnyGemmKernel<kXTiles, kGroup, false, true, kGated>)
               : launch(SkinnyGemmKernel<kXTiles, kGroup, false, false, kGated>);
  }
}

}  // namespace

bool SkinnyGemmSupports(int64_t m, int64_t k, const bf16* w, int64_t ldw, const bf16* x,
                        int64_t ldx) {
  return m >= 1 && m <= kSkinnyGemmMaxRows && k >= 8 && k % 8 == 0 && k <= (int64_t{1} << 30) &&
         ldw % 8 == 0 && ldx % 8 == 0 && Aligned16(w) && Aligned16(x);
}

std::vector<int> SkinnyGemmSplits(int64_t k) {
  std::vector<int> splits;
  const int64_t blocks = (k + kBlockK - 1) / kBlockK;
  for (const int count : {1, 2, 4}) {
    if (count == 1 || blocks >= static_cast<int64_t>(count) * kWarps) splits.push_back(count);
  }
  return splits;
}

void SkinnyGemm(int64_t m, int64_t n, int64_t k, const bf16* w, int64_t ldw, const bf16* x,
                int64_t ldx, void* out, int64_t ldo, bool out_f32, bool accumulate, int splits,
                cudaStream_t stream, const SkinnyGemmExtras& extras) {
  SIEVE_CHECK(splits == 1 || splits == 2 || splits == 4) << "k split " << splits;
  if (extras.x_scale != nullptr) {
    SIEVE_CHECK(m <= kSkinnyGemmMaxGatedRows && extras.up_offset % 8 == 0)
        << "a gated skinny GEMM of " << m << " rows, up " << extras.up_offset << " after gate";
    LaunchTiles<1, 2, true>(m, n, k, w, ldw, x, ldx, out, ldo, out_f32, accumulate, splits, stream,
                            extras);
  } else if (m <= 8) {
    LaunchTiles<1, 4>(m, n, k, w, ldw, x, ldx, out, ldo, out_f32, accumulate, splits, stream,
                      extras);
  } else if (m <= 16) {
    LaunchTiles<2, 4>(m, n, k, w, ldw, x, ldx, out, ldo, out_f32, accumulate, splits, stream,
                      extras);
  } else {
    LaunchTiles<4, 2>(m, n, k, w, ldw, x, ldx, out, ldo, out_f32, accumulate, splits, stream,
                      extras);
  }
  SIEVE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace sieve::cuda
