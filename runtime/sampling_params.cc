#include "runtime/sampling_params.h"

#include <cmath>
#include <string>

namespace sieve {

Status SamplingParams::Validate() const {
  const auto bad = [](const std::string& what) { return InvalidArgumentError(what); };
  if (!std::isfinite(temperature) || temperature < 0.0f) return bad("temperature must be >= 0");
  if (top_k < -1) return bad("top_k must be -1, 0 (off) or positive");
  if (!(top_p > 0.0f && top_p <= 1.0f)) return bad("top_p must be in (0, 1]");
  if (!(min_p >= 0.0f && min_p <= 1.0f)) return bad("min_p must be in [0, 1]");
  if (!(repetition_penalty > 0.0f) || !std::isfinite(repetition_penalty)) {
    return bad("repetition_penalty must be > 0");
  }
  if (!(presence_penalty >= -2.0f && presence_penalty <= 2.0f)) {
    return bad("presence_penalty must be in [-2, 2]");
  }
  if (!(frequency_penalty >= -2.0f && frequency_penalty <= 2.0f)) {
    return bad("frequency_penalty must be in [-2, 2]");
  }
  if (max_tokens < 0 || (max_tokens == 0 && prompt_logprobs < 0)) {
    return bad("max_tokens must be at least 1 (0 only with prompt logprobs)");
  }
  if (logprobs > 20) return bad("logprobs must be at most 20");
  if (prompt_logprobs > 20) return bad("prompt_logprobs must be at most 20");
  for (const std::string& s : stop) {
    if (s.empty()) return bad("stop strings must not be empty");
  }
  return Status::Ok();
}

}  // namespace sieve
