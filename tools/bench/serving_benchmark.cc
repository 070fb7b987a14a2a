#include "tools/bench/serving_benchmark.h"

#include <sys/resource.h>

#include <boost/asio/steady_timer.hpp>

#include <chrono>
#include <deque>
#include <optional>

#include <fmt/format.h>

#include "tools/bench/arrivals.h"
#include "tools/bench/progress_bar.h"
#include "tools/bench/sse_parser.h"

namespace sieve::bench {

namespace {

namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;

constexpr size_t kMaxErrorBodyBytes = 600;  // of a non-2xx answer, kept in the error message
constexpr std::chrono::milliseconds kTickEvery{250};

double Seconds(Clock::duration duration) { return std::chrono::duration<double>(duration).count(); }

Clock::duration FromSeconds(double seconds) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

// One socket per request in flight: a high concurrency can exceed the default soft limit on open
// files (often 1024), so raise it towards the hard limit when needed.
void EnsureOpenFileLimit(size_t sockets) {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return;
  const rlim_t wanted = static_cast<rlim_t>(sockets) + 256;
  if (limit.rlim_cur >= wanted) return;
  limit.rlim_cur = std::min(wanted, limit.rlim_max);
  setrlimit(RLIMIT_NOFILE, &limit);
}

// The state of one request while its response streams in.
struct Exchange {
  SseParser parser;
  Clock::time_point sent;
  Clock::time_point last_text;   // when the latest chunk with text arrived
  Clock::time_point last_event;  // when the latest event other than [DONE] arrived
  bool got_text = false;
  bool saw_done = false;
  int http_status = 0;
  std::string error_body;    // of a non-2xx answer
  std::string stream_error;  // a bad event or an error object in the stream
  std::optional<int64_t> completion_tokens;
};

// Owns the io_context and everything the callbacks touch; they capture `this`, which outlives
// io_.run().
class LoadRunner {
 public:
  // One of `prompts` and `conversations` is empty: a prompt is a request, a conversation one
  // request a turn.
  LoadRunner(const ServingLoadOptions& options, const std::vector<BenchPrompt>& prompts,
             const std::vector<BenchConversation>& conversations, ProgressBar* progress)
      : options_(options),
        prompts_(prompts),
        conversations_(conversations),
        progress_(progress),
        arrival_timer_(io_),
        tick_timer_(io_) {
    if (conversations_.empty()) {
      for (size_t index = 0; index < prompts_.size(); ++index) first_record_.push_back(index);
      records_.resize(prompts_.size());
    } else {
      for (size_t index = 0; index < conversations_.size(); ++index) {
        first_record_.push_back(records_.size());
        for (size_t turn = 0; turn < conversations_[index].messages.size(); ++turn) {
          RequestRecord record;
          record.conversation = static_cast<int>(index);
          record.turn = static_cast<int>(turn);
          record.output_len_requested = conversations_[index].output_len;
          records_.push_back(std::move(record));
        }
      }
      prompt_texts_.resize(records_.size());
    }
    exchanges_.resize(records_.size());
    bodies_.resize(records_.size());
  }

