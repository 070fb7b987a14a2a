// Launchers of Sieve's CUDA kernels: plain functions over raw device pointers, one per op, all
// asynchronous on `stream`. CudaBackend (cuda_backend.cc) turns Backend calls into these. Each
// has a CPU twin in backend/cpu and a comparison test in this folder.
//
// Conventions: `bf16` activations, KV pool and weights; f32 for log-sum-exp, scores and logits.
// Row strides are in elements. "step" arrays are the device arrays of StepMeta (step_meta.h):
// int32, shapes as documented there.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "backend/cuda/row_rms.cuh"
#include "backend/step_meta.h"

namespace sieve::cuda {

using bf16 = __nv_bfloat16;

// The device side of one step's StepMeta (pointers into its single upload) and host sizes.
struct StepView {
  const int32_t* token_ids;         // [T]
  const int32_t* positions;         // [T]
  const int32_t* query_start;       // [S + 1]
  const int32_t* key_start;         // [S_p + 1]
  const int32_t* context_lens;      // [S]
  const int32_t* seq_slots;         // [S]
  const int32_t* write_start;       // [L][S]
  const int32_t* compression_jobs;  // [J][kCompressionJobInts]
  const int32_t* eviction_jobs;     // [E][kEvictionJobInts]
  int num_tokens;
  int num_prefill_tokens;
  int num_seqs;
  int num_prefill_seqs;
  int max_query_len;
  int max_kv_len;
  int num_prefill_keys;  // rows of the prefill K/V scratch
};

// The device side of the KV pool.
struct PoolView {
  // [num_pages][page_size][G][d]: bf16, or e4m3 bytes when fp8 (KvPool: entry x of layer l, KV
  // head g is stored as e4m3(x * (1 / scale[l][g])) and read as e4m3 value * scale[l][g]).
  void* k;
  void* v;
  const float* k_scales;  // [L][G] (fp8), else null
  const float* v_scales;  // [L][G] (fp8), else null
  bool fp8;
  const int32_t* page_table;  // [L][max_seqs][max_pages_per_seq]
  int32_t* kv_lens;           // [L][max_seqs]
  float* scores;              // [num_pages * page_size][G] or null
  int32_t* positions;         // [num_pages * page_size][G] or null
  int page_size;
  int max_seqs;
  int max_pages_per_seq;
  int num_kv_heads;
  int head_dim;
};

// ---------------- dense (dense_kernels.cu) ----------------
void Embedding(const bf16* table, int64_t table_stride, const int32_t* ids, int rows, int width,
               bf16* out, int64_t out_stride, cudaStream_t stream);
void RmsNorm(const bf16* x, int64_t x_stride, const bf16* weight, float eps, int rows, int width,
             bf16* out, int64_t out_stride, cudaStream_t stream);
// out = silu(s gate) * (s up), s of each row from `norm` (1 without rows).
void SiluMul(const bf16* gate_up, int64_t in_stride, int rows, int width, bf16* out,
             int64_t out_stride, const RowRmsView& norm, cudaStream_t stream);
// A quantized activation (backend.h: the FP8 GEMM's input, quantized by the op that makes it):
// codes [rows][ldc] e4m3, scales [rows] f32.
struct E4m3Rows {
  uint8_t* codes;
  int64_t ldc;  // elements (bytes)
  float* scales;
};
// RmsNorm and SiluMul into a quantized activation: each row as the bf16 op computes it (rounded
// to bf16), quantized as fp8_gemm.h's QuantizeRowsE4m3 quantizes a bf16 row; the codes and
// scales are those of the bf16 op followed by QuantizeRowsE4m3, bit for bit. A block a row.
void RmsNormE4m3(const bf16* x, int64_t x_stride, const bf16* weight, float eps, int rows,
                 int width, const E4m3Rows& out, cudaStream_t stream);
void SiluMulE4m3(const bf16* gate_up, int64_t in_stride, int rows, int width, const E4m3Rows& out,
                 const RowRmsView& norm, cudaStream_t stream);
// w[n][k] *= scale[k], rounded to bf16.
void ScaleColumns(bf16* w, int64_t w_stride, int rows, int cols, const bf16* scale,
                  cudaStream_t stream);
void GatherRows(const bf16* x, int64_t x_stride, const int32_t* rows, int count, int width,
                bf16* out, int64_t out_stride, cudaStream_t stream);
void ScatterInt32(const int32_t* patches, int count, int32_t* dst, cudaStream_t stream);
// dst[pairs[p][0]] = src[pairs[p][1]] for p < count.
void GatherInt32(const int32_t* src, const int32_t* pairs, int count, int32_t* dst,
                 cudaStream_t stream);
// Seeded N(0, stddev), counter-based: the same seed gives the same values on any GPU.
void FillRandomBf16(bf16* out, int64_t count, uint64_t seed, float stddev, cudaStream_t stream);
// Reads `bytes` of `buffer` (16-byte aligned, a multiple of 16): with a buffer twice the L2 this
// leaves the L2 holding clean lines of it, as a decode step's previous weight stream does, so that
// a benchmark of the next kernel meets cold caches. The read is kept from being optimised away by
// a store to `sink` that almost never happens (null: the buffer itself, for scratch buffers; give
// another scratch word when `buffer` holds data).
void ReadThrough(const void* buffer, size_t bytes, cudaStream_t stream, uint32_t* sink = nullptr);
void ConvertF32ToBf16(const float* in, int64_t count, bf16* out, cudaStream_t stream);

// ---------------- KV writes and gathers (kv_kernels.cu) ----------------
// RoPE (rotate-half, table [max_pos][d/2][2] cos/sin) on q and k of tokens [first_token,
// end_token) of qkv [T][(H + 2G) d], then k/v of those whose sequence has write_start[layer][s]
// >= 0 into the pool (and the side pools: position, score 0). Backend::RopeAndCacheWrite's
// RopeTokens are the ranges [0, T), [0, T_p) and [T_p, T). With norm.rows, q, k and v are first
// scaled by the token's s (row_rms.cuh), v in qkv too.
void RopeAndCacheWrite(bf16* qkv, int64_t qkv_stride, const float* rope_table, int num_heads,
                       const StepView& step, int layer, const PoolView& pool, int first_token,
                       int end_token, const RowRmsView& norm, cudaStream_t stream);
// Prefill K/V scratch [num_prefill_keys][G][d]: each prefill sequence's cached entries (from the
// layer's pages) followed by its chunk's rotated k/v (from qkv).
void GatherPrefillKv(const bf16* qkv, int64_t qkv_stride, int num_heads, const StepView& step,
                     int layer, const PoolView& pool, bf16* k_out, bf16* v_out,
                     cudaStream_t stream);

// ---------------- attention (prefill_attention.cu, decode_attention.cu) ----------------
// Causal flash attention of each prefill sequence's chunk rows against its K/V rows (bottom-right
// aligned: row i of sequence s sees keys j <= context_lens[s] + i). GQA: query head h uses KV head
// h / (H / G). q [T_p][H d] (row stride q_stride), k/v [keys][G][d] contiguous, out [T_p][H d]
// (row stride out_stride), lse [T_p][H] f32 (natural log of sum exp(scale * q.k)).
// head_dim 64 or 128. `chunks` is the host's copy of the step's prefill chunks
// (StepMeta::prefill_chunks), from which the sm_90a kernel orders its work. Runs the sm_90a wgmma
// kernel on an H100/H200 built for it, else the sm_80 one (PrefillAttentionWithKernel picks
// either, for the tests and the benchmark).
void PrefillAttention(const bf16* q, int64_t q_stride, const bf16* k, const bf16* v, int num_heads,
                      int num_kv_heads, int head_dim, const StepView& step,
                      const std::vector<PrefillChunk>& chunks, bf16* out, int64_t out_stride,
                      float* lse, int64_t lse_stride, cudaStream_t stream);
enum class PrefillKernel { kAuto, kSm80, kSm90 };
void PrefillAttentionWithKernel(PrefillKernel kernel, const bf16* q, int64_t q_stride,
                                const bf16* k, const bf16* v, int num_heads, int num_kv_heads,
                                int head_dim, const StepView& step,
                                const std::vector<PrefillChunk>& chunks, bf16* out,
                                int64_t out_stride, float* lse, int64_t lse_stride,
                                cudaStream_t stream);
// Whether this device runs the sm_90a prefill kernel (an sm_90 GPU, and a build for sm_90a).
bool PrefillAttentionSm90Supported();
// Scratch bytes DecodeAttention needs for its split-K partial results at these sizes (with
// `batch_invariant`, for its fixed-size splits).
size_t DecodeAttentionWorkspaceBytes(int num_decode_seqs, int num_heads, int head_dim,
                                     int max_kv_len, bool batch_invariant = false);
// Attention of each decode token (rows [T_p, T) of q/out) over its sequence's entries in `layer`
// (page table row seq_slots[s], kv_lens). Split-K over long contexts. When pool.scores is set,
// adds each entry's probability averaged over the KV head's query group to it (H2O).
// `batch_invariant`: a head's arithmetic depends on its sequence's length only, never on the batch
// (splits of a fixed number of entries, one CTA shape, no folding: README_attention.md "Batch
// invariance").
void DecodeAttention(const bf16* q, int64_t q_stride, int num_heads, const StepView& step,
                     int layer, const PoolView& pool, bf16* out, int64_t out_stride,
                     void* workspace, size_t workspace_bytes, cudaStream_t stream,
                     bool batch_invariant = false);
// RopeAndCacheWrite over the decode tokens [T_p, T), then DecodeAttention of their q, in one
// kernel: each CTA rotates its heads' q in shared memory and, when its piece of the sequence holds
// the token's entry (write_start[layer][s]), rotates the token's k of its KV head and writes k, v
// and the position side pool there before reading it. qkv's rows stay as they are (q and k
// unrotated). The step must have write_start; pool.scores must be null (H2O's score pass reads
// rotated q from memory: it takes the two-kernel path). 16-byte aligned rope_table rows. With
// norm.rows, q, k and v are scaled by the token's s first, as RopeAndCacheWrite does.
void RopeDecodeAttention(const bf16* qkv, int64_t qkv_stride, const float* rope_table,
                         int num_heads, const StepView& step, int layer, const PoolView& pool,
                         bf16* out, int64_t out_stride, void* workspace, size_t workspace_bytes,
                         const RowRmsView& norm, cudaStream_t stream, bool batch_invariant = false);

// ---------------- sparsity (sparsity_kernels.cu) ----------------
// Compression jobs of one layer: rows [job_begin, job_end) of step.compression_jobs, whose host
// copies are `jobs` (for launch sizes). Semantics exactly as Backend::WindowScores / SelectKept /
// WriteKeptKv / EvictEntries (backend/backend.h).
void WindowScores(const bf16* q, int64_t q_stride, const bf16* k, const float* lse,
                  int64_t lse_stride, int num_heads, int num_kv_heads, int head_dim,
                  const StepView& step, const CompressionJob* jobs, int job_begin, int job_end,
                  float* scores, cudaStream_t stream);
size_t SelectKeptWorkspaceBytes(const CompressionJob* jobs, int job_begin, int job_end,
                                int num_kv_heads);
void SelectKept(const float* scores, int num_kv_heads, const StepView& step,
                const CompressionJob* jobs, int job_begin, int job_end, int32_t* kept,
                void* workspace, size_t workspace_bytes, cudaStream_t stream);
void WriteKeptKv(const bf16* k, const bf16* v, const float* scores, const int32_t* kept,
                 const StepView& step, const CompressionJob* jobs, int job_begin, int job_end,
                 int layer, const PoolView& pool, cudaStream_t stream);
void EvictEntries(const StepView& step, const EvictionJob* jobs, int job_begin, int job_end,
                  int layer, const PoolView& pool, cudaStream_t stream);

}  // namespace sieve::cuda
