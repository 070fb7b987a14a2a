// The prompts a benchmark sends: random token sequences (vLLM's RandomDataset), random prompts
// that share a few random prefixes (vLLM's PrefixRepetitionRandomDataset), or a JSONL file.
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
  // prefix-repetition: the index of the prefix it starts with, and that prefix's bytes at the
  // start of `prompt`; else -1 and 0
  int prefix_group = -1;
  int prefix_bytes = 0;
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

// vLLM's --prefix-repetition-* knobs and defaults.
struct PrefixRepetitionOptions {
  int num_prompts = 1000;
  int prefix_len = 256;
  int suffix_len = 256;
  int num_prefixes = 10;
  int output_len = 128;
  uint64_t seed = 0;
};

// vLLM's PrefixRepetitionRandomDataset: `num_prefixes` random prefixes of `prefix_len` tokens,
// and `num_prompts` prompts, each one of the prefixes followed by a random suffix of its own of
// `suffix_len` tokens, in a seeded random order. Prefix i starts num_prompts / num_prefixes
// prompts, one more for i < num_prompts % num_prefixes, so that exactly num_prompts are made
// (vLLM makes num_prefixes x floor(num_prompts / num_prefixes), dropping the remainder). Random
// text as MakeRandomDataset makes it; each suffix is fitted after its prefix, so the prompt's
// tokens begin with the prefix's own tokens (a BPE merge across the seam is redrawn, a few rounds
// at most, and a prefix that no suffix follows intact, such as one ending in spaces, is drawn
// again) and a prefix cache sees the whole prefix repeat. Every prompt of a group starts with
// the same prefix text, byte for byte. prompt_len is the whole prompt's re-tokenised length.
// InvalidArgument for a length or count below 1, or more prefixes than prompts.
Result<std::vector<BenchPrompt>> MakePrefixRepetitionDataset(
    const Tokenizer& tokenizer, const PrefixRepetitionOptions& options);

// --dataset-name multi-turn: conversations whose every turn's prompt is the last turn's prompt,
// the server's answer to it and a new user message, so a prefix cache that keeps prompt and
// generated tokens serves all but the new message from cache.
struct MultiTurnOptions {
  int num_conversations = 1000;  // --num-prompts
  int num_turns = 10;
  int first_len = 256;   // tokens of the first user message
  int message_len = 64;  // tokens of each later user message
  int output_len = 64;   // max_tokens of every turn
  uint64_t seed = 0;
};

// One conversation's user messages, fixed in advance; the answers come from the server at run
// time (RunConversationLoad).
struct BenchConversation {
  std::vector<std::string> messages;  // [num_turns] messages[0] is the first turn's whole prompt
  std::vector<int> message_lens;      // [num_turns] tokens of each message on its own
  int output_len = 0;                 // max_tokens of every turn
};

// `num_conversations` conversations of `num_turns` random messages each: the first of
// `first_len` tokens, the others of `message_len`, as MakeRandomDataset makes random text (each
// message on its own: the answer it follows is not known in advance, so a BPE merge across the
// seam can change a token or two there). InvalidArgument, naming the flag, for a length or count
// below 1.
Result<std::vector<BenchConversation>> MakeMultiTurnDataset(const Tokenizer& tokenizer,
                                                            const MultiTurnOptions& options);

// One JSON object per line: {"prompt": "...", "output_len": 128}; "output_len" may be left out
// (then `default_output_len`); blank lines are skipped. `num_prompts` > 0 takes that many,
// repeating the file from the top if it is shorter; 0 takes every line. Errors name the line.
Result<std::vector<BenchPrompt>> LoadJsonlDataset(const std::string& path,
                                                  const Tokenizer& tokenizer,
                                                  int default_output_len, int num_prompts);

}  // namespace sieve::bench
