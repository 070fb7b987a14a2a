// Prefill attention on Hopper (sm_90a): the same varlen causal flash attention as
// prefill_attention.cu (bottom-right causal alignment, GQA, the LSE), built as FlashAttention-3
// is: tensor copies (TMA) into 128-byte-swizzled shared memory, warpgroup MMA (wgmma.cuh), and
// warp specialisation.
//
// Work item = 64 query rows per consumer (128 at d = 128, 192 at d = 64; Shape) of one
// (sequence, query head). The grid is persistent (one CTA per SM) and walks the items longest
// first, in an order the host sorts (WorkOrder). A producer warpgroup (one thread issues the tensor
// copies of Q and of the K/V tiles of 128 keys onto transaction barriers, running ahead into the
// next item) and two or three consumer warpgroups of 64 rows each. A consumer issues S_n = Q K_n^T
// and O += P_{n-1} V_{n-1} together and runs tile n's softmax while the second product is still on
// the tensor cores; the consumers take turns issuing (named barriers), so one's softmax overlaps
// the others' products. A K/V stage goes back to the producer once every consumer's products on it
// are done, the Q tile once their last S is. The design and its numbers are in README_attention.md.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_image.h"
#include "backend/cuda/flash_warp.cuh"
#include "backend/cuda/prefill_attention.h"
#include "backend/cuda/wgmma.cuh"
#include "core/check.h"

