// Block-wide exact selection for the sparsity kernels (SelectKept) and the sampler (top-k, top-p):
// an MSB-first radix select, 8 bits a pass, over 64-bit keys that the caller computes on the fly.
//
// Keys are "larger is better" and must be distinct: callers build them as
//   (OrderedBits(value) << 32) | (0xffffffff - index)
// so that a higher value wins and, among equal values, the lower index wins. The CPU reference
// breaks ties the same way (backend/cpu/cpu_sparsity_ops.cc, runtime/sampler.cc), and because the
// keys are distinct the answer is one exact threshold: the selected elements are exactly the keys
// >= it, whatever the ties. Everything is integer arithmetic, so the result does not depend on the
// order in which threads or atomics run.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

namespace sieve::cuda::select {

// Unsigned order of the result == float order of the argument. -0.0 maps to +0.0's value because
// the CPU compares them equal (they must tie, and then the lower index wins). NaN is not expected.
__host__ __device__ inline uint32_t OrderedBits(float value) {
#ifdef __CUDA_ARCH__
  uint32_t bits = __float_as_uint(value);
#else
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
#endif
  if ((bits & 0x7fffffffu) == 0) bits = 0;  // -0.0 -> +0.0
  return (bits & 0x80000000u) != 0 ? ~bits : (bits | 0x80000000u);
}

// The distinct key of element `index` with value bits `ordered` (see the file comment).
__host__ __device__ inline uint64_t CompositeKey(uint32_t ordered, uint32_t index) {
  return (static_cast<uint64_t>(ordered) << 32) | (0xffffffffu - index);
}

// Calls fn(index, load(index)) for index = first, first + kStride, ... < end, in that order,
// loading kUnroll values before using any. The passes here read whole rows of keys from global
// memory with one element per thread in flight; batching the loads divides those round trips by
// kUnroll (one 128K-logit pass of the sampler: 61 -> ~10 us on an H200).
template <int kStride, int kUnroll, typename LoadFn, typename Fn>
__device__ __forceinline__ void ForEachStrided(int first, int end, LoadFn load, Fn fn) {
  using Value = decltype(load(0));
  int index = first;
  for (; index + (kUnroll - 1) * kStride < end; index += kUnroll * kStride) {
    Value values[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) values[u] = load(index + u * kStride);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) fn(index + u * kStride, values[u]);
  }
  for (; index < end; index += kStride) fn(index, load(index));
}

// Shared memory of one block running BlockRadixSelect.
struct RadixSelectSmem {
  unsigned int count[256];       // candidates per bin of the current byte
  unsigned long long mass[256];  // their summed weights (weighted mode only)
  unsigned long long prefix;     // key bits decided so far (broadcast by warp 0)
  unsigned long long remaining;  // count or mass still to take below the decided bins
  int done;                      // the decided prefix already identifies the threshold
};

// Adds `value` to a 64-bit counter in shared memory with 32-bit atomics: sm_90's 64-bit shared
// atomicAdd is a compare-and-swap loop, which spins when many threads add to one counter (the
// weighted select's flush spun ~48 times a warp and held ~19% of the sampler's stall samples at
// 64 rows: record 2026-12-02-h200-sampling-occupancy-ab, its ncu_stalls_v3.txt). The low word wraps
// exactly once for each carry its adder sees, so the sum is exact once every adder is done (while
// it stays below 2^64).
__device__ inline void AtomicAddSharedU64(unsigned long long* counter, unsigned long long value) {
  unsigned int* words = reinterpret_cast<unsigned int*>(counter);  // little-endian: low first
  const unsigned int low = static_cast<unsigned int>(value);
  const unsigned int high = static_cast<unsigned int>(value >> 32);
  const unsigned int before = atomicAdd(words, low);
  const unsigned int carry = before > 0xffffffffu - low ? 1u : 0u;
  if (high + carry != 0) atomicAdd(words + 1, high + carry);
}

