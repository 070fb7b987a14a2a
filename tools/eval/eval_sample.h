// EvalSample: one prompt of `sieve eval` with what its output is scored against, and
// SampleRecord: what came of it under one configuration.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace sieve::eval {

// How an output is scored (scoring.h).
enum class Metric {
  kContains,    // fraction of `expected` found in the output as whole runs (numbers, words)
  kExact,       // jsonl: SQuAD-normalised output equals an answer (best over answers)
  kSubstring,   // jsonl: a normalised answer is contained in the normalised output
  kF1,          // jsonl: SQuAD token F1 (best over answers)
  kPerplexity,  // teacher-forced tokens: the score is the NLL, aggregated as exp(mean)
};
const char* MetricName(Metric metric);

struct EvalSample {
  std::string task;
  int length = 0;                   // target tokens (jsonl: the length bucket)
  std::optional<double> depth;      // tasks with a depth axis
  int index = 0;                    // sample number within its (task, length, depth)
  std::string prompt;               // the text (perplexity: empty; the tokens are the prompt)
  std::vector<int32_t> prompt_ids;  // with BOS: what the in-process engine gets
  int max_tokens = 0;
  Metric metric = Metric::kContains;
  std::vector<std::string> expected;   // values, names, words; jsonl: the answers
  std::vector<int32_t> forced_tokens;  // perplexity: the tokens scored after the prompt
  bool truncated = false;              // jsonl: the middle of the prompt was cut
  // Two-turn tasks: turn 2's message, sent after the prompt and turn 1's answer, its tokens (no
  // BOS), and what its answer is scored against (the record's score; `expected` scores turn 1).
  std::string follow_up;
  std::vector<int32_t> follow_up_ids;
  std::vector<std::string> follow_up_expected;
  // A turn-2 sample of --second-turn reuse: tokens appended after `prompt_ids` on the cache the
  // policy left after the prompt (Request::forced_tokens with sample_after_forced), not prefilled
  // with it. Built by the evaluator, never generated.
  std::vector<int32_t> continuation;
};

struct SampleRecord {
  const EvalSample* sample = nullptr;
  std::string config;     // the configuration's label
  std::string output;     // generated text (perplexity: empty)
  double score = 0;       // in [0, 1]; perplexity: the summed NLL of the sample's tokens
  int scored_tokens = 0;  // perplexity: tokens whose NLL `score` sums
  std::string error;      // a request that failed (remote servers): scored 0
  // Two-turn tasks: turn 1's answer and score (output and score above are turn 2's).
  std::optional<std::string> first_turn_output;
  double first_turn_score = 0;
};

}  // namespace sieve::eval