  Result<ServingLoadResult> Run() {
    SIEVE_ASSIGN_OR_RETURN(endpoints_, ResolveHost(io_, options_.base_url));
    target_ = options_.base_url.path;
    if (options_.endpoint.empty() || options_.endpoint.front() != '/') target_ += '/';
    target_ += options_.endpoint;
    // Bodies are built before the clock starts: JSON encoding is not the server's time. (A
    // conversation's later turns are built when the turn before ends, before their clock starts.)
    for (size_t index = 0; index < prompts_.size(); ++index) {
      const BenchPrompt& prompt = prompts_[index];
      bodies_[index] = MakeRequestBody(options_.body, prompt.prompt, prompt.output_len).dump();
      records_[index].prompt_len = prompt.prompt_len;
      records_[index].output_len_requested = prompt.output_len;
    }
    for (size_t index = 0; index < conversations_.size(); ++index) {
      const BenchConversation& conversation = conversations_[index];
      if (conversation.messages.empty()) continue;
      const size_t first = first_record_[index];
      prompt_texts_[first] = conversation.messages.front();
      bodies_[first] =
          MakeRequestBody(options_.body, prompt_texts_[first], conversation.output_len).dump();
      records_[first].prompt_len = conversation.message_lens.front();
    }
    arrivals_ = MakeArrivalTimes(static_cast<int>(first_record_.size()), options_.request_rate,
                                 options_.burstiness, options_.seed);
    EnsureOpenFileLimit(options_.max_concurrency > 0 ? static_cast<size_t>(options_.max_concurrency)
                                                     : first_record_.size());
    start_ = Clock::now();
    end_ = start_;
    if (!records_.empty()) {
      ReleaseDue();
      Tick();
      io_.run();
    }
    ServingLoadResult result;
    result.duration_s = Seconds(end_ - start_);
    result.records = std::move(records_);
    result.prompts = std::move(prompt_texts_);
    return result;
  }

 private:
  // Moves every request whose release time has come to the waiting queue, sends what the
  // concurrency cap allows, and sleeps until the next release.
  void ReleaseDue() {
    const Clock::time_point now = Clock::now();
    while (next_release_ < arrivals_.size() &&
           start_ + FromSeconds(arrivals_[next_release_]) <= now) {
      const size_t first = first_record_[next_release_];
      records_[first].arrival_s = arrivals_[next_release_];
      waiting_.push_back(first);
      ++next_release_;
    }
    SendWaiting();
    if (next_release_ < arrivals_.size()) {
      arrival_timer_.expires_at(start_ + FromSeconds(arrivals_[next_release_]));
      arrival_timer_.async_wait([this](const boost::system::error_code& error) {
        if (!error) ReleaseDue();
      });
    }
  }

  void SendWaiting() {
    while (!waiting_.empty() &&
           (options_.max_concurrency <= 0 || in_flight_ < options_.max_concurrency)) {
      const size_t index = waiting_.front();
      waiting_.pop_front();
      Send(index);
    }
  }

  void Send(size_t index) {
    ++in_flight_;
    Exchange& exchange = exchanges_[index];
    exchange.sent = Clock::now();
    records_[index].start_s = Seconds(exchange.sent - start_);
    HttpRequestSpec spec;
    spec.method = "POST";
    spec.target = target_;
    spec.body = std::move(bodies_[index]);
    if (!options_.api_key.empty()) {
      spec.headers.emplace_back("Authorization", "Bearer " + options_.api_key);
    }
    spec.timeout = std::chrono::duration_cast<std::chrono::milliseconds>(
        std::chrono::duration<double>(options_.request_timeout_s));
    HttpCallbacks callbacks;
    callbacks.on_status = [this, index](int status) { exchanges_[index].http_status = status; };
    callbacks.on_body = [this, index](std::string_view bytes) { return OnBody(index, bytes); };
    callbacks.on_done = [this, index](const Status& status) { OnDone(index, status); };
    StartHttpCall(io_, endpoints_, options_.base_url, std::move(spec), std::move(callbacks));
  }

  static bool IsSuccess(int http_status) { return http_status >= 200 && http_status < 300; }

  bool OnBody(size_t index, std::string_view bytes) {
    Exchange& exchange = exchanges_[index];
    if (!IsSuccess(exchange.http_status)) {
      const size_t room =
          kMaxErrorBodyBytes - std::min(kMaxErrorBodyBytes, exchange.error_body.size());
      exchange.error_body.append(bytes.substr(0, room));
      return true;
    }
    // Every event of one read arrived together: they share its timestamp.
    const Clock::time_point now = Clock::now();
    bool keep_reading = true;
    exchange.parser.Feed(bytes, [&](std::string_view data) {
      if (!OnEvent(index, data, now)) keep_reading = false;
    });
    return keep_reading;
  }

