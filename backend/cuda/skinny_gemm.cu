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
// x is read from the L2 once per CTA: n / 16 times, 3 MB at one row for n = 6144 but 96 MB at
// 32, twice the weights. So from 9 rows a CTA takes 2 column blocks (32 columns) and feeds each x
// fragment to the mmas of both, halving that traffic; the grid is half as wide (the k splits
// widen it again where it no longer fills the SMs).
//
// Latency: a warp loads kGroup blocks of 32 k (kGroup KiB of weights per warp) before it needs any;
// with 3 CTAs (24 warps) on an SM that is ~96 KiB in flight per SM. A grid of n / 16 = 256 CTAs
// (the o and down GEMMs of Llama-3-8B) puts only 2 CTAs on most SMs, 64 KiB in flight, and those
// GEMMs read 63% and 72% of the copy rate at one row against 85-97% for the wider ones
// (bench/results/2026-12-04-h200-decode-batch256.json, the table at 1 row). So where one row tile
// suffices (m <= 8) and the grid fits 2 CTAs an SM, the kernel loads 8 blocks a group (2 CTAs an
// SM by its registers: 128 KiB in flight on an SM of 2): o and down alone 0.405 -> 0.329 and
// 1.241 -> 0.959 ms a step, the whole batch-1 step 4.20 -> 4.18 ms, since PDL hid most of it
// (bench/results/2026-12-04-h200-skinny-deep-group-ab.json). The first group is loaded before
// PdlWait: it depends on no kernel, so it streams while the kernel before still runs.
#include "backend/cuda/skinny_gemm.h"

#include <cooperative_groups.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/flash_warp.cuh"
#include "backend/cuda/pdl.cuh"
#include "core/check.h"

