// The small-m GEMM of small_m_gemm.h. The roles are swapped against the usual GEMM: w's rows are
// the MMA's M side and x's rows its N side, so the big operand fills the tensor-core tiles and the
// small one is padded only to 16 tokens. Per stage a CTA of 4 warps loads a 128 x 64 slab of w and
// an m x 64 slab of x into XOR-swizzled shared memory (the layout of flash_warp.cuh, which is also
// the tensor cores' 128-byte swizzle). On sm_90a the 4 warps are one warpgroup that multiplies
// both 64-row halves of the slab with every token by wgmma, reading both operands straight from
// shared memory; elsewhere each warp multiplies its 32 rows by mma.sync (ldmatrix fragments).
#include <cooperative_groups.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/flash_warp.cuh"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/small_m_gemm.h"

namespace sieve::cuda {
namespace {

using namespace flash;  // NOLINT: the warp helpers (cp.async, ldmatrix, mma)

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kTileN = kSmallMGemmTileN;
constexpr int kTileK = kSmallMGemmTileK;
constexpr int kStages = 4;
constexpr int kWarpRows = kTileN / kWarps;  // 32: two m16 fragments per warp
constexpr int kChunks = kTileK / 8;         // 16-byte chunks per tile row
static_assert(kWarpRows == 32, "each warp owns two 16-row A fragments");
// The tiles' swizzle repeats every 8 rows of 128 bytes; wgmma's descriptors assume each tile
// starts on such a 1024-byte boundary.
constexpr int kTileAlign = 1024;
static_assert(kTileK * 2 == 128, "a tile row is one 128-byte swizzle row");

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define SIEVE_SMALL_M_WGMMA 1
#endif
constexpr bool UsesWgmma() {
#ifdef SIEVE_SMALL_M_WGMMA
  return true;
#else
  return false;
#endif
}

// The w row of accumulator (i, c) of this thread. wgmma (one warpgroup): half i of the slab is
// one m64 tile whose warp `warp` holds rows 16 * warp + g (+ 8). mma.sync: warp `warp` owns rows
// 32 * warp + 16 * i + g (+ 8).
__device__ __forceinline__ int AccumulatorRow(int warp, int i, int g, int c) {
  return UsesWgmma() ? i * 64 + warp * 16 + g + 8 * (c / 2)
                     : warp * kWarpRows + i * 16 + g + 8 * (c / 2);
}

#ifdef SIEVE_SMALL_M_WGMMA
// A shared-memory matrix descriptor for a K-major tile of 128-byte rows in the 128-byte swizzle:
// start address, stride between 8-row core groups (1024 bytes; the leading offset is unused by
// this layout), swizzle mode 1 (128 B). Stepping k by 16 adds 32 bytes to the start address.
__device__ __forceinline__ uint64_t TileDescriptor(uint32_t address) {
  return static_cast<uint64_t>((address & 0x3FFFF) >> 4) | (uint64_t{1} << 16) |
         (uint64_t{1024 >> 4} << 32) | (uint64_t{1} << 62);
}

// acc (64 w rows x kTokens tokens, f32) += A (64 x 16 of w) . B (16 x kTokens of x)^T, both
// operands read from shared memory through their descriptors.
template <int kTokens>
__device__ __forceinline__ void Wgmma(float (&acc)[kTokens / 8][4], uint64_t a, uint64_t b);

template <>
__device__ __forceinline__ void Wgmma<16>(float (&d)[2][4], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
        "+f"(d[1][2]), "+f"(d[1][3])
      : "l"(a), "l"(b), "r"(1));  // 1: d += a . b
}

template <>
__device__ __forceinline__ void Wgmma<32>(float (&d)[4][4], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, "
      "p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
        "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3])
      : "l"(a), "l"(b), "r"(1));  // 1: d += a . b
}

template <>
__device__ __forceinline__ void Wgmma<64>(float (&d)[8][4], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "%32, %33, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
        "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]),
        "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]),
        "+f"(d[7][2]), "+f"(d[7][3])
      : "l"(a), "l"(b), "r"(1));  // 1: d += a . b
}
#endif

template <int kTileM>
__host__ __device__ constexpr int StageBytes() {
  return (kTileN + kTileM) * kTileK * 2;
}
// The cluster reduction's f32 partial sums, [token][w row] with rows padded by 4 floats: the
// fragment stores hit 32 different banks and every row stays 16-byte aligned for float4 reads.
constexpr int kPartialStride = kTileN + 4;
template <int kTileM>
constexpr bool PartialsFit() {
  return kTileM * kPartialStride * 4 <= kStages * StageBytes<kTileM>();
}
static_assert(PartialsFit<16>() && PartialsFit<32>() && PartialsFit<64>());

