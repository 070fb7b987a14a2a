// RunServingLoad: sends a set of prompts to an OpenAI-compatible server as streaming requests and
// times every chunk, on one thread and one io_context however many requests are in flight.
//
// Requests are released by the arrival process (arrivals.h) and sent as soon as fewer than
// --max-concurrency are in flight; a request's clock starts when it is sent, as in vLLM.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "core/status.h"
#include "tokenizer/tokenizer.h"
#include "tools/bench/dataset.h"
#include "tools/bench/http_client.h"
#include "tools/bench/metrics.h"
#include "tools/bench/openai_protocol.h"

namespace sieve::bench {

class ProgressBar;

struct ServingLoadOptions {
  HttpUrl base_url;
  std::string endpoint = "/v1/completions";  // appended to base_url's path
  RequestBodyOptions body;
  std::string api_key;      // sent as "Authorization: Bearer ..." when not empty
  int max_concurrency = 0;  // 0: no cap
  double request_rate = std::numeric_limits<double>::infinity();  // requests/s
  double burstiness = 1.0;                // gamma shape of the arrival gaps; 1: Poisson
  uint64_t seed = 0;                      // of the arrival process
  double request_timeout_s = 6 * 3600.0;  // per request; vLLM's aiohttp timeout
};

struct ServingLoadResult {
  std::vector<RequestRecord> records;  // one per prompt, in prompt order
  double duration_s = 0;               // first release to last completion
  // RunConversationLoad: every turn's prompt text, as records (empty for a turn never sent)
  std::vector<std::string> prompts;
};

// Runs the load. Every failure of a single request is recorded in its RequestRecord; an error
// comes back only when nothing could be sent at all (bad host). Output tokens are the server's
// usage count when it sends one, else `tokenizer`'s count of the generated text.
Result<ServingLoadResult> RunServingLoad(const ServingLoadOptions& options,
                                         const std::vector<BenchPrompt>& prompts,
                                         const Tokenizer& tokenizer, ProgressBar* progress);

// Runs conversations (--dataset-name multi-turn): the arrival process releases conversations;
// a released conversation sends its turns back to back, turn t + 1 (its prompt: turn t's prompt,
// turn t's generated text and messages[t + 1]) as soon as turn t's response is complete. Under
// --max-concurrency a conversation keeps its slot from its first turn to its last (the next turn
// goes to the front of the queue), as a client that chats would. Records: every turn, conversation
// by conversation, turn by turn, with their conversation and turn; a turn's arrival_s is its
// release (the conversation's arrival for turn 0, the end of the turn before for the others).
// A failed turn ends its conversation: its later turns are recorded as failed, never sent.
// prompt_len: turn 0's the dataset's, the others' the tokenizer's count of the whole prompt.
Result<ServingLoadResult> RunConversationLoad(const ServingLoadOptions& options,
                                              const std::vector<BenchConversation>& conversations,
                                              const Tokenizer& tokenizer, ProgressBar* progress);

}  // namespace sieve::bench
