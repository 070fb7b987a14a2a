// GPU sampler (sampling_kernels.h): a thread-block cluster of kCluster blocks per logits row, no
// sort of the row. One block per row left most of the H200's 132 multiprocessors idle at decode
// batch sizes and walked 128K logits with 512 threads in every radix pass (1.25 ms a step for
// top-p at 64 rows); a cluster splits the row into kCluster contiguous chunks, and its blocks
// combine their partial results through distributed shared memory (sm_90).
//
// Passes over the row (each block reads its chunk; L2-resident after the first pass):
//   A. max, argmax (ties: lowest id) and the softmax denominator, online a quad of logits at a
//      time, for greedy and logprob. Greedy rows stop here.
//   B. (top-k or top-p only) a histogram over kBins bins of s = log2(p_best / p) =
//      (best - x) * log2(e) / T in [0, kSpan): with top-k the token counts, for top-p alone the
//      summed cut weights (RowView::CutShift: one 32-bit shared-memory atomic a token that
//      returns nothing, so the pass never waits on one). The bin is a non-decreasing function of
//      s, so each bin is a contiguous range of the (logit, lower id first) key order, bin 0 the
//      best. The top-k cut lies in the first bin where the running
//      count reaches k, the top-p cut in the first bin where the running weight (of the top-k)
//      reaches top_p of it: only that bin's keys are collected into shared memory, where the exact
//      key is selected (select::BlockRadixSelect).
//   H. (top-k, with top-p or min-p but not both) when the head, every eligible token of the bins up
//      to top-k's cut bin, holds at most kHead tokens (B's counts tell): one pass collects it,
//      the cluster sorts it, and the top-k cut, the top-p cut and the draw are positions in the
//      running sums of its sorted weights (DrawFromHead). Rows with a larger head go on to C or D.
//   C. (top-k with top-p) one pass collects top-k's cut bin and sums the weights of the bins
//      before it, which is all top-p needs. A bin of more than kGather tokens (heavy ties, flat
//      rows) is first narrowed by cluster-wide radix passes, 8 key bits a pass, until few enough
//      are left: exact on any input, only slower.
//   D. the draw: each block sums the kept weights of its chunk per tile of consecutive ids, the
//      cluster adds the block sums in rank order, one 64-bit random number picks the block, the
//      tile and, by one warp's walk, the token: inverse-CDF over the ids in increasing order. The
//      last selection, when it needs a collect, is done in this pass: it collects the cut bin's
//      keys while summing the better bins, and adds the kept keys of the bin once the cut is known
//      (top-p alone learns only here how many tokens its bin holds; over kGather, it selects the
//      long way and sums the tiles again). Min-p, and top-k alone with a larger head, draw here.
//   E. the draw of top-p (with or without top-k) when min-p is off, instead of D (DrawOverBins):
//      every bin before the top-p cut's bin is kept whole, so a uniform number over the bins' cut
//      weights picks a bin, and one pass collects that bin alone to pick the token by a weighted
//      selection (the cut's bin is cut first; a number past its cut is drawn again, from the
//      second random word). D's pass weighs every token; E's only tests each token's bin.
// Tokens with s >= kSpan have weight 0 (2^-48 * 2^40 < 1/2) and are never counted or drawn:
// leaving them out of the top-k count changes nothing that can be drawn. Min-p needs no pass of
// its own: it is a test on each token's probability ratio in D. Every weight is a 40-bit
// fixed-point integer (cut weights rounded down to 17 significant bits at vocab 128K: the kept
// set and E's draw; D's draw in full) and every sum an integer, and a selection depends only on
// the set of keys
// collected, not on their order: the kept set and the draw are reproducible bit for bit, and do
// not depend on which row or cluster a request lands in.
//
// What bounds it (H200, 64 rows, top-p 0.95; record 2026-12-02-h200-sampling-ab, whose outputs
// hold `ncu --set full` of one such launch and scripts/ncu_stalls.py of its source page): not
// memory (DRAM 9%, L2 14% of peak) but issue and latency, 30M warp instructions at 5 blocks a
// multiprocessor, 42% of issue slots busy. By stall samples: pass B ~32%, the weighted select of
// the collected bin (its barriers and warp 0's bin search) ~20%, pass D ~20%, pass A ~16%. The same
// record has the A/B that made it so, 107 -> 70 us: 5 blocks a multiprocessor (one wave for 64 rows
// instead of two), pass A a quad at a time, pass B's atomics without a return, s computed once a
// token, and the select's flush summed per warp (select::FlushWarpRuns; before it, 64-bit
// compare-and-swap loops spinning on one address held a fifth of the stall samples). Cut weights
// (RowView::CutShift: pass B's one atomic a token instead of three) then took it from 68-69 to
// 63-64 us (record 2026-12-02-h200-sampling-cut-weights-ab), and E's draw over the bins to 56-57
// us, top-k 50 + top-p 0.9 from 70-71 to 62-63 (record 2026-12-02-h200-sampling-bin-draw-ab).
// The head path (H) took top-k 50 + top-p 0.9 from 63 to 43 us and top-k 50 from 50 to 42; top-p
// alone, whose code did not change, went from 57 to 59 (the kernel's register allocation around
// the added call: 1.44 KB of spill stores for 1.34) (record 2026-12-03-h200-sampling-head-ab).
#include <cooperative_groups.h>

#include <cstdint>
#include <mutex>
#include <set>

#include "backend/cuda/block_select.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_image.h"
#include "backend/cuda/sampling_kernels.h"
#include "core/check.h"

