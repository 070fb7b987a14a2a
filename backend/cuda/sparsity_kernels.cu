// KV-sparsity kernels of the CUDA backend (SPARSITY.md): window scores from the prefill LSE,
// pooling + top-k selection, the write of the kept entries into the layer's pages, and decode-time
// eviction. Each computes the function of its CPU twin (backend/cpu/cpu_sparsity_ops.cc) and makes
// the same selections: ties go to the lower position. README_sparsity.md has the design notes.
//
// Every launch of one layer covers all of that layer's jobs: the kernels read their job from the
// device rows of StepMeta, and the host copies only size the grid.
#include <cub/block/block_scan.cuh>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>

#include "backend/cuda/bf16x8.cuh"
#include "backend/cuda/block_select.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/flash_warp.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/kv_fp8.cuh"
#include "core/check.h"

namespace sieve::cuda {

namespace {

__device__ inline CompressionJob LoadJob(const int32_t* job_rows, int job_index) {
  return reinterpret_cast<const CompressionJob*>(job_rows)[job_index];
}

// Eight bf16 (one 16-byte load) as floats. `src` is 16-byte aligned.
__device__ inline void LoadBf16x8(const bf16* __restrict__ src, float (&out)[8]) {
  Unpack8(*reinterpret_cast<const uint4*>(src), out);
}

__device__ inline void StoreFloat8(float* dst, const float (&values)[8]) {
  reinterpret_cast<float4*>(dst)[0] = make_float4(values[0], values[1], values[2], values[3]);
  reinterpret_cast<float4*>(dst)[1] = make_float4(values[4], values[5], values[6], values[7]);
}

// Raises `kernel`'s dynamic shared-memory limit to `wanted` bytes or what the device's opt-in
// maximum leaves beside the kernel's static shared memory, whichever is smaller, once per device
// (`done` is the kernel's own cache); returns the limit. Above 48 KB a block's dynamic shared
// memory must be opted into.
template <typename Kernel>
int OptInSharedMemory(Kernel kernel, int wanted, std::atomic<int> (&done)[64]) {
  int device = 0;
  SIEVE_CUDA_CHECK(cudaGetDevice(&device));
  std::atomic<int>& limit = done[device % 64];
  if (limit.load() == 0) {
    int device_limit = 0;
    SIEVE_CUDA_CHECK(
        cudaDeviceGetAttribute(&device_limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    cudaFuncAttributes attributes{};
    SIEVE_CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel));
    // The limit covers static plus dynamic shared memory.
    const int bytes = std::min(device_limit - static_cast<int>(attributes.sharedSizeBytes), wanted);
    SIEVE_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    limit.store(bytes);
  }
  return limit.load();
}

// ---------------------------------------------------------------------------------------------
// WindowScores at head dims other than 64 and 128 (those take WindowScoresMmaKernel below)
//
// One block per (job, KV head, tile of kScoreKeys keys). The block keeps its K tile in shared
// memory as f32 and walks the group's query heads and, per head, the scored rows in chunks of
// kScoreRows: each chunk is a small [rows x d] x [d x keys] product done with f32 FMAs from
// shared memory (every thread a 4 x 4 register tile), turned into probabilities with the row's
// LSE and summed over the rows into per-key column sums that stay in registers. Keys are the
// outer loop, rows the inner one (SPARSITY.md), so nothing of size n x R is ever stored.
//
// Cost (Llama-3-8B, n = 4000, W = 32): n * W * H * d = 0.52 G FMA, ~16 us at the H200's f32 FMA
// peak; the K tile is read once, the window's q (W x d per head, L2-resident) once per block.
constexpr int kScoreKeys = 64;  // keys per block
constexpr int kScoreRows = 32;  // query rows per chunk
constexpr int kKeyLanes = 16;   // threads across keys: each owns keys lane + 16 * c, c < 4
constexpr int kRowLanes = 8;    // threads across rows: each owns rows lane + 8 * r, r < 4
constexpr int kScoreThreads = kKeyLanes * kRowLanes;  // 128
static_assert(kKeyLanes * 4 == kScoreKeys && kRowLanes * 4 == kScoreRows);

// Shared-memory row pitch of the K and q tiles in floats: d + 4 keeps 16-byte alignment and makes
// the pitch an odd number of float4s, so the 16 key lanes' float4 reads hit distinct banks.
__host__ __device__ inline int ScorePitch(int head_dim) { return head_dim + 4; }

size_t WindowScoresSmemBytes(int head_dim) {
  const size_t floats = static_cast<size_t>(kScoreKeys + kScoreRows) * ScorePitch(head_dim) +
                        kScoreRows + kRowLanes * kScoreKeys;
  return floats * sizeof(float);
}

// What a block of either WindowScores kernel scores: its job, its tile of keys [key_begin,
// key_begin + keys) and its KV head (grid x, y, z = key tile, KV head, job), and the prompt rows
// it walks. Prompt row i is token row token_of_row0 + i: the scored rows lie in this step's chunk
// (the scheduler guarantees it; the CPU twin checks it). Causal: rows before the tile's first key
// see none of its keys, so the chunks of chunk_rows start at chunk_first, the chunk holding
// key_begin. False when the block has nothing to score: a job that scores nothing (StreamingLLM's
// sinks), or a tile past its job's keys (the grid is sized for the layer's longest job).
struct ScoreBlock {
  CompressionJob job;
  int key_begin;
  int kv_head;
  int group;  // query heads of a KV head
  int64_t token_of_row0;
  int chunk_first;
};
__device__ inline bool ScoreBlockOf(const int32_t* __restrict__ job_rows, int job_begin, int keys,
                                    int chunk_rows, int num_heads, int num_kv_heads,
                                    const int32_t* __restrict__ query_start,
                                    const int32_t* __restrict__ context_lens, ScoreBlock& block) {
  block.job = LoadJob(job_rows, job_begin + static_cast<int>(blockIdx.z));
  block.key_begin = static_cast<int>(blockIdx.x) * keys;
  if (block.job.mode != SelectMode::kTopScores || block.key_begin >= block.job.num_keys) {
    return false;
  }
  block.kv_head = static_cast<int>(blockIdx.y);
  block.group = num_heads / num_kv_heads;
  const int seq = block.job.prefill_seq;
  block.token_of_row0 =
      static_cast<int64_t>(query_start[seq]) - static_cast<int64_t>(context_lens[seq]);
  const int row_first = block.job.num_keys - block.job.score_rows;  // first scored prompt row
  block.chunk_first = block.key_begin > row_first
                          ? row_first + (block.key_begin - row_first) / chunk_rows * chunk_rows
                          : row_first;
  return true;
}

// Thread `tid`'s key of the block: its scores over the group, `reduced` (a sum or a max), made
// the job's score (the mean divides by the group, in the CPU's rounding).
__device__ inline void WriteScore(const ScoreBlock& block, int tid, float reduced,
                                  float* __restrict__ scores) {
  const int n = block.job.num_keys;
  if (block.key_begin + tid >= n) return;
  scores[block.job.score_offset + static_cast<int64_t>(block.kv_head) * n + block.key_begin + tid] =
      block.job.reduce == GroupReduce::kMean ? __fdiv_rn(reduced, static_cast<float>(block.group))
                                             : reduced;
}

// Four blocks a multiprocessor is what the ~52 KB of shared memory allows at d = 128; the bound
// also gives ptxas the register budget (128) under which it does not spill.
__global__ __launch_bounds__(kScoreThreads, 4) void WindowScoresKernel(
    const bf16* __restrict__ q,     // [T][>= H d] row stride q_stride
    int64_t q_stride,               //
    const bf16* __restrict__ k,     // [num_prefill_keys][G][d]
    const float* __restrict__ lse,  // [T_p][>= H] row stride lse_stride
    int64_t lse_stride,             //
    int num_heads, int num_kv_heads, int head_dim, float scale,
    const int32_t* __restrict__ query_start,   // [S + 1]
    const int32_t* __restrict__ key_start,     // [S_p + 1]
    const int32_t* __restrict__ context_lens,  // [S]
    const int32_t* __restrict__ job_rows,      // [J][kCompressionJobInts]
    int job_begin,
    float* __restrict__ scores) {  // job rows at score_offset, [G][n]
  extern __shared__ float4 smem_float4[];
  const int pitch = ScorePitch(head_dim);
  float* k_tile = reinterpret_cast<float*>(smem_float4);  // [kScoreKeys][pitch]
  float* q_tile = k_tile + kScoreKeys * pitch;            // [kScoreRows][pitch]
  float* lse_tile = q_tile + kScoreRows * pitch;          // [kScoreRows]
  float* partial = lse_tile + kScoreRows;                 // [kRowLanes][kScoreKeys]

  ScoreBlock block;
  if (!ScoreBlockOf(job_rows, job_begin, kScoreKeys, kScoreRows, num_heads, num_kv_heads,
                    query_start, context_lens, block)) {
    return;
  }
  const auto& [job, key_begin, kv_head, group, token_of_row0, chunk_first] = block;
  const int n = job.num_keys;
  const int seq = job.prefill_seq;
  const int tid = static_cast<int>(threadIdx.x);
  const int vecs = head_dim / 8;
  const int64_t key_pitch = static_cast<int64_t>(num_kv_heads) * head_dim;

  // The K tile, as f32; keys past n are zeros (their columns are masked anyway).
  const bf16* k_rows = k + (static_cast<int64_t>(key_start[seq]) + key_begin) * key_pitch +
                       static_cast<int64_t>(kv_head) * head_dim;
  for (int item = tid; item < kScoreKeys * vecs; item += kScoreThreads) {
    const int key = item / vecs, vec = item % vecs;
    float values[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (key_begin + key < n) LoadBf16x8(k_rows + key * key_pitch + vec * 8, values);
    StoreFloat8(k_tile + key * pitch + vec * 8, values);
  }

  const int key_lane = tid % kKeyLanes, row_lane = tid / kKeyLanes;
  float reduced = 0.0f;  // threads tid < kScoreKeys: key key_begin + tid over the group so far
  for (int head = kv_head * group; head < (kv_head + 1) * group; ++head) {
    float column[4] = {0.0f, 0.0f, 0.0f, 0.0f};  // keys key_lane + 16c over this thread's rows
    for (int chunk = chunk_first; chunk < n; chunk += kScoreRows) {
      __syncthreads();  // the K tile is complete; the previous chunk's reads are done
      const bf16* q_head = q + static_cast<int64_t>(head) * head_dim;
      for (int item = tid; item < kScoreRows * vecs; item += kScoreThreads) {
        const int row = item / vecs, vec = item % vecs;
        float values[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        if (chunk + row < n) {
          LoadBf16x8(q_head + (token_of_row0 + chunk + row) * q_stride + vec * 8, values);
        }
        StoreFloat8(q_tile + row * pitch + vec * 8, values);
      }
      if (tid < kScoreRows) {
        // Only scored rows have an LSE (the prefill wrote them); the others are never read.
        lse_tile[tid] =
            chunk + tid < n ? lse[(token_of_row0 + chunk + tid) * lse_stride + head] : 0.0f;
      }
      __syncthreads();

      float acc[4][4] = {};  // [row r][key c]
      const float* q_base = q_tile + row_lane * pitch;
      const float* k_base = k_tile + key_lane * pitch;
#pragma unroll 4
      for (int dim = 0; dim < head_dim; dim += 4) {
        float4 qv[4], kv[4];
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          qv[r] = *reinterpret_cast<const float4*>(q_base + r * kRowLanes * pitch + dim);
        }
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          kv[c] = *reinterpret_cast<const float4*>(k_base + c * kKeyLanes * pitch + dim);
        }
#pragma unroll
        for (int r = 0; r < 4; ++r) {
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            acc[r][c] = fmaf(qv[r].x, kv[c].x, acc[r][c]);
            acc[r][c] = fmaf(qv[r].y, kv[c].y, acc[r][c]);
            acc[r][c] = fmaf(qv[r].z, kv[c].z, acc[r][c]);
            acc[r][c] = fmaf(qv[r].w, kv[c].w, acc[r][c]);
          }
        }
      }
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int row = chunk + row_lane + r * kRowLanes;
        if (row >= n) continue;
        const float row_lse = lse_tile[row_lane + r * kRowLanes];
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int key = key_begin + key_lane + c * kKeyLanes;
          // p = exp(s - lse); keys after the row are masked (causal), which also masks j >= n.
          if (key <= row) column[c] += expf(scale * acc[r][c] - row_lse);
        }
      }
    }
    // Sum the row lanes' column sums: this head's probability mass per key.
    __syncthreads();  // the previous head's reads of `partial` are done
#pragma unroll
    for (int c = 0; c < 4; ++c)
      partial[row_lane * kScoreKeys + key_lane + c * kKeyLanes] = column[c];
    __syncthreads();
    if (tid < kScoreKeys) {
      float head_sum = 0.0f;
      for (int lane = 0; lane < kRowLanes; ++lane) head_sum += partial[lane * kScoreKeys + tid];
      // Probabilities are >= 0, so 0 also starts a max (as on the CPU).
      reduced = job.reduce == GroupReduce::kMax ? fmaxf(reduced, head_sum) : reduced + head_sum;
    }
  }
  if (tid < kScoreKeys) WriteScore(block, tid, reduced, scores);
}

