// GEMMs whose epilogue does the op that follows them, on Hopper (sm_90a), built as
// prefill_attention_sm90.cu is: tensor copies (TMA) into 128-byte-swizzled shared memory,
// warpgroup MMA (wgmma.cuh) and warp specialisation. Two epilogues share one main loop:
// - SwiGluGemm, the MLP's gate_up GEMM with SiLU x mul: a tile's w slice is its 128 gate rows and
//   the 128 up rows F further on, so that in the accumulator fragment (wgmma.cuh) a thread holds
//   gate column c in block j and up column c in block j + 16 of the same rows, and multiplies them
//   in registers, with no shuffle and no shared memory;
// - QkvRopeGemm, the attention's qkv GEMM with RoPE and the K/V cache write
//   (RopeAndCacheWrite's, kv_kernels.cu): a tile's 256 output columns are whole heads (d = 64 or
//   128), so the rotated pair (c, c + d/2) of a head is blocks j and j + d/16 of one thread.
//
// A tile's w slice is 256 rows (two halves of 128 rows, each one tensor copy a k step), computed
// by one wgmma of N = 256 a k16 slice. The grid is persistent (one CTA per SM) and walks the tiles
// in groups of row tiles (EpilogueGemmUnitOf), so the CTAs running together share their x and w
// tiles in the L2.
// A producer warpgroup (one thread issues the copies of each k step's x and w slices into a ring
// of stages, running ahead into the next tile) and two consumer warpgroups, which keep one k step's
// products in flight while the next is issued, then run the epilogue on their 64 x 256
// accumulators straight from registers.
//
// Two experiments beside the default (EpilogueGemmVariant):
// - ping-pong: the consumers take turns with tiles of 64 rows of their own instead of sharing
//   tiles of 128 rows, so that one's epilogue runs while the other's products are on the tensor
//   cores (the cooperative schedule leaves them idle during its epilogue);
// - cluster = 2: two CTAs of a thread-block cluster take adjacent row tiles of one column tile and
//   share its w slice: each copies one half into both CTAs' shared memory (multicast), so a CTA
//   reads 32 KiB of the L2 a k step instead of 48. A stage is then free once its consumers in both
//   CTAs are done with it.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/epilogue_gemm.h"
#include "backend/cuda/flash_warp.cuh"
#include "backend/cuda/kv_index.cuh"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/rope.cuh"
#include "backend/cuda/tensor_map.h"
#include "backend/cuda/wgmma.cuh"
#include "core/check.h"

