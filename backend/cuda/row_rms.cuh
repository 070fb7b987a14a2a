// The per-row scale of a folded RMSNorm (Backend's RowRms): s = 1 / sqrt(mean(row^2) + eps) of a
// bf16 row of the residual stream, computed by one warp. Every kernel that applies it (RoPE, the
// fused RoPE of decode attention, SiLU) sums in the same fixed order (lane-strided, then an xor
// tree), so the fused and unfused paths scale by the same bits.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#ifdef __CUDACC__
#include "backend/cuda/bf16x8.cuh"
#endif

namespace sieve::cuda {

// Where a kernel finds the rows whose RMS scales its input; rows null: s = 1.
struct RowRmsView {
  const __nv_bfloat16* rows = nullptr;  // [T][stride]
  int64_t stride = 0;                   // elements
  int width = 0;                        // D
  float eps = 0.0f;
};

#ifdef __CUDACC__
// Every lane of the calling warp returns s of row `row` (1 when view.rows is null). Rows are
// 16-byte aligned with width % 8 == 0 (checked on the host).
__device__ __forceinline__ float WarpRowInvRms(const RowRmsView& view, int row) {
  if (view.rows == nullptr) return 1.0f;
  const int lane = static_cast<int>(threadIdx.x % 32);
  const auto* chunks =
      reinterpret_cast<const uint4*>(view.rows + static_cast<int64_t>(row) * view.stride);
  // Chunks lane, lane + 32, ... in order, kBatch loads issued before any is used. Chunks past the
  // row read as zeros, which add exactly nothing.
  constexpr int kBatch = 8;
  const int count = view.width / 8;
  float sum = 0.0f;
  for (int base = lane; base < count; base += 32 * kBatch) {
    uint4 raw[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int chunk = base + 32 * b;
      raw[b] = chunk < count ? chunks[chunk] : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      float values[8];
      Unpack8(raw[b], values);
#pragma unroll
      for (int i = 0; i < 8; ++i) sum = __fmaf_rn(values[i], values[i], sum);
    }
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  }
  return rsqrtf(sum / static_cast<float>(view.width) + view.eps);
}
#endif

}  // namespace sieve::cuda
