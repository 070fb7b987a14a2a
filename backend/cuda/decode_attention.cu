// Paged decode attention: one query token per decode sequence against every entry its sequence
// holds in one layer, read through the page table. GQA-aware: one CTA serves the (up to 16) query
// heads of one KV head, so each K/V entry is read from memory once per step, and the heads form
// the 16 rows of the same tensor-core tile code the prefill kernel uses (flash_warp.cuh). The
// unused rows of that tile cost tensor-core time only, which this memory-bound kernel has spare.
//
// Work split: CTA = (decode sequence, KV head, head chunk, split). A split is a contiguous range
// of the sequence's entries; the CTA's warps (4 "wide", 2 "narrow") take 16 entries each of every
// tile, tiles stream through a 3-stage cp.async pipeline (2 where shared memory is smaller), and
// the warps merge their softmax states in shared memory at the end. With more than one split
// (flash-decoding), each split writes a normalised partial output and its log-sum-exp, and a
// combine kernel merges them. The optional H2O pass recomputes q.k of every entry against the final
// lse and adds the group-mean probability to the scores side pool. Fused RoPE
// (RopeDecodeAttention): the CTA rotates its q rows in shared memory and writes the step's new
// entry of its KV head itself before reading it. README_attention.md has the numbers.
#include "backend/cuda/decode_attention.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "backend/cuda/bf16x8.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/flash_warp.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/kv_fp8.cuh"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/rope.cuh"
#include "backend/cuda/row_rms.cuh"
#include "core/check.h"

