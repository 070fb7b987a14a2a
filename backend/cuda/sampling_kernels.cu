// GPU sampler (sampling_kernels.h): one block of 512 threads per logits row, no sort.
//
// Passes over the row (each a coalesced read of the logits, L2-resident after the first):
//   1. max, argmax (ties: lowest id) and the softmax denominator, online, for greedy and logprob;
//   2. top-k: radix select of the k-th best (logit, lower id first) key (block_select.cuh);
//   3. top-p: the total weight of the top-k, then a weighted radix select of the key at which the
//      best-first running weight reaches top_p of it;
//   4. min-p: the smallest kept key whose probability reaches min_p of the best's;
//   5. the draw: sums of the kept weights over kDrawRanges contiguous id ranges, one 64-bit
//      random number scaled to the kept total, and one warp's walk inside the range it falls in.
// The kept set is always "keys >= cut" for one 64-bit cut, every weight is a 40-bit fixed-point
// integer, and the sums are integer: the draw is reproducible bit for bit.
#include <cstdint>

#include "backend/cuda/block_select.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/sampling_kernels.h"
#include "core/check.h"

namespace sieve::cuda {

namespace {

// 512 threads: at 1024 the 64-register cap made ptxas spill; two blocks a multiprocessor give the
// same occupancy.
constexpr int kSampleThreads = 512;
constexpr int kSampleWarps = kSampleThreads / 32;
// The draw first finds which of kDrawRanges contiguous id ranges holds it, then walks that range.
constexpr int kDrawRanges = 256;
// Logits loaded before any is used, in every pass over a row (select::ForEachStrided).
constexpr int kUnroll = 4;
constexpr float kWeightScale = 1099511627776.0f;  // 2^40: weights are round(p / p_best * 2^40)

struct SampleSmem {
  select::RadixSelectSmem radix;
  float warp_max[kSampleWarps];
  float warp_sum[kSampleWarps];
  int warp_argmax[kSampleWarps];
  unsigned long long warp_u64[kSampleWarps];
  unsigned long long range_weight[kDrawRanges];
  int token;
};

// Online softmax state of a set of logits: its max, the lowest id holding it, and the sum of
// exp(x - max). Combining is exact for the max and argmax, so greedy is the true argmax.
struct SoftmaxState {
  float max;
  float sum;
  int argmax;  // INT32_MAX: empty
};

__device__ inline SoftmaxState Combine(const SoftmaxState& a, const SoftmaxState& b) {
  if (a.argmax == INT32_MAX) return b;
  if (b.argmax == INT32_MAX) return a;
  const float max = fmaxf(a.max, b.max);
  SoftmaxState out;
  out.max = max;
  out.sum = a.sum * expf(a.max - max) + b.sum * expf(b.max - max);
  out.argmax = a.max > b.max ? a.argmax : (b.max > a.max ? b.argmax : min(a.argmax, b.argmax));
  return out;
}

__device__ inline SoftmaxState ShuffleXor(const SoftmaxState& state, int offset) {
  return {__shfl_xor_sync(0xffffffffu, state.max, offset),
          __shfl_xor_sync(0xffffffffu, state.sum, offset),
          __shfl_xor_sync(0xffffffffu, state.argmax, offset)};
}

// Fixed-order block sums and minimums: lane 0's butterfly result of each warp, then the warps in
// order. Every thread returns the same value.
__device__ inline unsigned long long BlockSumU64(unsigned long long value,
                                                 unsigned long long* slots) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    value += __shfl_xor_sync(0xffffffffu, value, offset);
  }
  if (threadIdx.x % 32 == 0) slots[threadIdx.x / 32] = value;
  __syncthreads();
  unsigned long long total = 0;
  for (int warp = 0; warp < kSampleWarps; ++warp) total += slots[warp];
  __syncthreads();
  return total;
}

__device__ inline unsigned long long BlockMinU64(unsigned long long value,
                                                 unsigned long long* slots) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    value = min(value, __shfl_xor_sync(0xffffffffu, value, offset));
  }
  if (threadIdx.x % 32 == 0) slots[threadIdx.x / 32] = value;
  __syncthreads();
  unsigned long long total = slots[0];
  for (int warp = 1; warp < kSampleWarps; ++warp) total = min(total, slots[warp]);
  __syncthreads();
  return total;
}

