// Prefill attention: varlen causal flash attention (FlashAttention-2 style) over the prefill
// sequences of a step, with bottom-right causal alignment for chunked prefill and GQA. This is the
// sm_80 kernel (A100, RTX 4090, and the reference for the Hopper one); PrefillAttention runs
// prefill_attention_sm90.cu's wgmma kernel where the device and the build have it.
//
// One CTA = 128 query rows of one (sequence, query head); 8 warps own 16 rows each. K/V tiles of
// 64 keys stream through shared memory with cp.async, double-buffered, one barrier per tile. Each
// warp keeps its Q fragments, O accumulator and softmax state in registers (flash_warp.cuh), so
// the only shared-memory traffic in the loop is the K/V fragment loads. The design and its
// numbers are in README_attention.md.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cmath>
#include <cstdint>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/flash_warp.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/prefill_attention.h"
#include "core/check.h"

namespace sieve::cuda {
namespace {

constexpr int kBlockM = 128;  // query rows per CTA
constexpr int kBlockN = 64;   // keys per tile
constexpr int kWarps = kBlockM / 16;
constexpr int kThreads = kWarps * 32;
constexpr int kStages = 2;  // K/V tiles in shared memory: the one computed on, the one landing

template <int kHeadDim>
constexpr int SmemQBytes() {
  return kBlockM * kHeadDim * 2;
}
template <int kHeadDim>
constexpr int SmemKvTileBytes() {
  return kBlockN * kHeadDim * 2;
}
// d = 128: 32 KiB Q + 2 stages x (16 + 16) KiB K/V = 96 KiB; d = 64: 48 KiB.
template <int kHeadDim>
constexpr int SmemBytes() {
  return SmemQBytes<kHeadDim>() + 2 * kStages * SmemKvTileBytes<kHeadDim>();
}

// Grid: x = query head, y = prefill sequence, z = query tile counted from the end, so the tiles
// with the most keys (the last rows of the longest chunks) start first and the short ones fill in
// behind them. Tiles past a sequence's chunk exit at once.
template <int kHeadDim>
__global__ void __launch_bounds__(kThreads, 1) PrefillAttentionKernel(const PrefillParams params) {
  constexpr int kQBytes = SmemQBytes<kHeadDim>();
  constexpr int kKvBytes = SmemKvTileBytes<kHeadDim>();
  extern __shared__ __align__(128) uint8_t smem[];
  const uint32_t smem_q = flash::SharedAddress(smem);
  const uint32_t smem_k = smem_q + kQBytes;
  const uint32_t smem_v = smem_k + kStages * kKvBytes;

  const int head = static_cast<int>(blockIdx.x);
  const int seq = static_cast<int>(blockIdx.y);
  const int q_tile = static_cast<int>(gridDim.z - 1 - blockIdx.z);
  const int query_begin = params.query_start[seq];
  const int query_len = params.query_start[seq + 1] - query_begin;
  const int row0 = q_tile * kBlockM;
  if (row0 >= query_len) return;
  const int key_begin = params.key_start[seq];
  const int kv_len = params.key_start[seq + 1] - key_begin;
  const int context = params.context_lens[seq];
  const int rows = min(kBlockM, query_len - row0);
  // Row i sees keys j <= context + i: the tile's last row bounds the keys any row needs.
  const int num_keys = min(kv_len, context + row0 + rows);
  const int num_tiles = (num_keys + kBlockN - 1) / kBlockN;

  const int kv_head = head / params.group;
  const int64_t kv_stride = static_cast<int64_t>(params.num_kv_heads) * kHeadDim;
  const bf16* q_rows = params.q + static_cast<int64_t>(query_begin + row0) * params.q_stride +
                       static_cast<int64_t>(head) * kHeadDim;
  const bf16* k_rows = params.k + static_cast<int64_t>(key_begin) * kv_stride +
                       static_cast<int64_t>(kv_head) * kHeadDim;
  const bf16* v_rows = params.v + static_cast<int64_t>(key_begin) * kv_stride +
                       static_cast<int64_t>(kv_head) * kHeadDim;
  // Keys past kv_len are zero-filled, never read (they belong to the next sequence or lie past
  // the buffer); the mask drops them.
  const auto load_kv = [&](int tile) {
    const int first = tile * kBlockN;
    const int stage = tile % kStages;
    flash::LoadTileAsync<kHeadDim, kBlockN, kThreads>(
        smem_k + stage * kKvBytes, k_rows + first * kv_stride, kv_stride, kv_len - first);
    flash::LoadTileAsync<kHeadDim, kBlockN, kThreads>(
        smem_v + stage * kKvBytes, v_rows + first * kv_stride, kv_stride, kv_len - first);
  };

  // Prologue: Q and the first kStages - 1 K/V tiles, one commit group per tile (Q rides with
  // tile 0).
  flash::LoadTileAsync<kHeadDim, kBlockM, kThreads>(smem_q, q_rows, params.q_stride, rows);
  if (num_tiles > 0) load_kv(0);
  flash::CpAsyncCommit();
#pragma unroll
  for (int tile = 1; tile < kStages - 1; ++tile) {
    if (tile < num_tiles) load_kv(tile);
    flash::CpAsyncCommit();
  }

  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int warp_row0 = row0 + warp * 16;  // in the sequence's chunk
  const bool warp_active = warp_row0 < query_len;
  // Inclusive key bounds: what each of this lane's two rows sees, what the warp's first row sees
  // (tiles ending at or below it need no mask) and what its last valid row sees (tiles starting
  // above it are skipped). Rows past the chunk are clamped to existing keys; they are computed
  // only because they share a warp with real rows, and never stored.
  const int row_g = warp_row0 + lane / 4;
  const int lane_key_last[2] = {min(context + row_g, kv_len - 1),
                                min(context + row_g + 8, kv_len - 1)};
  const int warp_key_first_row = min(context + warp_row0, kv_len - 1);
  const int warp_key_last_row = min(context + min(warp_row0 + 15, query_len - 1), kv_len - 1);

  flash::WarpRows<kHeadDim> state;
  state.Reset();
  flash::CpAsyncWait<kStages - 2>();
  __syncthreads();
  state.LoadQ(smem_q, warp * 16);

  for (int tile = 0; tile < num_tiles; ++tile) {
    // After this barrier tile `tile` is visible to all threads, and every warp has finished
    // tile - 1, so its stage can be refilled.
    flash::CpAsyncWait<kStages - 2>();
    __syncthreads();
    if (tile + kStages - 1 < num_tiles) load_kv(tile + kStages - 1);
    flash::CpAsyncCommit();  // possibly empty: keeps the group count per iteration fixed

    const int first = tile * kBlockN;
    if (!warp_active || first > warp_key_last_row) continue;  // every key masked for this warp
    const int stage = tile % kStages;
    const uint32_t k_tile = smem_k + stage * kKvBytes;
    const uint32_t v_tile = smem_v + stage * kKvBytes;
    const int limit[2] = {lane_key_last[0] - first, lane_key_last[1] - first};
    if (first + kBlockN - 1 > warp_key_first_row) {
      state.template AttendTile<kBlockN, true>(k_tile, v_tile, 0, params.scale_log2, limit);
    } else {
      state.template AttendTile<kBlockN, false>(k_tile, v_tile, 0, params.scale_log2, limit);
    }
  }
  if (!warp_active) return;  // no barrier follows: the epilogue is per warp

  // Epilogue: normalise, stage the warp's 16 bf16 rows in its own rows of the Q tile (only this
  // warp ever read them), then store 16-byte chunks, a full row per 16 (d = 128) or 8 lanes.
  state.FinishSums();
  const int g = lane / 4;
  const int t = lane % 4;
  float inv_sum[2];
  float row_lse[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const float sum = state.l[half];
    inv_sum[half] = sum > 0.0f ? 1.0f / sum : 0.0f;
    row_lse[half] = sum > 0.0f ? state.m[half] * params.scale + logf(sum) : -INFINITY;
  }
  __syncwarp();
#pragma unroll
  for (int n = 0; n < kHeadDim / 8; ++n) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = warp * 16 + g + 8 * half;
      const uint32_t packed = flash::PackBf16(state.acc[n][2 * half] * inv_sum[half],
                                              state.acc[n][2 * half + 1] * inv_sum[half]);
      *reinterpret_cast<uint32_t*>(smem + flash::TileOffset<kHeadDim>(row, n) + t * 4) = packed;
    }
  }
  __syncwarp();
  constexpr int kChunks = kHeadDim / 8;
#pragma unroll
  for (int step = 0; step < 16 * kChunks / 32; ++step) {
    const int index = lane + step * 32;
    const int row = index / kChunks;
    const int chunk = index % kChunks;
    const int query_row = warp_row0 + row;
    if (query_row < query_len) {
      const uint4 value = *reinterpret_cast<const uint4*>(
          smem + flash::TileOffset<kHeadDim>(warp * 16 + row, chunk));
      *reinterpret_cast<uint4*>(params.out +
                                static_cast<int64_t>(query_begin + query_row) * params.out_stride +
                                static_cast<int64_t>(head) * kHeadDim + chunk * 8) = value;
    }
  }
  if (params.lse != nullptr && t == 0) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int query_row = row_g + 8 * half;
      if (query_row < query_len) {
        params.lse[static_cast<int64_t>(query_begin + query_row) * params.lse_stride + head] =
            row_lse[half];
      }
    }
  }
}