namespace sieve::cuda {

namespace {

namespace cg = cooperative_groups;

// 8 blocks of 256 threads per row (8 is the portable cluster size): 64 rows are 512 blocks, 3.9
// a multiprocessor. At 4 blocks a multiprocessor (64 registers a thread) an H200 holds 62 such
// clusters, so 64 rows took two waves; 5 (48 registers, and the largest shared-memory carveout for
// 5 x 39 KB) hold them in one.
constexpr int kCluster = 8;
constexpr int kThreads = 256;
constexpr int kBlocksPerSm = 5;

// Thread-block clusters are sm_90's: the device code below is compiled for sm_90 and up only; on
// older targets the kernel traps, and SampleTokensSupported() keeps it from launching (the
// backend samples on the host there).
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
#define SIEVE_SAMPLING_CLUSTERS 1
#else
#define SIEVE_SAMPLING_CLUSTERS 0
#endif
#if SIEVE_SAMPLING_CLUSTERS
constexpr int kWarps = kThreads / 32;
// Every pass reads quads of 4 consecutive logits (one 16-byte load where the row is aligned),
// kQuadsInFlight of them per thread before using any: 64 bytes a thread in flight, so that the
// loads' round trips overlap.
constexpr int kQuadsInFlight = 4;

// Pass B: kBins bins of width kSpan / kBins = 3/64 in s = log2(p_best / p). The benchmark's 128K
// logits, spread over 22 units of s, are ~280 a bin; real logits are sparser near the head.
constexpr int kBins = 1024;
constexpr float kSpan = 48.0f;
constexpr float kBinsPerUnit = kBins / kSpan;
constexpr float kLog2e = 1.44269504088896340736f;
// Bins from this one on hold weightless tokens only: s >= 42.04 there, and 2^-42.04 * 2^40 < 1/2.
constexpr int kWeightlessBin = static_cast<int>(42.0f * kBinsPerUnit) + 1;
// The most keys one bin may hold to be collected (C) without narrowing it first.
constexpr int kGather = 2048;
// The most keys a top-k row's head may hold to be sorted whole (DrawFromHead): two a thread of
// the block that sums them (BlockFindCrossing<kHead>), in the upper half of its collect buffer.
constexpr int kHead = 512;
static_assert(kHead <= 2 * kThreads && 2 * kHead <= kGather);
// The draw's tiles per block: a chunk is cut into at most kMaxTiles tiles of a multiple of
// kTileMin ids (a warp's 32 lanes x kQuadsInFlight quads).
constexpr int kMaxTiles = 256;
constexpr int kTileMin = 32 * 4 * kQuadsInFlight;
// Chunks start at multiples of this many ids (whole quads, whole 128-byte lines).
constexpr int kChunkAlign = 128;

constexpr float kWeightScale = 1099511627776.0f;  // 2^40: the draw weighs round(p / p_best * 2^40)

// Online softmax state of a set of logits: its max, the lowest id holding it, and the sum of
// exp(x - max). Combining is exact for the max and argmax, so greedy is the true argmax.
struct SoftmaxState {
  float max;
  float sum;
  int argmax;  // INT32_MAX: empty
};

struct SampleSmem {
  select::RadixSelectSmem radix;
  unsigned int hist_count[kBins];              // B: this block's, then the cluster's
  unsigned long long hist_weight[kBins];       //
  unsigned int digit_count[256];               // the radix passes narrowing a large bin
  unsigned long long digit_weight[256];        //
  unsigned int slice_count[kBins / kCluster];  // the cluster's totals of this block's bin slice
  unsigned long long slice_weight[kBins / kCluster];
  unsigned long long buffer[kGather];  // collected keys (C)
  unsigned long long tile_weight[kMaxTiles];
  unsigned long long warp_u64[kWarps];
  SoftmaxState warp_state[kWarps];
  SoftmaxState block_state;         // this block's chunk (read by the cluster)
  SoftmaxState row_state;           // the whole row
  unsigned long long block_weight;  // kept weight of this block's chunk (read by the cluster)
  unsigned long long found_before;
  int found_position;
  int own_count;  // keys this block collected into buffer[0, own_count) (read by the cluster)
};

__device__ inline SoftmaxState Combine(const SoftmaxState& a, const SoftmaxState& b) {
  if (a.argmax == INT32_MAX) return b;
  if (b.argmax == INT32_MAX) return a;
  const float max = fmaxf(a.max, b.max);
  SoftmaxState out;
  out.max = max;
  out.sum = a.sum * exp2f((a.max - max) * kLog2e) + b.sum * exp2f((b.max - max) * kLog2e);
  out.argmax = a.max > b.max ? a.argmax : (b.max > a.max ? b.argmax : min(a.argmax, b.argmax));
  return out;
}

__device__ inline SoftmaxState ShuffleXor(const SoftmaxState& state, int offset) {
  return {__shfl_xor_sync(0xffffffffu, state.max, offset),
          __shfl_xor_sync(0xffffffffu, state.sum, offset),
          __shfl_xor_sync(0xffffffffu, state.argmax, offset)};
}

// Fixed-order block sum: lane 0's butterfly result of each warp, then the warps in order. Every
// thread returns the same value.
__device__ inline unsigned long long BlockSumU64(unsigned long long value, SampleSmem& smem) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    value += __shfl_xor_sync(0xffffffffu, value, offset);
  }
  if (threadIdx.x % 32 == 0) smem.warp_u64[threadIdx.x / 32] = value;
  __syncthreads();
  unsigned long long total = 0;
  for (int warp = 0; warp < kWarps; ++warp) total += smem.warp_u64[warp];
  __syncthreads();
  return total;
}

__device__ inline unsigned long long BlockMinU64(unsigned long long value, SampleSmem& smem) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    value = min(value, __shfl_xor_sync(0xffffffffu, value, offset));
  }
  if (threadIdx.x % 32 == 0) smem.warp_u64[threadIdx.x / 32] = value;
  __syncthreads();
  unsigned long long lowest = smem.warp_u64[0];
  for (int warp = 1; warp < kWarps; ++warp) lowest = min(lowest, smem.warp_u64[warp]);
  __syncthreads();
  return lowest;
}

// The inverse of select::OrderedBits: the logit a key was built from (-0.0 comes back as +0.0,
// which every function here treats alike).
__device__ inline float ValueOfKey(unsigned long long key) {
  const uint32_t ordered = static_cast<uint32_t>(key >> 32);
  return __uint_as_float((ordered & 0x80000000u) != 0 ? (ordered & 0x7fffffffu) : ~ordered);
}

__device__ inline unsigned long long KeyOf(int id, float value) {
  return select::CompositeKey(select::OrderedBits(value), static_cast<uint32_t>(id));
}

// Eligible tokens (s < kSpan) and their bin; bins are non-increasing in the logit.
__device__ inline bool Eligible(float s) { return s < kSpan; }
__device__ inline int BinOf(float s) { return min(kBins - 1, static_cast<int>(s * kBinsPerUnit)); }

// One row as a block of its cluster sees it. The explicitly rounded operations keep the compiler
// from contracting them differently at different call sites: every pass must see the same
// weights and bins for the same logit.
template <bool kAligned>  // 16-byte aligned rows, vocab % 4 == 0: quads are single whole loads
struct RowView {
  const float* x;  // the row's logits
  int lo, hi;      // this block's chunk [lo, hi)
  float best;
  float scale;   // log2(e) / T
  int cut_bits;  // a cut weight's mantissa is at most 2^cut_bits (CutShift)

  // s = log(p_best / p) = (best - x) / T >= 0; NaN for a NaN logit (never eligible).
  __device__ float Scaled(float value) const {
    return value == best ? 0.0f : __fmul_rn(__fsub_rn(best, value), scale);
  }
  // p / p_best = exp((x - best) / T) = 2^-s, from s = Scaled(x): the passes that have s already
  // spare the subtraction and the product.
  // For an eligible token (0 <= s < kSpan) 2^-s is a normal float, where ex2.approx.ftz equals
  // exp2f's ex2.approx without the denormal fix-up around it; ineligible tokens' ratios are never
  // used.
  __device__ static float RatioOfScaled(float s) {
    if (s == 0.0f) return 1.0f;
    float ratio;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(ratio) : "f"(-s));
    return ratio;
  }
  // Where the kept set is decided (pass B's histogram, the weighted selections), and in E's draw,
  // an eligible token weighs its cut weight: p / p_best in fixed point (2^40 = 1) rounded down to a
  // multiple of 2^CutShift(bin), one shift for the whole bin, which leaves the mantissa (the weight
  // >> shift) at most 2^cut_bits. A chunk's mantissas then sum below 2^31 in one 32-bit counter a
  // bin: pass B adds a token with one shared-memory atomic (40-bit weights took three 14-bit
  // parts). A token keeps cut_bits significant bits (17 at vocab 128K), finer than a float
  // cumulative sum; D's draw weighs tokens in full.
  __device__ int CutShift(int bin) const {
    static_assert(kBins == 1024 && kSpan == 48.0f, "floor(bin * kSpan / kBins) below");
    return max(0, 40 - cut_bits - ((3 * bin) >> 6));  // p / p_best <= 2^-floor(bin * 3 / 64)
  }
  __device__ unsigned int CutMantissaOfScaled(float s, int bin) const {
    const float scale_up = __int_as_float((127 + 40 - CutShift(bin)) << 23);  // 2^(40 - shift)
    return __float2uint_rz(RatioOfScaled(s) * scale_up);
  }
  __device__ unsigned long long CutWeightOfScaled(float s) const {
    const int bin = BinOf(s);
    return static_cast<unsigned long long>(CutMantissaOfScaled(s, bin)) << CutShift(bin);
  }
  // D's draw weight (and the head's without top-p): p / p_best in full 40-bit fixed point, 0 below
  // min-p's ratio (min_p <= 0: none).
  __device__ static unsigned long long DrawWeightOfScaled(float s, float min_p) {
    const float ratio = RatioOfScaled(s);
    if (min_p > 0.0f && ratio < min_p) return 0;
    return __float2ull_rn(ratio * kWeightScale);
  }
  __device__ float Ratio(float value) const { return RatioOfScaled(Scaled(value)); }
  __device__ unsigned long long CutWeight(float value) const {
    return CutWeightOfScaled(Scaled(value));
  }

  // Logits [id, id + 4) (id % 4 == 0), those at or past `end` not loaded (their value unused).
  __device__ float4 LoadQuad(int id, int end) const {
    if constexpr (kAligned) return __ldg(reinterpret_cast<const float4*>(x + id));
    float4 quad;
    quad.x = __ldg(x + id);
    quad.y = id + 1 < end ? __ldg(x + id + 1) : 0.0f;
    quad.z = id + 2 < end ? __ldg(x + id + 2) : 0.0f;
    quad.w = id + 3 < end ? __ldg(x + id + 3) : 0.0f;
    return quad;
  }
  // Aligned rows end on a whole quad: no bounds to test.
  template <typename Fn>
  __device__ static void Visit(int id, int end, const float4& quad, Fn& fn) {
    fn(id, quad.x);
    if (kAligned || id + 1 < end) fn(id + 1, quad.y);
    if (kAligned || id + 2 < end) fn(id + 2, quad.z);
    if (kAligned || id + 3 < end) fn(id + 3, quad.w);
  }
  // Calls quad_fn(id, quad) for the quads starting at first, first + kStep, first + 2 kStep, ...
  // below `end` (first and kStep multiples of 4), kQuadsInFlight quads loaded before any is used.
  // The quads are not visited in increasing order: callers may not depend on it.
  template <int kStep, typename QuadFn>
  __device__ void ForWholeQuads(int first, int end, QuadFn quad_fn) const {
    int id = first;
    for (; id + (kQuadsInFlight - 1) * kStep < end; id += kQuadsInFlight * kStep) {
      float4 quads[kQuadsInFlight];
#pragma unroll
      for (int u = 0; u < kQuadsInFlight; ++u) quads[u] = LoadQuad(id + u * kStep, end);
#pragma unroll
      for (int u = 0; u < kQuadsInFlight; ++u) quad_fn(id + u * kStep, quads[u]);
    }
    for (; id < end; id += kStep) quad_fn(id, LoadQuad(id, end));
  }
  // Calls fn(id, x[id]) for the ids below `end` of those quads, a logit at a time.
  template <int kStep, typename Fn>
  __device__ void ForQuads(int first, int end, Fn fn) const {
    ForWholeQuads<kStep>(first, end, [&](int id, const float4& quad) { Visit(id, end, quad, fn); });
  }
  // Calls fn(id, x[id]) for every id of this block's chunk.
  template <typename Fn>
  __device__ void ForChunk(Fn fn) const {
    ForQuads<4 * kThreads>(lo + 4 * static_cast<int>(threadIdx.x), hi, fn);
  }
  // Calls fn(id, quad) for the quads of this block's chunk, a whole quad at a time, ids at or past
  // hi set to -inf (a masked token).
  template <typename Fn>
  __device__ void ForChunkQuads(Fn fn) const {
    ForWholeQuads<4 * kThreads>(lo + 4 * static_cast<int>(threadIdx.x), hi,
                                [&](int id, float4 quad) {
                                  if (!kAligned) {
                                    if (id + 1 >= hi) quad.y = -INFINITY;
                                    if (id + 2 >= hi) quad.z = -INFINITY;
                                    if (id + 3 >= hi) quad.w = -INFINITY;
                                  }
                                  fn(id, quad);
                                });
  }
};

