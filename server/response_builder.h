// ResponseBuilder: the OpenAI response bodies of one completion or chat request, built from the
// engine's outputs choice by choice.
//
// Non-streaming: Add every output, then Body() is the `text_completion` / `chat.completion`
// object. Streaming: each output becomes one Server-Sent Event (`data: {...}\n\n`) holding a
// `text_completion` / `chat.completion.chunk`; Start() opens the stream (chat: one chunk per
// choice with the assistant role) and End() closes it (the usage chunk when asked, then
// `data: [DONE]`). Not thread-safe: one per request, used on its connection's strand.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/engine.h"
#include "server/api_error.h"
#include "server/completion_request.h"
#include "tokenizer/tokenizer.h"

namespace sieve {

class ResponseBuilder {
 public:
  // `model`: the name responses carry. `tokenizer` (may be null) spells logprob tokens.
  ResponseBuilder(const CompletionRequest& request, std::string model, const Tokenizer* tokenizer);

  const std::string& id() const { return id_; }

  // Non-streaming.
  void Add(size_t choice, const RequestOutput& output);
  std::string Body() const;

  // Streaming: SSE text, possibly "" (nothing worth a chunk: e.g. text held back for a stop
  // string and no logprobs).
  std::string Start() const;
  std::string Event(size_t choice, const RequestOutput& output);
  std::string End() const;
  // An error after the stream began: an event with the OpenAI error object.
  static std::string ErrorEvent(const ApiError& error);

  int completion_tokens() const;
  int prompt_tokens() const { return prompt_tokens_; }

 private:
  struct Choice {
    bool echoed = false;  // echo: the prompt opened this choice already
    std::string text;
    std::string finish_reason;  // "" while running
    int num_generated = 0;
    int text_offset = 0;      // completions logprobs: offset of the next token's text
    nlohmann::json logprobs;  // accumulated (non-streaming)
  };

  // The logprobs of `output`'s tokens in this API's shape, or null when not requested; with
  // echo, the prompt's first (choice `index`'s, before its first output).
  nlohmann::json Logprobs(size_t index, Choice& choice, const RequestOutput& output);
  // The text `output` adds to choice `index`: with echo, its prompt's first. Marks it echoed.
  std::string NewText(size_t index, Choice& choice, const RequestOutput& output);
  void Record(Choice& choice, const RequestOutput& output);
  nlohmann::json Usage() const;
  nlohmann::json ChunkBase() const;

  ApiKind kind_;
  bool include_usage_;
  int logprobs_;
  bool echo_;
  int n_;                                      // choices per prompt
  std::vector<std::vector<int32_t>> prompts_;  // echo: [prompts] token ids
  std::vector<std::string> prompt_texts_;      // echo: [prompts]
  std::string model_;
  const Tokenizer* tokenizer_;
  std::string id_;
  int64_t created_;
  int prompt_tokens_ = 0;
  std::vector<Choice> choices_;
};

// "stop", "length" or "abort".
std::string FinishReasonText(FinishReason reason);
// A fresh id: prefix + 24 random hex digits.
std::string RandomId(std::string_view prefix);

}  // namespace sieve