// ---------------------------------------------------------------------------------------------
// WindowScores on the tensor cores, at d = 64 and 128 (the others take the kernel above): the
// same function, with each [16 rows x 64 keys] piece of Q K^T a warp's bf16 mma.sync tiles
// (flash_warp.cuh's ScoreTile, f32 accumulation) instead of f32 FMAs from shared memory. One
// block per (job, KV head, 64 keys), 4 warps. A pass takes 4 heads of the group, warp w head
// h0 + w, and walks the scored rows in chunks of 32 (two 16-row slabs a warp), skipping slabs
// before the tile's first key (causal). Each lane sums exp(scale s - lse) over its rows in
// registers; shuffles add the warp's 8 row lanes, and the heads are folded into the group's mean
// or max in head order.
constexpr int kMmaScoreKeys = 64;
constexpr int kMmaScoreRows = 32;
constexpr int kMmaScoreWarps = 4;
constexpr int kMmaScoreThreads = 32 * kMmaScoreWarps;
static_assert(kMmaScoreKeys == kScoreKeys, "both kernels take the grid WindowScores sizes");
static_assert(kMmaScoreThreads == kMmaScoreWarps * kMmaScoreRows, "a thread per (head, row) lse");

// Shared memory: the swizzled K tile and one Q tile a warp (bf16), the Q rows' lse, and each
// warp's per-key sums. d = 128: 16 + 32 KiB + 1.5 KiB.
template <int kHeadDim>
constexpr int MmaScoreSmemBytes() {
  return (kMmaScoreKeys + kMmaScoreWarps * kMmaScoreRows) * kHeadDim * 2 +
         kMmaScoreWarps * (kMmaScoreRows + kMmaScoreKeys) * 4;
}