namespace internal {

template <bool kWeighted>
__device__ inline void FlushRun(RadixSelectSmem& smem, int bin, unsigned int count,
                                unsigned long long mass) {
  atomicAdd(&smem.count[bin], count);
  if constexpr (kWeighted) AtomicAddSharedU64(&smem.mass[bin], mass);
}

// The last runs of a warp's lanes (every lane calls this, converged): the runs in the bin of the
// warp's first lane that has one are summed across the warp and added once, the others alone.
// The candidates of a pass share their decided prefix, so most runs of a warp fall in one bin,
// and one atomic a warp replaces up to 32 on one address.
template <bool kWeighted>
__device__ inline void FlushWarpRuns(RadixSelectSmem& smem, int bin, unsigned int count,
                                     unsigned long long mass) {
  const unsigned int with_run = __ballot_sync(0xffffffffu, count > 0);
  if (with_run == 0) return;
  const int shared_bin = __shfl_sync(0xffffffffu, bin, __ffs(static_cast<int>(with_run)) - 1);
  const bool joins = count > 0 && bin == shared_bin;
  unsigned int warp_count = joins ? count : 0u;
  unsigned long long warp_mass = joins ? mass : 0ull;
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    warp_count += __shfl_xor_sync(0xffffffffu, warp_count, offset);
    if constexpr (kWeighted) warp_mass += __shfl_xor_sync(0xffffffffu, warp_mass, offset);
  }
  if (threadIdx.x % 32 == 0) FlushRun<kWeighted>(smem, shared_bin, warp_count, warp_mass);
  if (count > 0 && !joins) FlushRun<kWeighted>(smem, bin, count, mass);
}

// Warp 0: walks the 256 bins from the best (255) down and finds the one in which the running
// total (count, or mass when weighted) first reaches `remaining`. Lane l owns bins 255 - 8l down
// to 248 - 8l, so the lanes in order are the bins in order.
template <bool kWeighted>
__device__ inline void FindBin(RadixSelectSmem& smem, int shift, unsigned long long prefix,
                               unsigned long long remaining) {
  const int lane = static_cast<int>(threadIdx.x);
  const auto value_of = [&smem](int bin) -> unsigned long long {
    if constexpr (kWeighted) {
      return smem.mass[bin];
    } else {
      return smem.count[bin];
    }
  };
  unsigned long long lane_total = 0;
#pragma unroll
  for (int slot = 0; slot < 8; ++slot) lane_total += value_of(255 - 8 * lane - slot);
  unsigned long long inclusive = lane_total;
#pragma unroll
  for (int offset = 1; offset < 32; offset <<= 1) {
    const unsigned long long other = __shfl_up_sync(0xffffffffu, inclusive, offset);
    if (lane >= offset) inclusive += other;
  }
  const unsigned int reached = __ballot_sync(0xffffffffu, inclusive >= remaining);
  if (reached == 0) {
    // Fewer candidates (or less mass) than asked for: callers never ask for that; keeping every
    // remaining candidate is the graceful answer.
    if (lane == 0) {
      smem.prefix = prefix;
      smem.remaining = remaining;
      smem.done = 1;
    }
    return;
  }
  if (lane != __ffs(static_cast<int>(reached)) - 1) return;
  unsigned long long above = inclusive - lane_total;  // taken from better bins
  int chosen = 248 - 8 * lane;  // reached within the lane's bins, so the loop always sets it
  for (int bin = 255 - 8 * lane; bin >= 248 - 8 * lane; --bin) {
    const unsigned long long value = value_of(bin);
    if (above + value >= remaining) {
      chosen = bin;
      break;
    }
    above += value;
  }
  const unsigned int chosen_count = smem.count[chosen];
  const unsigned long long left = remaining - above;  // >= 1
  smem.prefix = prefix | (static_cast<unsigned long long>(chosen) << shift);
  smem.remaining = left;
  // One candidate left in the bin: it is the threshold. Counting mode and every candidate of
  // the bin needed: the threshold is the bin's smallest key, and prefix (low bits 0) <= it.
  smem.done = chosen_count == 1 || (!kWeighted && chosen_count == left);
}

}  // namespace internal