namespace sieve::cuda {
namespace {

constexpr int kWideWarps = 4;
constexpr int kNarrowWarps = 2;
// Pipeline depth: 3 stages (two tiles in flight while one is computed on) where a block may have
// the shared memory (wide at d = 128 needs 100 KiB: A100, H100/H200), else 2 (Ada and Ampere
// consumer parts: 99 KiB).
constexpr int kMaxStages = 3;
// Shared memory a block may opt into on every sm_80+ part (sm_86/89 have the least).
constexpr int kSmemEveryDevice = 99 * 1024;
constexpr int kHeadsPerCta = 16;  // query heads per CTA: the M of one mma tile
constexpr int kMinSplitEntries = 128;
constexpr int kMaxSplitEntries = 4096;
// Wide CTAs an SM holds at once at d = 128, what the shared memory allows: one wave of them is
// where ChooseDecodeCta turns to narrow CTAs.
constexpr int kWideCtasPerSm = 2;

// How many pieces a sequence of `length` entries is cut into when `fill_splits` pieces per
// sequence fill the GPU: at least that many and enough that none exceeds kMaxSplitEntries, but
// none under kMinSplitEntries; at least 1. The host sizes the grid by it for the longest sequence
// (DecodeAttentionSplits), and each sequence cuts itself by it with its own length (UsedSplits).
__host__ __device__ inline int64_t SplitsForLength(int64_t length, int64_t fill_splits) {
  const int64_t for_length = (length + kMaxSplitEntries - 1) / kMaxSplitEntries;
  const int64_t most = (length + kMinSplitEntries - 1) / kMinSplitEntries;
  const int64_t wanted = fill_splits > for_length ? fill_splits : for_length;
  const int64_t splits = wanted < most ? wanted : most;
  return splits > 1 ? splits : 1;
}

// A CTA's page ids are read once into shared memory (kMaxSplitEntries entries and a tile of
// rounding at the default 16-entry pages fit); with more pages it reads them from the table.
constexpr int kCachedPages = 288;

// The CTA shape of kWarps warps (DecodeCta: 4 wide, 2 narrow).
template <int kWarps>
struct CtaShape {
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kTile = 16 * kWarps;  // entries per pipeline stage, 16 per warp
  // Resident CTAs per SM the kernel is compiled for: wide 2 (100 KiB each at d = 128), narrow 4
  // (52 KiB each).
  static constexpr int kMinCtasPerSm = 8 / kWarps;
};

template <int kHeadDim>
constexpr int SmemQBytes() {
  return kHeadsPerCta * kHeadDim * 2;
}
template <int kHeadDim, int kWarps>
constexpr int SmemKvTileBytes() {
  return CtaShape<kWarps>::kTile * kHeadDim * 2;
}
// An FP8 pool's tiles stream through the stages as e4m3 (half the bytes); each warp converts its
// 16 rows of the tile it attends into one bf16 K and V tile (the "compute tiles", after the
// stages), which the tensor-core code reads as it reads a bf16 stage.
template <int kHeadDim, int kWarps, bool kFp8>
constexpr int SmemStageBytes() {
  return kFp8 ? SmemKvTileBytes<kHeadDim, kWarps>() / 2 : SmemKvTileBytes<kHeadDim, kWarps>();
}
// d = 128: wide 4 KiB Q + 3 stages x (16 + 16) KiB K/V = 100 KiB (2 CTAs per SM on H100/H200),
// narrow 4 KiB + 3 x (8 + 8) KiB = 52 KiB (4 per SM); d = 64: half the K/V.
template <int kHeadDim, int kStages, int kWarps, bool kFp8 = false>
constexpr int SmemBytes() {
  return SmemQBytes<kHeadDim>() + 2 * kStages * SmemStageBytes<kHeadDim, kWarps, kFp8>() +
         (kFp8 ? 2 * SmemKvTileBytes<kHeadDim, kWarps>() : 0);
}
// FP8 at d = 128: wide 4 KiB + 3 x (8 + 8) KiB + 32 KiB = 84 KiB, narrow 44 KiB.
static_assert(SmemBytes<128, kMaxStages, kWideWarps, true>() == 84 * 1024);
static_assert(SmemBytes<128, kMaxStages, kNarrowWarps, true>() == 44 * 1024);
static_assert(SmemBytes<128, kMaxStages, kWideWarps>() == 100 * 1024);
static_assert(SmemBytes<128, kMaxStages, kNarrowWarps>() == 52 * 1024);
// 4 narrow CTAs per SM on H100/H200 (228 KiB per SM, 1 KiB of it reserved per CTA), with the
// static page-id cache.
static_assert(4 * (SmemBytes<128, kMaxStages, kNarrowWarps>() + kCachedPages * 4 + 1024) <=
              228 * 1024);
// After the key loop the K/V stages hold the warps' merge buffers: (m, l) of each warp's 16 rows,
// then each warp's rescaled 16 x d output, rows padded by 8 floats against bank conflicts.
template <int kHeadDim>
constexpr int MergeRowStride() {
  return kHeadDim + 8;
}
template <int kHeadDim, int kWarps>
constexpr bool MergeFits() {  // in the K/V stages of the smallest (2-stage) pipeline
  return kWarps * 16 * 2 * 4 + kWarps * 16 * MergeRowStride<kHeadDim>() * 4 <=
         2 * 2 * SmemKvTileBytes<kHeadDim, kWarps>();
}
static_assert(MergeFits<64, kWideWarps>() && MergeFits<128, kWideWarps>());
static_assert(MergeFits<64, kNarrowWarps>() && MergeFits<128, kNarrowWarps>());
// An FP8 CTA's final merge fits in its (2-stage) e4m3 stages and compute tiles.
template <int kHeadDim, int kWarps>
constexpr bool Fp8MergeFits() {
  return kWarps * 16 * 2 * 4 + kWarps * 16 * MergeRowStride<kHeadDim>() * 4 <=
         2 * 2 * SmemStageBytes<kHeadDim, kWarps, true>() + 2 * SmemKvTileBytes<kHeadDim, kWarps>();
}
static_assert(Fp8MergeFits<64, kWideWarps>() && Fp8MergeFits<128, kWideWarps>());
static_assert(Fp8MergeFits<64, kNarrowWarps>() && Fp8MergeFits<128, kNarrowWarps>());
// Between two KV heads of a folded CTA the next head's first tiles are in flight, and the merge
// has the Q tile ((m, l): q is in registers by then) and the one stage just attended: each half
// of it (K, V) holds the rescaled rows, at most kDecodeMaxFoldedGroup, of half the warps.
template <int kHeadDim, int kWarps>
constexpr bool FoldedMergeFits() {
  return (kWarps + 1) / 2 * kDecodeMaxFoldedGroup * MergeRowStride<kHeadDim>() * 4 <=
             SmemKvTileBytes<kHeadDim, kWarps>() &&
         kWarps * 16 * 2 * 4 <= SmemQBytes<kHeadDim>();
}

struct DecodeParams {
  const bf16* q;               // [T][q_stride]; fused RoPE: qkv rows, q and k not rotated
  void* k_pool;                // [num_pages][page_size][G][d] bf16 or e4m3 (written only by
  void* v_pool;                // fused RoPE)
  const float* k_scales;       // [G] of this layer: an FP8 pool's scales, else null
  const float* v_scales;       // [G] of this layer
  const int32_t* page_table;   // [max_seqs][max_pages_per_seq] of this layer
  const int32_t* kv_lens;      // [max_seqs] of this layer
  const int32_t* query_start;  // [S + 1]
  const int32_t* seq_slots;    // [S]
  const int32_t* write_start;  // [S] of this layer: the first entry this step writes, or < 0
  const float* rope_table;     // [max_pos][d/2][2] cos, sin: fused RoPE; null: q is rotated
  const int32_t* positions;    // [T] true positions (fused RoPE)
  int32_t* pool_positions;     // [num_pages * page_size][G] or null (written by fused RoPE)
  RowRmsView norm;             // fused RoPE: a folded RMSNorm's rows (row_rms.cuh), or none
  bf16* out;                   // [T][out_stride]
  float* lse;                  // [B][H] final log-sum-exp, or null when nobody needs it
  float* partial_lse;          // [num_splits][B][H] (num_splits > 1)
  float* partial_out;          // [num_splits][B][H][d] normalised per split (num_splits > 1)
  float* scores;               // [num_pages * page_size][G] or null
  int64_t q_stride;
  int64_t out_stride;
  int first_seq;         // S_p: decode sequences are [S_p, S)
  int num_decode;        // B
  int num_heads;         // H
  int num_kv_heads;      // G
  int group;             // H / G
  int head_chunks;       // ceil(group / kHeadsPerCta)
  int kv_heads_per_cta;  // KV heads a CTA attends one after another (folded CTAs: more than 1)
  int kv_head_groups;    // num_kv_heads / kv_heads_per_cta
  int page_size;
  int page_shift;  // log2(page_size), or -1 when it is not a power of two
  int max_pages_per_seq;
  int num_splits;   // the grid's splits: the most any sequence uses
  int fill_splits;  // splits the batch needs to fill the GPU (UsedSplits)
  // > 0 (batch invariance): every split holds this many entries, the last fewer, so a sequence's
  // pieces depend on its length alone; 0: UsedSplits' count of equal pieces.
  int split_entries;
  float scale;
  float scale_log2;
  uint64_t* trace;  // [trace_ctas][kDecodeTraceSlots] (decode_attention.h), or null
  int64_t trace_ctas;
};

// The splits a sequence of `length` entries uses out of the grid's num_splits (SplitsForLength
// with its own length). A CUDA graph's grid is sized for the longest context it may see, so
// without this every sequence would be cut that many ways.
__device__ __forceinline__ int UsedSplits(const DecodeParams& params, int length) {
  if (params.split_entries > 0) {
    const int pieces = (length + params.split_entries - 1) / params.split_entries;
    return max(1, min(pieces, params.num_splits));  // the host sizes the grid to cover them all
  }
  return static_cast<int>(
      min(SplitsForLength(length, params.fill_splits), static_cast<int64_t>(params.num_splits)));
}

// Entries [begin, end) of split `split` of a sequence holding `length` entries: equal pieces
// rounded up to whole tiles of kTile entries, so each sequence is cut by its own length (a CUDA
// graph replayed with longer contexts still covers every entry).
// With `split_entries` > 0 (a multiple of kTile), pieces of that many entries instead.
template <int kTile>
__device__ __forceinline__ void SplitRange(int length, int split, int num_splits, int split_entries,
                                           int& begin, int& end) {
  const int per_split = split_entries > 0
                            ? split_entries
                            : ((length + num_splits - 1) / num_splits + kTile - 1) / kTile * kTile;
  begin = min(length, split * per_split);
  end = min(length, begin + per_split);
}

// entry / page_size for a page size that is not a power of two, out of line: inlined at every
// call site it was a large share of the kernel's code.
__device__ __noinline__ int DividePages(int entry, int page_size) { return entry / page_size; }

// The page (index into the sequence's page list) holding `entry`.
__device__ __forceinline__ int PageOf(const DecodeParams& params, int entry) {
  return params.page_shift >= 0 ? entry >> params.page_shift : DividePages(entry, params.page_size);
}

// Index of `entry`, held by the sequence's page `page` whose id is `page_id`, in the pool's
// [num_pages * page_size] entry space.
__device__ __forceinline__ int64_t EntryInPool(const DecodeParams& params, int32_t page_id,
                                               int page, int entry) {
  return static_cast<int64_t>(page_id) * params.page_size + entry - page * params.page_size;
}

// The step's metadata (sequence slots, lengths, page ids, positions) is read once per layer, and
// between two layers' attention ~450 MB of weights stream through the 50 MB L2: with default
// eviction it comes from memory every layer, two dependent round trips before the first K/V tile
// can be asked for. Loads with an evict-last policy keep these few KB in the L2 from layer to
// layer and step to step (bench/results/2026-12-01-s9-h200-metadata-eager.json: page ids in shared
// memory 2.0 us after entry against 2.85; the kernel 36.1 us a layer against 36.6).
__device__ __forceinline__ uint64_t EvictLastPolicy() {
  uint64_t policy;
  asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}
__device__ __forceinline__ int32_t LoadKept(const int32_t* address, uint64_t policy) {
  int32_t value;
  asm volatile("ld.global.L2::cache_hint.b32 %0, [%1], %2;"
               : "=r"(value)
               : "l"(address), "l"(policy));
  return value;
}

// Index of `entry` of a (slot, layer) in the pool's entry space.
__device__ __forceinline__ int64_t PoolEntry(const DecodeParams& params, const int32_t* pages,
                                             int entry) {
  const int page = PageOf(params, entry);
  return EntryInPool(params, pages[page], page, entry);
}

// Fused RoPE: writes the decode token's k (rotated) and v of KV heads [first_kv_head,
// first_kv_head + count) into pool entry `pool_entry`, and its position into the side pool; as
// RopeAndCacheWrite does for those heads, bit for bit. `cos_sin` holds the angles of 16-byte chunk
// (thread % (d / 16)) of a half row. Several heads at once: the first kAtOnce * d/16 threads rotate
// k (thread % (d/16) is the chunk their angles are for), the next kAtOnce * d/8 copy v, the next
// kAtOnce write the position.
template <int kHeadDim, int kThreads>
__device__ __forceinline__ void WriteNewEntries(const DecodeParams& params, int64_t pool_entry,
                                                int token, int first_kv_head, int count,
                                                int position, const float (&cos_sin)[16],
                                                float row_scale) {
  constexpr int kHalfChunks = kHeadDim / 16;
  constexpr int kChunks = kHeadDim / 8;
  constexpr int kAtOnce = kThreads / (kHalfChunks + kChunks + 1);
  static_assert(kAtOnce >= 1, "a thread for each piece of an entry");
  const int tid = static_cast<int>(threadIdx.x);
  const bf16* row = params.q + static_cast<int64_t>(token) * params.q_stride;
  for (int base = 0; base < count; base += kAtOnce) {
    if (tid < kAtOnce * kHalfChunks) {
      const int kv_head = first_kv_head + base + tid / kHalfChunks;
      const int piece = tid % kHalfChunks;
      if (base + tid / kHalfChunks >= count) continue;
      const int64_t dst = (pool_entry * params.num_kv_heads + kv_head) * kHeadDim;
      const bf16* k = row + static_cast<int64_t>(params.num_heads + kv_head) * kHeadDim;
      uint4 low = *reinterpret_cast<const uint4*>(k + piece * 8);
      uint4 high = *reinterpret_cast<const uint4*>(k + (piece + kHalfChunks) * 8);
      rope::RotateChunks(low, high, cos_sin, row_scale);
      if (params.k_scales != nullptr) {  // FP8 pool: the rounded bf16 k, quantized
        const float inverse = 1.0f / params.k_scales[kv_head];
        auto* bytes = static_cast<uint8_t*>(params.k_pool) + dst;
        float values[8];
        Unpack8(low, values);
        *reinterpret_cast<uint2*>(bytes + piece * 8) = QuantizeE4m3x8(values, inverse);
        Unpack8(high, values);
        *reinterpret_cast<uint2*>(bytes + (piece + kHalfChunks) * 8) =
            QuantizeE4m3x8(values, inverse);
      } else {
        bf16* k_page = static_cast<bf16*>(params.k_pool) + dst;
        *reinterpret_cast<uint4*>(k_page + piece * 8) = low;
        *reinterpret_cast<uint4*>(k_page + (piece + kHalfChunks) * 8) = high;
      }
    } else if (tid < kAtOnce * (kHalfChunks + kChunks)) {
      const int index = tid - kAtOnce * kHalfChunks;
      const int kv_head = first_kv_head + base + index / kChunks;
      const int chunk = index % kChunks;
      if (base + index / kChunks >= count) continue;
      const int64_t dst = (pool_entry * params.num_kv_heads + kv_head) * kHeadDim;
      const bf16* v =
          row + static_cast<int64_t>(params.num_heads + params.num_kv_heads + kv_head) * kHeadDim;
      const uint4 value =
          rope::ScaleChunk(*reinterpret_cast<const uint4*>(v + chunk * 8), row_scale);
      if (params.v_scales != nullptr) {
        float values[8];
        Unpack8(value, values);
        *reinterpret_cast<uint2*>(static_cast<uint8_t*>(params.v_pool) + dst + chunk * 8) =
            QuantizeE4m3x8(values, 1.0f / params.v_scales[kv_head]);
      } else {
        *reinterpret_cast<uint4*>(static_cast<bf16*>(params.v_pool) + dst + chunk * 8) = value;
      }
    } else if (tid < kAtOnce * (kHalfChunks + kChunks + 1) && params.pool_positions != nullptr) {
      const int index = tid - kAtOnce * (kHalfChunks + kChunks);
      if (base + index >= count) continue;
      params.pool_positions[pool_entry * params.num_kv_heads + first_kv_head + base + index] =
          position;
    }
  }
}

// This CTA's trace row (decode_attention.h), for thread 0 only; null without a trace buffer.
__device__ __forceinline__ uint64_t* TraceRow(const DecodeParams& params) {
  if (__builtin_expect(params.trace == nullptr || threadIdx.x != 0, 1)) return nullptr;
  const int64_t cta = static_cast<int64_t>(blockIdx.y) * gridDim.x + blockIdx.x;
  return cta < params.trace_ctas ? params.trace + cta * kDecodeTraceSlots : nullptr;
}

// %globaltimer into `slot` of the CTA's trace row; at entry also the SM id.
__device__ __forceinline__ void TraceStamp(const DecodeParams& params, int slot) {
  uint64_t* row = TraceRow(params);
  if (__builtin_expect(row == nullptr, 1)) return;
  uint64_t now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  row[slot] = now;
  if (slot == kTraceEntry) {
    uint32_t sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    row[kTraceSm] = sm;
  }
}

// The key loop's SM cycles: the start's clock64 is parked in the row itself, so no register
// stays live across the loop when tracing is off.
__device__ __forceinline__ void TraceLoopCycles(const DecodeParams& params, bool end) {
  uint64_t* row = TraceRow(params);
  if (__builtin_expect(row == nullptr, 1)) return;
  const uint64_t now = static_cast<uint64_t>(clock64());
  row[kTraceLoopCycles] = end ? now - row[kTraceLoopCycles] : now;
}

// Grid: x = (decode sequence, group of kv_heads_per_cta KV heads, head chunk), chunk fastest;
// y = split. A CTA of several KV heads (folded, one head chunk) attends them one after another
// over the same entries: it reads the step metadata and its page ids, waits for the kernels
// before, computes the folded norm's scale and writes the new entries once for all of them, and
// its K/V pipeline runs on from one head's tiles into the next head's.
// kFolded: compiled apart, so that the unfolded CTAs (every batch up to one wave) run code
// without the between-heads part.
// kFp8: the pool holds e4m3 (PoolView); the K scale of the head attended folds into the score
// scale and the V scale into its output. kFp8Registers (d = 128): the warps read the e4m3 stages
// straight into f16 fragments (kv_fp8.cuh, E4m3WarpRows) instead of converting them into the
// bf16 compute tiles first.
template <int kHeadDim, int kStages, int kWarps, bool kFolded, bool kFp8, bool kFp8Registers>
__global__ void __launch_bounds__(CtaShape<kWarps>::kThreads, CtaShape<kWarps>::kMinCtasPerSm)
    DecodeAttentionKernel(const DecodeParams params) {
  static_assert(!kFp8Registers || (kFp8 && kHeadDim == 128), "e4m3 fragments need d = 128");
  constexpr int kThreads = CtaShape<kWarps>::kThreads;
  constexpr int kTile = CtaShape<kWarps>::kTile;
  constexpr int kQBytes = SmemQBytes<kHeadDim>();
  constexpr int kKvBytes = SmemKvTileBytes<kHeadDim, kWarps>();  // a bf16 tile
  constexpr int kStageBytes = SmemStageBytes<kHeadDim, kWarps, kFp8>();
  constexpr int kHalfChunks = kHeadDim / 16;  // 16-byte chunks in half a row: RoPE pairs
  // 16-byte pieces of one entry's K (or V) as the pool holds it.
  constexpr int kCopyChunks = kFp8 ? kHeadDim / 16 : kHeadDim / 8;
  constexpr int kElementBytes = kFp8 ? 1 : 2;
  static_assert((kTile * kCopyChunks) % kThreads == 0, "K/V copies divide evenly among threads");
  static_assert(kThreads % kHalfChunks == 0, "a thread rotates the same chunk of every row");
  static_assert(FoldedMergeFits<kHeadDim, kWarps>(), "a folded CTA merges in one K/V stage");
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ int32_t cached_pages[kCachedPages];
  const uint32_t smem_q = flash::SharedAddress(smem);
  const uint32_t smem_k = smem_q + kQBytes;
  const uint32_t smem_v = smem_k + kStages * kStageBytes;
  // FP8: the bf16 tiles the warps convert their rows into (unused otherwise).
  [[maybe_unused]] const uint32_t compute_k = smem_v + kStages * kStageBytes;
  [[maybe_unused]] const uint32_t compute_v = compute_k + kKvBytes;

  // Before PdlWait (pdl.cuh): what no kernel of this step writes before us. Step metadata, the
  // RoPE table and the page table come from host uploads and earlier layers; K/V entries below the
  // newest one were written by earlier steps. Only q and the newest entry come from the kernel
  // before (RopeAndCacheWrite; with fused RoPE, q, k and v come from the QKV GEMM and this kernel
  // writes the entry), so tiles without that entry start loading while it may still run.
  TraceStamp(params, kTraceEntry);
  const int item = static_cast<int>(blockIdx.x);
  const int fold = kFolded ? params.kv_heads_per_cta : 1;
  const int chunk = item % params.head_chunks;
  const int kv_head0 = (item / params.head_chunks) % params.kv_head_groups * fold;
  const int decode_index = item / (params.head_chunks * params.kv_head_groups);
  const int split = static_cast<int>(blockIdx.y);
  const int seq = params.first_seq + decode_index;
  const int tid = static_cast<int>(threadIdx.x);
  const uint64_t keep = EvictLastPolicy();
  const int token = LoadKept(params.query_start + seq, keep);
  const int slot = LoadKept(params.seq_slots + seq, keep);
  const int32_t* pages = params.page_table + static_cast<int64_t>(slot) * params.max_pages_per_seq;
  // Split 0 starts at entry 0 whatever the length, so its first page ids are asked for alongside
  // the length rather than after it (one dependent round trip fewer).
  const bool early_ids = split == 0 && tid < params.max_pages_per_seq;
  const int32_t first_id = early_ids ? LoadKept(pages + tid, keep) : 0;
  const int length = LoadKept(params.kv_lens + slot, keep);
  // The query heads of the KV head attended now (they follow on from one KV head to the next).
  int head0 = kv_head0 * params.group + chunk * kHeadsPerCta;
  const int num_rows = min(kHeadsPerCta, params.group - chunk * kHeadsPerCta);
  const int used_splits = UsedSplits(params, length);
  int begin = 0;
  int end = 0;
  SplitRange<kTile>(length, split, used_splits, params.split_entries, begin, end);
  int64_t part_row =  // row of (split, sequence, head0) in the partial arrays
      (static_cast<int64_t>(split) * params.num_decode + decode_index) * params.num_heads + head0;
  const int written = params.write_start != nullptr ? LoadKept(params.write_start + seq, keep) : -1;

  // Fused RoPE: the angles of this thread's chunk of a half row, and the pool entry this CTA
  // writes: the step's new entry when this split holds it (every head chunk of the KV head writes
  // the same bytes; each reads only what it wrote itself), or when no split does (an entry past
  // the length is written, never read, as RopeAndCacheWrite would) split 0.
  const bool fused = params.rope_table != nullptr;
  float cos_sin[16];
  int position = 0;
  int64_t new_entry = -1;
  if (fused) {
    position = LoadKept(params.positions + token, keep);
    rope::LoadChunkAngles(params.rope_table, position, kHeadDim, tid % kHalfChunks, cos_sin);
    if (written >= 0 &&
        ((begin <= written && written < end) || (written >= length && split == 0))) {
      new_entry = PoolEntry(params, pages, written);
    }
  }

  if (__builtin_expect(begin >= end, 0)) {  // rare: kept out of the hot code's way
    PdlWait();
    PdlLaunchDependents();
    if (new_entry >= 0) {
      WriteNewEntries<kHeadDim, kThreads>(params, new_entry, token, kv_head0, fold, position,
                                          cos_sin, WarpRowInvRms(params.norm, token));
    }
    // A split past the sequence's own count has nothing to do: the combine reads only those. An
    // empty piece adds nothing to the combine. A sequence with no entries at all (the engine
    // never makes one: a decode token's own entry is always there) gets zeros, as on the CPU.
    if (split >= used_splits) return;
    for (int head = 0; head < fold; ++head) {
      const int first_head = head0 + head * params.group;
      if (used_splits > 1) {
        if (tid < num_rows) params.partial_lse[part_row + head * params.group + tid] = -INFINITY;
      } else {
        for (int index = tid; index < num_rows * kHeadDim; index += kThreads) {
          params.out[static_cast<int64_t>(token) * params.out_stride +
                     static_cast<int64_t>(first_head) * kHeadDim + index] = __float2bfloat16(0.0f);
        }
        if (params.lse != nullptr && tid < num_rows) {
          params.lse[static_cast<int64_t>(decode_index) * params.num_heads + first_head + tid] =
              -INFINITY;
        }
      }
    }
    return;
  }

  const int first_page = PageOf(params, begin);
  const int page_count = PageOf(params, end - 1) - first_page + 1;
  const bool cached = page_count <= kCachedPages;
  if (cached) {
    for (int index = tid; index < page_count; index += kThreads) {
      cached_pages[index] =
          early_ids && index == tid ? first_id : LoadKept(pages + first_page + index, keep);
    }
  }
  __syncthreads();
  TraceStamp(params, kTracePagesLoaded);
  // Tiles are numbered across the CTA's KV heads: tile `index` is tile index % num_tiles of head
  // index / num_tiles.
  const int num_tiles = (end - begin + kTile - 1) / kTile;
  const int total_tiles = num_tiles * fold;
  const int64_t entry_stride = static_cast<int64_t>(params.num_kv_heads) * kHeadDim;
  // Entries past `end` are zero-filled and masked, never read: their page-table slots may hold
  // anything. The common case, page ids in shared memory and a power-of-two page size, takes few
  // instructions a copy: this lambda is inlined five times, and in a decode step the kernel's code
  // is evidently fetched from memory anew (README_attention.md;
  // bench/results/2026-12-01-s8-h200-attention-code-size.json: with this the key loop runs in the
  // step as fast as alone). Anything else takes the general loop, not unrolled.
  const bool fast_pages = cached && params.page_shift >= 0;
  // Copy `step` of this thread in the tile that starts at entry `first`: its row of the tile, its
  // 16-byte piece of the row, and the entry.
  struct CopySlot {
    int row, piece, entry;
  };
  const auto slot_of = [&](int first, int step) {
    const int index = tid + step * kThreads;
    return CopySlot{index / kCopyChunks, index % kCopyChunks, first + index / kCopyChunks};
  };
  // 16 bytes of an entry's K and V (element `offset` of the pool: entry and head) into row `row`
  // of a stage.
  // (An FP8 stage is rows of kHeadDim bytes: plain where each warp converts its own rows, swizzled
  // as a bf16 tile of kHeadDim / 2 columns where ldmatrix reads them into fragments.)
  const auto copy_chunk = [&](int stage, int row, int piece, int64_t offset, bool valid) {
    uint32_t dst = 0;
    if constexpr (kFp8Registers) {
      dst = flash::TileOffset<kHeadDim / 2>(row, piece);
    } else {
      dst = kFp8 ? static_cast<uint32_t>(row * kHeadDim + piece * 16)
                 : flash::TileOffset<kHeadDim>(row, piece);
    }
    const int64_t byte = (offset + piece * (16 / kElementBytes)) * kElementBytes;
    flash::CpAsync16(smem_k + stage * kStageBytes + dst,
                     static_cast<const uint8_t*>(params.k_pool) + byte, valid);
    flash::CpAsync16(smem_v + stage * kStageBytes + dst,
                     static_cast<const uint8_t*>(params.v_pool) + byte, valid);
  };
  // Tile `tile` of the CTA's KV head `head` into stage `stage`.
  const auto load_kv = [&](int head, int tile, int stage) {
    const int first = begin + tile * kTile;
    const int64_t head_offset = static_cast<int64_t>(kv_head0 + head) * kHeadDim;
    if (__builtin_expect(fast_pages, 1)) {
      const int shift = params.page_shift;
      const int mask = (1 << shift) - 1;
#pragma unroll
      for (int step = 0; step < kTile * kCopyChunks / kThreads; ++step) {
        const CopySlot c = slot_of(first, step);
        const bool valid = c.entry < end;
        const int32_t id = valid ? cached_pages[(c.entry >> shift) - first_page] : 0;
        const int64_t offset =
            ((static_cast<int64_t>(id) << shift) + (c.entry & mask)) * entry_stride + head_offset;
        copy_chunk(stage, c.row, c.piece, offset, valid);
      }
      return;
    }
#pragma unroll 1
    for (int step = 0; step < kTile * kCopyChunks / kThreads; ++step) {
      const CopySlot c = slot_of(first, step);
      const bool valid = c.entry < end;
      int64_t offset = head_offset;
      if (valid) {
        const int page = PageOf(params, c.entry);
        const int32_t id = cached ? cached_pages[page - first_page] : pages[page];
        offset += EntryInPool(params, id, page, c.entry) * entry_stride;
      }
      copy_chunk(stage, c.row, c.piece, offset, valid);
    }
  };
  // A tile may load before PdlWait when it ends before the first entry this step writes.
  int first_written = 0;
  if (params.write_start != nullptr) first_written = written < 0 ? end : written;
  const auto early = [&](int tile) {
    return min(end, begin + (tile + 1) * kTile) <= first_written;
  };
  // The first kStages - 1 tiles: (head, tile) of index `index` (the next head's when a head has
  // fewer tiles).
  const auto head_of = [&](int index) {
    return !kFolded || index < num_tiles ? 0 : index / num_tiles;
  };
#pragma unroll
  for (int index = 0; index < kStages - 1; ++index) {
    const int head = head_of(index);
    if (index < total_tiles && early(index - head * num_tiles)) {
      load_kv(head, index - head * num_tiles, index);
    }
  }
  PdlWait();
  PdlLaunchDependents();
  TraceStamp(params, kTraceWaitDone);
  // A folded RMSNorm's s of the token (1 without one): each warp computes it, in the same order.
  const float row_scale = fused ? WarpRowInvRms(params.norm, token) : 1.0f;
  if (fused) TraceStamp(params, kTraceScaleDone);
  if (new_entry >= 0) {
    // Fused RoPE: the entries go to memory before any copy below may read them. The copies are
    // other threads' cp.async (generic proxy, through L2): the fence and the barrier order the
    // stores before them.
    WriteNewEntries<kHeadDim, kThreads>(params, new_entry, token, kv_head0, fold, position, cos_sin,
                                        row_scale);
    __threadfence_block();
    __syncthreads();
  }
  TraceStamp(params, kTracePrologueDone);

  // The group's query heads are adjacent in q's row: rows of a [16][d] tile, zero past num_rows.
  // Commit groups: the first holds q and tile 0 (and any early tile), then one per tile.
  const bf16* q_row = params.q + static_cast<int64_t>(token) * params.q_stride;
  flash::LoadTileAsync<kHeadDim, kHeadsPerCta, kThreads>(
      smem_q, q_row + static_cast<int64_t>(head0) * kHeadDim, kHeadDim, num_rows);
  if (!early(0)) load_kv(0, 0, 0);
  flash::CpAsyncCommit();
#pragma unroll
  for (int index = 1; index < kStages - 1; ++index) {
    const int head = head_of(index);
    if (index < total_tiles && !early(index - head * num_tiles)) {
      load_kv(head, index - head * num_tiles, index);
    }
    flash::CpAsyncCommit();
  }
  // The tile the loop loads next: tile index kStages - 1.
  int load_head = head_of(kStages - 1);
  int load_tile = kStages - 1 - load_head * num_tiles;

  const int warp = tid / 32;
  const int lane = tid % 32;
  std::conditional_t<kFp8Registers, E4m3WarpRows<kHeadDim>, flash::WarpRows<kHeadDim>> state;
  state.Reset();
  flash::CpAsyncWait<kStages - 2>();
  __syncthreads();
  if (fused) {
    // Rotate the raw q rows in place: thread tid owns chunk tid % (d/16) of each half row (the
    // chunk its angles are for) of rows tid / (d/16), + kThreads / (d/16), ...
    for (int index = tid; index < num_rows * kHalfChunks; index += kThreads) {
      const int row = index / kHalfChunks;
      const int piece = index % kHalfChunks;
      uint4* low = reinterpret_cast<uint4*>(smem + flash::TileOffset<kHeadDim>(row, piece));
      uint4* high =
          reinterpret_cast<uint4*>(smem + flash::TileOffset<kHeadDim>(row, piece + kHalfChunks));
      uint4 low_value = *low;
      uint4 high_value = *high;
      rope::RotateChunks(low_value, high_value, cos_sin, row_scale);
      *low = low_value;
      *high = high_value;
    }
    __syncthreads();
  }
  state.LoadQ(smem_q, 0);
  TraceStamp(params, kTraceLoopStart);
  TraceLoopCycles(params, false);

  constexpr int kMergeStride = MergeRowStride<kHeadDim>();
  const int g = lane / 4;
  const int t = lane % 4;
  int head_first = 0;  // the index of the first tile of the KV head attended now
  // The KV head attended now and its scales (an FP8 pool's: K's folds into the score scale, V's
  // into the output).
  int kv_head = kv_head0;
  float head_scale = params.scale;
  float head_scale_log2 = params.scale_log2;
  float v_scale = 1.0f;
  const auto set_head_scales = [&] {
    if constexpr (kFp8) {
      // In f16 fragments an element is its e4m3 value / kE4m3HalfBitsScale.
      const float bits_scale = kFp8Registers ? kE4m3HalfBitsScale : 1.0f;
      const float k_scale = params.k_scales[kv_head] * bits_scale;
      head_scale = params.scale * k_scale;
      head_scale_log2 = params.scale_log2 * k_scale;
      v_scale = params.v_scales[kv_head] * bits_scale;
    }
  };
  set_head_scales();
  for (int index = 0; index < total_tiles; ++index) {
    // Tile `index` visible to all; every warp is done with index - 1, whose stage is refilled.
    flash::CpAsyncWait<kStages - 2>();
    __syncthreads();
    if (index + kStages - 1 < total_tiles) {
      load_kv(load_head, load_tile, (index + kStages - 1) % kStages);
      if (++load_tile == num_tiles) {
        load_tile = 0;
        ++load_head;
      }
    }
    flash::CpAsyncCommit();

    const int slice_first = begin + (index - head_first) * kTile + warp * 16;  // 16 entries
    const int stage = index % kStages;
    if (slice_first < end) {
      uint32_t k_tile = smem_k + stage * kStageBytes;
      uint32_t v_tile = smem_v + stage * kStageBytes;
      if constexpr (kFp8 && !kFp8Registers) {
        // The warp's 16 rows of e4m3 into the bf16 compute tiles (exact), which no other warp
        // touches: a warp barrier suffices.
        constexpr int kPieces = kHeadDim / 8;  // 8 elements a piece
        const uint8_t* k_rows = smem + kQBytes + stage * kStageBytes + warp * 16 * kHeadDim;
        const uint8_t* v_rows = k_rows + kStages * kStageBytes;
        uint8_t* k_out = smem + kQBytes + 2 * kStages * kStageBytes;
        uint8_t* v_out = k_out + kKvBytes;
#pragma unroll
        for (int piece = lane; piece < 16 * kPieces; piece += 32) {
          const int row = piece / kPieces;
          const int column = piece % kPieces;
          const uint32_t dst = flash::TileOffset<kHeadDim>(warp * 16 + row, column);
          *reinterpret_cast<uint4*>(k_out + dst) =
              E4m3x8ToBf16x8(*reinterpret_cast<const uint2*>(k_rows + piece * 8));
          *reinterpret_cast<uint4*>(v_out + dst) =
              E4m3x8ToBf16x8(*reinterpret_cast<const uint2*>(v_rows + piece * 8));
        }
        __syncwarp();
        k_tile = compute_k;
        v_tile = compute_v;
      }
      const int limit[2] = {end - 1 - slice_first, end - 1 - slice_first};
      if constexpr (kFp8Registers) {
        if (slice_first + 16 > end) {
          state.template AttendTile<true>(k_tile, v_tile, warp * 16, head_scale_log2, limit);
        } else {
          state.template AttendTile<false>(k_tile, v_tile, warp * 16, head_scale_log2, limit);
        }
      } else if (slice_first + 16 > end) {
        state.template AttendTile<16, true>(k_tile, v_tile, warp * 16, head_scale_log2, limit);
      } else {
        state.template AttendTile<16, false>(k_tile, v_tile, warp * 16, head_scale_log2, limit);
      }
    }
    if (index + 1 < head_first + num_tiles) continue;

    // The KV head's last tile is attended: merge the warps' states, out = sum_w acc_w * 2^((m_w -
    // m) c) / sum_w l_w 2^((m_w - m) c), and write the head's output. After the last tile no copy
    // is in flight and the merge buffers take the K/V stages; between two heads of a folded CTA
    // the next head's first tiles are, and each warp's rows go to the stage just attended (even
    // warps in its K half, odd ones in its V half; at most kDecodeMaxFoldedGroup rows).
    const bool last = !kFolded || index + 1 == total_tiles;
    if (last) flash::CpAsyncWait<0>();
    __syncthreads();  // every warp is done with the stage (the stages) and with the Q tile
    if (last) {
      TraceLoopCycles(params, true);
      TraceStamp(params, kTraceLoopEnd);
    }
    // The next head's raw q rows, asked for now so that they arrive during the merge.
    constexpr int kQPairs = (kDecodeMaxFoldedGroup * kHalfChunks + kThreads - 1) / kThreads;
    uint4 next_q[kQPairs][2];
#pragma unroll
    for (int pair = 0; pair < kQPairs; ++pair) {
      const int piece_index = tid + pair * kThreads;
      next_q[pair][0] = next_q[pair][1] = make_uint4(0, 0, 0, 0);
      if (!last && piece_index < num_rows * kHalfChunks) {
        const bf16* src =
            q_row +
            static_cast<int64_t>(head0 + params.group + piece_index / kHalfChunks) * kHeadDim +
            (piece_index % kHalfChunks) * 8;
        next_q[pair][0] = *reinterpret_cast<const uint4*>(src);
        next_q[pair][1] = *reinterpret_cast<const uint4*>(src + kHeadDim / 2);
      }
    }
    state.FinishSums();
    float* merge_ml = reinterpret_cast<float*>(smem);  // [kWarps][16][2] (m, l); q is in registers
    const auto warp_rows = [&](int w) {                // warp w's rescaled rows [.][kMergeStride]
      // Between heads an FP8 CTA merges in its compute tiles (its stages are half the size).
      const int between = kFp8 ? 2 * kStages * kStageBytes + (w % 2) * kKvBytes
                               : (w % 2) * kStages * kKvBytes + stage * kKvBytes;
      uint8_t* base =
          last ? smem + kQBytes + w * 16 * kMergeStride * 4
               : smem + kQBytes + between + (w / 2) * kDecodeMaxFoldedGroup * kMergeStride * 4;
      return reinterpret_cast<float*>(base);
    };
    if (t == 0) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        merge_ml[(warp * 16 + g + 8 * half) * 2] = state.m[half];
        merge_ml[(warp * 16 + g + 8 * half) * 2 + 1] = state.l[half];
      }
    }
    __syncthreads();
    float factor[2];
    float row_lse[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = g + 8 * half;
      float m_max = -INFINITY;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) m_max = fmaxf(m_max, merge_ml[(w * 16 + row) * 2]);
      float total = 0.0f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        const float l_w = merge_ml[(w * 16 + row) * 2 + 1];
        // l_w == 0 exactly when the warp saw no entry (m_w = -inf): skipping avoids -inf - -inf.
        if (l_w > 0.0f) {
          total += l_w * flash::Exp2((merge_ml[(w * 16 + row) * 2] - m_max) * head_scale_log2);
        }
      }
      const float own =
          state.l[half] > 0.0f ? flash::Exp2((state.m[half] - m_max) * head_scale_log2) : 0.0f;
      // An FP8 pool's V scale rides on the warp's weight.
      factor[half] = total > 0.0f ? own / total * v_scale : 0.0f;
      row_lse[half] = total > 0.0f ? m_max * head_scale + logf(total) : -INFINITY;
    }
    float* own_rows = warp_rows(warp);
    if constexpr (kFp8Registers) {
      // Even and odd tiles n, n + 1 hold dimensions 4t .. 4t + 3 of their 16 (E4m3OutputColumn).
#pragma unroll
      for (int n = 0; n < kHeadDim / 8; n += 2) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int row = g + 8 * half;
          if (row >= num_rows) continue;
          const float f = factor[half];
          *reinterpret_cast<float4*>(own_rows + row * kMergeStride + E4m3OutputColumn(n, t, 0)) =
              make_float4(state.acc[n][2 * half] * f, state.acc[n + 1][2 * half] * f,
                          state.acc[n][2 * half + 1] * f, state.acc[n + 1][2 * half + 1] * f);
        }
      }
    } else {
#pragma unroll
      for (int n = 0; n < kHeadDim / 8; ++n) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int row = g + 8 * half;
          if (row >= num_rows) continue;
          *reinterpret_cast<float2*>(own_rows + row * kMergeStride + n * 8 + 2 * t) = make_float2(
              state.acc[n][2 * half] * factor[half], state.acc[n][2 * half + 1] * factor[half]);
        }
      }
    }
    __syncthreads();
    for (int out_index = tid; out_index < num_rows * (kHeadDim / 4); out_index += kThreads) {
      const int row = out_index / (kHeadDim / 4);
      const int column = (out_index % (kHeadDim / 4)) * 4;
      float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        const float4 part =
            *reinterpret_cast<const float4*>(warp_rows(w) + row * kMergeStride + column);
        sum.x += part.x;
        sum.y += part.y;
        sum.z += part.z;
        sum.w += part.w;
      }
      if (used_splits == 1) {
        const uint2 packed =
            make_uint2(flash::PackBf16(sum.x, sum.y), flash::PackBf16(sum.z, sum.w));
        *reinterpret_cast<uint2*>(params.out + static_cast<int64_t>(token) * params.out_stride +
                                  static_cast<int64_t>(head0 + row) * kHeadDim + column) = packed;
      } else {
        *reinterpret_cast<float4*>(params.partial_out + (part_row + row) * kHeadDim + column) = sum;
      }
    }
    if (warp == 0 && t == 0) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = g + 8 * half;
        if (row >= num_rows) continue;
        if (used_splits > 1) {
          params.partial_lse[part_row + row] = row_lse[half];
        } else if (params.lse != nullptr) {
          params.lse[static_cast<int64_t>(decode_index) * params.num_heads + head0 + row] =
              row_lse[half];
        }
      }
    }
    if (last) break;

    // The next KV head: its q rows (rotated with the same angles and scale) into the Q tile once
    // the merge has read it, a fresh softmax state, and on with its tiles, whose first are in
    // flight.
    __syncthreads();