template <int kHeadDim>
__global__ __launch_bounds__(kMmaScoreThreads) void WindowScoresMmaKernel(
    const bf16* __restrict__ q,     // [T][>= H d] row stride q_stride
    int64_t q_stride,               //
    const bf16* __restrict__ k,     // [num_prefill_keys][G][d]
    const float* __restrict__ lse,  // [T_p][>= H] row stride lse_stride
    int64_t lse_stride,             //
    int num_heads, int num_kv_heads, float scale,
    const int32_t* __restrict__ query_start,   // [S + 1]
    const int32_t* __restrict__ key_start,     // [S_p + 1]
    const int32_t* __restrict__ context_lens,  // [S]
    const int32_t* __restrict__ job_rows,      // [J][kCompressionJobInts]
    int job_begin,
    float* __restrict__ scores) {  // job rows at score_offset, [G][n]
  constexpr int kQTileBytes = kMmaScoreRows * kHeadDim * 2;
  extern __shared__ __align__(128) uint8_t score_smem[];
  const uint32_t k_tile = flash::SharedAddress(score_smem);
  const uint32_t q_tiles = k_tile + kMmaScoreKeys * kHeadDim * 2;
  float* lse_tile = reinterpret_cast<float*>(
      score_smem + (kMmaScoreKeys + kMmaScoreWarps * kMmaScoreRows) * kHeadDim * 2);  // [4][32]
  float* head_sums = lse_tile + kMmaScoreWarps * kMmaScoreRows;  // [4][kMmaScoreKeys]

  ScoreBlock block;
  if (!ScoreBlockOf(job_rows, job_begin, kMmaScoreKeys, kMmaScoreRows, num_heads, num_kv_heads,
                    query_start, context_lens, block)) {
    return;
  }
  const auto& [job, key_begin, kv_head, group, token_of_row0, chunk_first] = block;
  const int n = job.num_keys;
  const int seq = job.prefill_seq;
  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid / 32;
  const int g = (tid % 32) / 4;
  const int t = tid % 4;
  const int64_t key_pitch = static_cast<int64_t>(num_kv_heads) * kHeadDim;

  // The K tile; keys past n are zeros (their columns are masked anyway).
  flash::LoadTileAsync<kHeadDim, kMmaScoreKeys, kMmaScoreThreads>(
      k_tile,
      k + (static_cast<int64_t>(key_start[seq]) + key_begin) * key_pitch +
          static_cast<int64_t>(kv_head) * kHeadDim,
      key_pitch, n - key_begin);
  flash::CpAsyncCommit();

  float reduced = 0.0f;  // threads tid < kMmaScoreKeys: key key_begin + tid over the group so far
  for (int h0 = 0; h0 < group; h0 += kMmaScoreWarps) {
    const int pass_heads = min(kMmaScoreWarps, group - h0);
    const int first_head = kv_head * group + h0;
    float column[kMmaScoreKeys / 8][2] = {};  // keys 8 nn + 2t + e over this lane's rows
    for (int chunk = chunk_first; chunk < n; chunk += kMmaScoreRows) {
      __syncthreads();  // the chunk before is read
      const int valid_rows = min(kMmaScoreRows, n - chunk);
      const bf16* q_rows = q + (token_of_row0 + chunk) * q_stride;
#pragma unroll
      for (int slot = 0; slot < kMmaScoreWarps; ++slot) {
        // A slot past the group loads nothing (its address is the pass's first head's row).
        flash::LoadTileAsync<kHeadDim, kMmaScoreRows, kMmaScoreThreads>(
            q_tiles + slot * kQTileBytes,
            q_rows + static_cast<int64_t>(first_head + (slot < pass_heads ? slot : 0)) * kHeadDim,
            q_stride, slot < pass_heads ? valid_rows : 0);
      }
      flash::CpAsyncCommit();
      {
        // Only scored rows have an LSE (the prefill wrote them); the others are never read.
        const int slot = tid / kMmaScoreRows;
        const int row = tid % kMmaScoreRows;
        lse_tile[tid] = slot < pass_heads && row < valid_rows
                            ? lse[(token_of_row0 + chunk + row) * lse_stride + first_head + slot]
                            : 0.0f;
      }
      flash::CpAsyncWait<0>();
      __syncthreads();
      if (warp < pass_heads) {
#pragma unroll
        for (int slab = 0; slab < kMmaScoreRows / 16; ++slab) {
          const int slab_row = chunk + slab * 16;  // prompt row of the slab's first row
          if (slab_row >= n || slab_row + 15 < key_begin) continue;
          uint32_t a[kHeadDim / 16][4];
          flash::LoadRowFragments<kHeadDim>(q_tiles + warp * kQTileBytes, slab * 16, a);
          float s[kMmaScoreKeys / 8][4];
          flash::ScoreTile<kHeadDim, kMmaScoreKeys>(a, k_tile, 0, s);
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const int row = slab_row + g + 8 * half;
            const float row_lse = lse_tile[warp * kMmaScoreRows + slab * 16 + g + 8 * half];
#pragma unroll
            for (int nn = 0; nn < kMmaScoreKeys / 8; ++nn) {
#pragma unroll
              for (int e = 0; e < 2; ++e) {
                const int key = key_begin + 8 * nn + 2 * t + e;
                // p = exp(s - lse); keys after the row are masked (causal), which also masks
                // keys >= n, and rows past the prompt score nothing.
                if (key <= row && row < n) {
                  column[nn][e] += expf(scale * s[nn][2 * half + e] - row_lse);
                }
              }
            }
          }
        }
      }
    }
    // Add the warp's 8 row lanes of each key (lanes t, t + 4, ..., t + 28); lanes 0-3 hold the
    // head's sums, which the heads of the pass then fold in head order.
#pragma unroll
    for (int nn = 0; nn < kMmaScoreKeys / 8; ++nn) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float sum = column[nn][e];
        sum += __shfl_xor_sync(0xffffffffu, sum, 4);
        sum += __shfl_xor_sync(0xffffffffu, sum, 8);
        sum += __shfl_xor_sync(0xffffffffu, sum, 16);
        if (g == 0) head_sums[warp * kMmaScoreKeys + 8 * nn + 2 * t + e] = sum;
      }
    }
    __syncthreads();
    if (tid < kMmaScoreKeys) {
      for (int slot = 0; slot < pass_heads; ++slot) {
        const float head_sum = head_sums[slot * kMmaScoreKeys + tid];
        // Probabilities are >= 0, so 0 also starts a max (as on the CPU).
        reduced = job.reduce == GroupReduce::kMax ? fmaxf(reduced, head_sum) : reduced + head_sum;
      }
    }
    // The next pass writes head_sums only after its first chunk's barrier.
  }
  flash::CpAsyncWait<0>();  // the K tile's copies, should no chunk have waited for them
  if (tid < kMmaScoreKeys) WriteScore(block, tid, reduced, scores);
}