// p / p_best = exp((x - best) / T). The explicitly rounded operations keep the compiler from
// contracting them differently at different call sites: every pass must see the same weights.
__device__ inline float ProbabilityRatio(float value, float best, float inverse_temperature) {
  return value == best ? 1.0f : expf(__fmul_rn(__fsub_rn(value, best), inverse_temperature));
}

__global__ __launch_bounds__(kSampleThreads, 2) void SampleTokensKernel(
    const float* __restrict__ logits,              // [rows][vocab]
    int vocab,                                     //
    const SamplingRowParams* __restrict__ params,  // [rows]
    int32_t* __restrict__ out_tokens,              // [rows]
    float* __restrict__ out_logprob) {             // [rows] or null
  __shared__ SampleSmem smem;
  const int row = static_cast<int>(blockIdx.x);
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid % 32, warp = tid / 32;
  const float* x = logits + static_cast<int64_t>(row) * vocab;
  const SamplingRowParams knobs = params[row];

  // 1. max, argmax and sum of exp(x - max) of the raw logits.
  SoftmaxState state{-INFINITY, 0.0f, INT32_MAX};
  const auto load_logit = [x](int id) { return x[id]; };
  select::ForEachStrided<kSampleThreads, kUnroll>(tid, vocab, load_logit, [&](int id, float value) {
    if (value == -INFINITY) return;  // masked token: no mass, and never the argmax
    if (state.argmax == INT32_MAX || value > state.max) {
      state.sum = (state.argmax == INT32_MAX ? 0.0f : state.sum * expf(state.max - value)) + 1.0f;
      state.max = value;
      state.argmax = id;  // ids rise, so the first holder of the max is the lowest
    } else {
      state.sum += expf(value - state.max);
    }
  });
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) state = Combine(state, ShuffleXor(state, offset));
  if (lane == 0) {
    smem.warp_max[warp] = state.max;
    smem.warp_sum[warp] = state.sum;
    smem.warp_argmax[warp] = state.argmax;
  }
  __syncthreads();
  SoftmaxState total{smem.warp_max[0], smem.warp_sum[0], smem.warp_argmax[0]};
  for (int other = 1; other < kSampleWarps; ++other) {
    total = Combine(total, {smem.warp_max[other], smem.warp_sum[other], smem.warp_argmax[other]});
  }
  // A row of -inf only (nothing can be sampled) falls back to token 0.
  const int argmax = total.argmax == INT32_MAX ? 0 : total.argmax;
  const float log_denominator = total.max + logf(total.sum);
  if (tid == 0) smem.token = argmax;

  if (knobs.temperature > 0.0f) {
    const float best = total.max;
    const float inverse_temperature = 1.0f / knobs.temperature;
    // Keys: the raw logit's order (the same as logit / T's), lower id first among equals.
    const auto key_of = [x](int id) {
      return select::CompositeKey(select::OrderedBits(x[id]), static_cast<uint32_t>(id));
    };
    // Weight: p / p_best = exp((x - best) / T) in 40-bit fixed point.
    const auto weight_from = [best, inverse_temperature](float value) -> unsigned long long {
      return __float2ull_rn(ProbabilityRatio(value, best, inverse_temperature) * kWeightScale);
    };
    const auto weight_of = [x, weight_from](int id) { return weight_from(x[id]); };
    const auto key_from = [](int id, float value) {
      return select::CompositeKey(select::OrderedBits(value), static_cast<uint32_t>(id));
    };
    const auto unit_weight = [](int) { return 1ull; };

    unsigned long long cut = 0;  // the kept set: keys >= cut
    if (knobs.top_k > 0 && knobs.top_k < vocab) {
      cut = select::BlockRadixSelect<kSampleThreads, false>(
          vocab, 0, static_cast<unsigned long long>(knobs.top_k), key_of, unit_weight, smem.radix);
    }
    if (knobs.top_p < 1.0f) {
      unsigned long long kept_weight = 0;
      select::ForEachStrided<kSampleThreads, kUnroll>(tid, vocab, load_logit,
                                                      [&](int id, float value) {
                                                        if (key_from(id, value) >= cut)
                                                          kept_weight += weight_from(value);
                                                      });
      kept_weight = BlockSumU64(kept_weight, smem.warp_u64);
      const double wanted =
          ceil(static_cast<double>(knobs.top_p) * static_cast<double>(kept_weight));
      unsigned long long target = wanted < 1.0 ? 1ull : static_cast<unsigned long long>(wanted);
      if (target > kept_weight) target = kept_weight;
      cut = select::BlockRadixSelect<kSampleThreads, true>(vocab, cut, target, key_of, weight_of,
                                                           smem.radix);
    }
    if (knobs.min_p > 0.0f) {
      unsigned long long lowest = ~0ull;
      select::ForEachStrided<kSampleThreads, kUnroll>(
          tid, vocab, load_logit, [&](int id, float value) {
            const unsigned long long key = key_from(id, value);
            const float ratio = ProbabilityRatio(value, best, inverse_temperature);
            if (key >= cut && ratio >= knobs.min_p) lowest = min(lowest, key);
          });
      lowest = BlockMinU64(lowest, smem.warp_u64);
      if (lowest != ~0ull && lowest > cut) cut = lowest;
    }

    // The draw. Range r is ids [r * span, (r + 1) * span); warps sum ranges in turn.
    const int span = (vocab + 32 * kDrawRanges - 1) / (32 * kDrawRanges) * 32;
    for (int range = warp; range < kDrawRanges; range += kSampleWarps) {
      const int begin = min(vocab, range * span), end = min(vocab, begin + span);
      unsigned long long range_weight = 0;
      select::ForEachStrided<32, kUnroll>(begin + lane, end, load_logit, [&](int id, float value) {
        if (key_from(id, value) >= cut) range_weight += weight_from(value);
      });
#pragma unroll
      for (int offset = 16; offset > 0; offset >>= 1) {
        range_weight += __shfl_xor_sync(0xffffffffu, range_weight, offset);
      }
      if (lane == 0) smem.range_weight[range] = range_weight;
    }
    __syncthreads();
    // Serial over the ranges (every thread the same, in the same order): not unrolled, or the
    // compiler keeps all 256 sums in registers and spills them.
    unsigned long long kept_total = 0;
#pragma unroll 1
    for (int range = 0; range < kDrawRanges; ++range) kept_total += smem.range_weight[range];
    // Uniform in [0, kept_total): the high word of a 64 x 64-bit product, exact.
    const unsigned long long draw =
        __umul64hi(SampleRandomBits(knobs.seed, knobs.offset), kept_total);
    int owner = -1;
    unsigned long long remainder = 0, below = 0;
#pragma unroll 1
    for (int range = 0; range < kDrawRanges && owner < 0; ++range) {
      if (draw < below + smem.range_weight[range]) {
        owner = range;
        remainder = draw - below;
      }
      below += smem.range_weight[range];
    }
    if (owner >= 0 && warp == owner % kSampleWarps) {
      // First kept id whose running weight within the range passes the remainder.
      const int begin = min(vocab, owner * span), end = min(vocab, begin + span);
      for (int base = begin; base < end; base += 32) {
        const int id = base + lane;
        unsigned long long inclusive = id < end && key_of(id) >= cut ? weight_of(id) : 0;
#pragma unroll
        for (int offset = 1; offset < 32; offset <<= 1) {
          const unsigned long long other = __shfl_up_sync(0xffffffffu, inclusive, offset);
          if (lane >= offset) inclusive += other;
        }
        const unsigned int passed = __ballot_sync(0xffffffffu, inclusive > remainder);
        if (passed != 0) {
          if (lane == __ffs(static_cast<int>(passed)) - 1) smem.token = id;
          break;
        }
        remainder -= __shfl_sync(0xffffffffu, inclusive, 31);
      }
    }
    __syncthreads();
  }

  if (tid == 0) {
    const int token = smem.token;
    out_tokens[row] = token;
    if (out_logprob != nullptr) out_logprob[row] = x[token] - log_denominator;
  }
}

}  // namespace

size_t SampleTokensWorkspaceBytes(int /*rows*/, int /*vocab*/) { return 0; }

void SampleTokens(const float* logits, int rows, int vocab, const SamplingRowParams* params,
                  int32_t* out_tokens, float* out_logprob, void* /*workspace*/,
                  size_t /*workspace_bytes*/, cudaStream_t stream) {
  if (rows == 0) return;
  SIEVE_CHECK(rows > 0 && vocab > 0) << "rows " << rows << " vocab " << vocab;
  SampleTokensKernel<<<rows, kSampleThreads, 0, stream>>>(logits, vocab, params, out_tokens,
                                                          out_logprob);
  SIEVE_CUDA_CHECK_LAUNCH();
}

}  // namespace sieve::cuda