// Among the elements [0, count) whose key is >= `cut` (cut = 0: all of them), finds the threshold
// t >= cut such that, walking the keys from the largest down:
//   counting mode (kWeighted = false): exactly `target` keys are >= t;
//   weighted mode: t is the key at which the running sum of weight_of() first reaches `target`
//   (the smallest best-first prefix with that much weight, as top-p defines it).
// Preconditions: 1 <= target <= the count (or total weight) of the candidates; every thread of
// the block calls it (it synchronises); key_of(i) is the same value every time it is called.
// kThreads is the block size.
template <int kThreads, bool kWeighted, typename KeyFn, typename WeightFn>
__device__ unsigned long long BlockRadixSelect(int count, unsigned long long cut,
                                               unsigned long long target, KeyFn key_of,
                                               WeightFn weight_of, RadixSelectSmem& smem) {
  static_assert(kThreads >= 256 && kThreads % 32 == 0 && kThreads <= 1024);
  // The leading bytes every candidate shares decide nothing: one pass finds them (the AND and the
  // OR of the candidates), and the radix passes start at the first byte where they differ. A
  // cluster of similar values (the sampler's one bin of logits) shares two bytes or more (record
  // 2026-12-02-h200-select-prefix-ab: top-k 50 + top-p 0.9 at 64 rows 74 -> 70 us).
  unsigned long long all_and = ~0ull, any_or = 0;
  ForEachStrided<kThreads, 4>(static_cast<int>(threadIdx.x), count, key_of,
                              [&](int, unsigned long long key) {
                                if (key < cut) return;
                                all_and &= key;
                                any_or |= key;
                              });
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    all_and &= __shfl_xor_sync(0xffffffffu, all_and, offset);
    any_or |= __shfl_xor_sync(0xffffffffu, any_or, offset);
  }
  const int warp = static_cast<int>(threadIdx.x) / 32;
  if (threadIdx.x % 32 == 0) {
    smem.mass[warp] = all_and;
    smem.mass[32 + warp] = any_or;
  }
  __syncthreads();
  for (int other = 0; other < kThreads / 32; ++other) {
    all_and &= smem.mass[other];
    any_or |= smem.mass[32 + other];
  }
  __syncthreads();  // read before the passes clear mass
  const unsigned long long differing = all_and ^ any_or;
  // One candidate (keys are distinct): it is the threshold.
  if (differing == 0) return all_and > cut ? all_and : cut;
  const int first_shift = (63 - __clzll(static_cast<long long>(differing))) / 8 * 8;
  unsigned long long mask =
      first_shift == 56 ? 0ull : ~((1ull << (first_shift + 8)) - 1);  // the shared bytes
  unsigned long long prefix = all_and & mask, remaining = target;
  for (int shift = first_shift; shift >= 0; shift -= 8) {
    if (threadIdx.x < 256) {
      smem.count[threadIdx.x] = 0;
      if constexpr (kWeighted) smem.mass[threadIdx.x] = 0;
    }
    __syncthreads();
    // Runs of one bin are summed in registers and flushed once: where most candidates share a
    // bin (the top byte of similar floats), that spares the same-address atomics.
    int run_bin = -1;
    unsigned int run_count = 0;
    unsigned long long run_mass = 0;
    ForEachStrided<kThreads, 4>(
        static_cast<int>(threadIdx.x), count, key_of, [&](int index, unsigned long long key) {
          if (key < cut || (key & mask) != prefix) return;
          const int bin = static_cast<int>((key >> shift) & 0xff);
          if (bin != run_bin) {
            if (run_count > 0) internal::FlushRun<kWeighted>(smem, run_bin, run_count, run_mass);
            run_bin = bin;
            run_count = 0;
            run_mass = 0;
          }
          ++run_count;
          if constexpr (kWeighted) run_mass += weight_of(index);
        });
    internal::FlushWarpRuns<kWeighted>(smem, run_bin, run_count, run_mass);
    __syncthreads();
    if (threadIdx.x < 32) internal::FindBin<kWeighted>(smem, shift, prefix, remaining);
    __syncthreads();
    prefix = smem.prefix;
    remaining = smem.remaining;
    mask |= 0xffull << shift;
    if (smem.done) break;  // the same value for every thread
  }
  // Candidates that share the decided prefix but are below `cut` are not candidates.
  return prefix > cut ? prefix : cut;
}

}  // namespace sieve::cuda::select