// out = value, or out += value (one rounding of the f32 sum) when accumulating.
__device__ __forceinline__ void Store(float* out, float value, bool accumulate) {
  *out = accumulate ? *out + value : value;
}
__device__ __forceinline__ void Store(__nv_bfloat16* out, float value, bool accumulate) {
  *out = __float2bfloat16_rn(accumulate ? __bfloat162float(*out) + value : value);
}

// Columns [k0, k0 + kTileK) of kRows rows of `src` (row stride ld) into the swizzled tile at
// `tile`, by cp.async: rows at or past `valid_rows` and columns at or past k are zero-filled
// without being read.
template <int kRows>
__device__ __forceinline__ void LoadRows(uint32_t tile, const __nv_bfloat16* src, int64_t ld,
                                         int valid_rows, int k0, int k, int tid) {
#pragma unroll
  for (int step = 0; step < kRows * kChunks / kThreads; ++step) {
    const int index = tid + step * kThreads;
    const int row = index / kChunks;
    const int chunk = index % kChunks;
    const int col = k0 + chunk * 8;
    const bool valid = row < valid_rows && col < k;
    CpAsync16(tile + TileOffset<kTileK>(row, chunk), valid ? src + row * ld + col : src, valid);
  }
}

// kCluster: the gridDim.y splits of a slab are one thread-block cluster (sm_90+) and add their
// sums through distributed shared memory; otherwise splits add up by atomics in split_sums.
template <int kTileM, typename OutT, bool kCluster>
__global__ void __launch_bounds__(kThreads)
    SmallMGemmKernel(SmallMGemmArgs args, int per_split, int prefetch_blocks) {
  extern __shared__ __align__(128) unsigned char shared[];
  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int slab = static_cast<int>(blockIdx.x);
  const int n0 = slab * kTileN;
  const int k_blocks = (args.k + kTileK - 1) / kTileK;
  const int kb_begin = static_cast<int>(blockIdx.y) * per_split;
  const int count = min(k_blocks, kb_begin + per_split) - kb_begin;
  // The host asks for kTileAlign bytes more than the stages need (see Launch).
  const uint32_t base = (SharedAddress(shared) + kTileAlign - 1) & ~uint32_t{kTileAlign - 1};

  // Stage `slot` <- k block kb_begin + kb of w (the slab's kTileN rows) and of x (kTileM token
  // rows, after w's tile): rows past n or m and k past the end are zero-filled without being read.
  const auto load_w = [&](int kb, int slot) {
    LoadRows<kTileN>(base + slot * StageBytes<kTileM>(), args.w + n0 * args.ldw, args.ldw,
                     args.n - n0, (kb_begin + kb) * kTileK, args.k, tid);
  };
  const auto load_x = [&](int kb, int slot) {
    LoadRows<kTileM>(base + slot * StageBytes<kTileM>() + kTileN * kTileK * 2, args.x, args.ldx,
                     args.m, (kb_begin + kb) * kTileK, args.k, tid);
  };

  // The weights depend on no earlier kernel: their first stages are requested, and the next
  // prefetch_blocks stages pulled towards the L2, before waiting for the kernel that writes x
  // (pdl.cuh). In a decode step that overlaps the weight stream with the small kernels before.
  PdlLaunchDependents();
#pragma unroll
  for (int stage = 0; stage < kStages - 1; ++stage) {
    if (stage < count) load_w(stage, stage);
  }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const int prefetch_end = min(count, prefetch_blocks);
  if (prefetch_end > kStages - 1 && n0 + tid < args.n) {
    static_assert(kThreads == kTileN, "one thread per w row of the slab");
    const int k_begin = (kb_begin + kStages - 1) * kTileK;
    const int k_end = min(args.k, (kb_begin + prefetch_end) * kTileK);
    const __nv_bfloat16* row = args.w + (n0 + tid) * args.ldw + k_begin;
    const uint32_t bytes = static_cast<uint32_t>(k_end - k_begin) * 2;  // k % 8 == 0: whole 16 B
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(row), "r"(bytes) : "memory");
  }
#endif
  PdlWait();
  // Commit groups: the first holds stage 0's x and the early w stages, then one per stage.
#pragma unroll
  for (int stage = 0; stage < kStages - 1; ++stage) {
    if (stage < count) load_x(stage, stage);
    CpAsyncCommit();
  }
  float acc[2][kTileM / 8][4];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