  // Returns false once the stream has nothing more to say ([DONE] or an error).
  bool OnEvent(size_t index, std::string_view data, Clock::time_point now) {
    Exchange& exchange = exchanges_[index];
    if (exchange.saw_done || !exchange.stream_error.empty()) return false;
    Result<StreamEvent> event = ParseStreamEvent(data);
    if (!event.ok()) {
      exchange.stream_error = event.status().message();
      return false;
    }
    if (event->done) {
      exchange.saw_done = true;
      return false;
    }
    if (!event->error.empty()) {
      exchange.stream_error = "the server reported an error mid-stream: " + event->error;
      return false;
    }
    exchange.last_event = now;
    RequestRecord& record = records_[index];
    if (!event->text.empty()) {
      if (!exchange.got_text) {
        record.ttft_s = Seconds(now - exchange.sent);
        exchange.got_text = true;
      } else {
        record.itl_s.push_back(Seconds(now - exchange.last_text));
      }
      exchange.last_text = now;
      record.generated_text += event->text;
      ++chunks_received_;
    }
    if (event->completion_tokens) exchange.completion_tokens = event->completion_tokens;
    return true;
  }

  void OnDone(size_t index, const Status& status) {
    const Clock::time_point now = Clock::now();
    Exchange& exchange = exchanges_[index];
    RequestRecord& record = records_[index];
    if (status.ok() && IsSuccess(exchange.http_status) && !exchange.saw_done &&
        exchange.stream_error.empty()) {
      // A last event may lack its closing blank line when the server just closed the stream.
      exchange.parser.Finish(
          [&](std::string_view data) { OnEvent(index, data, exchange.last_event); });
    }
    if (!status.ok()) {
      record.error = status.message();
    } else if (!IsSuccess(exchange.http_status)) {
      record.error =
          fmt::format("HTTP {} from {}: {}", exchange.http_status, target_, exchange.error_body);
    } else if (!exchange.stream_error.empty()) {
      record.error = exchange.stream_error;
    } else if (!exchange.got_text) {
      record.error = "the response streamed no generated text (does the server stream " + target_ +
                     " with \"stream\": true?)";
    }
    record.success = record.error.empty();
    record.e2e_s = Seconds((record.success ? exchange.last_event : now) - exchange.sent);
    if (exchange.completion_tokens) {
      record.output_tokens = *exchange.completion_tokens;
      record.output_tokens_from_usage = true;
    }
    exchange = Exchange();
    --in_flight_;
    ++num_done_;
    if (!record.success) ++num_failed_;
    if (!conversations_.empty()) NextTurn(index, now);
    if (progress_ != nullptr) progress_->Update(num_done_, num_failed_, chunks_received_);
    if (num_done_ == static_cast<int>(records_.size())) {
      end_ = now;
      arrival_timer_.cancel();
      tick_timer_.cancel();
    } else {
      SendWaiting();
    }
  }

  // After turn `index` of a conversation ended: its next turn goes to the front of the queue (the
  // slot this turn held is free, so it is sent at once), or, when this turn failed, every later
  // turn is recorded as failed.
  void NextTurn(size_t index, Clock::time_point now) {
    const RequestRecord& record = records_[index];
    const BenchConversation& conversation =
        conversations_[static_cast<size_t>(record.conversation)];
    const size_t next_turn = static_cast<size_t>(record.turn) + 1;
    if (next_turn >= conversation.messages.size()) return;
    if (!record.success) {
      for (size_t turn = next_turn; turn < conversation.messages.size(); ++turn) {
        RequestRecord& skipped = records_[index + (turn - next_turn) + 1];
        skipped.error = fmt::format("not sent: turn {} of its conversation failed", record.turn);
        skipped.arrival_s = Seconds(now - start_);
        skipped.start_s = skipped.arrival_s;
        ++num_done_;
        ++num_failed_;
      }
      return;
    }
    const size_t next = index + 1;
    prompt_texts_[next] =
        prompt_texts_[index] + record.generated_text + conversation.messages[next_turn];
    bodies_[next] =
        MakeRequestBody(options_.body, prompt_texts_[next], conversation.output_len).dump();
    records_[next].arrival_s = Seconds(now - start_);
    waiting_.push_front(next);
  }