namespace sieve::cuda {
namespace {

using bf16 = __nv_bfloat16;

// Some of these are used only by the kernel body, which the host pass and builds for other
// architectures leave out.
constexpr int kHalfRows = 128;                // rows of w a half of a tile's w slice
constexpr int kTileColumns = 2 * kHalfRows;   // the accumulator's columns: 32 blocks of 8
[[maybe_unused]] constexpr int kBlockK = 64;  // a k step: one 128-byte panel of each operand
constexpr int kConsumers = 2;
constexpr int kThreads = (1 + kConsumers) * 128;
[[maybe_unused]] constexpr int kProducerRegisters = 24;
[[maybe_unused]] constexpr int kConsumerRegisters = 240;
[[maybe_unused]] constexpr uint32_t kHalfBytes = kHalfRows * kBlockK * 2;  // 16 KiB
static_assert(kProducerRegisters * 128 + kConsumerRegisters * 128 * kConsumers <= 65536);

// The consumers' schedule. Cooperative: a tile is 128 rows of x, 64 a consumer, 4 stages of
// 48 KiB. Ping-pong: a tile is 64 rows, the consumers take every other tile of their CTA, 5
// stages of 40 KiB. Shared memory: the stages, 1 KiB to align them to the 1024-byte swizzle
// atoms, and the barriers.
template <bool kPingpong>
struct Schedule {
  static constexpr int kTileRows = kPingpong ? 64 : 128;
  static constexpr int kStages = kPingpong ? 5 : 4;
  static constexpr uint32_t kTileXBytes = kTileRows * kBlockK * 2;
  static constexpr uint32_t kStageBytes = kTileXBytes + 2 * kHalfBytes;
  static constexpr int kSmemBytes =
      1024 + kStages * static_cast<int>(kStageBytes) + 2 * kStages * 8;
  static_assert(kSmemBytes <= 227 * 1024);
};

// s of each row (row_rms.cuh), a warp a row: the GEMM's epilogue reads it from `scales`.
__global__ void RowScalesKernel(RowRmsView norm, int rows, float* __restrict__ scales) {
  PdlWait();
  PdlLaunchDependents();
  const int row = static_cast<int>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (row >= rows) return;
  const float scale = WarpRowInvRms(norm, row);
  if (threadIdx.x % 32 == 0) scales[row] = scale;
}

}  // namespace

// The epilogues (outside the anonymous namespace: the host pass, which leaves out the kernel
// body that calls them, would warn of unused internal functions).
namespace epilogues {

using bf16 = __nv_bfloat16;

__device__ __forceinline__ float RoundToBf16(float value) {
  return __bfloat162float(__float2bfloat16(value));
}

// ---- Epilogues. Each gives the w rows of a column tile's two halves and stores a consumer
// warp's 16 x 256 accumulators: rows row_g and row_g + 8 of x (lane = 4g + t), blocks of 8
// columns, block j holding columns 8j + 2t, 8j + 2t + 1 (wgmma.cuh). What a row needs from memory
// (its scale, its pool entry) is loaded by Prepare before the tile's main loop, whose products
// then hide those loads' latency, and handed to Store. ----

// out[m][f] = silu(s bf16(gate)) * (s bf16(up)): SiluMul's arithmetic (dense_kernels.cu) on the
// bf16 products, each quad writing 16 contiguous bytes of a row.
struct SwiGluEpilogue {
  const float* row_scales;  // null: s = 1
  bf16* out;
  int64_t out_stride;
  int m;
  int f;
  int column_tiles;  // F / 128

  __device__ int WRow(int column_tile, int half) const {
    return half * f + column_tile * kHalfRows;
  }
  struct Rows {
    float scale[2];
  };
  __device__ __forceinline__ Rows Prepare(int row_g) const {
    Rows rows;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = row_g + 8 * half;
      rows.scale[half] = row_scales != nullptr && row < m ? row_scales[row] : 1.0f;
    }
    return rows;
  }
  __device__ __forceinline__ void Store(float (&acc)[32][4], const Rows& rows, int row_g,
                                        int column_tile, int t) const {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = row_g + 8 * half;
      if (row >= m) continue;
      const float s = rows.scale[half];
      bf16* out_row =
          out + static_cast<int64_t>(row) * out_stride + column_tile * kHalfRows + 2 * t;
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        float value[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float gate = RoundToBf16(acc[j][2 * half + e]) * s;
          const float up = RoundToBf16(acc[j + 16][2 * half + e]);
          value[e] = gate / (1.0f + __expf(-gate)) * (up * s);
        }
        *reinterpret_cast<uint32_t*>(out_row + 8 * j) = flash::PackBf16(value[0], value[1]);
      }
    }
  }
};

// qkv[m][(H + 2G) d] = x . w^T, then on rows below rope_rows (the step's prefill tokens) what
// RopeAndCacheWrite does to them: q and k rotated and v, all scaled by s first, and k, v (and the
// position side pools) into the token's pool entry where its sequence writes one. The arithmetic
// is rope.cuh's on the bf16 products, as RopeAndCacheWriteKernel's on the bf16 qkv row.
template <int kHeadDim>
struct QkvRopeEpilogue {
  bf16* qkv;
  int64_t qkv_stride;
  const float* rope_table;  // [max_pos][d/2][2]
  const float* row_scales;  // null: s = 1
  StepView step;
  PoolView pool;
  int layer;
  int num_heads;
  int m;
  int rope_rows;
  int column_tiles;  // (H + 2G) d / 256

