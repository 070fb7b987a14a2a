// The OpenAI-compatible wire format as the load generator uses it: the JSON body of a streaming
// completion or chat request, and what one `data:` event of the response stream says.
//
// Kept apart from the HTTP code so that the same parsing serves every server (vLLM, llama.cpp's
// llama-server, Sieve) and is tested on its own.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace sieve::bench {

enum class ApiKind {
  kCompletions,      // POST /v1/completions: "prompt" in, choices[0].text out
  kChatCompletions,  // POST /v1/chat/completions: "messages" in, choices[0].delta.content out
};

// Chat when the endpoint ends in "chat/completions", else completions (as vLLM's openai backends).
ApiKind ApiKindForEndpoint(std::string_view endpoint);

struct RequestBodyOptions {
  ApiKind api = ApiKind::kCompletions;
  std::string model;
  double temperature = 0.0;  // greedy by default, so runs are comparable across servers
  bool ignore_eos = false;   // sent only when set: OpenAI itself rejects the field
  // Merged last into the body (--extra-body): top_p, min_tokens, a server-specific field...
  nlohmann::json extra = nlohmann::json::object();
};

// A streaming request that also asks for the final usage chunk (stream_options.include_usage), so
// output tokens are counted by the server's tokenizer when it cooperates.
nlohmann::json MakeRequestBody(const RequestBodyOptions& options, const std::string& prompt,
                               int max_tokens);

// What one `data:` event carried.
struct StreamEvent {
  bool done = false;  // the "[DONE]" sentinel
  // Generated text in this chunk: choices[0].text (completions) or choices[0].delta.content plus
  // any reasoning_content (chat). Empty for role-only, finish-only and usage chunks.
  std::string text;
  std::optional<int64_t> completion_tokens;  // from a usage object
  std::optional<int64_t> prompt_tokens;      // from a usage object
  std::string error;                         // an {"error": ...} object sent mid-stream
};

// InvalidArgument when `data` is neither "[DONE]" nor a JSON object.
Result<StreamEvent> ParseStreamEvent(std::string_view data);

}  // namespace sieve::bench
