// The prompts a benchmark sends: random token sequences (vLLM's RandomDataset) or a JSONL file.
//
// Prompt lengths are counted with the benchmark's tokenizer, without BOS or other special tokens,
// as vLLM counts them; pass the served model's tokenizer (--tokenizer) for lengths that match the
// server's.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "tokenizer/tokenizer.h"

namespace sieve::bench {

struct BenchPrompt {
  std::string prompt;
  int prompt_len = 0;  // tokens of `prompt` by the benchmark's tokenizer
  int output_len = 0;  // max_tokens to ask for
};

struct RandomDatasetOptions {
  int num_prompts = 1000;
  int input_len = 1024;
  int output_len = 128;
  // Lengths are drawn uniformly from [len * (1 - ratio), len * (1 + ratio)]; 0: all exactly len.
  double range_ratio = 0.0;
  uint64_t seed = 0;
};

// Each prompt is random token ids decoded to text, then re-tokenised: when the text's tokens
// differ in number from the target (BPE merges across the random tokens), the text is cut back or
// extended with more random tokens, a few rounds at most; prompt_len is the final, re-tokenised
// length. Ids are drawn from the ordinary tokens that decode on their own to valid UTF-8 free of
// control characters, so the text survives JSON and the server's tokenizer unchanged.
// InvalidArgument for bad options or a tokenizer with no such token.
Result<std::vector<BenchPrompt>> MakeRandomDataset(const Tokenizer& tokenizer,
                                                   const RandomDatasetOptions& options);

// One JSON object per line: {"prompt": "...", "output_len": 128}; "output_len" may be left out
// (then `default_output_len`); blank lines are skipped. `num_prompts` > 0 takes that many,
// repeating the file from the top if it is shorter; 0 takes every line. Errors name the line.
Result<std::vector<BenchPrompt>> LoadJsonlDataset(const std::string& path,
                                                  const Tokenizer& tokenizer,
                                                  int default_output_len, int num_prompts);

}  // namespace sieve::bench