  __device__ int WRow(int column_tile, int half) const {
    return column_tile * kTileColumns + half * kHalfRows;
  }
  // A prefill row's scale, position and pool entry (-1: none). Every lane of the warp calls it
  // (the sequence search shuffles).
  struct Rows {
    float scale[2];
    int position[2];
    int64_t entry[2];
  };
  __device__ __forceinline__ Rows Prepare(int row_g) const {
    Rows rows;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = row_g + 8 * half;
      const bool rotated = row < m && row < rope_rows;
      const int seq = WarpSequenceOf(step.query_start, step.num_prefill_seqs, row);
      rows.scale[half] = rotated && row_scales != nullptr ? row_scales[row] : 1.0f;
      rows.position[half] = rotated ? step.positions[row] : 0;
      rows.entry[half] = rotated ? WriteEntry(step, layer, pool, row, seq) : -1;
    }
    return rows;
  }
  __device__ __forceinline__ void Store(float (&acc)[32][4], const Rows& rows, int row_g,
                                        int column_tile, int t) const {
    constexpr int kHeadsPerTile = kTileColumns / kHeadDim;
    constexpr int kHeadBlocks = kHeadDim / 8;
    constexpr int kPairBlocks = kHeadBlocks / 2;  // from x[i] to its partner x[i + d/2]
    const int first_head = column_tile * kHeadsPerTile;
    const int kv_heads = pool.num_kv_heads;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = row_g + 8 * half;
      if (row >= m) continue;
      bf16* out_row =
          qkv + static_cast<int64_t>(row) * qkv_stride + column_tile * kTileColumns + 2 * t;
      if (row >= rope_rows) {  // a decode token: stored as the GEMM's product
#pragma unroll
        for (int j = 0; j < 32; ++j) {
          *reinterpret_cast<uint32_t*>(out_row + 8 * j) =
              flash::PackBf16(acc[j][2 * half], acc[j][2 * half + 1]);
        }
        continue;
      }
      const float s = rows.scale[half];
      const int position = rows.position[half];
      const int64_t entry = rows.entry[half];
      const float* cos_sin = rope_table + static_cast<int64_t>(position) * kHeadDim;
#pragma unroll
      for (int local = 0; local < kHeadsPerTile; ++local) {
        const int head = first_head + local;
        bf16* x = out_row + local * kHeadDim;
        const int first_block = local * kHeadBlocks;
        if (head < num_heads + kv_heads) {  // q or k: rotated
          const int kv_head = head - num_heads;
          bf16* cache = kv_head >= 0 && entry >= 0
                            ? pool.k + (entry * kv_heads + kv_head) * kHeadDim + 2 * t
                            : nullptr;
#pragma unroll
          for (int j = 0; j < kPairBlocks; ++j) {
            // cos, sin of pairs 8j + 2t and 8j + 2t + 1.
            const float4 angles = *reinterpret_cast<const float4*>(cos_sin + 2 * (8 * j + 2 * t));
            const int low = first_block + j;
            const int high = low + kPairBlocks;
            bf16 a0, b0, a1, b1;
            rope::RotatePair(__fmul_rn(RoundToBf16(acc[low][2 * half]), s),
                             __fmul_rn(RoundToBf16(acc[high][2 * half]), s), angles.x, angles.y, a0,
                             b0);
            rope::RotatePair(__fmul_rn(RoundToBf16(acc[low][2 * half + 1]), s),
                             __fmul_rn(RoundToBf16(acc[high][2 * half + 1]), s), angles.z, angles.w,
                             a1, b1);
            const uint32_t low_word = rope::PackPair(a0, a1);
            const uint32_t high_word = rope::PackPair(b0, b1);
            *reinterpret_cast<uint32_t*>(x + 8 * j) = low_word;
            *reinterpret_cast<uint32_t*>(x + 8 * j + kHeadDim / 2) = high_word;
            if (cache != nullptr) {
              *reinterpret_cast<uint32_t*>(cache + 8 * j) = low_word;
              *reinterpret_cast<uint32_t*>(cache + 8 * j + kHeadDim / 2) = high_word;
            }
          }
          if (cache != nullptr && t == 0) {
            if (pool.positions) pool.positions[entry * kv_heads + kv_head] = position;
            if (pool.scores) pool.scores[entry * kv_heads + kv_head] = 0.0f;
          }
        } else {  // v: scaled
          const int kv_head = head - num_heads - kv_heads;
          bf16* cache =
              entry >= 0 ? pool.v + (entry * kv_heads + kv_head) * kHeadDim + 2 * t : nullptr;
#pragma unroll
          for (int j = 0; j < kHeadBlocks; ++j) {
            const int block = first_block + j;
            const uint32_t word = rope::PackPair(
                __float2bfloat16(__fmul_rn(RoundToBf16(acc[block][2 * half]), s)),
                __float2bfloat16(__fmul_rn(RoundToBf16(acc[block][2 * half + 1]), s)));
            *reinterpret_cast<uint32_t*>(x + 8 * j) = word;
            if (cache != nullptr) *reinterpret_cast<uint32_t*>(cache + 8 * j) = word;
          }
        }
      }
    }
  }
};

}  // namespace epilogues

