// The gate_up GEMM with SiLU x mul in its epilogue, on Hopper (sm_90a), built as
// prefill_attention_sm90.cu is: tensor copies (TMA) into 128-byte-swizzled shared memory,
// warpgroup MMA (wgmma.cuh) and warp specialisation.
//
// A tile is 128 rows of x by 128 output columns, which take 256 rows of w: the tile's 128 gate
// rows and the 128 up rows F further on, loaded side by side so that one wgmma of N = 256 computes
// both. In the accumulator fragment (wgmma.cuh) a thread then holds gate column c in block j and
// up column c in block j + 16 of the same rows: the epilogue multiplies them in registers, with
// no shuffle and no shared memory. The grid is persistent (one CTA per SM) and walks the tiles in
// groups of row tiles (SwiGluUnitOf), so the CTAs running together share their x and w tiles in
// the L2.
// A producer warpgroup (one thread issues the copies of each k step's x and w slices into a ring
// of kStages stages, running ahead into the next tile) and two consumer warpgroups of 64 rows
// each, which keep one k step's products in flight while the next is issued.
//
// kCluster = 2 (an experiment beside kCluster = 1): two CTAs of a thread-block cluster take
// adjacent row tiles of one column tile and share its w slice: each copies one half (the gate
// rows, the up rows) into both CTAs' shared memory (multicast), so a CTA reads 32 KiB of the L2 a k
// step instead of 48. A stage is then free once the consumers of both CTAs are done with it.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/flash_warp.cuh"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/swiglu_gemm.h"
#include "backend/cuda/tensor_map.h"
#include "backend/cuda/wgmma.cuh"
#include "core/check.h"

