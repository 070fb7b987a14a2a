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

// The pool entry token `token` of the step writes in `layer`, or -1 where its sequence writes
// nothing there (write_start[layer][s] < 0). Decode tokens (one a sequence, after the prefill
// tokens) need no search.
__device__ __forceinline__ int64_t TokenWriteEntry(const StepView& step, int layer,
                                                   const PoolView& pool, int token) {
  const int seq = token >= step.num_prefill_tokens
                      ? step.num_prefill_seqs + (token - step.num_prefill_tokens)
                      : SequenceOf(step.query_start, step.num_prefill_seqs, token);
  const int write_start = step.write_start[static_cast<int64_t>(layer) * step.num_seqs + seq];
  if (write_start < 0) return -1;
  return PoolEntry(pool, layer, step.seq_slots[seq], write_start + token - step.query_start[seq]);
}

}  // namespace sieve::cuda