namespace {

using epilogues::QkvRopeEpilogue;
using epilogues::SwiGluEpilogue;

// ---- The main loop, shared by the epilogues' kernels (below; a kernel of its own each, so
// that a timeline tells them apart). The tensor maps are the kernel's __grid_constant__
// parameters: the tensor copies take their addresses. ----
template <int kCluster, bool kPingpong, class Epilogue>
__device__ __forceinline__ void EpilogueGemmMainLoop(const CUtensorMap& map_x,
                                                     const CUtensorMap& map_w, int m, int k,
                                                     const Epilogue& epilogue) {
#if SIEVE_SM90A
  static_assert(kCluster == 1 || kCluster == 2);
  using S = Schedule<kPingpong>;
  constexpr int kStages = S::kStages;
  constexpr uint32_t kStageBytes = S::kStageBytes;
  extern __shared__ uint8_t smem_raw[];
  const uint32_t smem = (flash::SharedAddress(smem_raw) + 1023) & ~1023u;
  // Stage s: the x slice (a tile's rows), then the w slice (its two halves of 128 rows), each row
  // 64 k of 128 bytes. The barriers after the stages: full, then empty, one of each a stage.
  const auto stage_x = [&](int stage) { return smem + stage * kStageBytes; };
  const auto stage_w = [&](int stage) { return smem + stage * kStageBytes + S::kTileXBytes; };
  const uint32_t barriers = smem + kStages * kStageBytes;
  const auto bar_full = [&](int stage) { return barriers + 8 * stage; };
  const auto bar_empty = [&](int stage) { return barriers + 8 * (kStages + stage); };
  // A unit of work: kCluster adjacent row tiles of one column tile, one a CTA of the cluster (a
  // row tile past m reads zeros and stores nothing).
  const int cta = kCluster > 1 ? static_cast<int>(wgmma::ClusterRank()) : 0;
  const int cluster = static_cast<int>(blockIdx.x) / kCluster;
  const int num_clusters = static_cast<int>(gridDim.x) / kCluster;
  const int row_units = (m + S::kTileRows * kCluster - 1) / (S::kTileRows * kCluster);
  const int column_tiles = epilogue.column_tiles;
  const int num_units = row_units * column_tiles;
  const int k_steps = (k + kBlockK - 1) / kBlockK;  // a last partial step reads zeros past k

  if (threadIdx.x == 0) {
    for (int stage = 0; stage < kStages; ++stage) {
      wgmma::BarrierInit(bar_full(stage), 1);
      // Each warp of the stage's consumers (one warpgroup in ping-pong, both otherwise) in each
      // CTA whose w half the stage receives.
      wgmma::BarrierInit(bar_empty(stage), 4 * (kPingpong ? 1 : kConsumers) * kCluster);
    }
    wgmma::FenceBarrierInit();
  }
  if constexpr (kCluster > 1) {
    wgmma::ClusterSync();  // no CTA copies or arrives into another before its barriers exist
  } else {
    __syncthreads();
  }
  // x (the residual stream), the row scales and the step's tables come from the kernels and
  // copies before.
  PdlWait();
  PdlLaunchDependents();

  const int warpgroup = static_cast<int>(threadIdx.x) / 128;
  if (warpgroup == 0) {
    // The producer. Rows of x past m read as zeros; their products are never stored.
    wgmma::RegistersDecrease<kProducerRegisters>();
    if (threadIdx.x != 0) return;
    int steps = 0;  // k steps loaded so far: the stage and its phase
    for (int unit = cluster; unit < num_units; unit += num_clusters) {
      const EpilogueGemmUnit work = EpilogueGemmUnitOf(unit, row_units, column_tiles);
      const int row0 = (work.row_unit * kCluster + cta) * S::kTileRows;
      for (int step = 0; step < k_steps; ++step, ++steps) {
        const int stage = steps % kStages;
        if (steps >= kStages) wgmma::BarrierWait(bar_empty(stage), ((steps / kStages) & 1) ^ 1);
        wgmma::BarrierArriveExpectBytes(bar_full(stage), kStageBytes);
        const int k0 = step * kBlockK;
        wgmma::TensorCopy2d(stage_x(stage), &map_x, k0, row0, bar_full(stage));
        if constexpr (kCluster == 1) {
          for (int half = 0; half < 2; ++half) {
            wgmma::TensorCopy2d(stage_w(stage) + half * kHalfBytes, &map_w, k0,
                                epilogue.WRow(work.column_tile, half), bar_full(stage));
          }
        } else {
          // CTA c copies half c into both.
          wgmma::TensorCopy2dMulticast(stage_w(stage) + cta * kHalfBytes, &map_w, k0,
                                       epilogue.WRow(work.column_tile, cta), bar_full(stage), 0b11);
        }
      }
    }
    if constexpr (kCluster > 1) {
      // The other CTA's consumers arrive on this CTA's empty barriers until its last stages are
      // done: this CTA stays until they have, so that no arrival meets a CTA that has exited.
      for (int tail = 0; tail < kStages; ++tail, ++steps) {
        if (steps >= kStages) {
          wgmma::BarrierWait(bar_empty(steps % kStages), ((steps / kStages) & 1) ^ 1);
        }
      }
    }
    return;
  }
  wgmma::RegistersIncrease<kConsumerRegisters>();

  const int consumer = warpgroup - 1;
  const int warp = (static_cast<int>(threadIdx.x) / 32) & 3;  // in the warpgroup
  const int lane = static_cast<int>(threadIdx.x) & 31;
  // The warpgroup's 64 x 256 accumulator: blocks 0-15 the first half's columns, 16-31 the second's.
  float acc[32][4];
  const auto release = [&](int stage) {
    if (lane == 0) {
      wgmma::BarrierArrive(bar_empty(stage));
      if constexpr (kCluster > 1) wgmma::BarrierArriveInCta(bar_empty(stage), cta ^ 1);
    }
  };

  // Ping-pong: the consumers take the CTA's units in turn, 0 first. Each waits for its turn on its
  // named barrier (1 + consumer), which the other arrives on once it has waited for the last full
  // stage of its unit. The order is needed, not only wanted: a consumer that ran ahead to a stage
  // two fills away would take the parity of the fill before it for its own.
  const int my_turn = 1 + consumer;
  const int next_turn = 1 + (consumer + 1) % kConsumers;
  if (kPingpong && consumer == 0) wgmma::NamedBarrierArrive(my_turn, 256);
  int steps = 0;
  int turn = 0;  // ping-pong: the CTA's units so far; this consumer takes every other one
  for (int unit = cluster; unit < num_units; unit += num_clusters, ++turn) {
    if (kPingpong && turn % kConsumers != consumer) {
      steps += k_steps;  // the other consumer's tile: its stages are the other's to release
      continue;
    }
    if constexpr (kPingpong) wgmma::NamedBarrierSync(my_turn, 256);
    const EpilogueGemmUnit work = EpilogueGemmUnitOf(unit, row_units, column_tiles);
    const int row_tile = work.row_unit * kCluster + cta;
    // The first of this warpgroup's 64 rows (ping-pong: the whole tile), and this thread's first
    // row; what the epilogue needs of its rows is loaded now, under the main loop.
    const int row0 = row_tile * S::kTileRows + (kPingpong ? 0 : consumer * 64);
    const int row_g = row0 + warp * 16 + lane / 4;
    const auto rows = epilogue.Prepare(row_g);
    // The main loop: a k step's 4 wgmma (k16 each, 32 bytes into the panels' rows), committed as
    // one group; the step before is then waited for and its stage given back.
    for (int step = 0; step < k_steps; ++step, ++steps) {
      const int stage = steps % kStages;
      wgmma::BarrierWait(bar_full(stage), (steps / kStages) & 1);
      wgmma::Fence();
#pragma unroll
      for (int kk = 0; kk < kBlockK / 16; ++kk) {
        const uint64_t desc_x = wgmma::Descriptor(
            stage_x(stage) + (kPingpong ? 0 : consumer * 64 * 128) + kk * 32, 0, 1024);
        const uint64_t desc_w = wgmma::Descriptor(stage_w(stage) + kk * 32, 0, 1024);
        wgmma::MmaSs64x256(acc, desc_x, desc_w, step > 0 || kk > 0 ? 1 : 0);
      }
      wgmma::Commit();
      if (step > 0) {
        wgmma::Wait<1>();
        release((steps - 1) % kStages);
      }
    }
    if constexpr (kPingpong) wgmma::NamedBarrierArrive(next_turn, 256);
    wgmma::Wait<0>();
    wgmma::PinRegisters(acc);
    release((steps - 1) % kStages);
    epilogue.Store(acc, rows, row_g, work.column_tile, lane & 3);
  }
#endif  // SIEVE_SM90A
}

template <int kCluster, bool kPingpong>
__global__ void __launch_bounds__(kThreads, 1)
    SwiGluGemmSm90Kernel(const __grid_constant__ CUtensorMap map_x,
                         const __grid_constant__ CUtensorMap map_w, int m, int k,
                         const __grid_constant__ SwiGluEpilogue epilogue) {
  EpilogueGemmMainLoop<kCluster, kPingpong>(map_x, map_w, m, k, epilogue);
}

template <int kCluster, bool kPingpong, int kHeadDim>
__global__ void __launch_bounds__(kThreads, 1)
    QkvRopeGemmSm90Kernel(const __grid_constant__ CUtensorMap map_x,
                          const __grid_constant__ CUtensorMap map_w, int m, int k,
                          const __grid_constant__ QkvRopeEpilogue<kHeadDim> epilogue) {
  EpilogueGemmMainLoop<kCluster, kPingpong>(map_x, map_w, m, k, epilogue);
}

// The kernel of an epilogue.
template <int kCluster, bool kPingpong>
auto KernelOf(const SwiGluEpilogue&) {
  return SwiGluGemmSm90Kernel<kCluster, kPingpong>;
}
template <int kCluster, bool kPingpong, int kHeadDim>
auto KernelOf(const QkvRopeEpilogue<kHeadDim>&) {
  return QkvRopeGemmSm90Kernel<kCluster, kPingpong, kHeadDim>;
}

template <class Epilogue>
Sm90aKernelCheck& KernelCheck() {
  static Sm90aKernelCheck check(reinterpret_cast<const void*>(KernelOf<1, false>(Epilogue{})));
  return check;
}

// How many CTAs of kCluster run at once on the current device (persistent: the grid is no
// larger), asked once per device.
template <int kCluster, bool kPingpong, class Epilogue>
int ResidentCtas() {
  static std::atomic<int> ctas[kMaxCachedDevices] = {};
  return PerDeviceValue(ctas, [](int) {
    constexpr int kSmemBytes = Schedule<kPingpong>::kSmemBytes;
    const auto kernel = KernelOf<kCluster, kPingpong>(Epilogue{});
    SIEVE_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
    const int sms = CurrentDeviceAttribute<cudaDevAttrMultiProcessorCount>();
    if constexpr (kCluster == 1) {
      return sms;
    } else {
      cudaLaunchConfig_t config = {};
      config.gridDim = dim3(kCluster * sms);
      config.blockDim = dim3(kThreads);
      config.dynamicSmemBytes = kSmemBytes;
      cudaLaunchAttribute attribute;
      attribute.id = cudaLaunchAttributeClusterDimension;
      attribute.val.clusterDim.x = kCluster;
      attribute.val.clusterDim.y = 1;
      attribute.val.clusterDim.z = 1;
      config.attrs = &attribute;
      config.numAttrs = 1;
      int clusters = 0;
      SIEVE_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&clusters, kernel, &config));
      SIEVE_CHECK(clusters > 0) << "no cluster of " << kCluster << " epilogue GEMM CTAs fits";
      return clusters * kCluster;
    }
  });
}