// ---------------------------------------------------------------------------------------------
// SelectKept
//
// One block per (job, KV head). Pass 1 pools the prefix scores (exactly the CPU's arithmetic, so
// identical scores give identical pooled values) into order-preserving 32-bit keys, in shared
// memory up to kSelectSmemKeys candidates, else in the workspace. A radix select over the
// distinct 64-bit keys (value, lower position first) finds the threshold of the `keep` best, and
// an ordered compaction (block scan over index order) writes them ascending. Exactly `keep` are
// written whatever the ties.
constexpr int kSelectThreads = 512;
constexpr int kSelectItems = 4;  // consecutive positions per thread in the compaction

// The CPU's PoolScores at one position: same window, same order of operations.
__device__ inline float PooledScore(const float* __restrict__ scores, int count, int position,
                                    PoolKind pool, int kernel) {
  if (pool == PoolKind::kNone || kernel <= 1) return scores[position];
  const int half = kernel / 2;
  const int begin = max(0, position - half);
  const int end = min(count, position + half + 1);
  if (pool == PoolKind::kMax) {
    float best = scores[begin];  // padding counts as -inf: only real positions compete
    for (int index = begin + 1; index < end; ++index) best = fmaxf(best, scores[index]);
    return best;
  }
  float sum = 0.0f;  // zero padding, divided by the whole kernel (count_include_pad)
  for (int index = begin; index < end; ++index) sum = __fadd_rn(sum, scores[index]);
  return __fdiv_rn(sum, static_cast<float>(kernel));
}

