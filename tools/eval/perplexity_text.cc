#include "tools/eval/perplexity_text.h"

#include <random>

#include "tools/eval/task_generator.h"

namespace sieve::eval {

Result<PerplexityText> PerplexityText::Create(const std::string& text, const Tokenizer& tokenizer) {
  PerplexityText out;
  SIEVE_ASSIGN_OR_RETURN(out.bos_, tokenizer.Encode("", /*add_bos=*/true));
  SIEVE_ASSIGN_OR_RETURN(out.tokens_, tokenizer.Encode(text, /*add_bos=*/false));
  return out;
}

Result<EvalSample> PerplexityText::Sample(int length, int scored, int index, uint64_t seed) const {
  const size_t context = static_cast<size_t>(length) - bos_.size();
  const size_t window = context + static_cast<size_t>(scored);
  if (tokens_.size() < window) {
    return OutOfRangeError("--text has " + std::to_string(tokens_.size()) +
                           " tokens; perplexity at length " + std::to_string(length) + " needs " +
                           std::to_string(window) + " (the context and --ppl-tokens)");
  }
  std::mt19937_64 rng = SampleRng(seed, "perplexity", length, std::nullopt, index);
  const size_t start = std::uniform_int_distribution<size_t>(0, tokens_.size() - window)(rng);
  EvalSample sample;
  sample.task = "perplexity";
  sample.length = length;
  sample.index = index;
  sample.metric = Metric::kPerplexity;
  sample.prompt_ids = bos_;
  sample.prompt_ids.insert(sample.prompt_ids.end(), tokens_.begin() + start,
                           tokens_.begin() + start + context);
  sample.forced_tokens.assign(tokens_.begin() + start + context, tokens_.begin() + start + window);
  sample.max_tokens = scored;
  return sample;
}

}  // namespace sieve::eval