#pragma unroll
    for (int pair = 0; pair < kQPairs; ++pair) {
      const int piece_index = tid + pair * kThreads;
      if (piece_index >= num_rows * kHalfChunks) continue;
      const int row = piece_index / kHalfChunks;
      const int piece = piece_index % kHalfChunks;
      if (fused) rope::RotateChunks(next_q[pair][0], next_q[pair][1], cos_sin, row_scale);
      *reinterpret_cast<uint4*>(smem + flash::TileOffset<kHeadDim>(row, piece)) = next_q[pair][0];
      *reinterpret_cast<uint4*>(smem + flash::TileOffset<kHeadDim>(row, piece + kHalfChunks)) =
          next_q[pair][1];
    }
    __syncthreads();
    state.Reset();
    state.LoadQ(smem_q, 0);
    head_first += num_tiles;
    head0 += params.group;
    part_row += params.group;
    ++kv_head;
    set_head_scales();
  }
  TraceStamp(params, kTraceExit);
}

// Merges the splits of one (decode sequence, head): weights exp(lse_s - max lse). Grid (B, H),
// one thread per output column. A sequence that used one split was written by the main kernel.
// At batch 1 this kernel is on the step's critical path 32 times a step, and what it costs there
// is round trips to the L2, so none of its loads waits for another: each thread loads one split's
// lse (a chunk of kHeadDim splits at a time), the block takes their maximum, and each thread then
// loads its column of 8 splits at once (predicated, no branch between the loads).
template <int kHeadDim>
__global__ void __launch_bounds__(kHeadDim) DecodeCombineKernel(const DecodeParams params) {
  __shared__ float weights[kHeadDim];  // exp(lse_s - max lse) of one chunk of splits, 0 if empty
  __shared__ float warp_max[kHeadDim / 32];
  PdlWait();
  PdlLaunchDependents();
  const int decode_index = static_cast<int>(blockIdx.x);
  const int seq = params.first_seq + decode_index;
  const int used_splits = UsedSplits(params, params.kv_lens[params.seq_slots[seq]]);
  if (used_splits == 1) return;
  const int head = static_cast<int>(blockIdx.y);
  const int column = static_cast<int>(threadIdx.x);
  const int64_t split_stride = static_cast<int64_t>(params.num_decode) * params.num_heads;
  const int64_t row = static_cast<int64_t>(decode_index) * params.num_heads + head;
  const float* lse = params.partial_lse + row;
  // An empty piece has lse -inf: it adds nothing, and its partial output was never written.
  float own_lse = column < used_splits ? lse[column * split_stride] : -INFINITY;
  float m_max = own_lse;
  for (int split = column + kHeadDim; split < used_splits; split += kHeadDim) {
    m_max = fmaxf(m_max, lse[split * split_stride]);
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    m_max = fmaxf(m_max, __shfl_xor_sync(0xffffffffu, m_max, offset));
  }
  if (column % 32 == 0) warp_max[column / 32] = m_max;
  __syncthreads();
#pragma unroll
  for (int warp = 0; warp < kHeadDim / 32; ++warp) m_max = fmaxf(m_max, warp_max[warp]);
  constexpr int kInFlight = 8;
  float total = 0.0f;
  float value = 0.0f;
  const float* part_out = params.partial_out + row * kHeadDim + column;
  for (int base = 0; base < used_splits; base += kHeadDim) {
    const int count = min(kHeadDim, used_splits - base);
    if (base > 0) {
      __syncthreads();  // the chunk before is read
      own_lse = column < count ? lse[(base + column) * split_stride] : -INFINITY;
    }
    // With every piece empty m_max is -inf too, and every weight 0.
    if (column < count) weights[column] = own_lse == -INFINITY ? 0.0f : expf(own_lse - m_max);
    __syncthreads();
    for (int first = 0; first < count; first += kInFlight) {
      float weight[kInFlight];
      float part[kInFlight];
      // Every load is made (past the chunk, of its last split again; an empty piece's slot holds
      // stale workspace bytes) and the select after drops what does not count.
#pragma unroll
      for (int j = 0; j < kInFlight; ++j) {
        const int index = min(first + j, count - 1);
        const float loaded = weights[index];
        weight[j] = first + j < count ? loaded : 0.0f;
        part[j] = part_out[(base + index) * split_stride * kHeadDim];
      }
#pragma unroll
      for (int j = 0; j < kInFlight; ++j) {
        total += weight[j];
        value += weight[j] > 0.0f ? weight[j] * part[j] : 0.0f;
      }
    }
  }
  const int token = params.query_start[seq];
  params.out[static_cast<int64_t>(token) * params.out_stride +
             static_cast<int64_t>(head) * kHeadDim + column] =
      __float2bfloat16(total > 0.0f ? value / total : 0.0f);
  if (params.lse != nullptr && column == 0) {
    params.lse[row] = total > 0.0f ? m_max + logf(total) : -INFINITY;
  }
}

