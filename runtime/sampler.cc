#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <unordered_map>

#include "core/logits.h"

namespace sieve {

namespace {

void ApplyPenalties(std::span<float> logits, const SamplingParams& params,
                    std::span<const int32_t> history, int num_prompt) {
  const int vocab = static_cast<int>(logits.size());
  if (params.repetition_penalty != 1.0f) {
    std::vector<bool> seen(vocab, false);
    for (const int32_t token : history) {
      if (token >= 0 && token < vocab) seen[token] = true;
    }
    for (int token = 0; token < vocab; ++token) {
      if (!seen[token]) continue;
      float& logit = logits[token];
      logit = logit > 0 ? logit / params.repetition_penalty : logit * params.repetition_penalty;
    }
  }
  if (params.presence_penalty != 0.0f || params.frequency_penalty != 0.0f) {
    std::unordered_map<int32_t, int> counts;
    for (size_t index = num_prompt; index < history.size(); ++index) ++counts[history[index]];
    for (const auto& [token, count] : counts) {
      if (token < 0 || token >= vocab) continue;
      logits[token] -= params.presence_penalty + params.frequency_penalty * count;
    }
  }
}

void LogSoftmax(std::span<const float> logits, std::vector<float>& out) {
  const float log_sum = LogSumExp(logits);
  out.resize(logits.size());
  for (size_t index = 0; index < logits.size(); ++index) out[index] = logits[index] - log_sum;
}

}  // namespace

SampleResult Sampler::Sample(std::span<float> logits, const SamplingParams& params,
                             std::span<const int32_t> history, int num_prompt,
                             std::mt19937_64& rng) {
  SampleResult result;
  std::vector<float> raw_logprobs;
  if (params.logprobs >= 0) LogSoftmax(logits, raw_logprobs);

  ApplyPenalties(logits, params, history, num_prompt);
  if (params.greedy()) {
    result.token = ArgMax(logits);
  } else {
    const int vocab = static_cast<int>(logits.size());
    for (float& logit : logits) logit /= params.temperature;
    // Candidates sorted by logit (ties: lower id first) so every filter works on one order.
    std::vector<int32_t> order(vocab);
    std::iota(order.begin(), order.end(), 0);
    int count = vocab;
    const int top_k = params.top_k > 0 ? std::min(params.top_k, vocab) : vocab;
    const auto by_logit = [&](int32_t a, int32_t b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    };
    if (top_k < vocab) {
      std::partial_sort(order.begin(), order.begin() + top_k, order.end(), by_logit);
      count = top_k;
    } else {
      std::sort(order.begin(), order.end(), by_logit);
    }
    std::vector<double> probs(count);
    const float max_logit = logits[order[0]];
    double total = 0;
    for (int index = 0; index < count; ++index) {
      probs[index] = std::exp(static_cast<double>(logits[order[index]] - max_logit));
      total += probs[index];
    }
    for (double& p : probs) p /= total;
    if (params.top_p < 1.0f) {  // smallest prefix whose mass reaches top_p (at least one)
      double cumulative = 0;
      int keep = 0;
      while (keep < count) {
        cumulative += probs[keep++];
        if (cumulative >= params.top_p) break;
      }
      count = keep;
    }
    if (params.min_p > 0.0f) {
      const double threshold = params.min_p * probs[0];
      int keep = 1;
      while (keep < count && probs[keep] >= threshold) ++keep;
      count = keep;
    }
    double mass = 0;
    for (int index = 0; index < count; ++index) mass += probs[index];
    const double draw = std::generate_canonical<double, 53>(rng) * mass;
    double cumulative = 0;
    result.token = order[count - 1];
    for (int index = 0; index < count; ++index) {
      cumulative += probs[index];
      if (draw < cumulative) {
        result.token = order[index];
        break;
      }
    }
  }
  if (params.logprobs >= 0) {
    result.logprob = raw_logprobs[result.token];
    std::vector<int32_t> order(raw_logprobs.size());
    std::iota(order.begin(), order.end(), 0);
    const int top = std::min<int>(params.logprobs, static_cast<int>(order.size()));
    std::partial_sort(order.begin(), order.begin() + top, order.end(), [&](int32_t a, int32_t b) {
      return raw_logprobs[a] > raw_logprobs[b] || (raw_logprobs[a] == raw_logprobs[b] && a < b);
    });
    for (int index = 0; index < top; ++index) {
      result.top_logprobs.push_back({order[index], raw_logprobs[order[index]]});
    }
  }
  return result;
}

}  // namespace sieve