// x [m][k] (row stride ldx) times w [w_rows][k] (contiguous), as many persistent CTAs as run at
// once and there are units.
template <int kCluster, bool kPingpong, class Epilogue>
void Launch(int64_t m, int64_t k, const bf16* x, int64_t ldx, const bf16* w, int64_t w_rows,
            const Epilogue& epilogue, cudaStream_t stream) {
  using S = Schedule<kPingpong>;
  const CUtensorMap map_x = PanelTensorMap(x, k, m, ldx, S::kTileRows);
  const CUtensorMap map_w = PanelTensorMap(w, k, w_rows, k, kHalfRows);
  const int64_t row_units = (m + S::kTileRows * kCluster - 1) / (S::kTileRows * kCluster);
  const int64_t units = row_units * epilogue.column_tiles;
  const int resident = ResidentCtas<kCluster, kPingpong, Epilogue>() / kCluster;
  const int grid = static_cast<int>(std::min<int64_t>(units, resident)) * kCluster;
  LaunchWithPdlInClusters(KernelOf<kCluster, kPingpong>(epilogue), dim3(grid), dim3(kCluster),
                          dim3(kThreads), S::kSmemBytes, stream, map_x, map_w, static_cast<int>(m),
                          static_cast<int>(k), epilogue);
}