// H2O: scores[entry][g] += mean over the group's heads of exp(scale q_h . k - lse_h), for every
// entry of the split. A second pass over K, written for clarity: a warp per entry, lanes across
// d, a warp reduction per head. Grid: x = (decode sequence, KV head), y = split. Static shared
// memory holds the group's q rows in f32 and their lse (the group is at most kMaxScoreGroup). Its
// pieces need not be the attention kernel's: any cut covers every entry once.
constexpr int kMaxScoreGroup = 32;
constexpr int kScoreWarps = 4;
constexpr int kScoreThreads = kScoreWarps * 32;

template <int kHeadDim>
__global__ void DecodeScoresKernel(const DecodeParams params) {
  PdlWait();
  PdlLaunchDependents();
  constexpr int kPerLane = kHeadDim / 32;
  __shared__ float shared_q[kMaxScoreGroup * kHeadDim];  // [group][d]
  __shared__ float lse_shared[kMaxScoreGroup];           // [group]
  const int kv_head = static_cast<int>(blockIdx.x) % params.num_kv_heads;
  const int decode_index = static_cast<int>(blockIdx.x) / params.num_kv_heads;
  const int seq = params.first_seq + decode_index;
  const int token = params.query_start[seq];
  const int slot = params.seq_slots[seq];
  int begin = 0;
  int end = 0;
  SplitRange<CtaShape<kScoreWarps>::kTile>(params.kv_lens[slot], static_cast<int>(blockIdx.y),
                                           params.num_splits, params.split_entries, begin, end);
  if (begin >= end) return;
  const int tid = static_cast<int>(threadIdx.x);
  const int head0 = kv_head * params.group;
  const bf16* q_group = params.q + static_cast<int64_t>(token) * params.q_stride +
                        static_cast<int64_t>(head0) * kHeadDim;
  for (int index = tid; index < params.group * kHeadDim; index += kScoreThreads) {
    shared_q[index] = __bfloat162float(q_group[index]);
  }
  for (int index = tid; index < params.group; index += kScoreThreads) {
    lse_shared[index] =
        params.lse[static_cast<int64_t>(decode_index) * params.num_heads + head0 + index];
  }
  __syncthreads();

  const int warp = tid / 32;
  const int lane = tid % 32;
  const int32_t* pages = params.page_table + static_cast<int64_t>(slot) * params.max_pages_per_seq;
  for (int entry = begin + warp; entry < end; entry += kScoreWarps) {
    const int64_t pool_entry = PoolEntry(params, pages, entry);
    const int64_t k_offset =
        (pool_entry * params.num_kv_heads + kv_head) * kHeadDim + lane * kPerLane;
    float k_values[kPerLane];
    if (params.k_scales != nullptr) {  // FP8 pool: e4m3 value * the head's scale
      const auto* k_row = static_cast<const __nv_fp8_storage_t*>(params.k_pool) + k_offset;
      const float k_scale = params.k_scales[kv_head];
#pragma unroll
      for (int index = 0; index < kPerLane; ++index) {
        const __half value(__nv_cvt_fp8_to_halfraw(k_row[index], __NV_E4M3));
        k_values[index] = __half2float(value) * k_scale;
      }
    } else {
      const bf16* k_row = static_cast<const bf16*>(params.k_pool) + k_offset;
#pragma unroll
      for (int index = 0; index < kPerLane; ++index)
        k_values[index] = __bfloat162float(k_row[index]);
    }
    float probability = 0.0f;
    for (int head = 0; head < params.group; ++head) {
      const float* q_row = shared_q + head * kHeadDim + lane * kPerLane;
      float dot = 0.0f;
#pragma unroll
      for (int index = 0; index < kPerLane; ++index) dot = fmaf(q_row[index], k_values[index], dot);
#pragma unroll
      for (int offset = 16; offset > 0; offset /= 2) {
        dot += __shfl_xor_sync(0xffffffffu, dot, offset);
      }
      probability += expf(dot * params.scale - lse_shared[head]);
    }
    if (lane == 0) {
      params.scores[pool_entry * params.num_kv_heads + kv_head] +=
          probability / static_cast<float>(params.group);
    }
  }
}

