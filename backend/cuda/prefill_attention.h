// What the two prefill attention kernels share: their parameters, and the launcher of the Hopper
// one (prefill_attention_sm90.cu). PrefillAttention (prefill_attention.cu) picks the kernel.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "backend/cuda/kernels.h"

namespace sieve::cuda {

struct PrefillParams {
  const bf16* q;                // [T_p][q_stride], head h in columns [h d, (h + 1) d)
  const bf16* k;                // [keys][G][d]
  const bf16* v;                // [keys][G][d]
  bf16* out;                    // [T_p][out_stride]
  float* lse;                   // [T_p][lse_stride] or null
  const int32_t* query_start;   // [S_p + 1]
  const int32_t* key_start;     // [S_p + 1]
  const int32_t* context_lens;  // [>= S_p]
  int64_t q_stride;
  int64_t out_stride;
  int64_t lse_stride;
  int num_kv_heads;
  int group;  // query heads per KV head
  float scale;
  float scale_log2;
};

// The wgmma kernel: a persistent grid over work items of 128 query rows (d = 64: 192) of one
// (sequence, head), their tiles sorted on the host from `chunks` (the step's prefill chunks, as
// StepMeta::prefill_chunks), K/V tiles of 128 keys. head_dim 64 or 128; only where
// PrefillAttentionSm90Supported().
// The query tiles of the chunks, each entry (sequence << 16) | tile of rows_per_tile rows, most key
// tiles (of keys_per_tile keys, those the tile's last row sees) first, ties in chunk order: the
// list the sm_90a kernel's persistent grid deals out, G items a round, back and forth.
std::vector<uint32_t> SortedPrefillTiles(const std::vector<PrefillChunk>& chunks, int rows_per_tile,
                                         int keys_per_tile);

void LaunchPrefillAttentionSm90(const PrefillParams& params, int head_dim, int num_heads,
                                const StepView& step, const std::vector<PrefillChunk>& chunks,
                                cudaStream_t stream);

}  // namespace sieve::cuda