// Positions 0..N-1 of values value_at(p): the first position at which the running sum reaches
// `target` and the sum of the positions before it; position N (before = total) when the total
// is below it. Every thread gets the same answer.
struct Crossing {
  int position;
  unsigned long long before;
  unsigned long long total;
};
template <int N, typename ValueAt>
__device__ Crossing BlockFindCrossing(ValueAt value_at, unsigned long long target,
                                      SampleSmem& smem) {
  static_assert(N % kThreads == 0);
  constexpr int kPer = N / kThreads;
  const int tid = static_cast<int>(threadIdx.x), lane = tid % 32, warp = tid / 32;
  unsigned long long values[kPer];
  unsigned long long own = 0;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    values[i] = value_at(tid * kPer + i);
    own += values[i];
  }
  unsigned long long inclusive = own;
#pragma unroll
  for (int offset = 1; offset < 32; offset <<= 1) {
    const unsigned long long other = __shfl_up_sync(0xffffffffu, inclusive, offset);
    if (lane >= offset) inclusive += other;
  }
  if (lane == 31) smem.warp_u64[warp] = inclusive;
  __syncthreads();
  unsigned long long ahead = 0, total = 0;
  for (int other = 0; other < kWarps; ++other) {
    if (other < warp) ahead += smem.warp_u64[other];
    total += smem.warp_u64[other];
  }
  const unsigned long long exclusive = ahead + inclusive - own;
  if (tid == 0) {
    smem.found_position = N;
    smem.found_before = total;
  }
  __syncthreads();
  // The intervals (exclusive, exclusive + own] are disjoint: at most one thread writes.
  if (exclusive < target && exclusive + own >= target) {
    unsigned long long running = exclusive;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      if (running + values[i] >= target) {
        smem.found_position = tid * kPer + i;
        smem.found_before = running;
        break;
      }
      running += values[i];
    }
  }
  __syncthreads();
  const Crossing crossing{smem.found_position, smem.found_before, total};
  __syncthreads();
  return crossing;
}

// Makes every block's counts[0, N) (kCounts) and weights[0, N) (arrays of SampleSmem) the
// cluster's sums of them. Block r adds up slice r of the bins from all blocks, then every block
// copies all slices: each remote value is read twice in all, not kCluster times. Other blocks may
// still read this block's slices when it returns: the next cluster.sync (every path has one
// before the slices are rewritten or the block exits) orders that.
template <int N, bool kCounts>
__device__ void ClusterReduceHistogram(unsigned int* counts, unsigned long long* weights,
                                       SampleSmem& smem, cg::cluster_group& cluster) {
  constexpr int kSlice = N / kCluster;
  static_assert(kSlice <= kBins / kCluster);
  const int tid = static_cast<int>(threadIdx.x);
  const int rank = static_cast<int>(cluster.block_rank());
  cluster.sync();  // every block's own histogram is complete
  for (int i = tid; i < kSlice; i += kThreads) {
    const int bin = rank * kSlice + i;
    unsigned int count = 0;
    unsigned long long weight = 0;
#pragma unroll
    for (int other = 0; other < kCluster; ++other) {
      if constexpr (kCounts) count += cluster.map_shared_rank(counts, other)[bin];
      weight += cluster.map_shared_rank(weights, other)[bin];
    }
    smem.slice_count[i] = count;
    smem.slice_weight[i] = weight;
  }
  cluster.sync();  // every slice is complete, and no block reads the own histograms any more
  for (int bin = tid; bin < N; bin += kThreads) {
    const int owner = bin / kSlice;
    if constexpr (kCounts)
      counts[bin] = cluster.map_shared_rank(smem.slice_count, owner)[bin % kSlice];
    weights[bin] = cluster.map_shared_rank(smem.slice_weight, owner)[bin % kSlice];
  }
  __syncthreads();
}

// A pass adds its tokens' cut-weight mantissas (RowView::CutShift) with one 32-bit atomic a token
// into the first kBins words of smem.hist_weight (the collect buffer may be in use); this turns
// them into the bins' 64-bit cut weights in place. Every thread calls it after the pass.
template <typename Row>
__device__ void SpreadMantissas(const Row& row, SampleSmem& smem) {
  constexpr int kPer = kBins / kThreads;
  const int tid = static_cast<int>(threadIdx.x);
  const unsigned int* mantissas = reinterpret_cast<const unsigned int*>(smem.hist_weight);
  unsigned int own[kPer];
  __syncthreads();  // the pass's atomics are done
#pragma unroll
  for (int i = 0; i < kPer; ++i) own[i] = mantissas[tid + i * kThreads];
  __syncthreads();  // every mantissa read before the weights overwrite them
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int bin = tid + i * kThreads;
    smem.hist_weight[bin] = static_cast<unsigned long long>(own[i]) << row.CutShift(bin);
  }
}

// Shares the keys every block appended to its buffer[0, own_count) (at most kGather in all, the
// caller knows how many): every block's buffer gets all of them, its own first, in an order that
// varies from run to run; what is computed from them depends only on the set. Returns their
// number.
// `appended` (optional) gets how many keys were appended in all, kGather or more meaning that some
// did not fit (then the buffers hold only some of them).
__device__ int ClusterShareCollected(SampleSmem& smem, cg::cluster_group& cluster,
                                     int* appended = nullptr) {
  const int tid = static_cast<int>(threadIdx.x);
  const int rank = static_cast<int>(cluster.block_rank());
  cluster.sync();  // every block's own keys are in place
  int total = min(smem.own_count, kGather);
  int all = smem.own_count;
  for (int other = 0; other < kCluster; ++other) {
    if (other == rank) continue;
    const SampleSmem* remote = cluster.map_shared_rank(&smem, other);
    const int own_count = remote->own_count;
    all += own_count;
    const int count = min(min(own_count, kGather), kGather - total);
    for (int i = tid; i < count; i += kThreads) smem.buffer[total + i] = remote->buffer[i];
    total += count;
  }
  cluster.sync();  // every block has copied: buffers and own counts may be rewritten
  if (appended != nullptr) *appended = all;
  return total;
}

