// FakeOpenAiServer: a tiny OpenAI-compatible SSE server for the load generator's tests. It streams
// a known number of tokens with known delays, so what the client measures can be checked against
// what the server did. One thread per connection: fine for a test, and independent of the
// client's async design.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

namespace sieve::bench::testing {

struct FakeServerOptions {
  int max_tokens_cap = 8;  // tokens streamed: min(request max_tokens, this)
  std::chrono::milliseconds first_token_delay{50};
  std::chrono::milliseconds token_delay{20};
  bool send_usage = true;     // answer stream_options.include_usage with a usage chunk
  bool split_events = false;  // write every event in 3-byte HTTP chunks
  int fail_every = 0;         // every n-th generation request (1-based) gets HTTP 500; 0: never
  // GET /metrics also exposes vLLM's prefix-cache counters, kept as a prefix cache of whole
  // prompts would keep them, one token a byte (the embedded byte tokenizer's count): each
  // generation request looks up its prompt's bytes (queries) and hits as many as its longest
  // common prefix with any prompt received before it. They start at these values, as a server's
  // that ran before the benchmark.
  bool prefix_cache_metrics = false;
  int64_t prefix_cache_initial_queries = 0;
  int64_t prefix_cache_initial_hits = 0;
};

class FakeOpenAiServer {
 public:
  explicit FakeOpenAiServer(FakeServerOptions options);
  ~FakeOpenAiServer();
  FakeOpenAiServer(const FakeOpenAiServer&) = delete;
  FakeOpenAiServer& operator=(const FakeOpenAiServer&) = delete;

  int port() const { return port_; }
  std::string base_url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  int generation_requests() const { return generation_requests_.load(); }
  nlohmann::json last_request_body() const;
  // The prompt of every generation request (a chat request's first message), in arrival order.
  std::vector<std::string> prompts() const;
  // The text of the i-th token: what a client should reassemble.
  static std::string TokenText(int index);

 private:
  struct Impl;
  void AcceptLoop();
  void Serve(int socket_fd);

  FakeServerOptions options_;
  std::unique_ptr<Impl> impl_;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::atomic<int> generation_requests_{0};
  mutable std::mutex mutex_;
  nlohmann::json last_request_body_;
  std::vector<std::string> prompts_;  // guarded by mutex_
  int64_t prefix_cache_queries_ = 0;  // guarded by mutex_
  int64_t prefix_cache_hits_ = 0;     // guarded by mutex_
  std::thread accept_thread_;
  std::vector<std::thread> connection_threads_;  // guarded by mutex_
};

}  // namespace sieve::bench::testing