// The current device's SM count (the split and CTA choices ask on every launch).
int SmCount() { return CurrentDeviceAttribute<cudaDevAttrMultiProcessorCount>(); }

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// CTAs of one split: (decode sequence, KV head, chunk of up to kHeadsPerCta query heads).
int64_t CtasPerSplit(int num_decode_seqs, int num_heads, int num_kv_heads) {
  return static_cast<int64_t>(num_decode_seqs) * num_kv_heads *
         CeilDiv(num_heads / num_kv_heads, kHeadsPerCta);
}

// One wave of wide CTAs.
int64_t TargetCtas() { return static_cast<int64_t>(kWideCtasPerSm) * SmCount(); }

// Splits per sequence that the split-K aims for (SplitsForLength's fill_splits): as many as put
// one CTA on every SM, never more. Fewer, longer pieces streamed better than a full wave of 2 per
// SM (and need a smaller combine), and rounding up to cover the SMs started a partial second wave:
// back to back, batch 1 x 4096 entries took 11.5 us with 16 splits against 12.4 with 32, batch 16
// 66 us with one split against 68 with 2 and 82 with 4; the best of 1-32 splits at every batch of
// 1-32 is this rule's count or within 0.5 us of it (forced-split rows of
// bench/results/2026-12-03-h200-decode-split-fill-ab.json).
int64_t FillSplits(int num_decode_seqs, int num_heads, int num_kv_heads) {
  return std::max<int64_t>(1, SmCount() / CtasPerSplit(num_decode_seqs, num_heads, num_kv_heads));
}

