// The split-K plan and CTA configuration of the paged decode attention (decode_attention.cu),
// exposed so that the tests and the benchmark can run each path on purpose. DecodeAttention
// (kernels.h) is DecodeAttentionWithSplits(DecodeAttentionSplits(...), DecodeCta::kAuto, 0, q, ...,
// nullptr, ...); RopeDecodeAttention the same with the RoPE table.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "backend/cuda/kernels.h"

namespace sieve::cuda {

// The grid's split count (flash-decoding) for the longest sequence, `max_kv_len` entries: as many
// as put one CTA on every SM when the batch is small (never more), at least 128 entries a piece,
// and pieces of at most 4096 entries so that one long sequence does not trail a large batch. Fewer
// when `workspace_bytes` cannot hold the partial results. Each sequence then uses the same rule
// with its own length, up to this count: a CUDA graph sized for max_model_len does not cut a
// sparse layer's 400 entries as if they were 8192, and a sequence of one split skips the combine.
int DecodeAttentionSplits(int num_decode_seqs, int num_heads, int num_kv_heads, int head_dim,
                          int max_kv_len, size_t workspace_bytes);

// Workspace bytes for exactly `num_splits` (DecodeAttentionWorkspaceBytes bounds this for the
// splits DecodeAttentionSplits can choose).
size_t DecodeAttentionWorkspaceBytesForSplits(int num_decode_seqs, int num_heads, int head_dim,
                                              int num_splits);

// The shape of a decode attention CTA. Wide: 4 warps, 64-entry tiles, 100 KiB of shared memory
// at d = 128, 2 CTAs per SM. Narrow: 2 warps, 32-entry tiles, 52 KiB, 4 CTAs per SM: a batch of
// up to 4 x SMs (sequence, KV head) CTAs runs in one wave where wide would need two.
enum class DecodeCta { kAuto, kWide, kNarrow };

// What kAuto resolves to: narrow when the CTAs of one split are more than one wide wave
// (2 x SMs), else wide. The split count does not enter: in a CUDA graph it is sized for the
// longest context the graph may see, not for the sequences it runs (each sequence uses its own
// count). Never returns kAuto.
DecodeCta ChooseDecodeCta(int num_decode_seqs, int num_heads, int num_kv_heads);

// Folded CTAs: a CTA may attend several KV heads of its sequence one after another, so that
// the per-CTA work before the key loop (the step metadata and page ids, the wait for the kernels
// before, the folded norm's scale, the new entries) is done once for all of them and the K/V
// pipeline runs on from one head into the next. For groups of at most this many query heads.
constexpr int kDecodeMaxFoldedGroup = 8;

// What DecodeAttention folds: the fewest KV heads a CTA (a divisor of num_kv_heads) that bring the
// CTAs of one split within one wave of `cta` (4 narrow or 2 wide CTAs an SM); 1 when they fit
// unfolded or the group is above kDecodeMaxFoldedGroup. `cta` is not kAuto. Measured against
// unfolded CTAs in README_attention.md ("Folded CTAs").
int ChooseDecodeKvHeadsPerCta(int num_decode_seqs, int num_heads, int num_kv_heads, DecodeCta cta);

// Batch invariance (DecodeAttention's `batch_invariant`; README_attention.md "Batch
// invariance"): every split holds kDecodeInvariantSplitEntries entries of its sequence (the last
// fewer), so a sequence of L entries is cut into ceil(L / that) pieces whatever the batch, by
// CTAs of the one shape kDecodeInvariantCta, unfolded; the combine merges the pieces in split
// order. A head's result then depends on its sequence's entries alone. A multiple of every CTA
// shape's tile.
constexpr int kDecodeInvariantSplitEntries = 256;
constexpr DecodeCta kDecodeInvariantCta = DecodeCta::kNarrow;
// The grid's split count for a longest sequence of `max_kv_len` entries (at least 1).
int DecodeAttentionInvariantSplits(int max_kv_len);

// DecodeAttention with a forced split count (>= 1), CTA configuration (kAuto: ChooseDecodeCta)
// and KV heads a CTA (0: ChooseDecodeKvHeadsPerCta; else a divisor of num_kv_heads, and 1 for
// groups above kDecodeMaxFoldedGroup); the workspace must hold
// DecodeAttentionWorkspaceBytesForSplits(..., num_splits) bytes. With `rope_table` set this is
// RopeDecodeAttention (kernels.h): q points at qkv rows [T][(H + 2G) d] with q and k not rotated,
// and `norm` may carry a folded RMSNorm. `split_entries` > 0 cuts every sequence into pieces of
// that many entries (a multiple of 64; num_splits must cover the longest: batch invariance)
// instead of num_splits' equal pieces.
void DecodeAttentionWithSplits(int num_splits, DecodeCta cta, int kv_heads_per_cta, const bf16* q,
                               int64_t q_stride, const float* rope_table, int num_heads,
                               const StepView& step, int layer, const PoolView& pool, bf16* out,
                               int64_t out_stride, void* workspace, size_t workspace_bytes,
                               const RowRmsView& norm, cudaStream_t stream, int split_entries = 0);

// ---- Where one launch's time goes (a diagnostic; off by default) ----
// With a trace buffer set, thread 0 of every CTA of the main kernel writes the %globaltimer (ns)
// at each phase below into row cta = blockIdx.y * gridDim.x + blockIdx.x of
// [max_ctas][kDecodeTraceSlots], plus the SM cycles of its key loop and its SM id. Every launch
// made (or captured into a graph) while it is set writes there; the last one to run wins. A
// launch with more CTAs writes only the first max_ctas. `sieve bench kernels` prints a summary
// with SIEVE_DECODE_TRACE=1 (docs/benchmarks.md). Off, each stamp is one predicated branch.
enum DecodeTraceSlot : int {
  kTraceEntry,         // the CTA starts
  kTracePagesLoaded,   // its page ids are in shared memory; early tiles are requested next
  kTraceWaitDone,      // PdlWait returned: the kernels before are done
  kTraceScaleDone,     // the row's norm scale is computed (fused RoPE with a folded norm)
  kTracePrologueDone,  // after PdlWait, the row's norm scale and the new entry's write
  kTraceLoopStart,     // q and the first tiles have arrived
  kTraceLoopEnd,       // every tile attended
  kTraceExit,          // outputs written
  kTraceLoopCycles,    // SM cycles from loop start to loop end (clock64)
  kTraceSm,            // %smid
  kDecodeTraceSlots
};
void SetDecodeAttentionTrace(uint64_t* buffer, int64_t max_ctas);
// SIEVE_DECODE_TRACE is set, non-empty and not "0": the benchmarks trace one extra call.
bool DecodeAttentionTraceRequested();
// Per phase, min / p10 / p50 / p90 / max microseconds after the first CTA's entry, and the key
// loop's median SM clock, of a trace copied to the host; "" when no CTA wrote one.
std::string SummarizeDecodeAttentionTrace(const uint64_t* trace, int64_t ctas);

}  // namespace sieve::cuda