template <class Epilogue>
void LaunchVariant(const EpilogueGemmVariant& variant, int64_t m, int64_t k, const bf16* x,
                   int64_t ldx, const bf16* w, int64_t w_rows, const Epilogue& epilogue,
                   cudaStream_t stream) {
  SIEVE_CHECK(variant.cluster == 1 || variant.cluster == 2)
      << "clusters of " << variant.cluster << " CTAs";
  if (variant.cluster == 2) {
    if (variant.pingpong) {
      Launch<2, true>(m, k, x, ldx, w, w_rows, epilogue, stream);
    } else {
      Launch<2, false>(m, k, x, ldx, w, w_rows, epilogue, stream);
    }
  } else if (variant.pingpong) {
    Launch<1, true>(m, k, x, ldx, w, w_rows, epilogue, stream);
  } else {
    Launch<1, false>(m, k, x, ldx, w, w_rows, epilogue, stream);
  }
}

// The row scales of a folded norm into `row_scales` (m floats), or null without one.
const float* RowScales(int64_t m, const RowRmsView& norm, float* row_scales, cudaStream_t stream) {
  if (norm.rows == nullptr || m == 0) return nullptr;
  SIEVE_CHECK(norm.width % 8 == 0 && norm.stride % 8 == 0 && Aligned16(norm.rows))
      << "a folded RMSNorm's rows must be 16-byte aligned, width and stride multiples of 8";
  constexpr int kWarps = 8;
  LaunchWithPdl(RowScalesKernel, static_cast<int>((m + kWarps - 1) / kWarps), kWarps * 32, 0,
                stream, norm, static_cast<int>(m), row_scales);
  return row_scales;
}