// Appends one key to this block's part of the collection. own_count must have been zeroed (and
// a barrier passed) before.
__device__ inline void CollectOwn(unsigned long long key, SampleSmem& smem) {
  const int slot = atomicAdd(&smem.own_count, 1);
  if (slot < kGather) smem.buffer[slot] = key;
}

// Collects the keys of the row's tokens for which pred(id, value) holds into every block's buffer
// (ClusterShareCollected).
template <typename Row, typename Pred>
__device__ int ClusterCollect(const Row& row, Pred pred, SampleSmem& smem,
                              cg::cluster_group& cluster) {
  if (threadIdx.x == 0) smem.own_count = 0;
  __syncthreads();
  row.ForChunk([&](int id, float value) {
    if (pred(id, value)) CollectOwn(KeyOf(id, value), smem);
  });
  return ClusterShareCollected(smem, cluster);
}

// select::BlockRadixSelect's threshold may be a key prefix with zero low bits, below the selected
// key: right where every key is a candidate, too low where the candidates are one bin of the row
// (tokens of worse bins can share the prefix). The smallest collected key >= it is the exact cut.
// Every thread gets it.
template <bool kWeighted, typename WeightAt>
__device__ unsigned long long SelectCollected(int count, unsigned long long cut,
                                              unsigned long long target, WeightAt weight_at,
                                              SampleSmem& smem) {
  const unsigned long long* buffer = smem.buffer;
  const unsigned long long threshold = select::BlockRadixSelect<kThreads, kWeighted>(
      count, cut, target, [buffer](int i) { return buffer[i]; }, weight_at, smem.radix);
  unsigned long long lowest = ~0ull;
  for (int i = static_cast<int>(threadIdx.x); i < count; i += kThreads) {
    if (buffer[i] >= threshold) lowest = min(lowest, buffer[i]);
  }
  return BlockMinU64(lowest, smem);
}

struct Selected {
  unsigned long long cut;     // the threshold key
  unsigned long long weight;  // the summed weight of the candidates with key >= cut
};

// Among the row's candidates (pred; `count` of them), the threshold key t such that, walking
// keys from the largest down, exactly `target` keys are >= t (kWeighted = false), or the running
// weight first reaches `target` at t (kWeighted = true). Preconditions as
// select::BlockRadixSelect's. More than kGather candidates are narrowed by cluster-wide radix
// passes over the next 8 key bits first.
template <bool kWeighted, typename Row, typename Pred>
__device__ Selected ClusterSelect(const Row& row, Pred pred, int count, unsigned long long target,
                                  SampleSmem& smem, cg::cluster_group& cluster) {
  const int tid = static_cast<int>(threadIdx.x);
  unsigned long long prefix = 0, mask = 0, weight_above = 0;
  for (int shift = 56; count > kGather && shift >= 0; shift -= 8) {
    for (int digit = tid; digit < 256; digit += kThreads) {
      smem.digit_count[digit] = 0;
      smem.digit_weight[digit] = 0;
    }
    __syncthreads();
    row.ForChunk([&](int id, float value) {
      if (!pred(id, value)) return;
      const unsigned long long key = KeyOf(id, value);
      if ((key & mask) != prefix) return;
      const int digit = static_cast<int>((key >> shift) & 0xff);
      atomicAdd(&smem.digit_count[digit], 1u);
      select::AtomicAddSharedU64(&smem.digit_weight[digit], row.CutWeight(value));
    });
    ClusterReduceHistogram<256, true>(smem.digit_count, smem.digit_weight, smem, cluster);
    // Position p is digit 255 - p: best first.
    const Crossing crossing = BlockFindCrossing<256>(
        [&smem](int p) -> unsigned long long {
          return kWeighted ? smem.digit_weight[255 - p] : smem.digit_count[255 - p];
        },
        target, smem);
    const int digit = 255 - min(crossing.position, 255);
    weight_above += BlockSumU64(tid > digit ? smem.digit_weight[tid] : 0ull, smem);
    target -= crossing.before;
    count = static_cast<int>(smem.digit_count[digit]);
    prefix |= static_cast<unsigned long long>(digit) << shift;
    mask |= 0xffull << shift;
    __syncthreads();  // digit_count[digit] read before the next pass clears it
  }
  const int collected = ClusterCollect(
      row,
      [&](int id, float value) { return pred(id, value) && (KeyOf(id, value) & mask) == prefix; },
      smem, cluster);
  const unsigned long long* buffer = smem.buffer;
  const auto weight_at = [buffer, &row](int i) { return row.CutWeight(ValueOfKey(buffer[i])); };
  const unsigned long long cut = SelectCollected<kWeighted>(collected, 0, target, weight_at, smem);

  unsigned long long kept = 0;
  for (int i = tid; i < collected; i += kThreads) {
    if (buffer[i] >= cut) kept += weight_at(i);
  }
  return {cut, weight_above + BlockSumU64(kept, smem)};
}