namespace sieve::cuda {
namespace {

using bf16 = __nv_bfloat16;

// Some of these are used only by the kernel body, which the host pass and builds for other
// architectures leave out.
constexpr int kBlockM = 128;                  // rows of x a tile: 64 a consumer warpgroup
constexpr int kBlockN = 128;                  // output columns a tile (256 rows of w)
[[maybe_unused]] constexpr int kBlockK = 64;  // a k step: one 128-byte panel of each operand
constexpr int kStages = 4;
constexpr int kConsumers = 2;
constexpr int kThreads = (1 + kConsumers) * 128;
[[maybe_unused]] constexpr int kProducerRegisters = 24;
[[maybe_unused]] constexpr int kConsumerRegisters = 240;
[[maybe_unused]] constexpr uint32_t kTileXBytes = kBlockM * kBlockK * 2;  // 16 KiB
[[maybe_unused]] constexpr uint32_t kGateBytes = kBlockN * kBlockK * 2;   // 16 KiB, as the up rows
constexpr uint32_t kStageBytes = kTileXBytes + 2 * kGateBytes;            // 48 KiB
// 4 stages of 48 KiB, 1 KiB to align them to the 1024-byte swizzle atoms, and the barriers.
constexpr int kSmemBytes = 1024 + kStages * static_cast<int>(kStageBytes) + 2 * kStages * 8;
static_assert(kSmemBytes <= 227 * 1024);
static_assert(kProducerRegisters * 128 + kConsumerRegisters * 128 * kConsumers <= 65536);

// s of each row (row_rms.cuh), a warp a row: the GEMM's epilogue reads it from `scales`.
__global__ void RowScalesKernel(RowRmsView norm, int rows, float* __restrict__ scales) {
  PdlWait();
  PdlLaunchDependents();
  const int row = static_cast<int>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (row >= rows) return;
  const float scale = WarpRowInvRms(norm, row);
  if (threadIdx.x % 32 == 0) scales[row] = scale;
}

template <int kCluster>
__global__ void __launch_bounds__(kThreads, 1)
    SwiGluGemmSm90Kernel(const __grid_constant__ CUtensorMap map_x,
                         const __grid_constant__ CUtensorMap map_w,
                         const float* __restrict__ row_scales, bf16* __restrict__ out,
                         int64_t out_stride, int m, int f, int k) {
#if SIEVE_SM90A
  static_assert(kCluster == 1 || kCluster == 2);
  extern __shared__ uint8_t smem_raw[];
  const uint32_t smem = (flash::SharedAddress(smem_raw) + 1023) & ~1023u;
  // Stage s: the x slice (128 rows), then the w slice (128 gate rows, 128 up rows), each row 64
  // k of 128 bytes. The barriers after the stages: full, then empty, one of each a stage.
  const auto stage_x = [&](int stage) { return smem + stage * kStageBytes; };
  const auto stage_w = [&](int stage) { return smem + stage * kStageBytes + kTileXBytes; };
  const uint32_t barriers = smem + kStages * kStageBytes;
  const auto bar_full = [&](int stage) { return barriers + 8 * stage; };
  const auto bar_empty = [&](int stage) { return barriers + 8 * (kStages + stage); };
  // A unit of work: kCluster adjacent row tiles of one column tile, one a CTA of the cluster (a
  // row tile past m reads zeros and stores nothing).
  const int cta = kCluster > 1 ? static_cast<int>(wgmma::ClusterRank()) : 0;
  const int cluster = static_cast<int>(blockIdx.x) / kCluster;
  const int num_clusters = static_cast<int>(gridDim.x) / kCluster;
  const int row_units = (m + kBlockM * kCluster - 1) / (kBlockM * kCluster);
  const int column_tiles = f / kBlockN;
  const int num_units = row_units * column_tiles;
  const int k_steps = (k + kBlockK - 1) / kBlockK;  // a last partial step reads zeros past k

  if (threadIdx.x == 0) {
    for (int stage = 0; stage < kStages; ++stage) {
      wgmma::BarrierInit(bar_full(stage), 1);
      // Each consumer warp of each CTA whose w half the stage receives.
      wgmma::BarrierInit(bar_empty(stage), 4 * kConsumers * kCluster);
    }
    wgmma::FenceBarrierInit();
  }
  if constexpr (kCluster > 1) {
    wgmma::ClusterSync();  // no CTA copies or arrives into another before its barriers exist
  } else {
    __syncthreads();
  }
  // x (the residual stream) and the row scales come from the kernels before.
  PdlWait();
  PdlLaunchDependents();

  const int warpgroup = static_cast<int>(threadIdx.x) / 128;
  if (warpgroup == 0) {
    // The producer. Rows of x past m read as zeros; their products are never stored.
    wgmma::RegistersDecrease<kProducerRegisters>();
    if (threadIdx.x != 0) return;
    int steps = 0;  // k steps loaded so far: the stage and its phase
    for (int unit = cluster; unit < num_units; unit += num_clusters) {
      const SwiGluUnit work = SwiGluUnitOf(unit, row_units, column_tiles);
      const int column_tile = work.column_tile;
      const int row0 = (work.row_unit * kCluster + cta) * kBlockM;
      for (int step = 0; step < k_steps; ++step, ++steps) {
        const int stage = steps % kStages;
        if (steps >= kStages) wgmma::BarrierWait(bar_empty(stage), ((steps / kStages) & 1) ^ 1);
        wgmma::BarrierArriveExpectBytes(bar_full(stage), kStageBytes);
        const int k0 = step * kBlockK;
        wgmma::TensorCopy2d(stage_x(stage), &map_x, k0, row0, bar_full(stage));
        if constexpr (kCluster == 1) {
          wgmma::TensorCopy2d(stage_w(stage), &map_w, k0, column_tile * kBlockN, bar_full(stage));
          wgmma::TensorCopy2d(stage_w(stage) + kGateBytes, &map_w, k0, f + column_tile * kBlockN,
                              bar_full(stage));
        } else {
          // CTA 0 the gate rows, CTA 1 the up rows, each into both.
          wgmma::TensorCopy2dMulticast(stage_w(stage) + cta * kGateBytes, &map_w, k0,
                                       cta * f + column_tile * kBlockN, bar_full(stage), 0b11);
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
  const int g = lane / 4;
  const int t = lane & 3;
  // The warpgroup's 64 x 256 accumulator: blocks 0-15 the gate columns, 16-31 the up columns.
  float acc[32][4];
  const auto release = [&](int stage) {
    if (lane == 0) {
      wgmma::BarrierArrive(bar_empty(stage));
      if constexpr (kCluster > 1) wgmma::BarrierArriveInCta(bar_empty(stage), cta ^ 1);
    }
  };

  int steps = 0;
  for (int unit = cluster; unit < num_units; unit += num_clusters) {
    const SwiGluUnit work = SwiGluUnitOf(unit, row_units, column_tiles);
    const int column_tile = work.column_tile;
    const int row_tile = work.row_unit * kCluster + cta;
    // The main loop: a k step's 4 wgmma (k16 each, 32 bytes into the panels' rows), committed as
    // one group; the step before is then waited for and its stage given back.
    for (int step = 0; step < k_steps; ++step, ++steps) {
      const int stage = steps % kStages;
      wgmma::BarrierWait(bar_full(stage), (steps / kStages) & 1);
      wgmma::Fence();
#pragma unroll
      for (int kk = 0; kk < kBlockK / 16; ++kk) {
        const uint64_t desc_x =
            wgmma::Descriptor(stage_x(stage) + consumer * 64 * 128 + kk * 32, 0, 1024);
        const uint64_t desc_w = wgmma::Descriptor(stage_w(stage) + kk * 32, 0, 1024);
        wgmma::MmaSs64x256(acc, desc_x, desc_w, step > 0 || kk > 0 ? 1 : 0);
      }
      wgmma::Commit();
      if (step > 0) {
        wgmma::Wait<1>();
        release((steps - 1) % kStages);
      }
    }
    wgmma::Wait<0>();
    wgmma::PinRegisters(acc);
    release((steps - 1) % kStages);

    // Epilogue, straight from registers: SiluMul's arithmetic (dense_kernels.cu) on the bf16
    // products, each quad writing 16 contiguous bytes of a row.
    const int row_g = row_tile * kBlockM + consumer * 64 + warp * 16 + g;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = row_g + 8 * half;
      if (row >= m) continue;
      const float s = row_scales != nullptr ? row_scales[row] : 1.0f;
      bf16* out_row = out + static_cast<int64_t>(row) * out_stride + column_tile * kBlockN + 2 * t;
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        float value[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float gate = __bfloat162float(__float2bfloat16(acc[j][2 * half + e])) * s;
          const float up = __bfloat162float(__float2bfloat16(acc[j + 16][2 * half + e]));
          value[e] = gate / (1.0f + __expf(-gate)) * (up * s);
        }
        *reinterpret_cast<uint32_t*>(out_row + 8 * j) = flash::PackBf16(value[0], value[1]);
      }
    }
  }
#endif  // SIEVE_SM90A
}

Sm90aKernelCheck& KernelCheck() {
  static Sm90aKernelCheck check(reinterpret_cast<const void*>(SwiGluGemmSm90Kernel<1>));
  return check;
}

// How many CTAs of kCluster run at once on the current device (persistent: the grid is no
// larger), asked once per device.
template <int kCluster>
int ResidentCtas() {
  static std::atomic<int> ctas[kMaxCachedDevices] = {};
  return PerDeviceValue(ctas, [](int) {
    SIEVE_CUDA_CHECK(cudaFuncSetAttribute(SwiGluGemmSm90Kernel<kCluster>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
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
      SIEVE_CUDA_CHECK(
          cudaOccupancyMaxActiveClusters(&clusters, SwiGluGemmSm90Kernel<kCluster>, &config));
      SIEVE_CHECK(clusters > 0) << "no cluster of " << kCluster << " fused gate_up CTAs fits";
      return clusters * kCluster;
    }
  });
}

template <int kCluster>
void Launch(int64_t m, int64_t f, int64_t k, const bf16* x, int64_t ldx, const bf16* w,
            const float* scales, bf16* out, int64_t ldo, cudaStream_t stream) {
  const CUtensorMap map_x = PanelTensorMap(x, k, m, ldx, kBlockM);
  const CUtensorMap map_w = PanelTensorMap(w, k, 2 * f, k, kBlockN);
  const int64_t units = (m + kBlockM * kCluster - 1) / (kBlockM * kCluster) * (f / kBlockN);
  const int grid =
      static_cast<int>(std::min<int64_t>(units, ResidentCtas<kCluster>() / kCluster)) * kCluster;
  LaunchWithPdlInClusters(SwiGluGemmSm90Kernel<kCluster>, dim3(grid), dim3(kCluster),
                          dim3(kThreads), kSmemBytes, stream, map_x, map_w, scales, out, ldo,
                          static_cast<int>(m), static_cast<int>(f), static_cast<int>(k));
}

}  // namespace

bool SwiGluGemmSupports(int64_t f, int64_t k, const bf16* x, int64_t ldx, const bf16* w,
                        const bf16* out, int64_t ldo) {
  return f > 0 && f % kBlockN == 0 && k % 8 == 0 && ldx % 8 == 0 && ldo % 8 == 0 && Aligned16(x) &&
         Aligned16(w) && Aligned16(out) && KernelCheck().Runs();
}

void SwiGluGemm(int64_t m, int64_t f, int64_t k, const bf16* x, int64_t ldx, const bf16* w,
                const RowRmsView& norm, float* row_scales, bf16* out, int64_t ldo,
                cudaStream_t stream, int cluster) {
  if (m == 0) return;
  SIEVE_CHECK(SwiGluGemmSupports(f, k, x, ldx, w, out, ldo))
      << "the fused gate_up GEMM does not take " << m << " x " << f << " x " << k;
  SIEVE_CHECK(m < (int64_t{1} << 31) && f < (int64_t{1} << 30) && k < (int64_t{1} << 31));
  SIEVE_CHECK(cluster == 1 || cluster == 2) << "clusters of " << cluster << " CTAs";
  SIEVE_CHECK(norm.rows == nullptr ||
              (norm.width % 8 == 0 && norm.stride % 8 == 0 && Aligned16(norm.rows)))
      << "a folded RMSNorm's rows must be 16-byte aligned, width and stride multiples of 8";
  const float* scales = nullptr;
  if (norm.rows != nullptr) {
    constexpr int kWarps = 8;
    LaunchWithPdl(RowScalesKernel, static_cast<int>((m + kWarps - 1) / kWarps), kWarps * 32, 0,
                  stream, norm, static_cast<int>(m), row_scales);
    scales = row_scales;
  }
  if (cluster == 2) {
    Launch<2>(m, f, k, x, ldx, w, scales, out, ldo, stream);
  } else {
    Launch<1>(m, f, k, x, ldx, w, scales, out, ldo, stream);
  }
}

}  // namespace sieve::cuda