bool OperandsFit(int64_t k, const bf16* x, int64_t ldx, const bf16* w, const bf16* out,
                 int64_t ldo) {
  return k > 0 && k % 8 == 0 && ldx % 8 == 0 && ldo % 8 == 0 && Aligned16(x) && Aligned16(w) &&
         Aligned16(out);
}

void CheckSizes(int64_t m, int64_t n, int64_t k) {
  SIEVE_CHECK(m < (int64_t{1} << 31) && n < (int64_t{1} << 30) && k < (int64_t{1} << 31))
      << m << " x " << n << " x " << k;
}

}  // namespace

bool SwiGluGemmSupports(int64_t f, int64_t k, const bf16* x, int64_t ldx, const bf16* w,
                        const bf16* out, int64_t ldo) {
  return f > 0 && f % kHalfRows == 0 && OperandsFit(k, x, ldx, w, out, ldo) &&
         KernelCheck<SwiGluEpilogue>().Runs();
}

void SwiGluGemm(int64_t m, int64_t f, int64_t k, const bf16* x, int64_t ldx, const bf16* w,
                const RowRmsView& norm, float* row_scales, bf16* out, int64_t ldo,
                cudaStream_t stream, const EpilogueGemmVariant& variant) {
  if (m == 0) return;
  SIEVE_CHECK(SwiGluGemmSupports(f, k, x, ldx, w, out, ldo))
      << "the fused gate_up GEMM does not take " << m << " x " << f << " x " << k;
  CheckSizes(m, 2 * f, k);
  const SwiGluEpilogue epilogue{
      RowScales(m, norm, row_scales, stream), out, ldo, static_cast<int>(m), static_cast<int>(f),
      static_cast<int>(f / kHalfRows)};
  LaunchVariant(variant, m, k, x, ldx, w, 2 * f, epilogue, stream);
}

