// RoPE fused with the write of K/V into the pages, and the gather of a prefill sequence's whole
// K/V into contiguous scratch.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>

#include "backend/cuda/bf16x8.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/kv_fp8.cuh"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/rope.cuh"
#include "backend/cuda/row_rms.cuh"
#include "core/check.h"

namespace sieve::cuda {

namespace {

constexpr int kThreads = 256;

// The sequence a row belongs to: the last s with starts[s] <= row (starts is cumulative).
__device__ __forceinline__ int SequenceOf(const int32_t* __restrict__ starts, int count, int row) {
  int low = 0;
  int high = count - 1;
  while (low < high) {
    const int mid = (low + high + 1) / 2;
    if (starts[mid] <= row) {
      low = mid;
    } else {
      high = mid - 1;
    }
  }
  return low;
}

__device__ __forceinline__ int64_t PoolEntry(const PoolView& pool, int layer, int slot, int entry) {
  const int32_t* row = pool.page_table + (static_cast<int64_t>(layer) * pool.max_seqs + slot) *
                                             pool.max_pages_per_seq;
  return static_cast<int64_t>(row[entry / pool.page_size]) * pool.page_size +
         entry % pool.page_size;
}

// Blocks (token - first_token, part): the token's rotations and copies are spread over gridDim.y
// blocks, so a decode step of few tokens still fills the GPU.
__global__ void RopeAndCacheWriteKernel(bf16* __restrict__ qkv, int64_t qkv_stride,
                                        const float* __restrict__ rope_table, int num_heads,
                                        StepView step, int layer, PoolView pool, int first_token,
                                        RowRmsView norm) {
  __shared__ float row_scale;
  PdlWait();
  PdlLaunchDependents();
  const int token = first_token + static_cast<int>(blockIdx.x);
  // A folded RMSNorm's s for this token (row_rms.cuh): one warp computes it for the block.
  float scale = 1.0f;
  if (norm.rows != nullptr) {
    if (threadIdx.x < 32) {
      const float value = WarpRowInvRms(norm, token);
      if (threadIdx.x == 0) row_scale = value;
    }
    __syncthreads();
    scale = row_scale;
  }
  const int head_dim = pool.head_dim;
  const int half = head_dim / 2;
  const int kv_heads = pool.num_kv_heads;
  // Decode tokens (one per sequence, after the prefill tokens) need no search.
  const int seq = token >= step.num_prefill_tokens
                      ? step.num_prefill_seqs + (token - step.num_prefill_tokens)
                      : SequenceOf(step.query_start, step.num_prefill_seqs, token);
  const int write_start = step.write_start[static_cast<int64_t>(layer) * step.num_seqs + seq];
  const int position = step.positions[token];
  int64_t entry = -1;
  if (write_start >= 0) {
    entry =
        PoolEntry(pool, layer, step.seq_slots[seq], write_start + token - step.query_start[seq]);
  }
  bf16* row = qkv + static_cast<int64_t>(token) * qkv_stride;
  const float* cos_sin = rope_table + static_cast<int64_t>(position) * head_dim;
  const int first = static_cast<int>(blockIdx.y * blockDim.x + threadIdx.x);
  const int stride = static_cast<int>(gridDim.y * blockDim.x);
  // Rotate q and k: work item = 8 pairs (x[i], x[i + half]) of one head, from two 16-byte
  // loads (scalar bf16 accesses held the kernel to about a third of the copy rate at prefill
  // sizes).
  const int vectors = half / 8;
  for (int item = first; item < (num_heads + kv_heads) * vectors; item += stride) {
    const int head = item / vectors;
    const int index = item % vectors * 8;
    bf16* x = row + head * head_dim;
    float a[8], b[8], cs[16];
    Unpack8(*reinterpret_cast<const uint4*>(x + index), a);
    Unpack8(*reinterpret_cast<const uint4*>(x + index + half), b);
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const float4 quad = reinterpret_cast<const float4*>(cos_sin + 2 * index)[q];
      cs[4 * q] = quad.x;
      cs[4 * q + 1] = quad.y;
      cs[4 * q + 2] = quad.z;
      cs[4 * q + 3] = quad.w;
    }
    uint4 ra_raw, rb_raw;
    auto* ra = reinterpret_cast<bf16*>(&ra_raw);
    auto* rb = reinterpret_cast<bf16*>(&rb_raw);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      rope::RotatePair(__fmul_rn(a[i], scale), __fmul_rn(b[i], scale), cs[2 * i], cs[2 * i + 1],
                       ra[i], rb[i]);
    }
    *reinterpret_cast<uint4*>(x + index) = ra_raw;
    *reinterpret_cast<uint4*>(x + index + half) = rb_raw;
    if (head >= num_heads && entry >= 0) {
      const int64_t dst = (entry * kv_heads + (head - num_heads)) * head_dim;
      if (pool.fp8) {
        // The rounded bf16 k is what the pool quantizes (as the CPU twin quantizes its row).
        const float inverse =
            1.0f / pool.k_scales[static_cast<int64_t>(layer) * kv_heads + head - num_heads];
        float rotated[8];
        Unpack8(ra_raw, rotated);
        *reinterpret_cast<uint2*>(static_cast<uint8_t*>(pool.k) + dst + index) =
            QuantizeE4m3x8(rotated, inverse);
        Unpack8(rb_raw, rotated);
        *reinterpret_cast<uint2*>(static_cast<uint8_t*>(pool.k) + dst + index + half) =
            QuantizeE4m3x8(rotated, inverse);
      } else {
        bf16* k = static_cast<bf16*>(pool.k) + dst;
        *reinterpret_cast<uint4*>(k + index) = ra_raw;
        *reinterpret_cast<uint4*>(k + index + half) = rb_raw;
      }
    }
  }
  // v: scaled in qkv too (prefill attention reads it from there), then copied to the page.
  if (norm.rows != nullptr || entry >= 0) {
    auto* v = reinterpret_cast<uint4*>(row + (num_heads + kv_heads) * head_dim);
    const int64_t page_offset = entry * kv_heads * head_dim;  // elements
    for (int index = first; index < kv_heads * head_dim / 8; index += stride) {
      uint4 raw = v[index];
      if (norm.rows != nullptr) {
        float values[8];
        Unpack8(raw, values);
#pragma unroll
        for (int i = 0; i < 8; ++i) values[i] = __fmul_rn(values[i], scale);
        raw = Pack8(values);
        v[index] = raw;
      }
      if (entry < 0) continue;
      if (pool.fp8) {
        const int g = index * 8 / head_dim;
        float values[8];
        Unpack8(raw, values);
        reinterpret_cast<uint2*>(static_cast<uint8_t*>(pool.v) + page_offset)[index] =
            QuantizeE4m3x8(values,
                           1.0f / pool.v_scales[static_cast<int64_t>(layer) * kv_heads + g]);
      } else {
        reinterpret_cast<uint4*>(static_cast<bf16*>(pool.v) + page_offset)[index] = raw;
      }
    }
  }
  if (entry < 0) return;
  for (int g = first; g < kv_heads; g += stride) {
    if (pool.positions) pool.positions[entry * kv_heads + g] = position;
    if (pool.scores) pool.scores[entry * kv_heads + g] = 0.0f;
  }
}

