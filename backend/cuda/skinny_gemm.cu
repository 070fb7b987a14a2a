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
// with 3 CTAs (24 warps) on an SM that is ~96 KiB in flight per SM. A grid of n / 16 = 256 CTAs
// (the o and down GEMMs of Llama-3-8B) puts only 2 CTAs on most SMs, 64 KiB in flight, and those
// GEMMs read 63% and 72% of the copy rate at one row against 85-97% for the wider ones
// (bench/results/2026-12-04-h200-decode-batch256.json, the table at 1 row). So where one row tile
// suffices (m <= 8) and the grid fits 2 CTAs an SM, the kernel loads 8 blocks a group (2 CTAs an
// SM by its registers: 128 KiB in flight on an SM of 2): o and down alone 0.405 -> 0.329 and
// 1.241 -> 0.959 ms a step, the whole batch-1 step 4.20 -> 4.18 ms, since PDL hid most of it
// (bench/results/2026-12-04-h200-skinny-deep-group-ab.json). The first group is loaded before
// PdlWait: it depends on no kernel, so it streams while the kernel before still runs.
//
// The gated form (kGated, SkinnyGemmSwiGlu) is the MLP's gate_up GEMM with SiLU x mul fused: a
// CTA's 16 rows of w are 8 gate rows and their 8 up rows, and its sums leave through SiluMul's
// arithmetic as 8 output columns, so a one-row step runs no SiLU kernel and never writes gate_up.
#include "backend/cuda/skinny_gemm.h"

#include <cooperative_groups.h>

#include <type_traits>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/flash_warp.cuh"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/row_rms.cuh"
#include "core/check.h"