// Workspace: final lse [B][H], then (with splits) partial lse [slots][H] and partial outputs
// [slots][H][d], slots = splits * B; each region 256-byte aligned.
struct WorkspaceLayout {
  size_t partial_lse_offset = 0;
  size_t partial_out_offset = 0;
  size_t lse_bytes = 0;
  size_t bytes = 0;
};
WorkspaceLayout Layout(int num_decode_seqs, int num_heads, int head_dim, int64_t slots) {
  const auto align = [](size_t bytes) { return (bytes + 255) / 256 * 256; };
  WorkspaceLayout layout;
  layout.lse_bytes = align(static_cast<size_t>(num_decode_seqs) * num_heads * sizeof(float));
  layout.partial_lse_offset = layout.lse_bytes;
  layout.partial_out_offset =
      layout.partial_lse_offset + align(static_cast<size_t>(slots) * num_heads * sizeof(float));
  layout.bytes =
      layout.partial_out_offset + static_cast<size_t>(slots) * num_heads * head_dim * sizeof(float);
  return layout;
}

template <int kHeadDim, int kStages, int kWarps, bool kFolded, bool kFp8, bool kFp8Registers>
void LaunchDecodeMain(const DecodeParams& params, int device, cudaStream_t stream) {
  constexpr int kSmem = SmemBytes<kHeadDim, kStages, kWarps, kFp8>();
  const auto kernel =
      DecodeAttentionKernel<kHeadDim, kStages, kWarps, kFolded, kFp8, kFp8Registers>;
  // Above 48 KiB of dynamic shared memory needs an opt-in, once per device. The carveout asks for
  // all of the SM's shared memory (the copies bypass L1): 4 narrow CTAs need 217 KiB of it.
  static std::atomic<uint64_t> configured_devices{0};
  OncePerDevice(configured_devices, device, [&] {
    SIEVE_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
    SIEVE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                          cudaSharedmemCarveoutMaxShared));
  });
  const dim3 grid(params.num_decode * params.kv_head_groups * params.head_chunks,
                  params.num_splits);
  LaunchWithPdl(kernel, grid, CtaShape<kWarps>::kThreads, kSmem, stream, params);
}

