// The split-K plan of the paged decode attention (decode_attention.cu), exposed so that the tests
// and the benchmark can run each path on purpose. DecodeAttention (kernels.h) is
// DecodeAttentionWithSplits(DecodeAttentionSplits(...), ...).
#pragma once

#include <cstddef>
#include <cstdint>

#include "backend/cuda/kernels.h"

namespace sieve::cuda {

// How many pieces each decode sequence's entries are cut into (flash-decoding): enough CTAs to
// fill the device twice over when the batch is small, at least 128 entries a piece, and pieces of
// at most 4096 entries so that one long sequence does not trail a large batch. Fewer when
// `workspace_bytes` cannot hold the partial results.
int DecodeAttentionSplits(int num_decode_seqs, int num_heads, int num_kv_heads, int head_dim,
                          int max_kv_len, size_t workspace_bytes);

// Workspace bytes for exactly `num_splits` (DecodeAttentionWorkspaceBytes bounds this for the
// splits DecodeAttentionSplits can choose).
size_t DecodeAttentionWorkspaceBytesForSplits(int num_decode_seqs, int num_heads, int head_dim,
                                              int num_splits);

// DecodeAttention with a forced split count (>= 1); the workspace must hold
// DecodeAttentionWorkspaceBytesForSplits(..., num_splits) bytes.
void DecodeAttentionWithSplits(int num_splits, const bf16* q, int64_t q_stride, int num_heads,
                               const StepView& step, int layer, const PoolView& pool, bf16* out,
                               int64_t out_stride, void* workspace, size_t workspace_bytes,
                               cudaStream_t stream);

}  // namespace sieve::cuda