namespace sieve::cuda {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kColumns = 16;  // output columns (rows of w) per CTA
// k per load: 16 bytes of a weight row per lane of a quad (32 bf16 or 64 e4m3 values).
template <typename Operand>
constexpr int kBlockK = 64 / static_cast<int>(sizeof(Operand));
using e4m3 = uint8_t;  // e4m3 codes (fp8_gemm.h)

// 16 bytes of weights, read once: not kept in L1, the L2 asked to fetch 256-byte blocks. Volatile
// keeps the loads before PdlWait where they are.
__device__ __forceinline__ uint4 LoadWeights(const void* p) {
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

// mma.sync m16n8k32 over e4m3 (sm_89 and newer): A's registers hold 4 consecutive k of a row, B's
// 4 of a column; a0 = (row g, k 4t..), a1 = (g + 8, 4t..), a2 = (g, 4t + 16..), a3 = (g + 8,
// 4t + 16..), b0 = (4t.., column g), b1 = (4t + 16.., g).
__device__ __forceinline__ void MmaE4m3(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                        uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  asm("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
  (void)c, (void)a, (void)b0, (void)b1;
  __trap();  // SkinnyGemmE4m3Supports keeps older device code from launching it
#endif
}

// The e4m3 form of MmaBlock: a block of 64 k, lane (g, t) holding k 16t .. 16t + 16 of its rows
// (words .x .y .z .w = k 16t + {0..3}, {4..7}, {8..11}, {12..15}); the first mma takes words .x
// and .y as its k 4t.. and 4t + 16.., the second .z and .w, alike for A and B.
__device__ __forceinline__ void MmaBlockE4m3(float (&acc)[4], const uint4& lo, const uint4& hi,
                                             const uint4& x) {
  const uint32_t first[4] = {lo.x, hi.x, lo.y, hi.y};
  const uint32_t second[4] = {lo.z, hi.z, lo.w, hi.w};
  MmaE4m3(acc, first, x.x, x.y);
  MmaE4m3(acc, second, x.z, x.w);
}

// Thread-block clusters are sm_90's. Before it SkinnyGemmSplits offers no k split, so a kernel
// built for an older target never reaches these with more than one CTA a cluster (and traps if
// it did).
__device__ __forceinline__ void ClusterSync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cooperative_groups::this_cluster().sync();
#else
  __trap();
#endif
}

// The value at `local`'s place in the shared memory of the cluster's CTA `rank`.
__device__ __forceinline__ float ClusterPeerValue(float* local, int rank) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  return *cooperative_groups::this_cluster().map_shared_rank(local, rank);
#else
  (void)local, (void)rank;
  __trap();
  return 0.0f;
#endif
}

// CTAs an SM the kernel is compiled for: its registers (lo, hi and xs hold 2 + kXTiles 16-byte
// values per block of the group) fit 80 a thread at 4 blocks, 128 at 8.
template <int kGroup>
constexpr int kCtasPerSm = kGroup > 4 ? 2 : 3;

// kGated (the MLP's gate_up GEMM with SiLU x mul fused, skinny_gemm.h's SkinnyGemmSwiGlu): n is
// F, w has 2F rows (gate, then up), and a CTA's 16 rows of w are gate rows c .. c + 8 and the up
// rows F further on, so that its sums hold both halves of 8 output columns; `norm` gives the
// folded norm's row scales. Otherwise `norm` is unused.
// Operand e4m3 (SkinnyGemmE4m3): w and x are row-quantized codes, and each sum is scaled by its
// row's x_scales and its column's w_scales before it is stored.
template <typename Operand, int kXTiles, int kGroup, bool kOutF32, bool kAccumulate, bool kGated>
__global__ void __launch_bounds__(kThreads, kCtasPerSm<kGroup>)
    SkinnyGemmKernel(const Operand* __restrict__ w, int64_t ldw, const Operand* __restrict__ x,
                     int64_t ldx, void* __restrict__ out, int64_t ldo, int m, int n, int k,
                     RowRmsView norm, const float* __restrict__ w_scales,
                     const float* __restrict__ x_scales) {
  constexpr bool kE4m3 = std::is_same_v<Operand, e4m3>;
  static_assert(!(kE4m3 && kGated), "the gated form is bf16's");
  constexpr int kBlock = kBlockK<Operand>;
  constexpr int kLaneK = kBlock / 4;  // k a lane reads per block
  // Each warp's sums: [warp][row of x][column], padded against bank conflicts.
  __shared__ float partial[kWarps][kXTiles * 8][kColumns + 1];
  __shared__ float row_scales[kGated ? kXTiles * 8 : 1];
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane / 4;
  const int t = lane % 4;
  constexpr int kOutColumns = kGated ? kColumns / 2 : kColumns;  // output columns per CTA
  const int column0 = static_cast<int>(blockIdx.x) * kOutColumns;
  // The cluster's CTAs (blockIdx.y) split k between them, then their warps.
  const int splits = static_cast<int>(gridDim.y);
  const int split_warp = static_cast<int>(blockIdx.y) * kWarps + warp;
  // Rows of w past n read the last row (in bounds); their sums are never stored.
  const int64_t row_lo = min(column0 + g, n - 1);
  const int64_t row_hi = kGated ? n + row_lo : min(column0 + g + 8, n - 1);
  const Operand* w_lo = w + row_lo * ldw + kLaneK * t;
  const Operand* w_hi = w + row_hi * ldw + kLaneK * t;
  const int blocks = (k + kBlock - 1) / kBlock;
  const int per_warp = (blocks + kWarps * splits - 1) / (kWarps * splits);
  const int begin = min(blocks, split_warp * per_warp);
  const int end = min(blocks, begin + per_warp);

  uint4 lo[kGroup];
  uint4 hi[kGroup];
  const auto load_weights = [&](int first) {
#pragma unroll
    for (int u = 0; u < kGroup; ++u) {
      const int offset = (first + u) * kBlock;
      const bool valid = first + u < end && offset + kLaneK * t < k;
      lo[u] = valid ? LoadWeights(w_lo + offset) : make_uint4(0, 0, 0, 0);
      hi[u] = valid ? LoadWeights(w_hi + offset) : make_uint4(0, 0, 0, 0);
    }
  };
  load_weights(begin);  // depends on no kernel: streams while the kernel before finishes
  PdlWait();
  PdlLaunchDependents();

  float acc[kXTiles][4] = {};
  for (int first = begin; first < end; first += kGroup) {
    if (first != begin) load_weights(first);
    uint4 xs[kGroup][kXTiles];
#pragma unroll
    for (int u = 0; u < kGroup; ++u) {
      const int offset = (first + u) * kBlock + kLaneK * t;
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
      for (int tile = 0; tile < kXTiles; ++tile) {
        if constexpr (kE4m3) {
          MmaBlockE4m3(acc[tile], lo[u], hi[u], xs[u][tile]);
        } else {
          MmaBlock(acc[tile], lo[u], hi[u], xs[u][tile]);
        }
      }
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
  if constexpr (kGated) {
    // The folded norm's s of each row (the bits SiluMul computes), a warp a row: the gated form
    // takes one row tile (m <= kWarps) and no k split.
    static_assert(kXTiles * 8 <= kWarps, "the gated form takes one row tile");
    if (warp < m) {
      const float scale = WarpRowInvRms(norm, warp);
      if (lane == 0) row_scales[warp] = scale;
    }
  }
  // This CTA's sums over its warps, into partial[0] (each entry read and written by one thread).
  for (int index = static_cast<int>(threadIdx.x); index < kXTiles * 8 * kColumns;
       index += kThreads) {
    const int row = index / kColumns;
    float sum = 0.0f;
#pragma unroll
    for (int from = 0; from < kWarps; ++from) sum += partial[from][row][index % kColumns];
    partial[0][row][index % kColumns] = sum;
  }
  if (splits > 1) {
    // The first CTA of the cluster adds the others' sums; they wait until it has read them.
    ClusterSync();
    if (blockIdx.y != 0) {
      ClusterSync();
      return;
    }
  } else {
    __syncthreads();
  }
  // The sum of one entry of partial[0] over the cluster's CTAs.
  const auto cluster_sum = [&](int row, int column) {
    float sum = partial[0][row][column];
    for (int rank = 1; rank < splits; ++rank) {
      sum += ClusterPeerValue(&partial[0][row][column], rank);
    }
    return sum;
  };
  for (int index = static_cast<int>(threadIdx.x); index < kXTiles * 8 * kOutColumns;
       index += kThreads) {
    const int row = index / kOutColumns;
    const int column = column0 + index % kOutColumns;
    if (row >= m || column >= n) continue;
    const int64_t at = static_cast<int64_t>(row) * ldo + column;
    if constexpr (kGated) {
      // SiluMul's arithmetic (dense_kernels.cu) on the bf16 gate and up.
      const float s = row_scales[row];
      const float gate =
          __bfloat162float(__float2bfloat16_rn(cluster_sum(row, index % kOutColumns))) * s;
      const float up =
          __bfloat162float(__float2bfloat16_rn(cluster_sum(row, index % kOutColumns + 8)));
      static_cast<bf16*>(out)[at] = __float2bfloat16_rn(gate / (1.0f + __expf(-gate)) * (up * s));
      continue;
    }
    float sum = cluster_sum(row, index % kOutColumns);
    if constexpr (kE4m3) sum = sum * x_scales[row] * w_scales[column];
    if constexpr (kOutF32) {
      float* target = static_cast<float*>(out) + at;
      *target = kAccumulate ? *target + sum : sum;
    } else {
      bf16* target = static_cast<bf16*>(out) + at;
      *target = __float2bfloat16_rn(kAccumulate ? __bfloat162float(*target) + sum : sum);
    }
  }
  if (splits > 1) ClusterSync();
}

template <int kXTiles, int kGroup>
struct TileShape {
  static constexpr int first = kXTiles;
  static constexpr int second = kGroup;
};

template <typename Operand, int kXTiles, int kGroup>
void LaunchTiles(int64_t m, int64_t n, int64_t k, const Operand* w, int64_t ldw, const Operand* x,
                 int64_t ldx, void* out, int64_t ldo, bool out_f32, bool accumulate, int splits,
                 const float* w_scales, const float* x_scales, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((n + kColumns - 1) / kColumns), splits);
  const dim3 cluster(1, splits, 1);
  const dim3 block(kThreads);
  const auto launch = [&](auto kernel) {
    LaunchWithPdlInClusters(kernel, grid, cluster, block, 0, stream, w, ldw, x, ldx, out, ldo,
                            static_cast<int>(m), static_cast<int>(n), static_cast<int>(k),
                            RowRmsView{}, w_scales, x_scales);
  };
  if (out_f32) {
    accumulate ? launch(SkinnyGemmKernel<Operand, kXTiles, kGroup, true, true, false>)
               : launch(SkinnyGemmKernel<Operand, kXTiles, kGroup, true, false, false>);
  } else {
    accumulate ? launch(SkinnyGemmKernel<Operand, kXTiles, kGroup, false, true, false>)
               : launch(SkinnyGemmKernel<Operand, kXTiles, kGroup, false, false, false>);
  }
}

// The k splits of a kernel whose rows are `blocks` loads long: 1, and where the loaded device
// code has clusters (sm_90 and newer, device_image.h; an A100 or RTX 4090 runs one CTA a column
// block) 2 and 4 where every warp still gets blocks.
std::vector<int> SplitsForBlocks(int64_t blocks) {
  std::vector<int> splits;
  const bool clusters = LoadedImageArch() >= 900;
  for (const int count : {1, 2, 4}) {
    if (count == 1 || (clusters && blocks >= static_cast<int64_t>(count) * kWarps)) {
      splits.push_back(count);
    }
  }
  return splits;
}

// SkinnyGemm's launch for either operand type: the row tiles and load depth by m and the grid.
template <typename Operand>
void LaunchSkinny(int64_t m, int64_t n, int64_t k, const Operand* w, int64_t ldw, const Operand* x,
                  int64_t ldx, void* out, int64_t ldo, bool out_f32, bool accumulate, int splits,
                  const float* w_scales, const float* x_scales, cudaStream_t stream) {
  SIEVE_CHECK(splits == 1 || splits == 2 || splits == 4) << "k split " << splits;
  const int64_t ctas = (n + kColumns - 1) / kColumns * splits;
  const auto launch = [&](auto tiles) {
    constexpr int kXTiles = decltype(tiles)::first;
    constexpr int kGroup = decltype(tiles)::second;
    LaunchTiles<Operand, kXTiles, kGroup>(m, n, k, w, ldw, x, ldx, out, ldo, out_f32, accumulate,
                                          splits, w_scales, x_scales, stream);
  };
  if (m <= 8 && ctas <= kCtasPerSm<8> * CurrentDeviceAttribute<cudaDevAttrMultiProcessorCount>()) {
    launch(TileShape<1, 8>{});
  } else if (m <= 8) {
    launch(TileShape<1, 4>{});
  } else if (m <= 16) {
    launch(TileShape<2, 4>{});
  } else {
    launch(TileShape<4, 2>{});
  }
  SIEVE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

bool SkinnyGemmSupports(int64_t m, int64_t k, const bf16* w, int64_t ldw, const bf16* x,
                        int64_t ldx) {
  return m >= 1 && m <= kSkinnyGemmMaxRows && k >= 8 && k % 8 == 0 && k <= (int64_t{1} << 30) &&
         ldw % 8 == 0 && ldx % 8 == 0 && Aligned16(w) && Aligned16(x);
}

std::vector<int> SkinnyGemmSplits(int64_t k) {
  return SplitsForBlocks((k + kBlockK<bf16> - 1) / kBlockK<bf16>);
}

void SkinnyGemm(int64_t m, int64_t n, int64_t k, const bf16* w, int64_t ldw, const bf16* x,
                int64_t ldx, void* out, int64_t ldo, bool out_f32, bool accumulate, int splits,
                cudaStream_t stream) {
  LaunchSkinny(m, n, k, w, ldw, x, ldx, out, ldo, out_f32, accumulate, splits, nullptr, nullptr,
               stream);
}

bool SkinnyGemmE4m3Supports(int64_t m, int64_t k, const uint8_t* w, int64_t ldw, const uint8_t* x,
                            int64_t ldx) {
  return m >= 1 && m <= kSkinnyGemmMaxRows && k >= 16 && k % 16 == 0 && k <= (int64_t{1} << 30) &&
         ldw % 16 == 0 && ldx % 16 == 0 && Aligned16(w) && Aligned16(x) && LoadedImageArch() >= 890;
}

std::vector<int> SkinnyGemmE4m3Splits(int64_t k) {
  return SplitsForBlocks((k + kBlockK<e4m3> - 1) / kBlockK<e4m3>);
}

void SkinnyGemmE4m3(int64_t m, int64_t n, int64_t k, const uint8_t* w, int64_t ldw,
                    const float* w_scales, const uint8_t* x, int64_t ldx, const float* x_scales,
                    void* out, int64_t ldo, bool out_f32, bool accumulate, int splits,
                    cudaStream_t stream) {
  LaunchSkinny(m, n, k, w, ldw, x, ldx, out, ldo, out_f32, accumulate, splits, w_scales, x_scales,
               stream);
}

void SkinnyGemmSwiGlu(int64_t m, int64_t f, int64_t k, const bf16* w, const bf16* x, int64_t ldx,
                      const RowRmsView& norm, bf16* out, int64_t ldo, cudaStream_t stream) {
  SIEVE_CHECK(f >= 1 && f < (int64_t{1} << 30) && m <= kSkinnyGemmSwiGluMaxRows &&
              SkinnyGemmSupports(m, k, w, k, x, ldx))
      << "the gated skinny GEMM does not take " << m << " x " << f << " x " << k;
  SIEVE_CHECK(norm.rows == nullptr ||
              (norm.width % 8 == 0 && norm.stride % 8 == 0 && Aligned16(norm.rows)))
      << "a folded RMSNorm's rows must be 16-byte aligned, width and stride multiples of 8";
  // 8 output columns (16 rows of w) a CTA: f / 8 CTAs, enough to fill the SMs at the MLP's
  // widths without a k split. One row tile; groups of 4 blocks, as SkinnyGemm loads for grids
  // past 2 CTAs an SM.
  const dim3 grid(static_cast<unsigned>((f + kColumns / 2 - 1) / (kColumns / 2)));
  const auto launch = [&](auto kernel) {
    LaunchWithPdl(kernel, grid, kThreads, 0, stream, w, k, x, ldx, static_cast<void*>(out), ldo,
                  static_cast<int>(m), static_cast<int>(f), static_cast<int>(k), norm,
                  static_cast<const float*>(nullptr), static_cast<const float*>(nullptr));
  };
  launch(SkinnyGemmKernel<bf16, 1, 4, false, false, true>);
  SIEVE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace sieve::cuda