template <int kHeadDim>
void LaunchPrefill(const PrefillParams& params, int num_heads, const StepView& step,
                   cudaStream_t stream) {
  constexpr int kSmem = SmemBytes<kHeadDim>();
  // Above 48 KiB of dynamic shared memory needs an opt-in, once per device.
  static std::atomic<uint64_t> configured_devices{0};
  int device = 0;
  SIEVE_CUDA_CHECK(cudaGetDevice(&device));
  OncePerDevice(configured_devices, device, [] {
    SIEVE_CUDA_CHECK(cudaFuncSetAttribute(PrefillAttentionKernel<kHeadDim>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  });
  const int num_q_tiles = (step.max_query_len + kBlockM - 1) / kBlockM;
  const dim3 grid(num_heads, step.num_prefill_seqs, num_q_tiles);
  PrefillAttentionKernel<kHeadDim><<<grid, kThreads, kSmem, stream>>>(params);
  SIEVE_CUDA_CHECK_LAUNCH();
}

}  // namespace

void PrefillAttentionWithKernel(PrefillKernel kernel, const bf16* q, int64_t q_stride,
                                const bf16* k, const bf16* v, int num_heads, int num_kv_heads,
                                int head_dim, const StepView& step,
                                const std::vector<PrefillChunk>& chunks, bf16* out,
                                int64_t out_stride, float* lse, int64_t lse_stride,
                                cudaStream_t stream) {
  if (step.num_prefill_seqs <= 0 || step.max_query_len <= 0) return;
  // The host's chunks must be the device arrays' (the sm_90a kernel's work is planned from them).
  int64_t chunk_rows = 0;
  int64_t chunk_keys = 0;
  for (const PrefillChunk& chunk : chunks) {
    chunk_rows += chunk.query_len;
    chunk_keys += static_cast<int64_t>(chunk.context_len) + chunk.query_len;
  }
  SIEVE_CHECK(static_cast<int>(chunks.size()) == step.num_prefill_seqs &&
              chunk_rows == step.num_prefill_tokens && chunk_keys == step.num_prefill_keys)
      << "prefill chunks (" << chunks.size() << " sequences, " << chunk_rows << " rows, "
      << chunk_keys << " keys) are not the step's (" << step.num_prefill_seqs << ", "
      << step.num_prefill_tokens << ", " << step.num_prefill_keys << ")";
  SIEVE_CHECK(num_kv_heads > 0 && num_heads % num_kv_heads == 0)
      << num_heads << " query heads, " << num_kv_heads << " KV heads";
  SIEVE_CHECK(head_dim == 64 || head_dim == 128) << "head_dim " << head_dim;
  SIEVE_CHECK(step.num_prefill_seqs <= 65535 &&
              (step.max_query_len + kBlockM - 1) / kBlockM <= 65535)
      << "grid too large";
  // Every row is moved in 16-byte pieces.
  SIEVE_CHECK(Aligned16(q) && Aligned16(k) && Aligned16(v) && Aligned16(out) && q_stride % 8 == 0 &&
              out_stride % 8 == 0)
      << "q, k, v, out and their row strides must be 16-byte aligned";
  PrefillParams params;
  params.q = q;
  params.k = k;
  params.v = v;
  params.out = out;
  params.lse = lse;
  params.query_start = step.query_start;
  params.key_start = step.key_start;
  params.context_lens = step.context_lens;
  params.q_stride = q_stride;
  params.out_stride = out_stride;
  params.lse_stride = lse_stride;
  params.num_kv_heads = num_kv_heads;
  params.group = num_heads / num_kv_heads;
  params.scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  params.scale_log2 = params.scale * static_cast<float>(M_LOG2E);
  if (kernel == PrefillKernel::kAuto) {
    kernel = PrefillAttentionSm90Supported() ? PrefillKernel::kSm90 : PrefillKernel::kSm80;
  }
  if (kernel == PrefillKernel::kSm90) {
    LaunchPrefillAttentionSm90(params, head_dim, num_heads, step, chunks, stream);
  } else if (head_dim == 64) {
    LaunchPrefill<64>(params, num_heads, step, stream);
  } else {
    LaunchPrefill<128>(params, num_heads, step, stream);
  }
}

void PrefillAttention(const bf16* q, int64_t q_stride, const bf16* k, const bf16* v, int num_heads,
                      int num_kv_heads, int head_dim, const StepView& step,
                      const std::vector<PrefillChunk>& chunks, bf16* out, int64_t out_stride,
                      float* lse, int64_t lse_stride, cudaStream_t stream) {
  PrefillAttentionWithKernel(PrefillKernel::kAuto, q, q_stride, k, v, num_heads, num_kv_heads,
                             head_dim, step, chunks, out, out_stride, lse, lse_stride, stream);
}

}  // namespace sieve::cuda