#pragma unroll
    for (int j = 0; j < kTileM / 8; ++j) {
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[i][j][c] = 0.0f;
    }
  }

  for (int kb = 0; kb < count; ++kb) {
    CpAsyncWait<kStages - 2>();
#ifdef SIEVE_SMALL_M_WGMMA
    // wgmma reads shared memory through the async proxy: make this thread's cp.async writes
    // visible to it before the barrier publishes them.
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
    __syncthreads();  // stage kb is visible to all; every warp is done with stage kb - 1's slot
    if (kb + kStages - 1 < count) {
      load_w(kb + kStages - 1, (kb + kStages - 1) % kStages);
      load_x(kb + kStages - 1, (kb + kStages - 1) % kStages);
    }
    CpAsyncCommit();
    const uint32_t w_tile = base + (kb % kStages) * StageBytes<kTileM>();
    const uint32_t x_tile = w_tile + kTileN * kTileK * 2;
#ifdef SIEVE_SMALL_M_WGMMA
    // Both halves of the slab, 4 k steps each, then wait: the next iteration refills this slot
    // right after its barrier, so every wgmma must have read it before this thread gets there.
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
    for (int ks = 0; ks < kTileK / 16; ++ks) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        Wgmma<kTileM>(acc[i], TileDescriptor(w_tile + i * 64 * kTileK * 2 + ks * 32),
                      TileDescriptor(x_tile + ks * 32));
      }
    }
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#else
#pragma unroll
    for (int ks = 0; ks < kTileK / 16; ++ks) {
      uint32_t a[2][4];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        LdMatrixX4(w_tile + TileOffset<kTileK>(warp * kWarpRows + i * 16 + (lane & 15),
                                               ks * 2 + (lane >> 4)),
                   a[i]);
      }
#pragma unroll
      for (int p = 0; p < kTileM / 16; ++p) {
        // Matrices: tokens 0-7 at k 0-7 and 8-15 (b0, b1 of the first n8 tile), then tokens
        // 8-15 likewise (the second tile).
        uint32_t b[4];
        LdMatrixX4(x_tile + TileOffset<kTileK>(p * 16 + (lane & 7) + ((lane >> 4) << 3),
                                               ks * 2 + ((lane >> 3) & 1)),
                   b);
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          Mma(acc[i][2 * p], a[i], b[0], b[1]);
          Mma(acc[i][2 * p + 1], a[i], b[2], b[3]);
        }
      }
    }
#endif
  }
  CpAsyncWait<0>();

  // Accumulator element c of (i, j): w row AccumulatorRow(warp, i, g, c), token j*8 + 2t + c%2.
  const int g = lane >> 2;
  const int t = lane & 3;
  OutT* out = static_cast<OutT*>(args.out);
  const bool split = gridDim.y > 1;
  if constexpr (kCluster) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    // Each split parks its sums in its own shared memory (the pipeline stages are drained); after
    // a cluster barrier, split r adds up its share of the slab's [m][128] outputs over every
    // split's shared memory and writes them; a second barrier keeps each CTA's shared memory alive
    // until its peers are done reading it.
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    float* partial = reinterpret_cast<float*>(shared);
    __syncthreads();  // every warp is done with the last stage
#pragma unroll
    for (int i = 0; i < 2; ++i) {
#pragma unroll
      for (int j = 0; j < kTileM / 8; ++j) {
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int row = AccumulatorRow(warp, i, g, c);
          const int token = j * 8 + 2 * t + (c % 2);
          partial[token * kPartialStride + row] = acc[i][j][c];
        }
      }
    }
    cluster.sync();
    const int splits = static_cast<int>(cluster.num_blocks());  // = gridDim.y
    const int rank = static_cast<int>(cluster.block_rank());
    const int quads = args.m * (kTileN / 4);  // float4 groups of the slab's outputs
    const int per_rank = (quads + splits - 1) / splits;
    const int quad_end = min(quads, (rank + 1) * per_rank);
    for (int quad = rank * per_rank + tid; quad < quad_end; quad += kThreads) {
      const int token = quad / (kTileN / 4);
      const int col = (quad % (kTileN / 4)) * 4;
      float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      for (int peer = 0; peer < splits; ++peer) {
        const float4 part = *reinterpret_cast<const float4*>(
            cluster.map_shared_rank(partial + token * kPartialStride + col, peer));
        sum.x += part.x;
        sum.y += part.y;
        sum.z += part.z;
        sum.w += part.w;
      }
      const float values[4] = {sum.x, sum.y, sum.z, sum.w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        if (n0 + col + e < args.n) {
          Store(out + token * args.ldo + n0 + col + e, values[e], args.accumulate);
        }
      }
    }
    cluster.sync();