// The main kernel with a pipeline of kStages where the device's shared memory allows, else 2.
template <int kHeadDim, int kWarps, bool kFolded, bool kFp8, bool kFp8Registers, int kStages>
void LaunchDecodeMainKernel(const DecodeParams& params, cudaStream_t stream) {
  int device = 0;
  SIEVE_CUDA_CHECK(cudaGetDevice(&device));
  if constexpr (SmemBytes<kHeadDim, kStages, kWarps, kFp8>() <= kSmemEveryDevice) {
    LaunchDecodeMain<kHeadDim, kStages, kWarps, kFolded, kFp8, kFp8Registers>(params, device,
                                                                              stream);
  } else {
    int smem_optin = 0;
    SIEVE_CUDA_CHECK(
        cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    if (smem_optin >= SmemBytes<kHeadDim, kStages, kWarps, kFp8>()) {
      LaunchDecodeMain<kHeadDim, kStages, kWarps, kFolded, kFp8, kFp8Registers>(params, device,
                                                                                stream);
    } else {
      LaunchDecodeMain<kHeadDim, 2, kWarps, kFolded, kFp8, kFp8Registers>(params, device, stream);
    }
  }
}

template <int kHeadDim, bool kFp8, bool kFp8Registers = false, int kStages = kMaxStages>
void LaunchDecodeCta(const DecodeParams& params, DecodeCta cta, cudaStream_t stream) {
  const bool folded = params.kv_heads_per_cta > 1;
  if (cta == DecodeCta::kNarrow) {
    if (folded) {
      LaunchDecodeMainKernel<kHeadDim, kNarrowWarps, true, kFp8, kFp8Registers, kStages>(params,
                                                                                         stream);
    } else {
      LaunchDecodeMainKernel<kHeadDim, kNarrowWarps, false, kFp8, kFp8Registers, kStages>(params,
                                                                                          stream);
    }
  } else if (folded) {
    LaunchDecodeMainKernel<kHeadDim, kWideWarps, true, kFp8, kFp8Registers, kStages>(params,
                                                                                     stream);
  } else {
    LaunchDecodeMainKernel<kHeadDim, kWideWarps, false, kFp8, kFp8Registers, kStages>(params,
                                                                                      stream);
  }
}

// TEMPORARY (the A/B of the FP8 decode paths, waiting for a GPU run; the loser goes with this
// switch): SIEVE_AB_FP8_DECODE = registers (e4m3 read into f16 fragments, E4m3WarpRows) or
// registers4 (the same with 4 pipeline stages); unset or anything else, the e4m3 stages are
// converted into bf16 compute tiles as before. README_attention.md, "FP8 pools".
enum class Fp8DecodePath { kTiles, kRegisters, kRegisters4 };
Fp8DecodePath ChosenFp8DecodePath() {
  static const Fp8DecodePath path = [] {
    const char* value = std::getenv("SIEVE_AB_FP8_DECODE");
    if (value != nullptr && std::strcmp(value, "registers") == 0) return Fp8DecodePath::kRegisters;
    if (value != nullptr && std::strcmp(value, "registers4") == 0) {
      return Fp8DecodePath::kRegisters4;
    }
    return Fp8DecodePath::kTiles;
  }();
  return path;
}

template <int kHeadDim>
void LaunchFp8DecodeCta(const DecodeParams& params, DecodeCta cta, cudaStream_t stream) {
  if constexpr (kHeadDim == 128) {
    switch (ChosenFp8DecodePath()) {
      case Fp8DecodePath::kTiles:
        LaunchDecodeCta<kHeadDim, true>(params, cta, stream);
        return;
      case Fp8DecodePath::kRegisters:
        LaunchDecodeCta<kHeadDim, true, true>(params, cta, stream);
        return;
      case Fp8DecodePath::kRegisters4:
        LaunchDecodeCta<kHeadDim, true, true, 4>(params, cta, stream);
        return;
    }
  }
  LaunchDecodeCta<kHeadDim, true>(params, cta, stream);
}

template <int kHeadDim>
void LaunchDecode(const DecodeParams& params, DecodeCta cta, cudaStream_t stream) {
  if (params.k_scales != nullptr) {
    LaunchFp8DecodeCta<kHeadDim>(params, cta, stream);
  } else {
    LaunchDecodeCta<kHeadDim, false>(params, cta, stream);
  }
  if (params.num_splits > 1) {
    LaunchWithPdl(DecodeCombineKernel<kHeadDim>, dim3(params.num_decode, params.num_heads),
                  kHeadDim, 0, stream, params);
  }
  if (params.scores != nullptr) {
    SIEVE_CHECK(params.group <= kMaxScoreGroup)
        << "H2O scores support at most " << kMaxScoreGroup << " query heads per KV head";
    LaunchWithPdl(DecodeScoresKernel<kHeadDim>,
                  dim3(params.num_decode * params.num_kv_heads, params.num_splits), kScoreThreads,
                  0, stream, params);
  }
}

// SetDecodeAttentionTrace's buffer, read by every launch.
struct TraceTarget {
  uint64_t* buffer = nullptr;
  int64_t max_ctas = 0;
};
TraceTarget& Trace() {
  static TraceTarget target;
  return target;
}

}  // namespace

bool DecodeAttentionTraceRequested() {
  const char* value = std::getenv("SIEVE_DECODE_TRACE");
  return value != nullptr && *value != '\0' && std::strcmp(value, "0") != 0;
}

void SetDecodeAttentionTrace(uint64_t* buffer, int64_t max_ctas) {
  Trace() = TraceTarget{buffer, buffer != nullptr ? max_ctas : 0};
}

std::string SummarizeDecodeAttentionTrace(const uint64_t* trace, int64_t ctas) {
  uint64_t first = ~uint64_t{0};
  int64_t written = 0;
  for (int64_t cta = 0; cta < ctas; ++cta) {
    const uint64_t entry = trace[cta * kDecodeTraceSlots + kTraceEntry];
    if (entry == 0) continue;
    first = std::min(first, entry);
    ++written;
  }
  if (written == 0) return "";
  char line[160];
  std::string text;
  std::snprintf(line, sizeof(line),
                "decode attention trace, %lld CTAs: us after the first CTA's entry, min / p10 / "
                "p50 / p90 / max\n",
                static_cast<long long>(written));
  text += line;
  const char* names[] = {"entry",         "page ids loaded", "PdlWait returned", "row scale ready",
                         "prologue done", "key loop starts", "key loop ends",    "exit"};
  for (int slot = kTraceEntry; slot <= kTraceExit; ++slot) {
    std::vector<double> values;
    for (int64_t cta = 0; cta < ctas; ++cta) {
      const uint64_t* row = trace + cta * kDecodeTraceSlots;
      if (row[kTraceEntry] != 0 && row[slot] != 0) values.push_back((row[slot] - first) / 1e3);
    }
    if (values.empty()) continue;
    std::sort(values.begin(), values.end());
    const auto at = [&](double fraction) {
      return values[static_cast<size_t>(fraction * static_cast<double>(values.size() - 1))];
    };
    std::snprintf(line, sizeof(line), "  %-16s %7.2f %7.2f %7.2f %7.2f %7.2f\n", names[slot],
                  at(0.0), at(0.1), at(0.5), at(0.9), at(1.0));
    text += line;
  }
  std::vector<double> mhz;  // the key loop's SM cycles over its globaltimer span
  for (int64_t cta = 0; cta < ctas; ++cta) {
    const uint64_t* row = trace + cta * kDecodeTraceSlots;
    if (row[kTraceEntry] != 0 && row[kTraceLoopEnd] > row[kTraceLoopStart]) {
      mhz.push_back(static_cast<double>(row[kTraceLoopCycles]) * 1e3 /
                    static_cast<double>(row[kTraceLoopEnd] - row[kTraceLoopStart]));
    }
  }
  if (!mhz.empty()) {
    std::sort(mhz.begin(), mhz.end());
    std::snprintf(line, sizeof(line), "  SM clock in the key loop: median %.0f MHz\n",
                  mhz[mhz.size() / 2]);
    text += line;
  }
  return text;
}

int DecodeAttentionSplits(int num_decode_seqs, int num_heads, int num_kv_heads, int head_dim,
                          int max_kv_len, size_t workspace_bytes) {
  if (num_decode_seqs <= 0 || max_kv_len <= 0 || num_kv_heads <= 0) return 1;
  int64_t splits = std::min<int64_t>(
      SplitsForLength(max_kv_len, FillSplits(num_decode_seqs, num_heads, num_kv_heads)), 65535);
  while (splits > 1 &&
         DecodeAttentionWorkspaceBytesForSplits(num_decode_seqs, num_heads, head_dim,
                                                static_cast<int>(splits)) > workspace_bytes) {
    --splits;
  }
  return static_cast<int>(splits);
}

size_t DecodeAttentionWorkspaceBytesForSplits(int num_decode_seqs, int num_heads, int head_dim,
                                              int num_splits) {
  const int64_t slots = num_splits > 1 ? static_cast<int64_t>(num_splits) * num_decode_seqs : 0;
  return Layout(num_decode_seqs, num_heads, head_dim, slots).bytes;
}

int DecodeAttentionInvariantSplits(int max_kv_len) {
  return static_cast<int>(std::clamp<int64_t>(
      CeilDiv(std::max(max_kv_len, 1), kDecodeInvariantSplitEntries), 1, 65535));
}

size_t DecodeAttentionWorkspaceBytes(int num_decode_seqs, int num_heads, int head_dim,
                                     int max_kv_len, bool batch_invariant) {
  if (num_decode_seqs <= 0) return 0;
  if (batch_invariant) {
    return DecodeAttentionWorkspaceBytesForSplits(num_decode_seqs, num_heads, head_dim,
                                                  DecodeAttentionInvariantSplits(max_kv_len));
  }
  // DecodeAttentionSplits picks splits <= max(ceil(target / B), ceil(L / 4096)) and <= ceil(L /
  // 128), so splits * B stays under this bound, which also grows with B and L: a workspace sized
  // for the largest batch and context serves every smaller step.
  const int64_t batch = num_decode_seqs;
  const int64_t target_ctas = TargetCtas();
  const int64_t length = std::max(max_kv_len, 1);
  const int64_t slots =
      std::min(batch * CeilDiv(length, kMinSplitEntries),
               std::max(target_ctas + batch, batch * CeilDiv(length, kMaxSplitEntries)));
  return Layout(num_decode_seqs, num_heads, head_dim, slots).bytes;
}

DecodeCta ChooseDecodeCta(int num_decode_seqs, int num_heads, int num_kv_heads) {
  if (num_kv_heads <= 0) return DecodeCta::kWide;
  return CtasPerSplit(num_decode_seqs, num_heads, num_kv_heads) > TargetCtas() ? DecodeCta::kNarrow
                                                                               : DecodeCta::kWide;
}