namespace sieve::cuda {
namespace {

// Some of these are used only by the kernel body, which the host pass and builds for other
// architectures leave out.
[[maybe_unused]] constexpr int kBlockN = 128;  // keys per tile
[[maybe_unused]] constexpr int kConsumerRows = 64;
// K/V stages: 3 against 2 took causal 4k x 4 from 504 to 596 TFLOP/s and 16k from 546 to 590-612
// (bench/results/2026-12-02-h200-prefill-sm90-ab.json).
constexpr int kStages = 3;
constexpr int kTileRows = 128;                                      // K and V tiles have 128 rows
[[maybe_unused]] constexpr uint32_t kPanelBytes = kTileRows * 128;  // a 64-column panel of K, V
[[maybe_unused]] constexpr int kIssueBarrier = 1;                   // named barriers 1 .. consumers

// What the head dimension sets. A consumer warpgroup owns 64 query rows. At d = 128 two
// consumers (a 128-row item) hold O, S and P in 240 registers each. At d = 64 a tile's products
// are half as long while its softmax is as long, so two consumers taking turns leave the tensor
// cores idle while each waits out the other's softmax; three (a 192-row item, 160 registers
// each, as FlashAttention-3 does for d = 64) give each softmax two others' products to hide
// behind.
template <int kHeadDim>
struct Shape {
  static constexpr int kConsumers = kHeadDim == 64 ? 3 : 2;
  static constexpr int kBlockM = kConsumers * kConsumerRows;  // query rows per work item
  static constexpr int kThreads = (1 + kConsumers) * 128;
  static constexpr int kProducerRegisters = kConsumers == 2 ? 24 : 32;
  static constexpr int kConsumerRegisters = kConsumers == 2 ? 240 : 160;
  static constexpr uint32_t kTileBytes = kTileRows * kHeadDim * 2;  // a K or V tile
  static constexpr uint32_t kQPanelBytes = kBlockM * 128;           // a 64-column panel of Q
  static constexpr uint32_t kQTileBytes = kQPanelBytes * (kHeadDim / 64);
  // d = 128: 32 KiB Q + 3 stages x (32 + 32) KiB K/V = 224 KiB, 1 KiB to align the tiles to the
  // 1024-byte swizzle atoms, and the barriers (225.1 of the 227 KiB a block may have); d = 64:
  // 24 KiB Q + 3 x (16 + 16) KiB K/V, 121 KiB.
  static constexpr int kSmemBytes =
      1024 + static_cast<int>(kQTileBytes + 2 * kStages * kTileBytes) + 128;
  static_assert(kSmemBytes <= 227 * 1024);
  static_assert(kProducerRegisters * 128 + kConsumerRegisters * 128 * kConsumers <= 65536);
};

struct TensorMaps {
  CUtensorMap q;  // [T_p][H d] of q: boxes of kBlockM rows x 64 columns, 128-byte swizzle
  CUtensorMap k;  // [keys][G d]
  CUtensorMap v;
};

// The query tiles of a launch, most key tiles first: entry i is (prefill sequence << 16) |
// query tile. The host sorts them (SortedPrefillTiles) from the chunks it planned, and they travel
// in the kernel's parameters (constant memory, where every thread of a CTA reads the same entry); a
// step of more tiles than one order holds is several launches. Counting the tiles from the end
// of the step's longest chunk instead, heads fastest, lined up the long tiles of every sequence
// only while the chunks were of one length: serving's steps (two 4000-token prompts and a short
// piece of a third) left the busiest CTA 16-18% past the mean, against 0.5% sorted (the rounds
// below dealt out on the host; PrefillWorkOrderTest checks the sorted side), and that step's
// attention took 0.54 ms against 0.46 sorted on an H100
// (bench/results/2026-12-05-h100-prefill-sorted-tiles-ab.json).
constexpr int kMaxOrderTiles = 768;  // 3 KiB: with the maps and params, within 4 KiB of parameters
struct WorkOrder {
  int num_tiles;
  uint32_t tiles[kMaxOrderTiles];
};

// What a work item covers; the producer and the consumers derive the same.
struct WorkItem {
  int head;
  int query_begin;  // the sequence's first row in q / out
  int query_len;
  int row0;  // the item's first row in the chunk
  int key_begin;
  int kv_len;
  int context;
  int num_tiles;  // K/V tiles of 128 keys
};

template <int kBlockM>
__device__ __forceinline__ WorkItem DecodeWorkItem(const PrefillParams& params,
                                                   const WorkOrder& order, int work,
                                                   int num_heads) {
  // Heads fastest (the query heads of a KV head read its tiles in the same round), then the
  // order's tiles.
  WorkItem item;
  item.head = work % num_heads;
  const uint32_t tile = order.tiles[work / num_heads];
  const int seq = static_cast<int>(tile >> 16);
  const int q_tile = static_cast<int>(tile & 0xffffu);
  item.query_begin = params.query_start[seq];
  item.query_len = params.query_start[seq + 1] - item.query_begin;
  item.row0 = q_tile * kBlockM;
  item.key_begin = params.key_start[seq];
  item.kv_len = params.key_start[seq + 1] - item.key_begin;
  item.context = params.context_lens[seq];
  // The order lists only tiles inside their chunk (row0 < query_len). Row i sees keys
  // j <= context + i: the item's last row bounds the keys any row needs.
  const int rows = min(kBlockM, item.query_len - item.row0);
  const int num_keys = min(item.kv_len, item.context + item.row0 + rows);
  item.num_tiles = (num_keys + kBlockN - 1) / kBlockN;
  return item;
}

// This CTA's item of round `round` (num_work or more: none): the rounds take the longest-first list
// G items at a time (G = gridDim.x), CTA c taking item c of the even rounds and G - 1 - c of the
// odd ones. Handing out c, c + G, c + 2G, ... gave the first CTAs the longest item of every round
// (the busiest CTA 3% over the mean at 4k x 4 and 16k, 6% at 2 x 4000); going back and forth
// evens the sums: 16k 2% faster, 4% inside the engine's 2 x 4000 prefill step (record
// 2026-12-02-h200-prefill-snake-ab).
[[maybe_unused]] __device__ __forceinline__ int WorkOfRound(int round) {
  const int ctas = static_cast<int>(gridDim.x);
  const int cta = static_cast<int>(blockIdx.x);
  return round * ctas + ((round & 1) != 0 ? ctas - 1 - cta : cta);
}

// O += P V over one tile: kHeadDim output columns, so one wgmma of N = kHeadDim per 16 keys.
template <int kHeadDim>
__device__ __forceinline__ void MmaPv(float (&acc)[kHeadDim / 8][4], const uint32_t (&p)[4],
                                      uint64_t desc_v) {
#if SIEVE_SM90A
  if constexpr (kHeadDim == 128) {
    wgmma::MmaRs64x128(acc, p, desc_v);
  } else {
    wgmma::MmaRs64x64(acc, p, desc_v);
  }
#endif
}

template <int kHeadDim>
__global__ void __launch_bounds__(Shape<kHeadDim>::kThreads, 1)
    PrefillAttentionSm90Kernel(const __grid_constant__ TensorMaps maps, const PrefillParams params,
                               const __grid_constant__ WorkOrder order, int num_heads) {
#if SIEVE_SM90A
  using S = Shape<kHeadDim>;
  constexpr uint32_t kTileBytes = S::kTileBytes;
  constexpr int kConsumers = S::kConsumers;
  constexpr int kPanels = kHeadDim / 64;
  extern __shared__ uint8_t smem_raw[];
  const uint32_t smem_q = (flash::SharedAddress(smem_raw) + 1023) & ~1023u;
  const uint32_t smem_k = smem_q + S::kQTileBytes;
  const uint32_t smem_v = smem_k + kStages * kTileBytes;
  // Barriers after the tiles: Q full and empty, then per stage K full, V full and empty.
  const uint32_t bar_q_full = smem_v + kStages * kTileBytes;
  const uint32_t bar_q_empty = bar_q_full + 8;
  const auto bar_k_full = [&](int stage) { return bar_q_full + 16 + 24 * stage; };
  const auto bar_v_full = [&](int stage) { return bar_q_full + 24 + 24 * stage; };
  const auto bar_empty = [&](int stage) { return bar_q_full + 32 + 24 * stage; };
  const int num_work = num_heads * order.num_tiles;

  if (threadIdx.x == 0) {
    wgmma::BarrierInit(bar_q_full, 1);
    wgmma::BarrierInit(bar_q_empty, 4 * kConsumers);  // each consumer warp
    for (int stage = 0; stage < kStages; ++stage) {
      wgmma::BarrierInit(bar_k_full(stage), 1);
      wgmma::BarrierInit(bar_v_full(stage), 1);
      wgmma::BarrierInit(bar_empty(stage), 4 * kConsumers);
    }
    wgmma::FenceBarrierInit();
  }
  __syncthreads();

  const int warpgroup = static_cast<int>(threadIdx.x) / 128;
  if (warpgroup == 0) {
    // The producer. Keys past a sequence belong to the next one (masked) or lie past the scratch
    // (the copy zero-fills them); Q rows past the chunk likewise are computed, never stored.
    wgmma::RegistersDecrease<S::kProducerRegisters>();
    if (threadIdx.x != 0) return;
    int items = 0;  // items loaded so far: the Q barriers' phase
    int tiles = 0;  // K/V tiles loaded so far: the stage and its phase
    for (int round = 0, work; (work = WorkOfRound(round)) < num_work; ++round) {
      const WorkItem item = DecodeWorkItem<S::kBlockM>(params, order, work, num_heads);
      if (items > 0) wgmma::BarrierWait(bar_q_empty, (items - 1) & 1);
      wgmma::BarrierArriveExpectBytes(bar_q_full, S::kQTileBytes);
      for (int panel = 0; panel < kPanels; ++panel) {
        wgmma::TensorCopy2d(smem_q + panel * S::kQPanelBytes, &maps.q,
                            item.head * kHeadDim + panel * 64, item.query_begin + item.row0,
                            bar_q_full);
      }
      ++items;
      const int kv_column = item.head / params.group * kHeadDim;
      for (int tile = 0; tile < item.num_tiles; ++tile, ++tiles) {
        const int stage = tiles % kStages;
        if (tiles >= kStages) wgmma::BarrierWait(bar_empty(stage), ((tiles / kStages) & 1) ^ 1);
        const int key = item.key_begin + tile * kBlockN;
        wgmma::BarrierArriveExpectBytes(bar_k_full(stage), kTileBytes);
        for (int panel = 0; panel < kPanels; ++panel) {
          wgmma::TensorCopy2d(smem_k + stage * kTileBytes + panel * kPanelBytes, &maps.k,
                              kv_column + panel * 64, key, bar_k_full(stage));
        }
        wgmma::BarrierArriveExpectBytes(bar_v_full(stage), kTileBytes);
        for (int panel = 0; panel < kPanels; ++panel) {
          wgmma::TensorCopy2d(smem_v + stage * kTileBytes + panel * kPanelBytes, &maps.v,
                              kv_column + panel * 64, key, bar_v_full(stage));
        }
      }
    }
    return;
  }
  wgmma::RegistersIncrease<S::kConsumerRegisters>();

  const int consumer = warpgroup - 1;
  const int warp = (static_cast<int>(threadIdx.x) / 32) & 3;  // in the warpgroup
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int g = lane / 4;
  const int t = lane & 3;
  // O (the warpgroup's 64 x kHeadDim accumulator, this warp's 16 rows of it per thread as
  // flash_warp.cuh's fragments), the running max and sums.
  flash::SoftmaxRows<kHeadDim> rows;
  float(&acc)[kHeadDim / 8][4] = rows.acc;
  float(&m)[2] = rows.m;
  float(&l)[2] = rows.l;
  float s[kBlockN / 8][4];        // S, then its exponentials: 64 x 128
  uint32_t p[kBlockN / 16][4];    // P in bf16, the A fragments of O += P V
  float alpha[2];                 // how much the accumulated output shrinks this tile
  int lane_key_last[2] = {0, 0};  // inclusive key bound of each of the lane's two rows
  int group_key_first_row = 0;    // the warpgroup's first row's bound: tiles below need no mask

  // S = Q K^T of one tile into s: K-major A (this warpgroup's 64 rows of Q) and B (the tile's 128
  // keys); a k16 step is 32 bytes into a panel's rows, 4 steps a panel. Issued, not waited for.
  const auto issue_scores = [&](int stage) {
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
      const uint32_t step = (kk & 3) * 32;
      const uint64_t desc_q = wgmma::Descriptor(
          smem_q + (kk >> 2) * S::kQPanelBytes + step + consumer * kConsumerRows * 128, 0, 1024);
      const uint64_t desc_k =
          wgmma::Descriptor(smem_k + stage * kTileBytes + (kk >> 2) * kPanelBytes + step, 0, 1024);
      wgmma::MmaSs64x128(s, desc_q, desc_k, kk > 0 ? 1 : 0);
    }
    wgmma::Commit();
  };
  // O += P V of one tile: V is N-major, a k16 step is 16 rows (2 KiB) down its panels, and
  // N = kHeadDim spans its panels, kPanelBytes apart. Issued, not waited for.
  const auto issue_values = [&](int stage) {
#pragma unroll
    for (int kb = 0; kb < kBlockN / 16; ++kb) {
      MmaPv<kHeadDim>(
          acc, p[kb],
          wgmma::Descriptor(smem_v + stage * kTileBytes + kb * 16 * 128, kPanelBytes, 1024));
    }
    wgmma::Commit();
  };
  // Mask and online softmax of the tile of keys [first, first + 128) in s (flash_warp.cuh's):
  // exponentials in s, m and l updated, alpha set.
  const auto softmax = [&](int first) {
    if (first + kBlockN - 1 > group_key_first_row) {
      flash::MaskKeysPast(s, {lane_key_last[0] - first, lane_key_last[1] - first});
    }
    alpha[0] = flash::OnlineSoftmaxRow(s, 0, m[0], l[0], params.scale_log2);
    alpha[1] = flash::OnlineSoftmaxRow(s, 1, m[1], l[1], params.scale_log2);
  };
  // P's A fragment for keys 16 kb.. is S's accumulator blocks 2 kb and 2 kb + 1.
  const auto pack_probabilities = [&] {
#pragma unroll
    for (int kb = 0; kb < kBlockN / 16; ++kb) {
      p[kb][0] = flash::PackBf16(s[2 * kb][0], s[2 * kb][1]);
      p[kb][1] = flash::PackBf16(s[2 * kb][2], s[2 * kb][3]);
      p[kb][2] = flash::PackBf16(s[2 * kb + 1][0], s[2 * kb + 1][1]);
      p[kb][3] = flash::PackBf16(s[2 * kb + 1][2], s[2 * kb + 1][3]);
    }
  };
  const auto rescale_output = [&] {
#pragma unroll
    for (int n = 0; n < kHeadDim / 8; ++n) {
      acc[n][0] *= alpha[0];
      acc[n][1] *= alpha[0];
      acc[n][2] *= alpha[1];
      acc[n][3] *= alpha[1];
    }
  };
  const auto release = [&](uint32_t barrier) {
    if (lane == 0) wgmma::BarrierArrive(barrier);
  };