  // Keeps the progress display's clock moving between completions.
  void Tick() {
    if (progress_ != nullptr) progress_->Update(num_done_, num_failed_, chunks_received_);
    tick_timer_.expires_after(kTickEvery);
    tick_timer_.async_wait([this](const boost::system::error_code& error) {
      if (!error && num_done_ < static_cast<int>(records_.size())) Tick();
    });
  }

  const ServingLoadOptions& options_;
  const std::vector<BenchPrompt>& prompts_;
  const std::vector<BenchConversation>& conversations_;
  ProgressBar* progress_;
  asio::io_context io_;
  asio::steady_timer arrival_timer_;
  asio::steady_timer tick_timer_;
  TcpEndpoints endpoints_;
  std::string target_;
  // [requests]: every prompt, or every turn of every conversation (conversation by conversation)
  std::vector<std::string> bodies_;        // [requests] request JSON, moved out when sent
  std::vector<RequestRecord> records_;     // [requests]
  std::vector<Exchange> exchanges_;        // [requests]
  std::vector<std::string> prompt_texts_;  // [requests] conversations only: each turn's prompt
  // [prompts or conversations]: what the arrival process releases
  std::vector<size_t> first_record_;  // its first request
  std::vector<double> arrivals_;      // release time, s from start_
  std::deque<size_t> waiting_;        // requests released, not yet sent (concurrency cap)
  size_t next_release_ = 0;           // into first_record_
  int in_flight_ = 0;
  int num_done_ = 0;
  int num_failed_ = 0;
  int64_t chunks_received_ = 0;
  Clock::time_point start_;
  Clock::time_point end_;
};

// Servers that send no usage chunk: count the text with the benchmark's tokenizer, as vLLM does.
void CountUnreportedOutputTokens(const Tokenizer& tokenizer, std::vector<RequestRecord>& records) {
  for (RequestRecord& record : records) {
    if (!record.success || record.output_tokens_from_usage) continue;
    auto ids = tokenizer.Encode(record.generated_text, /*add_bos=*/false);
    record.output_tokens = ids.ok() ? static_cast<int64_t>(ids->size()) : 0;
  }
}

}  // namespace

Result<ServingLoadResult> RunServingLoad(const ServingLoadOptions& options,
                                         const std::vector<BenchPrompt>& prompts,
                                         const Tokenizer& tokenizer, ProgressBar* progress) {
  static const std::vector<BenchConversation> kNoConversations;
  LoadRunner runner(options, prompts, kNoConversations, progress);
  SIEVE_ASSIGN_OR_RETURN(ServingLoadResult result, runner.Run());
  if (progress != nullptr) progress->Finish();
  CountUnreportedOutputTokens(tokenizer, result.records);
  return result;
}

Result<ServingLoadResult> RunConversationLoad(const ServingLoadOptions& options,
                                              const std::vector<BenchConversation>& conversations,
                                              const Tokenizer& tokenizer, ProgressBar* progress) {
  for (const BenchConversation& conversation : conversations) {
    if (conversation.messages.empty() ||
        conversation.messages.size() != conversation.message_lens.size()) {
      return InvalidArgumentError("a conversation needs a message and a length for every turn");
    }
  }
  static const std::vector<BenchPrompt> kNoPrompts;
  LoadRunner runner(options, kNoPrompts, conversations, progress);
  SIEVE_ASSIGN_OR_RETURN(ServingLoadResult result, runner.Run());
  if (progress != nullptr) progress->Finish();
  CountUnreportedOutputTokens(tokenizer, result.records);
  // Later turns' prompts were made at run time: their length is the whole prompt's, re-tokenised.
  for (size_t index = 0; index < result.records.size(); ++index) {
    RequestRecord& record = result.records[index];
    if (record.turn <= 0 || result.prompts[index].empty()) continue;
    auto ids = tokenizer.Encode(result.prompts[index], /*add_bos=*/false);
    record.prompt_len = ids.ok() ? static_cast<int>(ids->size()) : 0;
  }
  return result;
}

}  // namespace sieve::bench