__global__ __launch_bounds__(kSelectThreads) void SelectKeptKernel(
    const float* __restrict__ scores,      // job rows at score_offset, [G][n]
    const int32_t* __restrict__ job_rows,  // [J][kCompressionJobInts]
    int job_begin, int num_kv_heads,
    uint32_t* workspace,           // [jobs][G][workspace_pitch], or null: keys in shared memory
    int64_t workspace_pitch,       //
    int32_t* __restrict__ kept) {  // job rows at index_offset, [G][C - W]
  using BlockScan = cub::BlockScan<int, kSelectThreads>;
  __shared__ select::RadixSelectSmem radix_smem;
  __shared__ typename BlockScan::TempStorage scan_smem;
  extern __shared__ uint32_t smem_keys[];  // [workspace_pitch] when workspace is null

  const CompressionJob job = LoadJob(job_rows, job_begin + static_cast<int>(blockIdx.y));
  const int kv_head = static_cast<int>(blockIdx.x);
  const int prefix = job.num_keys - job.window;  // candidates: the positions before the window
  const int keep = job.budget - job.window;
  if (keep <= 0) return;
  int32_t* out = kept + job.index_offset + static_cast<int64_t>(kv_head) * keep;
  const int tid = static_cast<int>(threadIdx.x);
  if (job.mode == SelectMode::kFirstPositions || keep >= prefix) {
    // The sinks, or every candidate: positions 0 .. keep-1 either way.
    for (int index = tid; index < keep; index += kSelectThreads) out[index] = index;
    return;
  }

  const float* head_scores =
      scores + job.score_offset + static_cast<int64_t>(kv_head) * job.num_keys;
  // The ordered pooled scores, read by every pass: in shared memory when they fit (the same
  // code through a generic pointer), else in this (job, head)'s rows of the workspace.
  uint32_t* keys = workspace == nullptr
                       ? smem_keys
                       : workspace + (static_cast<int64_t>(blockIdx.y) * num_kv_heads + kv_head) *
                                         workspace_pitch;
  for (int position = tid; position < prefix; position += kSelectThreads) {
    keys[position] =
        select::OrderedBits(PooledScore(head_scores, prefix, position, job.pool, job.pool_kernel));
  }
  __syncthreads();  // also makes the block's global writes visible to the block

  const auto key_of = [keys](int position) {
    return select::CompositeKey(keys[position], static_cast<uint32_t>(position));
  };
  const auto unit_weight = [](int) { return 1ull; };
  const unsigned long long threshold = select::BlockRadixSelect<kSelectThreads, false>(
      prefix, 0, static_cast<unsigned long long>(keep), key_of, unit_weight, radix_smem);

  // Ordered compaction: each thread takes kSelectItems consecutive positions per chunk; the
  // exclusive scan of the per-thread counts gives each kept position its output slot.
  int written = 0;
  for (int chunk = 0; chunk < prefix; chunk += kSelectThreads * kSelectItems) {
    const int first = chunk + tid * kSelectItems;
    unsigned int flags = 0;
    int local = 0;
#pragma unroll
    for (int item = 0; item < kSelectItems; ++item) {
      const int position = first + item;
      if (position < prefix && key_of(position) >= threshold) {
        flags |= 1u << item;
        ++local;
      }
    }
    int slot = 0, chunk_total = 0;
    BlockScan(scan_smem).ExclusiveSum(local, slot, chunk_total);
    slot += written;
#pragma unroll
    for (int item = 0; item < kSelectItems; ++item) {
      if ((flags >> item) & 1u) {
        if (slot < keep) out[slot] = first + item;  // always true: keys are distinct
        ++slot;
      }
    }
    written += chunk_total;
    __syncthreads();  // scan_smem is reused by the next chunk
  }
}

// Keys of up to this many candidates live in shared memory (88 KB: with the ~5 KB of static
// shared memory it stays under sm_89's 99 KB opt-in limit). n = 4000 and 16000 fit.
constexpr int64_t kSelectSmemKeys = 22528;