// E. the draw of top-p (with or without top-k) when min-p is off, over the bins instead of the
// ids. The kept set is every key of the bins before `bin` (their cut weights sum to `before`)
// and the keys of `bin` from its top-p cut up (the cut leaves `target` of its weight to reach).
// A uniform u in [0, before + W) is drawn, W the bin's weight before its cut (its kept weight
// when its keys are collected already, `collected`): u < before falls in a whole bin, which one
// pass collects to find the token; otherwise one pass collects `bin`, which gives its cut and
// kept weight K, and u - before < K is the token, else (probability (W - K) / (before + W)) u is
// drawn again in [0, before + K), from the second random word. Every token's chance is its cut
// weight over the kept total, as D's inverse CDF over the ids gives with full weights. The token
// within a bin is the key at which the running weight, keys from the largest down, first passes
// the remainder: a weighted selection. Returns the token.
// Not inlined, and its arguments by value, not by reference: a first version that took the row's
// view and the knobs by reference (their addresses taken, so possibly in local memory, where the
// passes before it read the view in their loops) slowed every mode at 64 rows, greedy from 15 to
// 19 us (record 2026-12-02-h200-sampling-bin-draw-ab, by_reference_version.txt).
template <typename Row, typename KeptWeight>
__device__ __noinline__ int DrawOverBins(const Row row, uint64_t seed, uint64_t offset,
                                         KeptWeight kept_weight, unsigned long long before, int bin,
                                         unsigned long long target, unsigned long long top_k_cut,
                                         bool collected, int collected_count, SampleSmem& smem,
                                         cg::cluster_group cluster) {
  const unsigned long long* buffer = smem.buffer;
  const auto weight_at = [buffer, &row](int i) { return row.CutWeight(ValueOfKey(buffer[i])); };
  const auto id_of_key = [](unsigned long long key) {
    return static_cast<int>(0xffffffffu - static_cast<uint32_t>(key));
  };
  // The key of bin b's candidates (key >= floor) at which the running weight passes `remainder`.
  const auto token_in_bin = [&](int b, unsigned long long floor, unsigned long long remainder) {
    const auto in_bin = [&row, b, floor](int id, float value) {
      const float s = row.Scaled(value);
      return Eligible(s) && BinOf(s) == b && KeyOf(id, value) >= floor;
    };
    if (threadIdx.x == 0) smem.own_count = 0;
    __syncthreads();
    row.ForChunk([&](int id, float value) {
      if (in_bin(id, value)) CollectOwn(KeyOf(id, value), smem);
    });
    int appended = 0;
    const int count = ClusterShareCollected(smem, cluster, &appended);
    if (appended <= kGather) {
      return id_of_key(SelectCollected<true>(count, floor, remainder + 1, weight_at, smem));
    }
    return id_of_key(ClusterSelect<true>(row, in_bin, appended, remainder + 1, smem, cluster).cut);
  };
  // A whole bin before `bin`: the crossing of u + 1 over the bins' weights.
  const auto token_before = [&](unsigned long long u) {
    const Crossing whole = BlockFindCrossing<kBins>(kept_weight, u + 1, smem);
    return token_in_bin(whole.position, top_k_cut, u - whole.before);
  };
  // Bin `bin`'s top-p cut among `count` collected keys, and the weight kept from it on.
  const auto cut_collected = [&](int count, unsigned long long* kept) {
    const unsigned long long cut = SelectCollected<true>(count, top_k_cut, target, weight_at, smem);
    unsigned long long sum = 0;
    for (int i = static_cast<int>(threadIdx.x); i < count; i += kThreads) {
      if (buffer[i] >= cut) sum += weight_at(i);
    }
    *kept = BlockSumU64(sum, smem);
    return cut;
  };

  if (collected) {  // top-k's cut bin, in every buffer already: its cut and K first
    unsigned long long kept = 0;
    const unsigned long long cut = cut_collected(collected_count, &kept);
    const unsigned long long u = __umul64hi(SampleRandomBits(seed, offset), before + kept);
    if (u < before) return token_before(u);
    return id_of_key(SelectCollected<true>(collected_count, cut, u - before + 1, weight_at, smem));
  }
  const unsigned long long u =
      __umul64hi(SampleRandomBits(seed, offset), before + kept_weight(bin));
  if (u < before) return token_before(u);
  // u is in `bin`: collect it (top-k's candidates only), cut it, and take u there if it is kept.
  const auto in_cut_bin = [&row, bin, top_k_cut](int id, float value) {
    const float s = row.Scaled(value);
    return Eligible(s) && BinOf(s) == bin && KeyOf(id, value) >= top_k_cut;
  };
  if (threadIdx.x == 0) smem.own_count = 0;
  __syncthreads();
  row.ForChunk([&](int id, float value) {
    if (in_cut_bin(id, value)) CollectOwn(KeyOf(id, value), smem);
  });
  int appended = 0;
  const int count = ClusterShareCollected(smem, cluster, &appended);
  unsigned long long cut = 0, kept = 0;
  if (appended <= kGather) {
    cut = cut_collected(count, &kept);
  } else {
    const Selected selected = ClusterSelect<true>(row, in_cut_bin, appended, target, smem, cluster);
    cut = selected.cut;
    kept = selected.weight;
  }
  unsigned long long again = u - before;
  if (again >= kept) {  // u fell past the cut: draw again over the kept set, now known
    again = __umul64hi(SampleRandomBits(seed, offset, true), before + kept);
    if (again < before) return token_before(again);
    again -= before;
  }
  if (appended <= kGather) {  // the buffer still holds the bin
    return id_of_key(SelectCollected<true>(count, cut, again + 1, weight_at, smem));
  }
  return token_in_bin(bin, cut, again);
}

// The draw of a top-k row (with top-p, or min-p, but not both) from its head: the eligible tokens
// of the bins up to top-k's cut bin `last_bin`, all of them (B's counts said how many: at most
// kHead). One pass collects them (ClusterShareCollected: every block gets all); the cluster sorts
// them, best first, each block placing its own keys (a warp a key: its position is the number of
// keys above it) in block 0's buffer; there the top-k cut is a position, and the top-p cut and the
// drawn token are where a running sum of the sorted weights reaches a target (BlockFindCrossing),
// where the general path takes a radix selection for each (C, E, D). Weights are E's cut weights
// with top-p (the kept set is decided on them) and D's full ones (min-p applied) without; the draw
// is the first position whose running weight passes a uniform u below the kept total: each kept
// token's chance is its weight over that total, as on the general path. Returns the token in block
// 0, -1 in the others, which may exit then.
template <typename Row>
__device__ __noinline__ int DrawFromHead(const Row row, int last_bin, int top_k, float top_p,
                                         float min_p, uint64_t seed, uint64_t offset,
                                         SampleSmem& smem, cg::cluster_group cluster) {
  const int tid = static_cast<int>(threadIdx.x), lane = tid % 32, warp = tid / 32;
  if (tid == 0) smem.own_count = 0;
  __syncthreads();
  row.ForChunk([&](int id, float value) {
    const float s = row.Scaled(value);
    if (Eligible(s) && BinOf(s) <= last_bin) CollectOwn(KeyOf(id, value), smem);
  });
  const int count = ClusterShareCollected(smem, cluster);  // <= kHead: no key left out
  // Each block places its own keys, buffer[0, own_count); the buffers' orders differ.
  unsigned long long* sorted = cluster.map_shared_rank(&smem, 0)->buffer + kHead;
  const int own = smem.own_count;
  const unsigned long long* keys = smem.buffer;
  for (int i = warp; i < own; i += kWarps) {
    const unsigned long long key = keys[i];
    unsigned int above = 0;
    for (int j = lane; j < count; j += 32) above += keys[j] > key ? 1u : 0u;
    above = __reduce_add_sync(0xffffffffu, above);
    if (lane == 0) sorted[above] = key;
  }
  cluster.sync();  // block 0 holds the sorted head; the others are done
  if (cluster.block_rank() != 0) return -1;

  // Block 0: the weights of the sorted keys, the first `kept` of them (0 past those).
  const unsigned long long* best_first = smem.buffer + kHead;
  const auto weights_of_first = [&row, best_first, top_p, min_p](int kept) {
    return [&row, best_first, top_p, min_p, kept](int position) -> unsigned long long {
      if (position >= kept) return 0;
      const float value = ValueOfKey(best_first[position]);
      return top_p < 1.0f ? row.CutWeight(value)
                          : Row::DrawWeightOfScaled(row.Scaled(value), min_p);
    };
  };
  const auto total_of_first = [&](int kept) {
    const auto weight_at = weights_of_first(kept);
    unsigned long long sum = 0;
    for (int position = tid; position < kept; position += kThreads) sum += weight_at(position);
    return BlockSumU64(sum, smem);
  };
  // The head holds top-k's cut bin whole, so at least top_k tokens.
  int kept = min(top_k, count);
  if (top_p < 1.0f) {
    const unsigned long long total = total_of_first(kept);
    const double wanted = ceil(static_cast<double>(top_p) * static_cast<double>(total));
    unsigned long long target = wanted < 1.0 ? 1ull : static_cast<unsigned long long>(wanted);
    if (target > total) target = total;
    kept = BlockFindCrossing<kHead>(weights_of_first(kept), target, smem).position + 1;
  }
  // The best token weighs 2^40 (its ratio is 1, min-p <= 1 keeps it): the total is positive.
  const unsigned long long u = __umul64hi(SampleRandomBits(seed, offset), total_of_first(kept));
  const int drawn = BlockFindCrossing<kHead>(weights_of_first(kept), u + 1, smem).position;
  return static_cast<int>(0xffffffffu - static_cast<uint32_t>(best_first[drawn]));
}

#endif  // SIEVE_SAMPLING_CLUSTERS

