#include "runtime/async_engine.h"

#include <exception>
#include <utility>

#include "core/logging.h"

namespace sieve {

AsyncEngine::AsyncEngine(std::unique_ptr<Engine> engine, AsyncEngineOptions options)
    : engine_(std::move(engine)),
      options_(options),
      tokenizer_(engine_->tokenizer()),
      max_model_len_(engine_->max_model_len()),
      vocab_size_(engine_->model().config().vocab_size),
      engine_options_(engine_->options()),
      kv_policy_spec_(engine_->default_policy().Spec()),
      kv_policy_description_(engine_->default_policy().ToString()),
      num_kv_pages_(engine_->Stats().num_pages),
      kv_pool_bytes_(engine_->kv_pool_bytes()),
      tensor_parallel_size_(engine_->tensor_parallel_size()),
      weight_quantization_(engine_->model().quantization()) {
  stats_ = engine_->Stats();
  ready_.store(!options_.warm_up);
  thread_ = std::thread([this] { Loop(); });
}

AsyncEngine::~AsyncEngine() { Shutdown(); }

Result<std::vector<AsyncEngine::Ticket>> AsyncEngine::Submit(std::vector<Request> requests,
                                                             RequestSink sink) {
  if (requests.empty()) return InvalidArgumentError("no requests to submit");
  auto shared_sink = std::make_shared<RequestSink>(std::move(sink));
  std::vector<Ticket> tickets;
  tickets.reserve(requests.size());
  {
    std::lock_guard lock(mutex_);
    if (!accepting_) return UnavailableError("the server is shutting down");
    const int count = static_cast<int>(requests.size());
    if (options_.max_queue > 0 && num_queued_ + count > options_.max_queue) {
      return ResourceExhaustedError("the request queue is full (" + std::to_string(num_queued_) +
                                    " waiting, --max-queue " + std::to_string(options_.max_queue) +
                                    "); retry later");
    }
    for (size_t index = 0; index < requests.size(); ++index) {
      const Ticket ticket = next_ticket_++;
      tickets.push_back(ticket);
      inbox_.push_back(Pending{ticket, index, std::move(requests[index]), shared_sink});
    }
    num_queued_ += count;
    num_in_flight_ += count;
  }
  wake_.notify_one();
  return tickets;
}

void AsyncEngine::Abort(Ticket ticket) {
  {
    std::lock_guard lock(mutex_);
    abort_inbox_.push_back(ticket);
  }
  wake_.notify_one();
}

void AsyncEngine::StopAccepting() {
  std::lock_guard lock(mutex_);
  accepting_ = false;
}

void AsyncEngine::AbortAll() {
  {
    std::lock_guard lock(mutex_);
    abort_all_ = true;
  }
  wake_.notify_one();
}

bool AsyncEngine::accepting() const {
  std::lock_guard lock(mutex_);
  return accepting_;
}

int AsyncEngine::Drain(std::chrono::milliseconds grace) {
  std::unique_lock lock(mutex_);
  if (!thread_.joinable()) return 0;
  const int64_t aborted_before = num_aborted_;
  const auto drained = [this] { return num_in_flight_ == 0 && num_releasing_ == 0; };
  if (!drained_.wait_for(lock, grace, drained)) {
    abort_all_ = true;
    wake_.notify_one();
    drained_.wait(lock, drained);
  }
  return static_cast<int>(num_aborted_ - aborted_before);
}

void AsyncEngine::Shutdown(std::chrono::milliseconds grace) {
  StopAccepting();
  Drain(grace);
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_one();
  if (thread_.joinable()) thread_.join();
}

AsyncEngineStats AsyncEngine::Stats() const {
  std::lock_guard lock(mutex_);
  AsyncEngineStats stats;
  stats.engine = stats_;
  stats.num_queued = num_queued_;
  stats.num_in_flight = num_in_flight_;
  stats.num_aborted = num_aborted_;
  return stats;
}

void AsyncEngine::WarmUp() {
  const auto keep_going = [this](int done, int total) {
    if (options_.warm_up_progress) options_.warm_up_progress(done, total);
    std::lock_guard lock(mutex_);
    return !stopping_ && !abort_all_;
  };
  Result<WarmUpReport> report = InternalError("warm-up did not finish");
  try {
    report = engine_->WarmUp(keep_going, options_.warm_up_plan_prefill_anyway);
  } catch (const std::exception& error) {
    report = InternalError(std::string("warm-up failed: ") + error.what());
  }
  // A failed warm-up leaves the engine serving as without one (first use does the work), but not
  // ready: the caller decides (sieve serve stops).
  if (report.ok() && !report->stopped) ready_.store(true);
  if (options_.warm_up_done) options_.warm_up_done(report);
}

void AsyncEngine::Loop() {
  if (options_.warm_up) WarmUp();
  for (;;) {
    std::vector<Pending> pending;
    std::vector<Ticket> aborts;
    bool abort_all = false;
    bool stopping = false;
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [this] {
        return !inbox_.empty() || !abort_inbox_.empty() || stopping_ || engine_->HasWork() ||
               (abort_all_ && !active_.empty());
      });
      pending.swap(inbox_);
      aborts.swap(abort_inbox_);
      abort_all = abort_all_;
      stopping = stopping_;
    }
    // Adds before aborts: an abort may name a request submitted in the same batch.
    AddPending(pending);
    for (const Ticket ticket : aborts) AbortTicket(ticket);
    if (abort_all) AbortActive();
    if (engine_->HasWork()) {
      std::vector<RequestOutput> outputs;
      try {
        outputs = engine_->Step();
      } catch (const std::exception& error) {
        // The engine reports bad input as Status; an exception here is a bug (or bad_alloc).
        // Fail the requests in flight rather than take the process down with the thread.
        spdlog::error("engine step failed: {}; aborting {} request(s)", error.what(),
                      active_.size());
        AbortActive();
      }
      // Publish first: whoever hears of a finished request sees its pages freed in the stats.
      Publish();
      Deliver(outputs);
    } else {
      Publish();
    }
    if (stopping && active_.empty() && !engine_->HasWork()) {
      std::lock_guard lock(mutex_);
      if (inbox_.empty()) break;
    }
  }
}