  // The consumers issue in turn, 0 first: each waits on its named barrier, which the one before it
  // arrives on once it has issued. Every consumer runs every tile of every item (a warpgroup
  // whose rows are past the chunk computes rows it never stores), so the turns stay in step.
  const int next_issuer = kIssueBarrier + (consumer + 1) % kConsumers;
  if (consumer == 0) wgmma::NamedBarrierArrive(kIssueBarrier, 256);
  int items = 0;
  int tiles = 0;
  for (int round = 0, work; (work = WorkOfRound(round)) < num_work; ++round) {
    const WorkItem item = DecodeWorkItem<S::kBlockM>(params, order, work, num_heads);
    const int group_row0 = item.row0 + consumer * kConsumerRows;  // in the chunk
    const int row_g = group_row0 + warp * 16 + g;
    // Rows past the chunk are clamped to existing keys.
    lane_key_last[0] = min(item.context + row_g, item.kv_len - 1);
    lane_key_last[1] = min(item.context + row_g + 8, item.kv_len - 1);
    group_key_first_row = min(item.context + group_row0, item.kv_len - 1);
    rows.Reset();

    wgmma::BarrierWait(bar_q_full, items & 1);
    // Tile 0: its scores only.
    {
      const int stage = tiles % kStages;
      wgmma::BarrierWait(bar_k_full(stage), (tiles / kStages) & 1);
      wgmma::NamedBarrierSync(kIssueBarrier + consumer, 256);
      wgmma::Fence();
      issue_scores(stage);
      wgmma::NamedBarrierArrive(next_issuer, 256);
      wgmma::Wait<0>();
      wgmma::PinRegisters(s);
      if (item.num_tiles == 1) release(bar_q_empty);
      softmax(0);
      pack_probabilities();
    }
    for (int tile = 1; tile < item.num_tiles; ++tile) {
      const int stage = (tiles + tile) % kStages;
      const int prev_stage = (tiles + tile - 1) % kStages;
      wgmma::BarrierWait(bar_k_full(stage), ((tiles + tile) / kStages) & 1);
      wgmma::NamedBarrierSync(kIssueBarrier + consumer, 256);
      wgmma::PinRegisters(acc);
      wgmma::Fence();
      issue_scores(stage);
      wgmma::BarrierWait(bar_v_full(prev_stage), ((tiles + tile - 1) / kStages) & 1);
      issue_values(prev_stage);
      wgmma::NamedBarrierArrive(next_issuer, 256);
      wgmma::Wait<1>();
      wgmma::PinRegisters(s);
      if (tile == item.num_tiles - 1) release(bar_q_empty);
      softmax(tile * kBlockN);
      wgmma::Wait<0>();
      wgmma::PinRegisters(acc);
      release(bar_empty(prev_stage));
      rescale_output();
      pack_probabilities();
    }
    // The last tile's O += P V.
    {
      const int last = tiles + item.num_tiles - 1;
      wgmma::BarrierWait(bar_v_full(last % kStages), (last / kStages) & 1);
      wgmma::PinRegisters(acc);
      wgmma::Fence();
      issue_values(last % kStages);
      wgmma::Wait<0>();
      wgmma::PinRegisters(acc);
      release(bar_empty(last % kStages));
    }
    tiles += item.num_tiles;
    ++items;

    // Epilogue, straight from registers (shared memory already holds the next item's tiles):
    // normalise, bf16 pairs, each quad writing 16 contiguous bytes of a row.
    float inv_sum[2];
    float row_lse[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const float sum = flash::QuadSum(l[half]);
      inv_sum[half] = sum > 0.0f ? 1.0f / sum : 0.0f;
      row_lse[half] = sum > 0.0f ? m[half] * params.scale + logf(sum) : -INFINITY;
    }
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int query_row = row_g + 8 * half;
      if (query_row >= item.query_len) continue;
      bf16* out_row = params.out +
                      static_cast<int64_t>(item.query_begin + query_row) * params.out_stride +
                      static_cast<int64_t>(item.head) * kHeadDim + 2 * t;
#pragma unroll
      for (int n = 0; n < kHeadDim / 8; ++n) {
        *reinterpret_cast<uint32_t*>(out_row + 8 * n) =
            flash::PackBf16(acc[n][2 * half] * inv_sum[half], acc[n][2 * half + 1] * inv_sum[half]);
      }
      if (params.lse != nullptr && t == 0) {
        params.lse[static_cast<int64_t>(item.query_begin + query_row) * params.lse_stride +
                   item.head] = row_lse[half];
      }
    }
  }
#endif  // SIEVE_SM90A
}