template <bool kAligned>
__global__ __cluster_dims__(kCluster, 1, 1)
    __launch_bounds__(kThreads, kBlocksPerSm) void SampleTokensKernel(
        const float* __restrict__ logits,              // [rows][vocab]
        int vocab,                                     //
        const SamplingRowParams* __restrict__ params,  // [rows]
        int32_t* __restrict__ out_tokens,              // [rows]
        float* __restrict__ out_logprob) {             // [rows] or null
#if !SIEVE_SAMPLING_CLUSTERS
  __trap();
#else
  __shared__ SampleSmem shared;
  SampleSmem& smem = shared;  // a reference: lambdas cannot capture a __shared__ variable
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
  const int row_index = static_cast<int>(blockIdx.x) / kCluster;
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid % 32, warp = tid / 32;
  const float* x = logits + static_cast<int64_t>(row_index) * vocab;
  const SamplingRowParams knobs = params[row_index];
  // Contiguous chunks starting at multiples of kChunkAlign ids.
  const int chunk = (vocab + kCluster * kChunkAlign - 1) / (kCluster * kChunkAlign) * kChunkAlign;
  // chunk < 2^(32 - clz(chunk)), so a chunk's cut-weight mantissas sum below 2^31.
  const int cut_bits = __clz(chunk) - 1;
  RowView<kAligned> row{
      x, min(vocab, rank * chunk), min(vocab, (rank + 1) * chunk), 0.0f, 0.0f, cut_bits};

  // A. max, argmax and sum of exp(x - max) of the raw logits.
  // A quad at a time: its max first, so that the running max moves (and the sum is rescaled) at
  // most once a quad and the four terms are independent, without a branch a logit.
  SoftmaxState state{-INFINITY, 0.0f, INT32_MAX};
  row.ForChunkQuads([&](int id, float4 quad) {
    const float quad_max = fmaxf(fmaxf(quad.x, quad.y), fmaxf(quad.z, quad.w));
    if (quad_max == -INFINITY) return;  // masked tokens only: no mass, and never the argmax
    if (quad_max > state.max) {  // also the first finite quad: the max starts at -inf, sum at 0
      state.sum *= exp2f((state.max - quad_max) * kLog2e);
      state.max = quad_max;
      state.argmax = INT32_MAX;
    }
    // A masked token adds exp2(-inf) = 0; a NaN makes the sum NaN, as it would the softmax.
    state.sum += (exp2f((quad.x - state.max) * kLog2e) + exp2f((quad.y - state.max) * kLog2e)) +
                 (exp2f((quad.z - state.max) * kLog2e) + exp2f((quad.w - state.max) * kLog2e));
    // Quads do not visit ids in increasing order: ties go to the lowest id explicitly.
    if (quad_max == state.max) {
      const int first = quad.x == quad_max   ? id
                        : quad.y == quad_max ? id + 1
                        : quad.z == quad_max ? id + 2
                                             : id + 3;
      state.argmax = min(state.argmax, first);
    }
  });
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) state = Combine(state, ShuffleXor(state, offset));
  if (lane == 0) smem.warp_state[warp] = state;
  __syncthreads();
  if (tid == 0) {
    SoftmaxState block = smem.warp_state[0];
    for (int other = 1; other < kWarps; ++other) block = Combine(block, smem.warp_state[other]);
    smem.block_state = block;
  }
  cluster.sync();
  if (tid == 0) {
    // Rank order: every block combines the same states in the same order.
    SoftmaxState total = cluster.map_shared_rank(&smem, 0)->block_state;
    for (int other = 1; other < kCluster; ++other) {
      total = Combine(total, cluster.map_shared_rank(&smem, other)->block_state);
    }
    smem.row_state = total;
  }
  __syncthreads();
  const SoftmaxState total = smem.row_state;
  // A row of -inf only (nothing can be sampled) falls back to token 0.
  const int argmax = total.argmax == INT32_MAX ? 0 : total.argmax;
  const float log_denominator = total.max + logf(total.sum);
  const auto finish = [&](int token) {
    out_tokens[row_index] = token;
    if (out_logprob != nullptr) out_logprob[row_index] = x[token] - log_denominator;
  };

  if (!(knobs.temperature > 0.0f) || total.argmax == INT32_MAX) {
    cluster.sync();  // no block exits while another reads its block_state
    if (rank == 0 && tid == 0) finish(argmax);
    return;
  }
  row.best = total.max;
  row.scale = __fdiv_rn(kLog2e, knobs.temperature);

  unsigned long long cut = 0;  // the kept set: eligible keys >= cut (then min-p)
  // The last selection, when it needs one collect of at most kGather keys, is left to the draw
  // pass (D), which collects pending_bin's keys while it sums the kept weights of the better bins:
  // one pass over the row fewer.
  int pending_bin = -1;
  unsigned long long pending_target = 0;
  bool pending_weighted = false;
  const bool top_k = knobs.top_k > 0 && knobs.top_k < vocab;
  const bool top_p = knobs.top_p < 1.0f;
  if (top_k || top_p) {
    // B. the cluster's histogram of the eligible tokens over the bins of s: with top-k, counts
    // (top-p then needs the weights of the bins before top-k's cut bin only, summed while that
    // bin is collected); top-p alone, weights (how many tokens its cut bin holds is learnt when D
    // collects them).
    bool weights_ready = !top_k;  // hist_weight holds the cluster's sums for the bins < cut_bin
    // Top-p alone sums each bin's cut-weight mantissas in one 32-bit counter a bin: a chunk's sum
    // stays below 2^31 (RowView::CutShift), so the atomics need not return their old value
    // (select::AtomicAddSharedU64's must, for the carry) and the pass does not wait on them.
    unsigned int* mantissas = reinterpret_cast<unsigned int*>(smem.hist_weight);  // SpreadMantissas
    for (int bin = tid; bin < kBins; bin += kThreads) {
      smem.hist_count[bin] = 0;
      if (weights_ready) mantissas[bin] = 0;
    }
    __syncthreads();
    row.ForChunk([&](int, float value) {
      const float s = row.Scaled(value);
      if (!Eligible(s)) return;
      const int bin = BinOf(s);
      if (top_k) atomicAdd(&smem.hist_count[bin], 1u);
      if (weights_ready) atomicAdd(&mantissas[bin], row.CutMantissaOfScaled(s, bin));
    });
    if (weights_ready) SpreadMantissas(row, smem);
    if (top_k) {
      ClusterReduceHistogram<kBins, true>(smem.hist_count, smem.hist_weight, smem, cluster);
    } else {
      ClusterReduceHistogram<kBins, false>(smem.hist_count, smem.hist_weight, smem, cluster);
    }

    // Top-k: bins before cut_bin are kept whole, cut_bin from `cut` on, the rest not at all.
    int cut_bin = kBins;
    unsigned long long cut_bin_weight = 0;  // kept weight within cut_bin
    int cut_bin_kept = 0;                   // kept tokens within cut_bin
    bool cut_bin_collected = false;         // the buffer holds all of cut_bin's keys
    int cut_bin_count = 0;
    if (top_k) {
      const Crossing crossing = BlockFindCrossing<kBins>(
          [&smem](int bin) -> unsigned long long { return smem.hist_count[bin]; },
          static_cast<unsigned long long>(knobs.top_k), smem);
      // Not reached: fewer than k eligible tokens, all kept. A weightless bin: nothing from it
      // on can be drawn, so where exactly the cut falls inside it does not matter.
      if (crossing.position < kWeightlessBin) {
        cut_bin = crossing.position;
        cut_bin_count = static_cast<int>(smem.hist_count[cut_bin]);
        cut_bin_kept = static_cast<int>(knobs.top_k - crossing.before);
        const unsigned long long head = crossing.before + cut_bin_count;
        if (head <= kHead && (!top_p || knobs.min_p <= 0.0f) && knobs.min_p <= 1.0f) {
          const int token = DrawFromHead(row, cut_bin, knobs.top_k, knobs.top_p, knobs.min_p,
                                         knobs.seed, knobs.offset, smem, cluster);
          if (rank == 0 && tid == 0) finish(token);
          return;
        }
        if (!top_p && cut_bin_count <= kGather) {
          pending_bin = cut_bin;
          pending_target = static_cast<unsigned long long>(cut_bin_kept);
        } else if (cut_bin_count <= kGather) {
          // One pass: the weights of the bins before cut_bin, for top-p, and cut_bin's keys.
          unsigned int* mantissas = reinterpret_cast<unsigned int*>(smem.hist_weight);
          for (int bin = tid; bin < kBins; bin += kThreads) mantissas[bin] = 0;
          if (tid == 0) smem.own_count = 0;
          __syncthreads();
          const int bin_k = cut_bin;
          row.ForChunk([&](int id, float value) {
            const float s = row.Scaled(value);
            if (!Eligible(s)) return;
            const int bin = BinOf(s);
            if (bin < bin_k) {
              atomicAdd(&mantissas[bin], row.CutMantissaOfScaled(s, bin));
            } else if (bin == bin_k) {
              CollectOwn(KeyOf(id, value), smem);
            }
          });
          SpreadMantissas(row, smem);
          ClusterReduceHistogram<kBins, false>(smem.hist_count, smem.hist_weight, smem, cluster);
          const int collected = ClusterShareCollected(smem, cluster);
          const unsigned long long* buffer = smem.buffer;
          const auto weight_at = [buffer, &row](int i) {
            return row.CutWeight(ValueOfKey(buffer[i]));
          };
          cut = SelectCollected<false>(collected, 0, static_cast<unsigned long long>(cut_bin_kept),
                                       weight_at, smem);
          unsigned long long kept = 0;
          for (int i = tid; i < collected; i += kThreads) {
            if (buffer[i] >= cut) kept += weight_at(i);
          }
          cut_bin_weight = BlockSumU64(kept, smem);
          cut_bin_collected = true;
          weights_ready = true;
        } else {
          const int bin = cut_bin;
          const Selected selected = ClusterSelect<false>(
              row,
              [&row, bin](int, float value) {
                const float s = row.Scaled(value);
                return Eligible(s) && BinOf(s) == bin;
              },
              cut_bin_count, static_cast<unsigned long long>(cut_bin_kept), smem, cluster);
          cut = selected.cut;
          cut_bin_weight = selected.weight;
        }
      }
    }
    if (top_p && !weights_ready) {
      // The weights of the bins before cut_bin (all bins when top-k kept every eligible token).
      unsigned int* mantissas = reinterpret_cast<unsigned int*>(smem.hist_weight);
      for (int bin = tid; bin < kBins; bin += kThreads) mantissas[bin] = 0;
      __syncthreads();
      const int bin_k = cut_bin;
      row.ForChunk([&](int, float value) {
        const float s = row.Scaled(value);
        if (!Eligible(s)) return;
        const int bin = BinOf(s);
        if (bin < bin_k) atomicAdd(&mantissas[bin], row.CutMantissaOfScaled(s, bin));
      });
      SpreadMantissas(row, smem);
      ClusterReduceHistogram<kBins, false>(smem.hist_count, smem.hist_weight, smem, cluster);
    }
    if (top_p) {
      // The top-k's weight per bin, then the bin where top_p of its total is reached.
      const auto kept_weight = [&smem, cut_bin, cut_bin_weight](int bin) -> unsigned long long {
        return bin < cut_bin ? smem.hist_weight[bin] : (bin == cut_bin ? cut_bin_weight : 0ull);
      };
      unsigned long long kept_total = 0;
      for (int bin = tid; bin < kBins; bin += kThreads) kept_total += kept_weight(bin);
      kept_total = BlockSumU64(kept_total, smem);
      const double wanted =
          ceil(static_cast<double>(knobs.top_p) * static_cast<double>(kept_total));
      unsigned long long target = wanted < 1.0 ? 1ull : static_cast<unsigned long long>(wanted);
      if (target > kept_total) target = kept_total;
      const Crossing crossing = BlockFindCrossing<kBins>(kept_weight, target, smem);
      const int bin = min(crossing.position, kBins - 1);  // always reached: target <= total
      target -= crossing.before;
      if (knobs.min_p <= 0.0f) {
        // Without min-p every bin before `bin` is kept whole: draw over the bins (E), whose pass
        // collects one bin, instead of over the ids (D), whose pass weighs every token.
        const unsigned long long top_k_cut = cut;
        const int token = DrawOverBins(row, knobs.seed, knobs.offset, kept_weight, crossing.before,
                                       bin, target, top_k_cut, bin == cut_bin && cut_bin_collected,
                                       cut_bin_count, smem, cluster);
        cluster.sync();  // no block exits while another reads its shared memory
        if (rank == 0 && tid == 0) finish(token);
        return;
      }
      if (bin == cut_bin && cut_bin_collected) {
        // The top-k's cut bin is in every buffer already.
        const unsigned long long* buffer = smem.buffer;
        cut = SelectCollected<true>(
            cut_bin_count, cut, target,
            [buffer, &row](int i) { return row.CutWeight(ValueOfKey(buffer[i])); }, smem);
      } else if (bin != cut_bin && (!top_k || smem.hist_count[bin] <= kGather)) {
        // Every key of `bin` is in the top-k (better than cut_bin): collected in D. Without
        // top-k the bin's size is unknown: D falls back when it holds more than kGather.
        pending_bin = bin;
        pending_target = target;
        pending_weighted = true;
      } else {
        const unsigned long long top_k_cut = cut;
        cut = ClusterSelect<true>(
                  row,
                  [&row, bin, top_k_cut](int id, float value) {
                    const float s = row.Scaled(value);
                    return Eligible(s) && BinOf(s) == bin && KeyOf(id, value) >= top_k_cut;
                  },
                  bin == cut_bin ? cut_bin_kept : static_cast<int>(smem.hist_count[bin]), target,
                  smem, cluster)
                  .cut;
      }
    }
  }
  // Min-p keeps ratio >= min_p; above 1 (nothing passes), the host Sampler keeps the best token.
  const float min_p = fminf(knobs.min_p, 1.0f);
  if (knobs.min_p > 1.0f) {
    const unsigned long long best_key = KeyOf(argmax, total.max);
    if (best_key > cut) cut = best_key;
    pending_bin = -1;  // only the best token is kept: the selection does not matter
  }
  // The weight of a token that passed top-k and top-p, after min-p.
  // From s = row.Scaled(value), which the draw's pass has already.
  const auto min_p_weight_of_scaled = [min_p](float s) -> unsigned long long {
    return RowView<kAligned>::DrawWeightOfScaled(s, min_p);
  };
  const auto min_p_weight = [&row, &min_p_weight_of_scaled](float value) {
    return min_p_weight_of_scaled(row.Scaled(value));
  };

  // D. the draw. Tiles of `span` consecutive ids, warps taking them in turn.
  const int span = ((row.hi - row.lo + kMaxTiles - 1) / kMaxTiles + kTileMin - 1) / kTileMin *
                   kTileMin;  // 0 for an empty chunk
  const int tiles = span == 0 ? 0 : (row.hi - row.lo + span - 1) / span;
  // Each tile's kept weight; `collect`: pending_bin's keys are collected instead (added below).
  const auto sum_tiles = [&](bool collect) {
    for (int tile = warp; tile < tiles; tile += kWarps) {
      const int begin = row.lo + tile * span, end = min(row.hi, begin + span);
      unsigned long long weight = 0;
      row.template ForQuads<4 * 32>(begin + 4 * lane, end, [&](int id, float value) {
        const float s = row.Scaled(value);
        if (!Eligible(s)) return;
        if (collect) {
          const int bin = BinOf(s);
          if (bin > pending_bin) return;
          if (bin == pending_bin) {
            CollectOwn(KeyOf(id, value), smem);
            return;
          }
        } else if (KeyOf(id, value) < cut) {
          return;
        }
        weight += min_p_weight_of_scaled(s);
      });
#pragma unroll
      for (int offset = 16; offset > 0; offset >>= 1) {
        weight += __shfl_xor_sync(0xffffffffu, weight, offset);
      }
      if (lane == 0) smem.tile_weight[tile] = weight;
    }
  };
  if (pending_bin >= 0) {
    if (tid == 0) smem.own_count = 0;
    __syncthreads();
  }
  sum_tiles(pending_bin >= 0);
  if (pending_bin >= 0) {
    int appended = 0;
    const int collected = ClusterShareCollected(smem, cluster, &appended);
    if (appended <= kGather) {
      const unsigned long long* buffer = smem.buffer;
      const auto weight_at = [buffer, &row](int i) { return row.CutWeight(ValueOfKey(buffer[i])); };
      cut = pending_weighted
                ? SelectCollected<true>(collected, 0, pending_target, weight_at, smem)
                : SelectCollected<false>(collected, 0, pending_target, weight_at, smem);
      // This block's own keys of the bin, buffer[0, own_count), that made the cut.
      const int own = smem.own_count;
      for (int i = tid; i < own; i += kThreads) {
        if (buffer[i] < cut) continue;
        const int id = static_cast<int>(0xffffffffu - static_cast<uint32_t>(buffer[i]));
        const unsigned long long weight = min_p_weight(ValueOfKey(buffer[i]));
        if (weight != 0)
          select::AtomicAddSharedU64(&smem.tile_weight[(id - row.lo) / span], weight);
      }
    } else {
      // The bin held more than kGather tokens (top-p alone): select it the long way (its size
      // is known now), then sum the tiles again with the cut.
      const int bin = pending_bin;
      const auto in_bin = [&row, bin](int, float value) {
        const float s = row.Scaled(value);
        return Eligible(s) && BinOf(s) == bin;
      };
      cut = pending_weighted
                ? ClusterSelect<true>(row, in_bin, appended, pending_target, smem, cluster).cut
                : ClusterSelect<false>(row, in_bin, appended, pending_target, smem, cluster).cut;
      sum_tiles(false);
    }
  }
  // The final kept set, for the walk: as the tile sums count it.
  const auto kept_weight = [&row, cut, &min_p_weight](int id, float value) -> unsigned long long {
    if (!Eligible(row.Scaled(value)) || KeyOf(id, value) < cut) return 0;
    return min_p_weight(value);
  };
  __syncthreads();
  if (tid == 0) {
    unsigned long long block_weight = 0;
    for (int tile = 0; tile < tiles; ++tile) block_weight += smem.tile_weight[tile];
    smem.block_weight = block_weight;
  }
  cluster.sync();
  unsigned long long kept_total = 0;
  unsigned long long block_weights[kCluster];
