// PerplexityText: held-out text (--text) tokenized once; each perplexity sample is a seeded
// random window of it: BOS + (L - 1) context tokens as the prompt, and the next `scored` tokens
// teacher-forced through decode steps, so the policy's compressed cache predicts them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "tokenizer/tokenizer.h"
#include "tools/eval/eval_sample.h"

namespace sieve::eval {

class PerplexityText {
 public:
  static Result<PerplexityText> Create(const std::string& text, const Tokenizer& tokenizer);

  // OutOfRange when the text is shorter than one window of L - 1 + scored tokens.
  Result<EvalSample> Sample(int length, int scored, int index, uint64_t seed) const;
  size_t num_tokens() const { return tokens_.size(); }

 private:
  std::vector<int32_t> bos_;     // the tokenizer's BOS prefix ([] or [bos])
  std::vector<int32_t> tokens_;  // [num_tokens] the whole text, no BOS
};

}  // namespace sieve::eval
