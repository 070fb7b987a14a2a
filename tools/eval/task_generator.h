// TaskGenerator: the synthetic long-context prompts of `sieve eval` (RULER-style), each built to a
// target token count.
//
// A prompt is prefix + context + question in tasks.json's wording, put together as
// scripts/train/tasks.py does (its "queries=1" shape). Everything random about a sample (values,
// keys, depths of distractors, where in the haystack text it starts) is drawn first, from a
// generator seeded by (seed, task, length, depth, index); the context is then a function of one
// size n (haystack units, pairs, list lines), and n is the largest whose prompt, tokenized with
// BOS, has at most `length` tokens. So a sample is the same whatever else is evaluated, and as
// long as the target allows.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "tokenizer/tokenizer.h"
#include "tools/eval/eval_sample.h"
#include "tools/eval/task_spec.h"

namespace sieve::eval {

// Every task `sieve eval --task` knows, in the order the report lists them.
const std::vector<std::string>& AllTaskNames();
// The generated synthetic tasks (not perplexity, jsonl or heldout).
bool IsSyntheticTask(std::string_view task);
// Tasks whose needle is placed at the requested depth (the others get depth null).
bool HasDepthAxis(std::string_view task);

// The generator of one sample: a hash of (seed, task, length, depth, index) through seed_seq.
std::mt19937_64 SampleRng(uint64_t seed, std::string_view task, int length,
                          std::optional<double> depth, int index);

// Places each (needle, depth in [0, 1]) before unit round(depth * n) (round half to even, as
// Python), deepest first, as tasks.py's insert_at_depths; returns the joined text.
std::string InsertAtDepths(const std::vector<std::string_view>& units,
                           const std::vector<std::pair<std::string, double>>& needles);

class TaskGenerator {
 public:
  // `haystack`: sentences of natural text for niah's haystack (empty: the noise sentence).
  // Both references must outlive the generator.
  TaskGenerator(const TaskSpec& spec, const Tokenizer& tokenizer,
                std::vector<std::string> haystack);

  // One sample of a synthetic task. OutOfRange when even the smallest context does not fit
  // `length`; InvalidArgument for an unknown task.
  Result<EvalSample> Generate(std::string_view task, int length, std::optional<double> depth,
                              int index, uint64_t seed) const;

  bool natural_haystack() const { return !haystack_.empty(); }

  // Text appended to every prompt after the question, counted in its length (e.g. " ": the
  // space that this tokenizer splits off the answer's first digits, so the query that retrieves
  // the answer is a prompt token and a policy's observation window holds it). Default: none.
  void set_prompt_suffix(std::string suffix) { prompt_suffix_ = std::move(suffix); }

 private:
  struct Fitted {
    int units = 0;
    std::string prompt;
    std::vector<int32_t> ids;
  };
  // The largest n in [1, length + 1] whose build(n) tokenizes (with BOS) to <= length tokens.
  Result<Fitted> Fit(const std::function<std::string(int)>& build, int length,
                     std::string_view task) const;
  // n haystack units: the noise sentence, or n sentences from `start` on (wrapping around).
  std::vector<std::string_view> Units(int n, bool natural, size_t start) const;

  const TaskSpec& spec_;
  const Tokenizer& tokenizer_;
  std::vector<std::string> haystack_;
  std::string prompt_suffix_;
};

}  // namespace sieve::eval
