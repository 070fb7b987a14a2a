// Sampler: picks the next token of one sequence from its logits on the host.
//
// Order (vLLM's): penalties on the raw logits, then greedy argmax (ties: lowest id) or
// temperature, top-k, top-p, min-p and a draw from the sequence's own generator, so a seeded
// request gives the same tokens whatever else is in the batch. Log-probabilities are those of
// the raw model distribution (log_softmax of the logits before any processing), like vLLM's
// default.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "runtime/sampling_params.h"

namespace sieve {

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0.0f;
};

struct SampleResult {
  int32_t token = 0;
  float logprob = 0.0f;                    // of the chosen token (when requested)
  std::vector<TokenLogprob> top_logprobs;  // the N most likely (when requested)
};

class Sampler {
 public:
  // `logits` [V] is modified in place. `history` is every token of the sequence so far (prompt
  // then generated); `num_prompt` of them are the prompt.
  static SampleResult Sample(std::span<float> logits, const SamplingParams& params,
                             std::span<const int32_t> history, int num_prompt,
                             std::mt19937_64& rng);
};

}  // namespace sieve