// cuTensorMapEncodeTiled from the driver, found once through the runtime (no libcuda link).
PFN_cuTensorMapEncodeTiled_v12000 TensorMapEncoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* function = nullptr;
    cudaDriverEntryPointQueryResult found{};
    SIEVE_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &function, 12000,
                                                      cudaEnableDefault, &found));
    SIEVE_CHECK(found == cudaDriverEntryPointSuccess && function != nullptr)
        << "the CUDA driver has no cuTensorMapEncodeTiled";
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(function);
  }();
  return encode;
}

// A [rows][width] bf16 matrix with row stride `stride` (elements) as boxes of `box_rows` rows x
// 64 columns, 128-byte swizzled: each box lands as one panel of a tile.
CUtensorMap PanelTensorMap(const bf16* base, int64_t width, int64_t rows, int64_t stride,
                           int box_rows) {
  CUtensorMap map{};
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(width), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(stride) * 2};
  const cuuint32_t box[2] = {64, static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult result = TensorMapEncoder()(
      &map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<bf16*>(base), dims, strides, box,
      element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  SIEVE_CHECK(result == CUDA_SUCCESS) << "cuTensorMapEncodeTiled failed: " << result;
  return map;
}

template <int kHeadDim>
void Launch(const PrefillParams& params, int num_heads, const StepView& step,
            const std::vector<PrefillChunk>& chunks, cudaStream_t stream) {
  using S = Shape<kHeadDim>;
  constexpr int kSmem = S::kSmemBytes;
  static std::atomic<uint64_t> configured_devices{0};
  int device = 0;
  SIEVE_CUDA_CHECK(cudaGetDevice(&device));
  OncePerDevice(configured_devices, device, [] {
    SIEVE_CUDA_CHECK(cudaFuncSetAttribute(PrefillAttentionSm90Kernel<kHeadDim>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  });
  SIEVE_CHECK(step.num_prefill_tokens > 0 && step.num_prefill_keys > 0)
      << "prefill step without its token and key counts";
  const int64_t kv_width = static_cast<int64_t>(params.num_kv_heads) * kHeadDim;
  TensorMaps maps;
  maps.q = PanelTensorMap(params.q, static_cast<int64_t>(num_heads) * kHeadDim,
                          step.num_prefill_tokens, params.q_stride, S::kBlockM);
  maps.k = PanelTensorMap(params.k, kv_width, step.num_prefill_keys, kv_width, kTileRows);
  maps.v = PanelTensorMap(params.v, kv_width, step.num_prefill_keys, kv_width, kTileRows);
  const std::vector<uint32_t> tiles = SortedPrefillTiles(chunks, S::kBlockM, kBlockN);
  const int sms = CurrentDeviceAttribute<cudaDevAttrMultiProcessorCount>();
  WorkOrder order;
  for (size_t first = 0; first < tiles.size(); first += kMaxOrderTiles) {
    order.num_tiles = static_cast<int>(std::min<size_t>(kMaxOrderTiles, tiles.size() - first));
    std::copy_n(tiles.begin() + static_cast<std::ptrdiff_t>(first), order.num_tiles, order.tiles);
    const int grid =
        static_cast<int>(std::min<int64_t>(static_cast<int64_t>(num_heads) * order.num_tiles, sms));
    PrefillAttentionSm90Kernel<kHeadDim>
        <<<grid, S::kThreads, kSmem, stream>>>(maps, params, order, num_heads);
    SIEVE_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace

std::vector<uint32_t> SortedPrefillTiles(const std::vector<PrefillChunk>& chunks, int rows_per_tile,
                                         int keys_per_tile) {
  struct Tile {
    int key_tiles;
    uint32_t entry;
  };
  std::vector<Tile> tiles;
  for (size_t seq = 0; seq < chunks.size(); ++seq) {
    const PrefillChunk& chunk = chunks[seq];
    const int count = (chunk.query_len + rows_per_tile - 1) / rows_per_tile;
    SIEVE_CHECK(seq <= 0xffff && count <= 0x10000)
        << "prefill attention: " << chunks.size() << " sequences, " << count << " query tiles";
    for (int tile = 0; tile < count; ++tile) {
      // The tile's last row sees keys [0, context + that row]: DecodeWorkItem's count.
      const int keys = chunk.context_len + std::min(chunk.query_len, (tile + 1) * rows_per_tile);
      tiles.push_back({(keys + keys_per_tile - 1) / keys_per_tile,
                       static_cast<uint32_t>(seq) << 16 | static_cast<uint32_t>(tile)});
    }
  }
  std::stable_sort(tiles.begin(), tiles.end(),
                   [](const Tile& a, const Tile& b) { return a.key_tiles > b.key_tiles; });
  std::vector<uint32_t> entries(tiles.size());
  std::transform(tiles.begin(), tiles.end(), entries.begin(),
                 [](const Tile& tile) { return tile.entry; });
  return entries;
}

bool PrefillAttentionSm90Supported() {
  // Per device: an sm_90 part, and a loaded image compiled for sm_90a (device_image.h: a build
  // for other architectures, plain sm_90 too, has the kernel without its body).
  static std::atomic<uint64_t> checked{0};
  static std::atomic<uint64_t> supported{0};
  int device = 0;
  SIEVE_CUDA_CHECK(cudaGetDevice(&device));
  const uint64_t bit = uint64_t{1} << (device & 63);
  if ((checked.load(std::memory_order_acquire) & bit) == 0) {
    int major = 0;
    int minor = 0;
    SIEVE_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    SIEVE_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    bool ok = false;
    if (major == 9 && minor == 0) {
      cudaFuncAttributes attributes{};
      ok = cudaFuncGetAttributes(&attributes, PrefillAttentionSm90Kernel<128>) == cudaSuccess &&
           attributes.binaryVersion == 90 && LoadedImageIsSm90a();
      (void)cudaGetLastError();  // a kernel image that does not load is an answer, not an error
    }
    if (ok) supported.fetch_or(bit, std::memory_order_release);
    checked.fetch_or(bit, std::memory_order_release);
  }
  return (supported.load(std::memory_order_acquire) & bit) != 0;
}

void LaunchPrefillAttentionSm90(const PrefillParams& params, int head_dim, int num_heads,
                                const StepView& step, const std::vector<PrefillChunk>& chunks,
                                cudaStream_t stream) {
  SIEVE_CHECK(PrefillAttentionSm90Supported()) << "the sm_90a prefill kernel needs an H100/H200";
  if (head_dim == 64) {
    Launch<64>(params, num_heads, step, chunks, stream);
  } else {
    Launch<128>(params, num_heads, step, chunks, stream);
  }
}

}  // namespace sieve::cuda
