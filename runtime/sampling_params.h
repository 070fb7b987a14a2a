// SamplingParams: how one request picks its tokens and when it stops (OpenAI / vLLM semantics).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"

namespace sieve {

struct SamplingParams {
  float temperature = 1.0f;         // 0: greedy
  int top_k = 0;                    // 0: off
  float top_p = 1.0f;               // 1: off
  float min_p = 0.0f;               // 0: off; drops tokens below min_p * max probability
  float repetition_penalty = 1.0f;  // 1: off; HF/vLLM: divide positive logits of seen tokens
  float presence_penalty = 0.0f;    // OpenAI: subtract once per generated token id
  float frequency_penalty = 0.0f;   // OpenAI: subtract per occurrence in the generated tokens
  std::optional<uint64_t> seed;     // reproducible sampling
  int max_tokens = 256;             // new tokens at most (also limited by the context); 0 only
                                    // with prompt_logprobs: the prompt is scored, nothing generated
  std::vector<std::string> stop;    // stop strings (not included in the output)
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  int logprobs = -1;  // -1: none; N >= 0: chosen token's logprob + top N
  // vLLM's prompt_logprobs: -1: none; N >= 0: each prompt token after the first gets its
  // logprob under the raw distribution given the tokens before it, and the top N there
  // (RequestOutput::prompt_logprobs; the echo of /v1/completions).
  int prompt_logprobs = -1;

  // Ranges as vLLM checks them; the message names the field.
  Status Validate() const;
  bool greedy() const { return temperature <= 0.0f; }
  // Whether a backend's device sampler can take it (Backend::BeginSampling): no penalties (they
  // need the sequence's tokens) and no top log-probabilities beyond the chosen token's.
  bool SamplesOnDevice() const {
    return repetition_penalty == 1.0f && presence_penalty == 0.0f && frequency_penalty == 0.0f &&
           logprobs <= 0;
  }
};

}  // namespace sieve