// One block per key row of the scratch.
__global__ void GatherPrefillKvKernel(const bf16* __restrict__ qkv, int64_t qkv_stride,
                                      int num_heads, StepView step, int layer, PoolView pool,
                                      bf16* __restrict__ k_out, bf16* __restrict__ v_out) {
  const int key_row = blockIdx.x;
  const int seq = SequenceOf(step.key_start, step.num_prefill_seqs, key_row);
  const int index_in_seq = key_row - step.key_start[seq];
  const int context = step.context_lens[seq];
  const int width = pool.num_kv_heads * pool.head_dim;  // elements of one K (or V) row
  bf16* k_dst = k_out + static_cast<int64_t>(key_row) * width;
  bf16* v_dst = v_out + static_cast<int64_t>(key_row) * width;
  if (index_in_seq < context && pool.fp8) {
    // A cached entry of an FP8 pool: e4m3 value * the (layer, head)'s scale, rounded to bf16.
    const int64_t entry = PoolEntry(pool, layer, step.seq_slots[seq], index_in_seq);
    const auto* k_src =
        reinterpret_cast<const uint2*>(static_cast<const uint8_t*>(pool.k) + entry * width);
    const auto* v_src =
        reinterpret_cast<const uint2*>(static_cast<const uint8_t*>(pool.v) + entry * width);
    const float* k_scales = pool.k_scales + static_cast<int64_t>(layer) * pool.num_kv_heads;
    const float* v_scales = pool.v_scales + static_cast<int64_t>(layer) * pool.num_kv_heads;
    for (int index = threadIdx.x; index < width / 8; index += blockDim.x) {
      const int g = index * 8 / pool.head_dim;
      float values[8];
      E4m3x8ToFloat(k_src[index], values);
#pragma unroll
      for (int i = 0; i < 8; ++i) values[i] = __fmul_rn(values[i], k_scales[g]);
      reinterpret_cast<uint4*>(k_dst)[index] = Pack8(values);
      E4m3x8ToFloat(v_src[index], values);
#pragma unroll
      for (int i = 0; i < 8; ++i) values[i] = __fmul_rn(values[i], v_scales[g]);
      reinterpret_cast<uint4*>(v_dst)[index] = Pack8(values);
    }
    return;
  }
  const bf16* k_src;
  const bf16* v_src;
  if (index_in_seq < context) {
    const int64_t entry = PoolEntry(pool, layer, step.seq_slots[seq], index_in_seq);
    k_src = static_cast<const bf16*>(pool.k) + entry * width;
    v_src = static_cast<const bf16*>(pool.v) + entry * width;
  } else {
    const bf16* row =
        qkv + static_cast<int64_t>(step.query_start[seq] + index_in_seq - context) * qkv_stride;
    k_src = row + num_heads * pool.head_dim;
    v_src = k_src + width;
  }
  if (width % 8 == 0) {  // 16-byte copies (rows of pool and qkv are 16-byte aligned then)
    for (int index = threadIdx.x; index < width / 8; index += blockDim.x) {
      reinterpret_cast<uint4*>(k_dst)[index] = reinterpret_cast<const uint4*>(k_src)[index];
      reinterpret_cast<uint4*>(v_dst)[index] = reinterpret_cast<const uint4*>(v_src)[index];
    }
  } else {
    for (int index = threadIdx.x; index < width; index += blockDim.x) {
      k_dst[index] = k_src[index];
      v_dst[index] = v_src[index];
    }
  }
}

}  // namespace

