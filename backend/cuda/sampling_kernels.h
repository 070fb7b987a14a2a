// GPU sampling of the next token of each logits row: greedy argmax, or temperature, top-k, top-p
// and min-p followed by a seeded draw, with the log-probability of the chosen token. The device
// twin of runtime/sampler.h (the host Sampler), so the logits never leave the GPU.
//
// Semantics (as the host Sampler, vLLM's order):
//   - temperature <= 0: the argmax of the raw logits, ties to the lowest id.
//   - otherwise, over the logits divided by the temperature: keep the top_k best (ties to the
//     lower id), then the smallest best-first prefix whose probability (renormalised over the
//     top-k) reaches top_p, then the tokens with probability >= min_p * the best one's; draw from
//     what is left in proportion to the probabilities.
//   - out_logprob is the chosen token's log-probability under the raw logits (log_softmax before
//     the temperature), like vLLM's default.
// Repetition, presence and frequency penalties are not applied here: rows that use them go
// through the host Sampler, or a penalty kernel must run on the logits first (then out_logprob
// is of the penalised logits).
//
// How (sampling_kernels.cu): a cluster of 8 thread blocks per row (sm_90), each reading one
// contiguous chunk of the row; a histogram of log-probability bins finds the bin holding the
// top-k or top-p cut, only that bin's tokens are collected and the exact cut found among them;
// no sort of the row. Top-p without min-p draws over the bins, then collects the drawn bin. Top-k
// (with top-p or min-p, not both) whose bins up to the cut hold at most 512 tokens collects those
// and sorts them, and cuts and draws on their prefix sums. Greedy reads the row once, min-p twice,
// top-k (from its head) three times, the rest three or four times.
//
// Differences from the host Sampler, none of which matters for the distribution: the order that
// top-k and top-p walk is by raw logit (the same as by logit / T, except where the division rounds
// two different logits to one value); probabilities are 40-bit fixed point relative to the best
// token's, p / p_best = exp2((x - best) * log2(e) / T) in f32 (a token below 2^-41 of the best is
// never drawn: at most vocab * 2^-41 ~ 6e-8 of the mass), and where top-p decides the kept set,
// and draws when min-p is off, they are rounded down to 17 significant bits at vocab 128K (12 at
// the largest vocabulary): a relative change of at most 2^-17 a token; the random stream is
// Philox4x32-10 keyed by (seed, offset), not std::mt19937_64.
// Every step is integer arithmetic, a fixed-order reduction, or a selection that depends only on
// a set of keys: the same inputs give the same tokens on every run, whichever row a request is in.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace sieve::cuda {

// One row's sampling knobs (device memory, [rows] of them).
struct SamplingRowParams {
  float temperature;  // <= 0: greedy
  int32_t top_k;      // <= 0 or >= vocab: off
  float top_p;        // >= 1: off
  float min_p;        // <= 0: off
  uint64_t seed;      // the request's seed (the host picks a random one when it gave none)
  uint64_t offset;    // the request's draw counter: its t-th token uses (seed, t)
};
static_assert(sizeof(SamplingRowParams) == 32);

// Device scratch SampleTokens needs: none (every row is one cluster working from the logits and
// shared memory). Kept so that callers size and pass it like the other launchers'.
size_t SampleTokensWorkspaceBytes(int rows, int vocab);

// The largest vocabulary SampleTokens takes (a block's chunk of at most 2^18 logits leaves cut
// weights 12 significant bits); callers sample larger ones on the host.
inline constexpr int kSampleTokensMaxVocab = 1 << 21;

// Whether the current device runs SampleTokens: it needs thread-block clusters (compute
// capability 9.0 and up). Where it does not, callers sample on the host.
bool SampleTokensSupported();

// How many rows the device runs at once (one cluster of blocks each): more rows than this take
// more than one wave. For the benchmark.
int SampleTokensConcurrentRows();

// logits [rows][vocab] f32 (row stride vocab), params [rows], out_tokens [rows] i32,
// out_logprob [rows] f32 (may be null). Asynchronous on `stream`.
void SampleTokens(const float* logits, int rows, int vocab, const SamplingRowParams* params,
                  int32_t* out_tokens, float* out_logprob, void* workspace, size_t workspace_bytes,
                  cudaStream_t stream);

// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011), the
// counter-based generator of Random123 and cuRAND: 10 rounds of the bijection below over the
// 128-bit counter, the 64-bit key bumped between rounds. Host and device, so tests can check it
// against the published known-answer vectors.
struct Philox4x32Out {
  uint32_t words[4];
};
__host__ __device__ inline Philox4x32Out Philox4x32_10(const uint32_t (&counter)[4],
                                                       const uint32_t (&key)[2]) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  uint32_t c0 = counter[0], c1 = counter[1], c2 = counter[2], c3 = counter[3];
  uint32_t k0 = key[0], k1 = key[1];
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k0 += kWeyl0;
      k1 += kWeyl1;
    }
    const uint64_t product0 = static_cast<uint64_t>(kMul0) * c0;
    const uint64_t product1 = static_cast<uint64_t>(kMul1) * c2;
    const uint32_t hi0 = static_cast<uint32_t>(product0 >> 32),
                   lo0 = static_cast<uint32_t>(product0);
    const uint32_t hi1 = static_cast<uint32_t>(product1 >> 32),
                   lo1 = static_cast<uint32_t>(product1);
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
  }
  return {{c0, c1, c2, c3}};
}

// The 64 random bits of draw (seed, offset): counter (offset, 0), key seed; words 0 and 1 of the
// block, or 2 and 3 for `second` (a draw that was rejected and is made again).
__host__ __device__ inline uint64_t SampleRandomBits(uint64_t seed, uint64_t offset,
                                                     bool second = false) {
  const uint32_t counter[4] = {static_cast<uint32_t>(offset), static_cast<uint32_t>(offset >> 32),
                               0u, 0u};
  const uint32_t key[2] = {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)};
  const Philox4x32Out out = Philox4x32_10(counter, key);
  const int high = second ? 2 : 0;
  return (static_cast<uint64_t>(out.words[high]) << 32) | out.words[high + 1];
}

}  // namespace sieve::cuda