void AsyncEngine::AddPending(std::vector<Pending>& pending) {
  std::vector<std::pair<std::shared_ptr<RequestSink>, RequestEvent>> events;
  int finals = 0;
  for (Pending& item : pending) {
    Result<RequestId> id = engine_->Add(std::move(item.request));
    RequestEvent event;
    event.index = item.index;
    if (id.ok()) {
      active_[*id] = Active{item.ticket, item.index, item.sink};
      id_of_ticket_[item.ticket] = *id;
      event.kind = RequestEvent::Kind::kAdded;
    } else {
      event.kind = RequestEvent::Kind::kRejected;
      event.status = id.status();
      ++finals;
    }
    events.emplace_back(item.sink, std::move(event));
  }
  pending.clear();  // Notify must hold the last engine-side copies of the rejected ones' sinks
  Notify(events, finals);
}

void AsyncEngine::AbortTicket(Ticket ticket) {
  const auto it = id_of_ticket_.find(ticket);
  if (it == id_of_ticket_.end()) return;  // finished already, or rejected
  if (engine_->Abort(it->second)) {
    std::lock_guard lock(mutex_);
    ++num_aborted_;
  }
}

void AsyncEngine::AbortActive() {
  int aborted = 0;
  for (const auto& [id, active] : active_) aborted += engine_->Abort(id) ? 1 : 0;
  std::lock_guard lock(mutex_);
  num_aborted_ += aborted;
}

void AsyncEngine::Deliver(std::vector<RequestOutput>& outputs) {
  std::vector<std::pair<std::shared_ptr<RequestSink>, RequestEvent>> events;
  int finals = 0;
  for (RequestOutput& output : outputs) {
    const auto it = active_.find(output.id);
    if (it == active_.end()) continue;
    RequestEvent event;
    event.kind = RequestEvent::Kind::kOutput;
    event.index = it->second.index;
    std::shared_ptr<RequestSink> sink = it->second.sink;
    if (output.finished) {
      id_of_ticket_.erase(it->second.ticket);
      active_.erase(it);
      ++finals;
    }
    event.output = std::move(output);
    events.emplace_back(std::move(sink), std::move(event));
  }
  Notify(events, finals);
}

void AsyncEngine::Notify(std::vector<std::pair<std::shared_ptr<RequestSink>, RequestEvent>>& events,
                         int finals) {
  // Count the finished ones first, so that a sink's owner never sees them still in flight.
  if (finals > 0) {
    std::lock_guard lock(mutex_);
    num_in_flight_ -= finals;
    num_releasing_ += finals;
  }
  for (auto& [sink, event] : events) (*sink)(std::move(event));
  // A finished request's sink may hold the last reference to its owner (the server's holds the
  // connection), which must be gone before Drain returns: what Drain's caller destroys next (the
  // server's io_context) must outlive it.
  events.clear();
  if (finals > 0) {
    {
      std::lock_guard lock(mutex_);
      num_releasing_ -= finals;
    }
    drained_.notify_all();
  }
}

void AsyncEngine::Publish() {
  EngineStats stats = engine_->Stats();
  std::lock_guard lock(mutex_);
  num_queued_ = static_cast<int>(inbox_.size()) + stats.num_waiting;
  stats_ = std::move(stats);
}

}  // namespace sieve