bool QkvRopeGemmSupports(int64_t width, int head_dim, int64_t k, const bf16* x, int64_t ldx,
                         const bf16* w, const bf16* qkv, int64_t ldq, const float* rope_table) {
  if ((head_dim != 64 && head_dim != 128) || width <= 0 || width % kTileColumns != 0 ||
      !Aligned16(rope_table) || !OperandsFit(k, x, ldx, w, qkv, ldq)) {
    return false;
  }
  return head_dim == 64 ? KernelCheck<QkvRopeEpilogue<64>>().Runs()
                        : KernelCheck<QkvRopeEpilogue<128>>().Runs();
}

void QkvRopeGemm(int64_t m, int64_t k, const bf16* x, int64_t ldx, const bf16* w,
                 const float* rope_table, int num_heads, const StepView& step, int layer,
                 const PoolView& pool, const RowRmsView& norm, float* row_scales, bf16* qkv,
                 int64_t ldq, cudaStream_t stream, const EpilogueGemmVariant& variant) {
  if (m == 0) return;
  const int head_dim = pool.head_dim;
  const int64_t width = static_cast<int64_t>(num_heads + 2 * pool.num_kv_heads) * head_dim;
  SIEVE_CHECK(QkvRopeGemmSupports(width, head_dim, k, x, ldx, w, qkv, ldq, rope_table))
      << "the qkv GEMM with RoPE does not take " << m << " x " << width << " x " << k
      << " at head_dim " << head_dim;
  SIEVE_CHECK(m == step.num_tokens) << m << " rows for a step of " << step.num_tokens;
  SIEVE_CHECK(step.num_prefill_tokens == 0 || step.write_start != nullptr)
      << "a step with prefill tokens needs write_start";
  CheckSizes(m, width, k);
  // Only the prefill rows are scaled (decode rows are stored as products).
  const float* scales = RowScales(step.num_prefill_tokens, norm, row_scales, stream);
  const auto launch = [&](auto epilogue) {
    epilogue.qkv = qkv;
    epilogue.qkv_stride = ldq;
    epilogue.rope_table = rope_table;
    epilogue.row_scales = scales;
    epilogue.step = step;
    epilogue.pool = pool;
    epilogue.layer = layer;
    epilogue.num_heads = num_heads;
    epilogue.m = static_cast<int>(m);
    epilogue.rope_rows = step.num_prefill_tokens;
    epilogue.column_tiles = static_cast<int>(width / kTileColumns);
    LaunchVariant(variant, m, k, x, ldx, w, width, epilogue, stream);
  };
  if (head_dim == 64) {
    launch(QkvRopeEpilogue<64>{});
  } else {
    launch(QkvRopeEpilogue<128>{});
  }
}

}  // namespace sieve::cuda