int ChooseDecodeKvHeadsPerCta(int num_decode_seqs, int num_heads, int num_kv_heads, DecodeCta cta) {
  if (num_kv_heads <= 0 || num_heads / num_kv_heads > kDecodeMaxFoldedGroup) {
    return 1;
  }
  const int64_t wave =
      static_cast<int64_t>(cta == DecodeCta::kNarrow ? CtaShape<kNarrowWarps>::kMinCtasPerSm
                                                     : CtaShape<kWideWarps>::kMinCtasPerSm) *
      SmCount();
  // The fewest KV heads a CTA (a divisor of G) that bring the CTAs within one wave.
  const auto ctas = [&](int fold) {
    return static_cast<int64_t>(num_decode_seqs) * (num_kv_heads / fold);
  };
  int fold = 1;
  while (fold < num_kv_heads && ctas(fold) > wave) {
    ++fold;
    while (num_kv_heads % fold != 0) ++fold;
  }
  return fold;
}

void DecodeAttentionWithSplits(int num_splits, DecodeCta cta, int kv_heads_per_cta, const bf16* q,
                               int64_t q_stride, const float* rope_table, int num_heads,
                               const StepView& step, int layer, const PoolView& pool, bf16* out,
                               int64_t out_stride, void* workspace, size_t workspace_bytes,
                               const RowRmsView& norm, cudaStream_t stream, int split_entries) {
  const int num_decode = step.num_seqs - step.num_prefill_seqs;
  if (num_decode <= 0) return;
  const int head_dim = pool.head_dim;
  SIEVE_CHECK(
      split_entries >= 0 && split_entries % 64 == 0 &&
      (split_entries == 0 || static_cast<int64_t>(num_splits) * split_entries >= step.max_kv_len))
      << split_entries << " entries a split, " << num_splits << " splits, longest "
      << step.max_kv_len;
  SIEVE_CHECK(pool.num_kv_heads > 0 && num_heads % pool.num_kv_heads == 0)
      << num_heads << " query heads, " << pool.num_kv_heads << " KV heads";
  SIEVE_CHECK(head_dim == 64 || head_dim == 128) << "head_dim " << head_dim;
  SIEVE_CHECK(num_splits >= 1 && num_splits <= 65535) << "num_splits " << num_splits;
  SIEVE_CHECK(pool.page_size > 0) << "page_size " << pool.page_size;
  SIEVE_CHECK(Aligned16(q) && Aligned16(pool.k) && Aligned16(pool.v) && q_stride % 8 == 0 &&
              out_stride % 4 == 0 && reinterpret_cast<uintptr_t>(out) % 8 == 0)
      << "q, the pool and their strides must be 16-byte aligned, out 8-byte aligned";
  if (rope_table != nullptr) {
    SIEVE_CHECK(step.write_start != nullptr && step.positions != nullptr)
        << "fused RoPE needs the step's write_start and positions";
    SIEVE_CHECK(pool.scores == nullptr)
        << "fused RoPE leaves q unrotated in memory, which H2O's score pass reads";
    SIEVE_CHECK(Aligned16(rope_table)) << "the RoPE table must be 16-byte aligned";
  }
  SIEVE_CHECK(norm.rows == nullptr || rope_table != nullptr)
      << "a folded RMSNorm's scale is applied by the fused RoPE only";
  if (cta == DecodeCta::kAuto) {
    cta = ChooseDecodeCta(num_decode, num_heads, pool.num_kv_heads);
  }
  if (kv_heads_per_cta == 0) {
    kv_heads_per_cta = ChooseDecodeKvHeadsPerCta(num_decode, num_heads, pool.num_kv_heads, cta);
  }
  SIEVE_CHECK(kv_heads_per_cta >= 1 && pool.num_kv_heads % kv_heads_per_cta == 0 &&
              (kv_heads_per_cta == 1 || num_heads / pool.num_kv_heads <= kDecodeMaxFoldedGroup))
      << kv_heads_per_cta << " KV heads a CTA of " << pool.num_kv_heads << ", group "
      << num_heads / pool.num_kv_heads;

  DecodeParams params;
  params.q = q;
  params.k_pool = pool.k;
  params.v_pool = pool.v;
  params.k_scales =
      pool.fp8 ? pool.k_scales + static_cast<int64_t>(layer) * pool.num_kv_heads : nullptr;
  params.v_scales =
      pool.fp8 ? pool.v_scales + static_cast<int64_t>(layer) * pool.num_kv_heads : nullptr;
  params.page_table =
      pool.page_table + static_cast<int64_t>(layer) * pool.max_seqs * pool.max_pages_per_seq;
  params.kv_lens = pool.kv_lens + static_cast<int64_t>(layer) * pool.max_seqs;
  params.query_start = step.query_start;
  params.seq_slots = step.seq_slots;
  params.write_start = step.write_start != nullptr
                           ? step.write_start + static_cast<int64_t>(layer) * step.num_seqs
                           : nullptr;
  params.rope_table = rope_table;
  params.positions = step.positions;
  params.pool_positions = pool.positions;
  params.norm = norm;
  params.out = out;
  params.scores = pool.scores;
  params.q_stride = q_stride;
  params.out_stride = out_stride;
  params.first_seq = step.num_prefill_seqs;
  params.num_decode = num_decode;
  params.num_heads = num_heads;
  params.num_kv_heads = pool.num_kv_heads;
  params.group = num_heads / pool.num_kv_heads;
  params.head_chunks = static_cast<int>(CeilDiv(params.group, kHeadsPerCta));
  params.kv_heads_per_cta = kv_heads_per_cta;
  params.kv_head_groups = pool.num_kv_heads / kv_heads_per_cta;
  params.page_size = pool.page_size;
  params.page_shift = -1;
  if ((pool.page_size & (pool.page_size - 1)) == 0) {
    params.page_shift = 0;
    while ((1 << params.page_shift) < pool.page_size) ++params.page_shift;
  }
  params.max_pages_per_seq = pool.max_pages_per_seq;
  params.num_splits = num_splits;
  params.fill_splits = static_cast<int>(
      std::min<int64_t>(num_splits, FillSplits(num_decode, num_heads, pool.num_kv_heads)));
  params.split_entries = split_entries;
  params.scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  params.scale_log2 = params.scale * static_cast<float>(M_LOG2E);
  params.trace = Trace().buffer;
  params.trace_ctas = Trace().max_ctas;

  // The final lse is kept only for the H2O pass; partial results only with splits.
  const bool need_lse = pool.scores != nullptr;
  const WorkspaceLayout layout =
      Layout(num_decode, num_heads, head_dim,
             num_splits > 1 ? static_cast<int64_t>(num_splits) * num_decode : 0);
  const size_t needed = num_splits > 1 ? layout.bytes : (need_lse ? layout.lse_bytes : 0);
  SIEVE_CHECK(needed == 0 || (workspace != nullptr && workspace_bytes >= needed))
      << "decode attention workspace holds " << workspace_bytes << " bytes, needs " << needed;
  auto* base = static_cast<uint8_t*>(workspace);
  params.lse = need_lse ? reinterpret_cast<float*>(base) : nullptr;
  params.partial_lse =
      num_splits > 1 ? reinterpret_cast<float*>(base + layout.partial_lse_offset) : nullptr;
  params.partial_out =
      num_splits > 1 ? reinterpret_cast<float*>(base + layout.partial_out_offset) : nullptr;

  if (head_dim == 64) {
    LaunchDecode<64>(params, cta, stream);
  } else {
    LaunchDecode<128>(params, cta, stream);
  }
}

void DecodeAttention(const bf16* q, int64_t q_stride, int num_heads, const StepView& step,
                     int layer, const PoolView& pool, bf16* out, int64_t out_stride,
                     void* workspace, size_t workspace_bytes, cudaStream_t stream,
                     bool batch_invariant) {
  const int num_decode = step.num_seqs - step.num_prefill_seqs;
  if (num_decode <= 0) return;
  if (batch_invariant) {
    DecodeAttentionWithSplits(DecodeAttentionInvariantSplits(step.max_kv_len), kDecodeInvariantCta,
                              1, q, q_stride, nullptr, num_heads, step, layer, pool, out,
                              out_stride, workspace, workspace_bytes, RowRmsView{}, stream,
                              kDecodeInvariantSplitEntries);
    return;
  }
  const int splits = DecodeAttentionSplits(num_decode, num_heads, pool.num_kv_heads, pool.head_dim,
                                           step.max_kv_len, workspace_bytes);
  DecodeAttentionWithSplits(splits, DecodeCta::kAuto, 0, q, q_stride, nullptr, num_heads, step,
                            layer, pool, out, out_stride, workspace, workspace_bytes, RowRmsView{},
                            stream);
}

void RopeDecodeAttention(const bf16* qkv, int64_t qkv_stride, const float* rope_table,
                         int num_heads, const StepView& step, int layer, const PoolView& pool,
                         bf16* out, int64_t out_stride, void* workspace, size_t workspace_bytes,
                         const RowRmsView& norm, cudaStream_t stream, bool batch_invariant) {
  const int num_decode = step.num_seqs - step.num_prefill_seqs;
  if (num_decode <= 0) return;
  SIEVE_CHECK(rope_table != nullptr);
  if (batch_invariant) {
    DecodeAttentionWithSplits(DecodeAttentionInvariantSplits(step.max_kv_len), kDecodeInvariantCta,
                              1, qkv, qkv_stride, rope_table, num_heads, step, layer, pool, out,
                              out_stride, workspace, workspace_bytes, norm, stream,
                              kDecodeInvariantSplitEntries);
    return;
  }
  const int splits = DecodeAttentionSplits(num_decode, num_heads, pool.num_kv_heads, pool.head_dim,
                                           step.max_kv_len, workspace_bytes);
  DecodeAttentionWithSplits(splits, DecodeCta::kAuto, 0, qkv, qkv_stride, rope_table, num_heads,
                            step, layer, pool, out, out_stride, workspace, workspace_bytes, norm,
                            stream);
}

}  // namespace sieve::cuda