namespace sieve::cuda {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kColumns = 16;  // output columns (rows of w) of one column block: an mma's M
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

// CTAs an SM the kernel is compiled for: its registers (lo and hi hold 2 x kColumnBlocks 16-byte
// values per block of the group, xs kXTiles) fit 80 a thread at 4 blocks of one column block,
// 128 at 8 or with 2 column blocks.
template <int kGroup, int kColumnBlocks>
constexpr int kCtasPerSm = kGroup > 4 || kColumnBlocks > 1 ? 2 : 3;

// A CTA computes kColumnBlocks x 16 columns: each x fragment a warp loads feeds the mmas of every
// column block, so x is read from the L2 n / (16 kColumnBlocks) times, not n / 16.
template <int kXTiles, int kGroup, int kColumnBlocks, bool kOutF32, bool kAccumulate>
__global__ void __launch_bounds__(kThreads, (kCtasPerSm<kGroup, kColumnBlocks>))
    SkinnyGemmKernel(const bf16* __restrict__ w, int64_t ldw, const bf16* __restrict__ x,
                     int64_t ldx, void* __restrict__ out, int64_t ldo, int m, int n, int k) {
  constexpr int kCtaColumns = kColumns * kColumnBlocks;
  // Each warp's sums: [warp][row of x][column], padded against bank conflicts.
  __shared__ float partial[kWarps][kXTiles * 8][kCtaColumns + 1];
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane / 4;
  const int t = lane % 4;
  const int column0 = static_cast<int>(blockIdx.x) * kCtaColumns;
  // The cluster's CTAs (blockIdx.y) split k between them, then their warps.
  const int splits = static_cast<int>(gridDim.y);
  const int split_warp = static_cast<int>(blockIdx.y) * kWarps + warp;
  // Rows of w past n read the last row (in bounds); their sums are never stored.
  const bf16* w_lo[kColumnBlocks];
  const bf16* w_hi[kColumnBlocks];
#pragma unroll
  for (int c = 0; c < kColumnBlocks; ++c) {
    const int column = column0 + c * kColumns + g;
    w_lo[c] = w + static_cast<int64_t>(min(column, n - 1)) * ldw + 8 * t;
    w_hi[c] = w + static_cast<int64_t>(min(column + 8, n - 1)) * ldw + 8 * t;
  }
  const int blocks = (k + kBlockK - 1) / kBlockK;
  const int per_warp = (blocks + kWarps * splits - 1) / (kWarps * splits);
  const int begin = min(blocks, split_warp * per_warp);
  const int end = min(blocks, begin + per_warp);

  uint4 lo[kGroup][kColumnBlocks];
  uint4 hi[kGroup][kColumnBlocks];
  const auto load_weights = [&](int first) {
#pragma unroll
    for (int u = 0; u < kGroup; ++u) {
      const int offset = (first + u) * kBlockK;
      const bool valid = first + u < end && offset + 8 * t < k;
#pragma unroll
      for (int c = 0; c < kColumnBlocks; ++c) {
        lo[u][c] = valid ? LoadWeights(w_lo[c] + offset) : make_uint4(0, 0, 0, 0);
        hi[u][c] = valid ? LoadWeights(w_hi[c] + offset) : make_uint4(0, 0, 0, 0);
      }
    }
  };
  load_weights(begin);  // depends on no kernel: streams while the kernel before finishes
  PdlWait();
  PdlLaunchDependents();

  float acc[kColumnBlocks][kXTiles][4] = {};
  for (int first = begin; first < end; first += kGroup) {
    if (first != begin) load_weights(first);
    uint4 xs[kGroup][kXTiles];
#pragma unroll
    for (int u = 0; u < kGroup; ++u) {
      const int offset = (first + u) * kBlockK + 8 * t;
#pragma unroll
      for (int tile = 0; tile < kXTiles; ++tile) {
        const int row = tile * 8 + g;
        xs[u][tile] =
            row < m && first + u < end && offset < k
                ? *reinterpret_cast<const uint4*>(x + static_cast<int64_t>(row) * ldx + offset)
                : make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int u = 0; u < kGroup; ++u) {
#pragma unroll
      for (int c = 0; c < kColumnBlocks; ++c) {
#pragma unroll
        for (int tile = 0; tile < kXTiles; ++tile) {
          MmaBlock(acc[c][tile], lo[u][c], hi[u][c], xs[u][tile]);
        }
      }
    }
  }

  // acc[c][tile]: c0, c1 = (column 16 c + g, x rows 8 tile + 2t, + 1), c2, c3 = (column
  // 16 c + g + 8, same rows).
#pragma unroll
  for (int c = 0; c < kColumnBlocks; ++c) {
#pragma unroll
    for (int tile = 0; tile < kXTiles; ++tile) {
      const int row = tile * 8 + 2 * t;
      const int column = c * kColumns + g;
      partial[warp][row][column] = acc[c][tile][0];
      partial[warp][row + 1][column] = acc[c][tile][1];
      partial[warp][row][column + 8] = acc[c][tile][2];
      partial[warp][row + 1][column + 8] = acc[c][tile][3];
    }
  }
  __syncthreads();
  // This CTA's sums over its warps, into partial[0] (each entry read and written by one thread).
  for (int index = static_cast<int>(threadIdx.x); index < kXTiles * 8 * kCtaColumns;
       index += kThreads) {
    const int row = index / kCtaColumns;
    float sum = 0.0f;
#pragma unroll
    for (int from = 0; from < kWarps; ++from) sum += partial[from][row][index % kCtaColumns];
    partial[0][row][index % kCtaColumns] = sum;
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
  for (int index = static_cast<int>(threadIdx.x); index < kXTiles * 8 * kCtaColumns;
       index += kThreads) {
    const int row = index / kCtaColumns;
    const int column = column0 + index % kCtaColumns;
    if (row >= m || column >= n) continue;
    float sum = partial[0][row][index % kCtaColumns];
    for (int rank = 1; rank < splits; ++rank) {
      sum += *cg::this_cluster().map_shared_rank(&partial[0][row][index % kCtaColumns], rank);
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

template <int kXTiles, int kGroup, int kColumnBlocks = 1>
void LaunchTiles(int64_t m, int64_t n, int64_t k, const bf16* w, int64_t ldw, const bf16* x,
                 int64_t ldx, void* out, int64_t ldo, bool out_f32, bool accumulate, int splits,
                 cudaStream_t stream) {
  constexpr int kCtaColumns = kColumns * kColumnBlocks;
  const dim3 grid(static_cast<unsigned>((n + kCtaColumns - 1) / kCtaColumns), splits);
  const dim3 cluster(1, splits, 1);
  const dim3 block(kThreads);
  const auto launch = [&](auto kernel) {
    LaunchWithPdlInClusters(kernel, grid, cluster, block, 0, stream, w, ldw, x, ldx, out, ldo,
                            static_cast<int>(m), static_cast<int>(n), static_cast<int>(k));
  };
  if (out_f32) {
    accumulate ? launch(SkinnyGemmKernel<kXTiles, kGroup, kColumnBlocks, true, true>)
               : launch(SkinnyGemmKernel<kXTiles, kGroup, kColumnBlocks, true, false>);
  } else {
    accumulate ? launch(SkinnyGemmKernel<kXTiles, kGroup, kColumnBlocks, false, true>)
               : launch(SkinnyGemmKernel<kXTiles, kGroup, kColumnBlocks, false, false>);
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
                cudaStream_t stream) {
  SIEVE_CHECK(splits == 1 || splits == 2 || splits == 4) << "k split " << splits;
  const int64_t ctas = (n + kColumns - 1) / kColumns * splits;
  if (m <= 8 &&
      ctas <= kCtasPerSm<8, 1> * CurrentDeviceAttribute<cudaDevAttrMultiProcessorCount>()) {
    LaunchTiles<1, 8>(m, n, k, w, ldw, x, ldx, out, ldo, out_f32, accumulate, splits, stream);
  } else if (m <= 8) {
    LaunchTiles<1, 4>(m, n, k, w, ldw, x, ldx, out, ldo, out_f32, accumulate, splits, stream);
  } else if (m <= 16) {
    LaunchTiles<2, 3, 2>(m, n, k, w, ldw, x, ldx, out, ldo, out_f32, accumulate, splits, stream);
  } else {
    LaunchTiles<4, 2, 2>(m, n, k, w, ldw, x, ldx, out, ldo, out_f32, accumulate, splits, stream);
  }
  SIEVE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace sieve::cuda