#endif
  } else {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
#pragma unroll
      for (int j = 0; j < kTileM / 8; ++j) {
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int row = n0 + AccumulatorRow(warp, i, g, c);
          const int token = j * 8 + 2 * t + (c % 2);
          if (row >= args.n || token >= args.m) continue;
          if (split) {
            atomicAdd(args.split_sums + static_cast<int64_t>(token) * args.n + row, acc[i][j][c]);
          } else {
            Store(out + token * args.ldo + row, acc[i][j][c], args.accumulate);
          }
        }
      }
    }
    if (!split) return;

    // The last CTA of this slab to finish owns the sums: it writes them out and clears them.
    __shared__ bool last;
    __threadfence();
    __syncthreads();
    if (tid == 0)
      last = atomicAdd(args.split_counters + slab, 1) == static_cast<int>(gridDim.y) - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    const int rows = min(kTileN, args.n - n0);
    for (int index = tid; index < args.m * kTileN; index += kThreads) {
      const int token = index / kTileN;
      const int col = index % kTileN;
      if (col >= rows) continue;
      float* sum = args.split_sums + static_cast<int64_t>(token) * args.n + n0 + col;
      Store(out + token * args.ldo + n0 + col, __ldcg(sum), args.accumulate);
      *sum = 0.0f;
    }
    if (tid == 0) args.split_counters[slab] = 0;
  }
}

template <int kTileM, typename OutT>
void Launch(const SmallMGemmArgs& args, cudaStream_t stream) {
  // The stages, plus room to start them on a kTileAlign boundary.
  constexpr int kSmemBytes = kStages * StageBytes<kTileM>() + kTileAlign;
  const int k_blocks = (args.k + kTileK - 1) / kTileK;
  const int splits = std::clamp(args.splits, 1, k_blocks);
  const int per_split = (k_blocks + splits - 1) / splits;
  const int used_splits = (k_blocks + per_split - 1) / per_split;  // none left empty
  bool cluster = false;
  if (used_splits > 1) {
    switch (args.reduce) {
      case SmallMSplitReduce::kAuto:
        cluster = used_splits <= kSmallMGemmMaxClusterSplits && SmallMGemmHasClusters();
        break;
      case SmallMSplitReduce::kCluster:
        if (used_splits > kSmallMGemmMaxClusterSplits || !SmallMGemmHasClusters()) {
          std::fprintf(stderr, "SmallMGemm: a cluster of %d splits is not available here\n",
                       used_splits);
          std::abort();
        }
        cluster = true;
        break;
      case SmallMSplitReduce::kAtomics:
        break;
    }
  }
  if (used_splits > 1 && !cluster &&
      (args.split_sums == nullptr || args.split_counters == nullptr)) {
    std::fprintf(stderr, "SmallMGemm: %d splits need the split buffers\n", used_splits);
    std::abort();
  }
  const auto kernel =
      cluster ? SmallMGemmKernel<kTileM, OutT, true> : SmallMGemmKernel<kTileM, OutT, false>;
  // Set on every call (it is cheap and not a stream operation): the attribute belongs to the
  // current device, and a process may drive several.
  SIEVE_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  const dim3 grid(SmallMGemmSlabs(args.n), used_splits);
  // Pull at most ~40 MB of weights towards the 50-60 MB L2 ahead of the pipeline.
  constexpr double kPrefetchBytes = 40.0 * (1 << 20);
  const double ctas = static_cast<double>(grid.x) * grid.y;
  const int prefetch_blocks = static_cast<int>(kPrefetchBytes / (ctas * kTileN * kTileK * 2.0));
  // With clusters, the splits of a slab are one cluster.
  const dim3 cluster_shape(1, cluster ? used_splits : 1, 1);
  LaunchWithPdlInClusters(kernel, grid, cluster_shape, kThreads, kSmemBytes, stream, args,
                          per_split, prefetch_blocks);
}

template <typename OutT>
void LaunchForRows(const SmallMGemmArgs& args, cudaStream_t stream) {
  if (args.m <= 16) {
    Launch<16, OutT>(args, stream);
  } else if (args.m <= 32) {
    Launch<32, OutT>(args, stream);
  } else {
    Launch<64, OutT>(args, stream);
  }
}

bool Aligned16(const void* pointer) { return reinterpret_cast<uintptr_t>(pointer) % 16 == 0; }

}  // namespace

bool SmallMGemmSupports(const SmallMGemmArgs& args) {
  return args.m >= 1 && args.m <= kSmallMGemmMaxRows && args.n >= 1 && args.k >= 8 &&
         args.k % 8 == 0 && args.ldw % 8 == 0 && args.ldx % 8 == 0 && Aligned16(args.w) &&
         Aligned16(args.x);
}

bool SmallMGemmHasClusters() { return DeviceComputeMajor() >= 9; }

void SmallMGemm(const SmallMGemmArgs& args, cudaStream_t stream) {
  if (args.out_f32) {
    LaunchForRows<float>(args, stream);
  } else {
    LaunchForRows<__nv_bfloat16>(args, stream);
  }
}

}  // namespace sieve::cuda
