// AsyncEngine: the thread-safe front door to an Engine.
//
// The Engine is single-threaded. AsyncEngine gives it one thread of its own (the engine thread),
// which alone calls Add, Abort, Step and Stats; every other thread talks to it through a
// mutex-protected inbox and a condition variable that wakes the engine thread. The engine thread
// steps while there is work and hands each request's events to that request's sink.
//
// A sink is called on the engine thread and must not block (the server's sinks post to the
// connection's executor): a slow sink slows every request in the batch. Its events come in this
// order: kAdded (or kRejected with the Engine::Add error, and nothing after), then kOutput events,
// the last of which has `output.finished`.
//
// Submitted requests count against `max_queue` until they start running; a Submit that would
// exceed it is refused with ResourceExhausted (HTTP 429), and with Unavailable (HTTP 503) once
// StopAccepting or Shutdown was called.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "runtime/engine.h"

namespace sieve {

struct RequestEvent {
  enum class Kind { kAdded, kRejected, kOutput };
  Kind kind = Kind::kOutput;
  size_t index = 0;      // which request of the Submit call
  Status status;         // kRejected: why Engine::Add refused it
  RequestOutput output;  // kOutput
};

using RequestSink = std::function<void(RequestEvent)>;

struct AsyncEngineOptions {
  int max_queue = 0;  // requests submitted but not yet running; 0: no limit
  // Run Engine::WarmUp on the engine thread before the first step. Requests submitted meanwhile
  // wait in the queue; ready() turns true when it ends. Both callbacks run on the engine thread.
  bool warm_up = false;
  bool warm_up_plan_prefill_anyway = false;  // Engine::WarmUp's (tests: a CPU warm-up with steps)
  std::function<void(int done, int total)> warm_up_progress;
  std::function<void(const Result<WarmUpReport>&)> warm_up_done;
};

struct AsyncEngineStats {
  EngineStats engine;       // as of the last step
  int num_queued = 0;       // submitted, not yet running (inbox + the engine's waiting)
  int num_in_flight = 0;    // submitted, not yet finished
  int64_t num_aborted = 0;  // requests aborted (client gone, shutdown)
};

class AsyncEngine {
 public:
  using Ticket = uint64_t;  // names a submitted request before the engine has given it an id

  // Starts the engine thread. `engine` must not be used by anyone else from now on.
  AsyncEngine(std::unique_ptr<Engine> engine, AsyncEngineOptions options);
  ~AsyncEngine();  // Shutdown(0)
  AsyncEngine(const AsyncEngine&) = delete;
  AsyncEngine& operator=(const AsyncEngine&) = delete;

  // Queues `requests` as one unit (all or none: the queue limit counts all of them). `sink` gets
  // every event of every one of them, with RequestEvent::index saying which.
  Result<std::vector<Ticket>> Submit(std::vector<Request> requests, RequestSink sink);
  // Ends a request at once, freeing its KV pages; its sink then gets a final output with
  // FinishReason::kAbort. Unknown or finished tickets are ignored.
  void Abort(Ticket ticket);

  // From now on Submit fails with Unavailable; requests in flight go on.
  void StopAccepting();
  // Aborts every request in flight, and any submitted later, without waiting.
  void AbortAll();
  // Waits up to `grace` for requests in flight to finish, aborts what is left, and waits until
  // every sink has had its final event and the engine thread holds none of them any more (a sink
  // may keep its owner alive). Returns the number of requests aborted.
  int Drain(std::chrono::milliseconds grace);
  // StopAccepting, Drain(grace), and joins the engine thread. Idempotent.
  void Shutdown(std::chrono::milliseconds grace = std::chrono::milliseconds(0));

  // A copy of the counters published after the engine thread's last step.
  AsyncEngineStats Stats() const;
  bool accepting() const;
  // False while the warm-up runs (AsyncEngineOptions::warm_up), true from its end on: the
  // server's /health answers 503 until then.
  bool ready() const { return ready_.load(); }

  // Immutable facts about the engine, safe from any thread.
  const Tokenizer* tokenizer() const { return tokenizer_; }
  int max_model_len() const { return max_model_len_; }
  int vocab_size() const { return vocab_size_; }
  const EngineOptions& engine_options() const { return engine_options_; }
  // The engine's KV policy: its spec ("full:0-2,pyramidkv:3-31"; its knobs are
  // engine_options().kv_policy_options), and both in words (KvPolicy::ToString).
  const std::string& kv_policy_spec() const { return kv_policy_spec_; }
  const std::string& kv_policy_description() const { return kv_policy_description_; }
  // The KV pool: pages of engine_options().page_size entries of one layer (each rank's pool
  // holds its own KV heads of every page), and one rank's bytes of them.
  int num_kv_pages() const { return num_kv_pages_; }
  int64_t kv_pool_bytes() const { return kv_pool_bytes_; }
  int tensor_parallel_size() const { return tensor_parallel_size_; }
  // How the model's linear weights are held as loaded: kFp8 for --quantization fp8 and for an FP8
  // checkpoint alike (LlamaModel::quantization).
  WeightQuantization weight_quantization() const { return weight_quantization_; }

 private:
  struct Pending {
    Ticket ticket = 0;
    size_t index = 0;
    Request request;
    std::shared_ptr<RequestSink> sink;
  };
  struct Active {
    Ticket ticket = 0;
    size_t index = 0;
    std::shared_ptr<RequestSink> sink;
  };

  void Loop();
  void WarmUp();  // engine thread, before the first step
  // Engine-thread helpers.
  void AddPending(std::vector<Pending>& pending);
  void AbortTicket(Ticket ticket);
  void AbortActive();
  void Deliver(std::vector<RequestOutput>& outputs);
  // Hands out `events` (`finals` of them final) after updating the in-flight count, and lets go
  // of their sinks before Drain may return.
  void Notify(std::vector<std::pair<std::shared_ptr<RequestSink>, RequestEvent>>& events,
              int finals);
  void Publish();

  std::unique_ptr<Engine> engine_;  // touched only by the engine thread
  const AsyncEngineOptions options_;
  const Tokenizer* const tokenizer_;
  const int max_model_len_;
  const int vocab_size_;
  const EngineOptions engine_options_;
  const std::string kv_policy_spec_;
  const std::string kv_policy_description_;
  const int num_kv_pages_;
  const int64_t kv_pool_bytes_;
  const int tensor_parallel_size_;
  const WeightQuantization weight_quantization_;

  // Engine-thread state.
  std::map<RequestId, Active> active_;
  std::map<Ticket, RequestId> id_of_ticket_;

  mutable std::mutex mutex_;
  std::condition_variable wake_;     // the engine thread waits here for work
  std::condition_variable drained_;  // Drain waits here for in-flight requests to end
  std::vector<Pending> inbox_;
  std::vector<Ticket> abort_inbox_;
  bool accepting_ = true;
  bool abort_all_ = false;
  bool stopping_ = false;
  Ticket next_ticket_ = 1;
  int num_queued_ = 0;
  int num_in_flight_ = 0;
  int num_releasing_ = 0;  // finished requests whose sinks the engine thread still holds
  int64_t num_aborted_ = 0;
  EngineStats stats_;
  std::atomic<bool> ready_{false};
  std::thread thread_;  // last: starts after everything above exists
};

}  // namespace sieve
