// Greedy picks and raw log-probabilities over one row of logits, shared by the host sampler
// (runtime/sampler.h) and the CPU backend's device-sampler twin (Backend::BeginSampling), so that
// both give the same bits.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>

namespace sieve {

// The first largest logit's index (ties: the lowest id).
inline int32_t ArgMax(std::span<const float> logits) {
  int32_t best = 0;
  for (int32_t index = 1; index < static_cast<int32_t>(logits.size()); ++index) {
    if (logits[index] > logits[best]) best = index;
  }
  return best;
}

// log(sum(exp(logits))): the max plus the log of a double sum of exp(logit - max).
inline float LogSumExp(std::span<const float> logits) {
  const float max = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (const float logit : logits) sum += std::exp(static_cast<double>(logit - max));
  return max + static_cast<float>(std::log(sum));
}

// log_softmax(logits)[token].
inline float LogSoftmaxAt(std::span<const float> logits, int32_t token) {
  return logits[static_cast<size_t>(token)] - LogSumExp(logits);
}

}  // namespace sieve