#pragma unroll
  for (int other = 0; other < kCluster; ++other) {
    block_weights[other] = cluster.map_shared_rank(&smem, other)->block_weight;
    kept_total += block_weights[other];
  }
  cluster.sync();         // no block exits while another reads its block_weight
  if (kept_total == 0) {  // cannot happen (the best token is always kept); be safe
    if (rank == 0 && tid == 0) finish(argmax);
    return;
  }
  // Uniform in [0, kept_total): the high word of a 64 x 64-bit product, exact.
  unsigned long long remainder = __umul64hi(SampleRandomBits(knobs.seed, knobs.offset), kept_total);
  int owner = kCluster - 1;
#pragma unroll
  for (int other = 0; other < kCluster; ++other) {
    if (remainder < block_weights[other]) {
      owner = other;
      break;
    }
    remainder -= block_weights[other];
  }
  if (rank != owner || warp != 0) return;
  // Warp 0 of the owner: lane l sums tiles [l * per, (l + 1) * per), a scan finds the tile.
  constexpr int kTilesPerLane = kMaxTiles / 32;
  unsigned long long lane_weight = 0;
#pragma unroll
  for (int i = 0; i < kTilesPerLane; ++i) {
    const int tile = lane * kTilesPerLane + i;
    if (tile < tiles) lane_weight += smem.tile_weight[tile];
  }
  unsigned long long inclusive = lane_weight;
