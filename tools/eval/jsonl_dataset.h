// jsonl: LongBench / RULER-style records evaluated by `sieve eval --task jsonl --data FILE`.
//
// A line is {"context": str, "input": str, "answers": [str], optional "length": int, optional
// "metric": "exact" | "substring" | "f1"}. The prompt is --prompt-template filled with context and
// input; a prompt longer than the evaluation allows is cut in its middle, as LongBench does
// (the instruction at the start and the question at the end survive).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "tokenizer/tokenizer.h"
#include "tools/eval/eval_sample.h"

namespace sieve::eval {

struct JsonlRecord {
  int line = 0;  // 1-based, for messages
  std::string context;
  std::string input;
  std::vector<std::string> answers;
  std::optional<int> length;
  std::optional<Metric> metric;
};

// InvalidArgument naming `file_name`, the line and what is wrong (not JSON, a missing or
// mistyped field, an empty answers list, an unknown metric). Blank lines are skipped.
Result<std::vector<JsonlRecord>> ParseJsonl(std::string_view text, const std::string& file_name);
Result<std::vector<JsonlRecord>> ReadJsonl(const std::string& path);

// "exact" | "substring" | "f1".
Result<Metric> ParseJsonlMetric(std::string_view name);

// "{context}" and "{input}" of `prompt_template` replaced in one pass (a context that itself
// contains "{input}" stays as it is).
std::string FillPromptTemplate(std::string_view prompt_template, std::string_view context,
                               std::string_view input);

// The first max_tokens / 2 and the last max_tokens - max_tokens / 2 ids when there are more
// than max_tokens.
std::vector<int32_t> TruncateMiddle(const std::vector<int32_t>& ids, int max_tokens);

// The smallest of `buckets` (sorted ascending) >= length, else the largest.
int LengthBucket(const std::vector<int>& buckets, int length);

struct JsonlOptions {
  std::string prompt_template = "{context}\n\n{input}";
  Metric metric = Metric::kSubstring;  // for records without one
  int max_tokens = 32;
  int max_prompt_tokens = 0;  // longer prompts are cut in the middle
  std::vector<int> buckets;   // --lengths, ascending
};

// One record as a sample: tokenized with BOS, truncated, bucketed by "length" or else by the
// prompt's own token count. A truncated prompt's text is the decoding of the kept ids.
Result<EvalSample> MakeJsonlSample(const JsonlRecord& record, int index,
                                   const JsonlOptions& options, const Tokenizer& tokenizer);

// The held-out needle set that `--task heldout` evaluates (testdata/eval/heldout_needles.jsonl,
// written by scripts/eval_heldout.py): installed under the binary's prefix
// (share/sieve/eval/), else in the source tree it was built from. NotFound names both places.
Result<std::string> FindHeldoutSet();

}  // namespace sieve::eval