void RopeAndCacheWrite(bf16* qkv, int64_t qkv_stride, const float* rope_table, int num_heads,
                       const StepView& step, int layer, const PoolView& pool, int first_token,
                       int end_token, const RowRmsView& norm, cudaStream_t stream) {
  SIEVE_CHECK(0 <= first_token && first_token <= end_token && end_token <= step.num_tokens)
      << "tokens [" << first_token << ", " << end_token << ") of " << step.num_tokens;
  if (end_token == first_token) return;
  // Enough blocks per token for ~2 items per thread at Llama shapes.
  // With a folded RMSNorm each block also reads the token's residual row, so long prefills keep
  // one block per token.
  const int items = (num_heads + pool.num_kv_heads) * pool.head_dim / 2;
  const int tokens = end_token - first_token;
  const int parts =
      norm.rows != nullptr && tokens > 256 ? 1 : std::max(1, std::min(8, items / (2 * kThreads)));
  // 16-byte vectors of 8 pairs (x[i], x[i + half]): head_dim % 16 == 0 (the backend runs 64 and
  // 128 only: CheckHeadDim) and rows of qkv, pages and cos/sin on 16 bytes.
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  SIEVE_CHECK(pool.head_dim % 16 == 0 && qkv_stride % 8 == 0 && aligned(qkv) && aligned(pool.k) &&
              aligned(pool.v) && aligned(rope_table))
      << "RopeAndCacheWrite needs head_dim % 16 == 0 and 16-byte aligned rows";
  LaunchWithPdl(RopeAndCacheWriteKernel, dim3(tokens, parts), kThreads, 0, stream, qkv, qkv_stride,
                rope_table, num_heads, step, layer, pool, first_token, norm);
}

void GatherPrefillKv(const bf16* qkv, int64_t qkv_stride, int num_heads, const StepView& step,
                     int layer, const PoolView& pool, bf16* k_out, bf16* v_out,
                     cudaStream_t stream) {
  const int key_rows = step.num_prefill_keys;
  if (key_rows == 0) return;
  GatherPrefillKvKernel<<<key_rows, 128, 0, stream>>>(qkv, qkv_stride, num_heads, step, layer, pool,
                                                      k_out, v_out);
  SIEVE_CUDA_CHECK_LAUNCH();
}

}  // namespace sieve::cuda
