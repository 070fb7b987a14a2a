// Where a step's tokens go in the paged KV pool: the device-side index arithmetic shared by the
// kernels that write new K/V entries (kv_kernels.cu's RoPE + cache write and prefill gather,
// epilogue_gemm_sm90.cu's qkv GEMM with RoPE in its epilogue), so that they write the same entries.
#pragma once

#include <cstdint>

#include "backend/cuda/kernels.h"

namespace sieve::cuda {

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

// Entry `entry` of slot `slot`'s sequence in `layer`, through the page table.
__device__ __forceinline__ int64_t PoolEntry(const PoolView& pool, int layer, int slot, int entry) {
  const int32_t* row = pool.page_table + (static_cast<int64_t>(layer) * pool.max_seqs + slot) *
                                             pool.max_pages_per_seq;
  return static_cast<int64_t>(row[entry / pool.page_size]) * pool.page_size +
         entry % pool.page_size;
}

// SequenceOf for a row of each lane's own, called by every lane of a warp with the same `starts`
// and `count`: up to 32 starts are read once (a load a lane) and searched by shuffles, so that the
// search waits for one load rather than one a step.
__device__ __forceinline__ int WarpSequenceOf(const int32_t* __restrict__ starts, int count,
                                              int row) {
  if (count > 32) return SequenceOf(starts, count, row);
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int start = lane < count ? starts[lane] : 0x7fffffff;
  int low = 0;  // starts[0] = 0 <= row; the last s with starts[s] <= row, by halving steps
#pragma unroll
  for (int step = 16; step > 0; step >>= 1) {
    const int probe = low + step < 32 ? low + step : 31;
    const int value = __shfl_sync(0xffffffffu, start, probe);
    if (low + step < count && value <= row) low += step;
  }
  return low;
}

// The pool entry token `token` of sequence `seq` writes in `layer`, or -1 where the sequence
// writes nothing there (write_start[layer][s] < 0).
__device__ __forceinline__ int64_t WriteEntry(const StepView& step, int layer, const PoolView& pool,
                                              int token, int seq) {
  const int write_start = step.write_start[static_cast<int64_t>(layer) * step.num_seqs + seq];
  if (write_start < 0) return -1;
  return PoolEntry(pool, layer, step.seq_slots[seq], write_start + token - step.query_start[seq]);
}

// WriteEntry of token `token`, its sequence found first. Decode tokens (one a sequence, after the
// prefill tokens) need no search.
__device__ __forceinline__ int64_t TokenWriteEntry(const StepView& step, int layer,
                                                   const PoolView& pool, int token) {
  const int seq = token >= step.num_prefill_tokens
                      ? step.num_prefill_seqs + (token - step.num_prefill_tokens)
                      : SequenceOf(step.query_start, step.num_prefill_seqs, token);
  return WriteEntry(step, layer, pool, token, seq);
}

}  // namespace sieve::cuda
