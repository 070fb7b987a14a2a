// CompletionRequest: a /v1/completions or /v1/chat/completions body, checked and tokenized.
//
// Parsing follows OpenAI's and vLLM's semantics: unknown fields are ignored, null means unset, a
// field of the wrong type or out of range is a 400 that names it. Prompts are tokenized here (on
// the HTTP thread; the tokenizer is read-only and thread-safe), so the engine thread only sees
// token ids. The length checks are vLLM's: a prompt must leave room for one token, and an
// explicit max_tokens must fit the context with the prompt; without one, a request may generate
// up to the end of the context.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/status.h"
#include "runtime/engine.h"
#include "tokenizer/tokenizer.h"

namespace sieve {

enum class ApiKind { kCompletion, kChat };

struct CompletionRequest {
  ApiKind kind = ApiKind::kCompletion;
  std::string model;  // "" : not given (the served model)
  // One entry per prompt: /v1/completions takes a batch of prompts; chat has exactly one.
  std::vector<std::vector<int32_t>> prompts;
  int n = 1;  // choices per prompt
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  // max_tokens is resolved per prompt by EngineRequests; every other field is final.
  SamplingParams sampling;
  std::optional<int> max_tokens;
  // -1: no logprobs. Completions: `logprobs` N; chat: `logprobs: true` with `top_logprobs` N.
  int logprobs = -1;
  // Completions' `echo`: each choice opens with its prompt (text, and with `logprobs` the prompt's
  // tokens and their logprobs, the first one's null). max_tokens may then be 0.
  bool echo = false;
  std::vector<std::string> prompt_texts;  // echo: [prompts] each prompt's text (ids: decoded)
  std::string kv_policy;                  // "" : the server's --kv-policy

  int num_choices() const { return static_cast<int>(prompts.size()) * n; }
};

struct RequestLimits {
  const Tokenizer* tokenizer = nullptr;  // null: token-id prompts only, no chat, no stop strings
  int max_model_len = 0;
  int vocab_size = 0;
  int max_n = 128;
  SamplingParams defaults;  // the model's generation_config, where it gives values
};

// Reads `body` (any JSON value; it must be an object). On error, `*param` names the field.
Result<CompletionRequest> ParseCompletionRequest(const nlohmann::json& body, ApiKind kind,
                                                 const RequestLimits& limits, std::string* param);

// The engine requests of `request`, choice by choice: choice k = prompt (k / n), copy (k % n).
// A seed, if given, becomes seed + k, so the choices differ but a repeated request repeats them.
// With echo and logprobs N, each asks for the prompt's logprobs with the top N
// (SamplingParams::prompt_logprobs).
std::vector<Request> EngineRequests(const CompletionRequest& request, int max_model_len);

}  // namespace sieve
