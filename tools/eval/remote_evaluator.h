// Evaluation through an OpenAI-compatible server (--base-url): each sample is one
// POST /v1/completions {model, prompt, max_tokens, temperature 0, stop ["\n"]}, up to
// `max_concurrency` at once on one thread (tools/bench/http_client). The server's KV policy is
// whatever it was started with, so a remote run is one configuration (--label).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "core/status.h"
#include "tools/bench/http_client.h"
#include "tools/eval/eval_results.h"
#include "tools/eval/eval_sample.h"

namespace sieve::eval {

struct RemoteOptions {
  bench::HttpUrl base_url;
  std::string api_key;
  std::string model;
  int max_concurrency = 16;
  double request_timeout_s = 600;
};

// One record per sample, in order. A request that fails (transport, non-2xx, no text) is a
// record with `error` and score 0; Unavailable when the host does not resolve.
Result<std::vector<SampleRecord>> RunOnServer(const RemoteOptions& options,
                                              const std::vector<const EvalSample*>& samples,
                                              const EvalConfig& config,
                                              const std::function<void(int)>& progress);

// choices[0].text of a /v1/completions answer, or InvalidArgument saying what the body lacked.
Result<std::string> CompletionText(std::string_view body);

}  // namespace sieve::eval