#pragma unroll
  for (int offset = 1; offset < 32; offset <<= 1) {
    const unsigned long long other = __shfl_up_sync(0xffffffffu, inclusive, offset);
    if (lane >= offset) inclusive += other;
  }
  const unsigned int passed_lanes = __ballot_sync(0xffffffffu, inclusive > remainder);
  const int owner_lane = passed_lanes != 0 ? __ffs(static_cast<int>(passed_lanes)) - 1 : 31;
  int owner_tile = 0;
  if (lane == owner_lane) {
    unsigned long long below = inclusive - lane_weight;
    owner_tile = min(tiles - 1, lane * kTilesPerLane);
    for (int i = 0; i < kTilesPerLane; ++i) {
      const int tile = lane * kTilesPerLane + i;
      if (tile >= tiles) break;
      owner_tile = tile;
      if (remainder < below + smem.tile_weight[tile]) break;
      below += smem.tile_weight[tile];
    }
    remainder -= below;
  }
  owner_tile = __shfl_sync(0xffffffffu, owner_tile, owner_lane);
  remainder = __shfl_sync(0xffffffffu, remainder, owner_lane);
  // Lane l sums ids [begin + l * per, begin + (l + 1) * per) of the tile; a scan finds the lane,
  // which walks its ids in order: the first whose running weight passes the remainder.
  const int begin = row.lo + owner_tile * span, end = min(row.hi, begin + span);
  const int per = span / 32;  // a multiple of 4
  const int lane_begin = begin + lane * per, lane_end = min(end, lane_begin + per);
  unsigned long long own = 0;
  const auto add_kept = [&](int id, float value) { own += kept_weight(id, value); };
  for (int id = lane_begin; id < lane_end; id += 4) {
    RowView<kAligned>::Visit(id, lane_end, row.LoadQuad(id, lane_end), add_kept);
  }
  unsigned long long running = own;
#pragma unroll
  for (int offset = 1; offset < 32; offset <<= 1) {
    const unsigned long long other = __shfl_up_sync(0xffffffffu, running, offset);
    if (lane >= offset) running += other;
  }
  const unsigned int passed = __ballot_sync(0xffffffffu, running > remainder);
  const int walker = passed != 0 ? __ffs(static_cast<int>(passed)) - 1 : 0;
  int token = argmax;
  if (passed != 0 && lane == walker) {
    unsigned long long below = running - own;
    for (int id = lane_begin; id < lane_end; ++id) {
      below += kept_weight(id, x[id]);
      if (below > remainder) {
        token = id;
        break;
      }
    }
  }
  token = __shfl_sync(0xffffffffu, token, walker);
  if (lane == 0) finish(token);
#endif  // SIEVE_SAMPLING_CLUSTERS
}

}  // namespace

size_t SampleTokensWorkspaceBytes(int /*rows*/, int /*vocab*/) { return 0; }

bool SampleTokensSupported() {
  // Per device: a process may drive GPUs of different kinds.
  int device = 0;
  SIEVE_CUDA_CHECK(cudaGetDevice(&device));
  int major = 0;
  SIEVE_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  return major >= 9 && LoadedImageArch() >= 900;  // device_image.h
}

namespace {

// The shared-memory carveout that lets kBlocksPerSm blocks share a multiprocessor (the driver's
// default carveout held 4), set once per device and kernel (the attribute is per device).
void ConfigureSampleKernels() {
  static std::mutex mutex;
  static std::set<int> configured;
  int device = 0;
  SIEVE_CUDA_CHECK(cudaGetDevice(&device));
  const std::lock_guard<std::mutex> lock(mutex);
  if (!configured.insert(device).second) return;
  for (const void* kernel : {reinterpret_cast<const void*>(SampleTokensKernel<true>),
                             reinterpret_cast<const void*>(SampleTokensKernel<false>)}) {
    SIEVE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                          cudaSharedmemCarveoutMaxShared));
  }
}

}  // namespace

int SampleTokensConcurrentRows() {
  ConfigureSampleKernels();
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(kCluster);
  config.blockDim = dim3(kThreads);
  int clusters = 0;
  SIEVE_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&clusters, SampleTokensKernel<true>, &config));
  return clusters;
}

void SampleTokens(const float* logits, int rows, int vocab, const SamplingRowParams* params,
                  int32_t* out_tokens, float* out_logprob, void* /*workspace*/,
                  size_t /*workspace_bytes*/, cudaStream_t stream) {
  if (rows == 0) return;
  SIEVE_CHECK(SampleTokensSupported()) << "GPU sampling needs thread-block clusters (sm_90)";
  // At the largest vocabulary (chunks of 2^18 tokens) cut weights keep 12 significant bits.
  SIEVE_CHECK(rows > 0 && vocab > 0 && vocab <= kSampleTokensMaxVocab &&
              rows <= INT32_MAX / kCluster)
      << "rows " << rows << " vocab " << vocab;
  ConfigureSampleKernels();

  // Rows start on 16 bytes when the base does and vocab % 4 == 0 (cudaMalloc gives 256).
  const bool aligned = vocab % 4 == 0 && reinterpret_cast<uintptr_t>(logits) % 16 == 0;
  if (aligned) {
    SampleTokensKernel<true>
        <<<rows * kCluster, kThreads, 0, stream>>>(logits, vocab, params, out_tokens, out_logprob);
  } else {
    SampleTokensKernel<false>
        <<<rows * kCluster, kThreads, 0, stream>>>(logits, vocab, params, out_tokens, out_logprob);
  }
  SIEVE_CUDA_CHECK_LAUNCH();
}

}  // namespace sieve::cuda