int64_t SelectWorkspacePitch(const CompressionJob* jobs, int job_begin, int job_end) {
  int64_t pitch = 0;
  for (int job_index = job_begin; job_index < job_end; ++job_index) {
    const CompressionJob& job = jobs[job_index];
    const int prefix = job.num_keys - job.window;
    if (job.mode == SelectMode::kTopScores && job.budget - job.window < prefix) {
      pitch = std::max<int64_t>(pitch, prefix);
    }
  }
  return (pitch + 31) / 32 * 32;  // 128-byte aligned rows
}

// ---------------------------------------------------------------------------------------------
// WriteKeptKv: one thread per 16-byte vector of one (entry, KV head) of one job.
constexpr int kWriteThreads = 256;

__global__ __launch_bounds__(kWriteThreads) void WriteKeptKvKernel(
    const bf16* __restrict__ k,             // [num_prefill_keys][G][d]
    const bf16* __restrict__ v,             // [num_prefill_keys][G][d]
    const float* __restrict__ scores,       // job rows at score_offset, [G][n]
    const int32_t* __restrict__ kept,       // job rows at index_offset, [G][C - W]
    const int32_t* __restrict__ key_start,  // [S_p + 1]
    const int32_t* __restrict__ job_rows,   // [J][kCompressionJobInts]
    int job_begin, int layer, PoolView pool) {
  const CompressionJob job = LoadJob(job_rows, job_begin + static_cast<int>(blockIdx.y));
  const int kv_heads = pool.num_kv_heads;
  const int head_dim = pool.head_dim;
  const int vecs = head_dim / 8;
  const int64_t layer_slot = static_cast<int64_t>(layer) * pool.max_seqs + job.seq_slot;
  // Nothing in this launch reads kv_lens, so one thread can set it at any time.
  if (blockIdx.x == 0 && threadIdx.x == 0) pool.kv_lens[layer_slot] = job.budget;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kWriteThreads + threadIdx.x;
  if (item >= static_cast<int64_t>(job.budget) * kv_heads * vecs) return;
  const int vec = static_cast<int>(item % vecs);
  const int kv_head = static_cast<int>(item / vecs % kv_heads);
  const int entry = static_cast<int>(item / vecs / kv_heads);
  const int keep = job.budget - job.window;
  // Entries [0, keep): the selected prefix positions; [keep, C): the window n-W .. n-1.
  const int key = entry < keep
                      ? kept[job.index_offset + static_cast<int64_t>(kv_head) * keep + entry]
                      : job.num_keys - job.budget + entry;
  const int32_t* page_row = pool.page_table + layer_slot * pool.max_pages_per_seq;
  const int list_entry = job.kept_offset + entry;
  const int64_t pool_entry =
      static_cast<int64_t>(page_row[list_entry / pool.page_size]) * pool.page_size +
      list_entry % pool.page_size;
  const int64_t src =
      ((static_cast<int64_t>(key_start[job.prefill_seq]) + key) * kv_heads + kv_head) * head_dim +
      vec * 8;
  const int64_t dst = (pool_entry * kv_heads + kv_head) * head_dim + vec * 8;
  if (pool.fp8) {
    // The scratch holds bf16 (entries read from the pool were rounded from e4m3 value * scale,
    // which quantizes back to the same e4m3: compaction keeps them as they were).
    const int64_t scale_index = static_cast<int64_t>(layer) * kv_heads + kv_head;
    float values[8];
    Unpack8(*reinterpret_cast<const uint4*>(k + src), values);
    *reinterpret_cast<uint2*>(static_cast<uint8_t*>(pool.k) + dst) =
        QuantizeE4m3x8(values, 1.0f / pool.k_scales[scale_index]);
    Unpack8(*reinterpret_cast<const uint4*>(v + src), values);
    *reinterpret_cast<uint2*>(static_cast<uint8_t*>(pool.v) + dst) =
        QuantizeE4m3x8(values, 1.0f / pool.v_scales[scale_index]);
  } else {
    *reinterpret_cast<uint4*>(static_cast<bf16*>(pool.k) + dst) =
        *reinterpret_cast<const uint4*>(k + src);
    *reinterpret_cast<uint4*>(static_cast<bf16*>(pool.v) + dst) =
        *reinterpret_cast<const uint4*>(v + src);
  }
  if (vec == 0) {
    const int64_t side = pool_entry * kv_heads + kv_head;
    if (pool.positions != nullptr) pool.positions[side] = key;
    if (pool.scores != nullptr) {
      pool.scores[side] =
          job.mode == SelectMode::kTopScores
              ? scores[job.score_offset + static_cast<int64_t>(kv_head) * job.num_keys + key]
              : 0.0f;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// EvictEntries: one block per job, one warp per KV head (heads pick their victims
// independently). The victim is the minimum of (score, position, entry) -- or (position, entry)
// for kOldest -- over the evictable entries: the CPU's first-found minimum, written as a total
// order so that the warp's butterfly reduction finds the same entry in any order.
constexpr int kEvictThreads = 256;
constexpr int kEvictWarps = kEvictThreads / 32;

struct Candidate {
  int entry;  // -1: none
  int position;
  float score;
};

__device__ inline bool Before(const Candidate& a, const Candidate& b, bool by_score) {
  if (a.entry < 0) return false;
  if (b.entry < 0) return true;
  if (by_score && a.score != b.score) return a.score < b.score;
  if (a.position != b.position) return a.position < b.position;
  return a.entry < b.entry;
}

__global__ __launch_bounds__(kEvictThreads) void EvictEntriesKernel(
    const int32_t* __restrict__ job_rows,  // [E][kEvictionJobInts]
    int job_begin, int layer, PoolView pool) {
  const EvictionJob job =
      reinterpret_cast<const EvictionJob*>(job_rows)[job_begin + static_cast<int>(blockIdx.x)];
  const int kv_heads = pool.num_kv_heads;
  const int head_dim = pool.head_dim;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t layer_slot = static_cast<int64_t>(layer) * pool.max_seqs + job.seq_slot;
  const int32_t* page_row = pool.page_table + layer_slot * pool.max_pages_per_seq;
  const int page_size = pool.page_size;
  const auto entry_of = [page_row, page_size](int entry) {
    return static_cast<int64_t>(page_row[entry / page_size]) * page_size + entry % page_size;
  };
  const bool by_score = job.kind == EvictionJob::kLowestScore;
  const int64_t last = entry_of(job.length - 1);
  for (int kv_head = warp; kv_head < kv_heads; kv_head += kEvictWarps) {
    Candidate best{-1, 0, 0.0f};
    for (int entry = lane; entry < job.length; entry += 32) {
      const int64_t side = entry_of(entry) * kv_heads + kv_head;
      const int32_t position = pool.positions[side];
      if (position < job.sinks || position > job.position - job.protect_recent) continue;
      const Candidate candidate{entry, position, by_score ? pool.scores[side] : 0.0f};
      if (Before(candidate, best, by_score)) best = candidate;
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
      const Candidate other{__shfl_xor_sync(0xffffffffu, best.entry, offset),
                            __shfl_xor_sync(0xffffffffu, best.position, offset),
                            __shfl_xor_sync(0xffffffffu, best.score, offset)};
      if (Before(other, best, by_score)) best = other;
    }
    // No victim (the CPU aborts: cap below sinks + recent): leave the head as it is.
    if (best.entry < 0) continue;
    const int64_t dst = entry_of(best.entry);
    if (dst == last) continue;  // the last entry is the victim: dropping the length removes it
    // The entry's bytes as they are (bf16 or e4m3), 16 at a time.
    const int element_bytes = pool.fp8 ? 1 : 2;
    const int64_t to = (dst * kv_heads + kv_head) * head_dim * element_bytes;
    const int64_t from = (last * kv_heads + kv_head) * head_dim * element_bytes;
#pragma unroll 1  // one or two trips (d <= 256); unrolling it only made ptxas spill
    for (int vec = lane; vec < head_dim * element_bytes / 16; vec += 32) {
      auto* k = static_cast<uint8_t*>(pool.k);
      auto* v = static_cast<uint8_t*>(pool.v);
      reinterpret_cast<uint4*>(k + to)[vec] = reinterpret_cast<const uint4*>(k + from)[vec];
      reinterpret_cast<uint4*>(v + to)[vec] = reinterpret_cast<const uint4*>(v + from)[vec];
    }
    if (lane == 0) {
      pool.positions[dst * kv_heads + kv_head] = pool.positions[last * kv_heads + kv_head];
      if (pool.scores != nullptr) {
        pool.scores[dst * kv_heads + kv_head] = pool.scores[last * kv_heads + kv_head];
      }
    }
  }
  __syncthreads();  // every head has read the entries before the length drops
  if (threadIdx.x == 0) pool.kv_lens[layer_slot] = job.length - 1;
}

}  // namespace

void WindowScores(const bf16* q, int64_t q_stride, const bf16* k, const float* lse,
                  int64_t lse_stride, int num_heads, int num_kv_heads, int head_dim,
                  const StepView& step, const CompressionJob* jobs, int job_begin, int job_end,
                  float* scores, cudaStream_t stream) {
  int max_tiles = 0;
  for (int job_index = job_begin; job_index < job_end; ++job_index) {
    if (jobs[job_index].mode != SelectMode::kTopScores) continue;
    max_tiles = std::max(max_tiles, (jobs[job_index].num_keys + kScoreKeys - 1) / kScoreKeys);
  }
  if (max_tiles == 0) return;
  SIEVE_CHECK(head_dim % 8 == 0 && head_dim <= 256) << "head_dim " << head_dim;
  SIEVE_CHECK(num_kv_heads > 0 && num_heads % num_kv_heads == 0);
  SIEVE_CHECK(q_stride % 8 == 0 && Aligned16(q) && Aligned16(k))
      << "WindowScores reads q and k in 16-byte vectors";
  const dim3 grid(max_tiles, num_kv_heads, job_end - job_begin);
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  if (head_dim == 64 || head_dim == 128) {
    const auto launch = [&](auto kernel, int smem, std::atomic<int>(&opted)[64]) {
      SIEVE_CHECK(OptInSharedMemory(kernel, smem, opted) >= smem)
          << "WindowScores at head_dim " << head_dim << " needs " << smem
          << " bytes of shared memory";
      kernel<<<grid, kMmaScoreThreads, smem, stream>>>(
          q, q_stride, k, lse, lse_stride, num_heads, num_kv_heads, scale, step.query_start,
          step.key_start, step.context_lens, step.compression_jobs, job_begin, scores);
    };
    static std::atomic<int> opted_in_64[64] = {};
    static std::atomic<int> opted_in_128[64] = {};
    if (head_dim == 64) {
      launch(WindowScoresMmaKernel<64>, MmaScoreSmemBytes<64>(), opted_in_64);
    } else {
      launch(WindowScoresMmaKernel<128>, MmaScoreSmemBytes<128>(), opted_in_128);
    }
    SIEVE_CUDA_CHECK_LAUNCH();
    return;
  }
  const size_t smem_bytes = WindowScoresSmemBytes(head_dim);
  // As much as d = 256 needs (or the device allows: 99 KB on sm_89), so one opt-in covers every
  // head_dim.
  static std::atomic<int> opted_in[64] = {};
  const int limit =
      OptInSharedMemory(WindowScoresKernel, static_cast<int>(WindowScoresSmemBytes(256)), opted_in);
  SIEVE_CHECK(smem_bytes <= static_cast<size_t>(limit))
      << "WindowScores at head_dim " << head_dim << " needs " << smem_bytes
      << " bytes of shared memory";
  WindowScoresKernel<<<grid, kScoreThreads, smem_bytes, stream>>>(
      q, q_stride, k, lse, lse_stride, num_heads, num_kv_heads, head_dim, scale, step.query_start,
      step.key_start, step.context_lens, step.compression_jobs, job_begin, scores);
  SIEVE_CUDA_CHECK_LAUNCH();
}

size_t SelectKeptWorkspaceBytes(const CompressionJob* jobs, int job_begin, int job_end,
                                int num_kv_heads) {
  if (job_end <= job_begin) return 0;
  const int64_t pitch = SelectWorkspacePitch(jobs, job_begin, job_end);
  if (pitch <= kSelectSmemKeys) return 0;  // the keys live in shared memory
  return static_cast<size_t>(job_end - job_begin) * num_kv_heads * pitch * sizeof(uint32_t);
}

void SelectKept(const float* scores, int num_kv_heads, const StepView& step,
                const CompressionJob* jobs, int job_begin, int job_end, int32_t* kept,
                void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  if (job_end <= job_begin) return;
  for (int job_index = job_begin; job_index < job_end; ++job_index) {
    const CompressionJob& job = jobs[job_index];
    SIEVE_CHECK(job.budget - job.window >= 0 && job.budget <= job.num_keys)
        << "keep " << job.budget - job.window << " of " << job.num_keys - job.window;
  }
  const int64_t pitch = SelectWorkspacePitch(jobs, job_begin, job_end);
  const bool keys_in_smem = pitch <= kSelectSmemKeys;
  size_t smem_bytes = 0;
  if (keys_in_smem) {
    smem_bytes = static_cast<size_t>(pitch) * sizeof(uint32_t);
    static std::atomic<int> opted_in[64] = {};
    const int limit = OptInSharedMemory(
        SelectKeptKernel, static_cast<int>(kSelectSmemKeys * sizeof(uint32_t)), opted_in);
    SIEVE_CHECK(smem_bytes <= static_cast<size_t>(limit)) << "SelectKept shared memory";
  } else {
    SIEVE_CHECK(workspace != nullptr &&
                workspace_bytes >= SelectKeptWorkspaceBytes(jobs, job_begin, job_end, num_kv_heads))
        << "SelectKept workspace " << workspace_bytes << " bytes";
  }
  const dim3 grid(num_kv_heads, job_end - job_begin);
  SelectKeptKernel<<<grid, kSelectThreads, smem_bytes, stream>>>(
      scores, step.compression_jobs, job_begin, num_kv_heads,
      keys_in_smem ? nullptr : static_cast<uint32_t*>(workspace), pitch, kept);
  SIEVE_CUDA_CHECK_LAUNCH();
}

void WriteKeptKv(const bf16* k, const bf16* v, const float* scores, const int32_t* kept,
                 const StepView& step, const CompressionJob* jobs, int job_begin, int job_end,
                 int layer, const PoolView& pool, cudaStream_t stream) {
  if (job_end <= job_begin) return;
  SIEVE_CHECK(pool.head_dim % 8 == 0 && Aligned16(k) && Aligned16(v) && Aligned16(pool.k) &&
              Aligned16(pool.v))
      << "WriteKeptKv copies 16-byte vectors";
  int64_t max_items = 0;
  for (int job_index = job_begin; job_index < job_end; ++job_index) {
    max_items = std::max<int64_t>(max_items, static_cast<int64_t>(jobs[job_index].budget) *
                                                 pool.num_kv_heads * (pool.head_dim / 8));
  }
  const int64_t blocks = std::max<int64_t>(1, (max_items + kWriteThreads - 1) / kWriteThreads);
  SIEVE_CHECK(blocks < (int64_t{1} << 31));
  const dim3 grid(static_cast<unsigned int>(blocks), job_end - job_begin);
  WriteKeptKvKernel<<<grid, kWriteThreads, 0, stream>>>(
      k, v, scores, kept, step.key_start, step.compression_jobs, job_begin, layer, pool);
  SIEVE_CUDA_CHECK_LAUNCH();
}

void EvictEntries(const StepView& step, const EvictionJob* jobs, int job_begin, int job_end,
                  int layer, const PoolView& pool, cudaStream_t stream) {
  if (job_end <= job_begin) return;
  SIEVE_CHECK(pool.positions != nullptr) << "eviction needs the positions side pool";
  SIEVE_CHECK(pool.head_dim % 8 == 0 && Aligned16(pool.k) && Aligned16(pool.v));
  for (int job_index = job_begin; job_index < job_end; ++job_index) {
    SIEVE_CHECK(jobs[job_index].length >= 1);
    SIEVE_CHECK(jobs[job_index].kind != EvictionJob::kLowestScore || pool.scores != nullptr)
        << "kLowestScore eviction needs the scores side pool";
  }
  EvictEntriesKernel<<<job_end - job_begin, kEvictThreads, 0, stream>>>(step.eviction_jobs,
                                                                        job_begin, layer, pool);
  SIEVE_CUDA_CHECK_LAUNCH();
}

}  // namespace sieve::cuda
