// AsyncEngine on the CPU backend with the embedded model: outputs equal the Engine's, errors reach
// the submitter, aborts free pages at once, the queue limit and shutdown refuse work, and many
// threads may submit at once.
#include "runtime/async_engine.h"

#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <map>
#include <thread>

#include "backend/backend.h"
#include "runtime/model_loader.h"

namespace sieve {
namespace {

using namespace std::chrono_literals;

struct EngineParts {
  std::unique_ptr<Backend> backend;
  LoadedModel loaded;
  std::unique_ptr<Engine> engine;
};

EngineParts MakeEngine(int max_num_seqs = 16) {
  EngineParts parts;
  parts.backend = MakeCpuBackend();
  LoadModelOptions load;
  load.tiny_random = true;  // fast, and its byte vocabulary is what the tests' ids assume
  load.max_model_len = 1024;
  auto loaded = LoadModel(load, *parts.backend);
  EXPECT_TRUE(loaded.ok()) << loaded.status().ToString();
  parts.loaded = std::move(loaded).value();
  EngineOptions options;
  options.max_model_len = 1024;
  options.max_num_seqs = max_num_seqs;
  options.kv_memory_bytes = int64_t{16} << 20;
  auto engine = Engine::Create(std::move(parts.loaded.model), parts.loaded.tokenizer.get(),
                               parts.loaded.eos_ids, options);
  EXPECT_TRUE(engine.ok()) << engine.status().ToString();
  parts.engine = std::move(engine).value();
  return parts;
}

Request Greedy(std::vector<int32_t> prompt, int max_tokens) {
  Request request;
  request.prompt = std::move(prompt);
  request.sampling.temperature = 0;
  request.sampling.max_tokens = max_tokens;
  request.sampling.ignore_eos = true;
  return request;
}

// Collects one request's events; Wait() returns when the final one came.
struct Collector {
  std::mutex mutex;
  std::vector<int32_t> tokens;
  std::vector<RequestEvent::Kind> kinds;
  std::optional<Status> rejected;
  std::optional<FinishReason> finish;
  std::promise<void> done;
  std::promise<void> first_token;
  bool first_token_set = false;

  RequestSink Sink() {
    return [this](RequestEvent event) {
      std::lock_guard lock(mutex);
      kinds.push_back(event.kind);
      if (event.kind == RequestEvent::Kind::kRejected) {
        rejected = event.status;
        done.set_value();
        return;
      }
      if (event.kind != RequestEvent::Kind::kOutput) return;
      tokens.insert(tokens.end(), event.output.new_tokens.begin(), event.output.new_tokens.end());
      if (!tokens.empty() && !first_token_set) {
        first_token_set = true;
        first_token.set_value();
      }
      if (event.output.finished) {
        finish = event.output.finish_reason;
        done.set_value();
      }
    };
  }
  void Wait() { done.get_future().wait(); }
};

TEST(AsyncEngineTest, OutputsEqualTheSynchronousEngine) {
  const std::vector<int32_t> prompt = {256, 72, 101, 108, 108, 111};
  std::vector<int32_t> expected;
  {
    EngineParts parts = MakeEngine();
    ASSERT_TRUE(parts.engine->Add(Greedy(prompt, 24)).ok());
    while (parts.engine->HasWork()) {
      for (const RequestOutput& output : parts.engine->Step()) {
        expected.insert(expected.end(), output.new_tokens.begin(), output.new_tokens.end());
      }
    }
  }
  Collector collector;  // before the engine: it must outlive the engine thread
  EngineParts parts = MakeEngine();
  AsyncEngine engine(std::move(parts.engine), {});
  auto tickets = engine.Submit({Greedy(prompt, 24)}, collector.Sink());
  ASSERT_TRUE(tickets.ok()) << tickets.status().ToString();
  collector.Wait();
  EXPECT_EQ(collector.tokens, expected);
  ASSERT_EQ(collector.finish, FinishReason::kLength);
  ASSERT_FALSE(collector.kinds.empty());
  EXPECT_EQ(collector.kinds.front(), RequestEvent::Kind::kAdded);
  engine.Shutdown();
  EXPECT_EQ(engine.Stats().num_in_flight, 0);
  EXPECT_EQ(engine.Stats().engine.generation_tokens, 24);
}

TEST(AsyncEngineTest, AddErrorsReachTheSubmitter) {
  Collector collector;
  EngineParts parts = MakeEngine();
  AsyncEngine engine(std::move(parts.engine), {});
  auto tickets = engine.Submit({Greedy({256, 5000}, 4)}, collector.Sink());
  ASSERT_TRUE(tickets.ok());
  collector.Wait();
  ASSERT_TRUE(collector.rejected.has_value());
  EXPECT_EQ(collector.rejected->code(), StatusCode::kInvalidArgument);
  EXPECT_NE(collector.rejected->message().find("5000"), std::string::npos);
}

TEST(AsyncEngineTest, AbortFreesPagesAtOnce) {
  Collector collector;
  EngineParts parts = MakeEngine();
  AsyncEngine engine(std::move(parts.engine), {});
  auto tickets = engine.Submit({Greedy({256, 1, 2, 3}, 1000)}, collector.Sink());
  ASSERT_TRUE(tickets.ok());
  collector.first_token.get_future().wait();
  EXPECT_GT(engine.Stats().engine.num_pages_used, 0);
  engine.Abort(tickets->front());
  collector.Wait();
  EXPECT_EQ(collector.finish, FinishReason::kAbort);
  EXPECT_LT(collector.tokens.size(), 1000u);
  // The stats are published after the step that reported the abort.
  for (int attempt = 0; attempt < 200 && engine.Stats().engine.num_pages_used > 0; ++attempt) {
    std::this_thread::sleep_for(1ms);
  }
  EXPECT_EQ(engine.Stats().engine.num_pages_used, 0);
  EXPECT_EQ(engine.Stats().num_aborted, 1);
  EXPECT_EQ(engine.Stats().num_in_flight, 0);
}

TEST(AsyncEngineTest, QueueLimitRefusesWithResourceExhausted) {
  Collector running;
  Collector waiting;
  EngineParts parts = MakeEngine(/*max_num_seqs=*/1);
  AsyncEngine engine(std::move(parts.engine), AsyncEngineOptions{.max_queue = 1});
  auto first = engine.Submit({Greedy({256, 1}, 1000)}, running.Sink());
  ASSERT_TRUE(first.ok());
  running.first_token.get_future().wait();  // running now, so no longer queued
  auto second = engine.Submit({Greedy({256, 2}, 2)}, waiting.Sink());
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  auto third = engine.Submit({Greedy({256, 3}, 2)}, [](RequestEvent) {});
  ASSERT_FALSE(third.ok());
  EXPECT_EQ(third.status().code(), StatusCode::kResourceExhausted);
  // All or nothing: two requests never fit a queue of one.
  EngineParts other_parts = MakeEngine();
  AsyncEngine other(std::move(other_parts.engine), AsyncEngineOptions{.max_queue = 1});
  auto pair = other.Submit({Greedy({256, 1}, 2), Greedy({256, 2}, 2)}, [](RequestEvent) {});
  EXPECT_EQ(pair.status().code(), StatusCode::kResourceExhausted);
  engine.Abort(first->front());
  waiting.Wait();
  EXPECT_EQ(waiting.finish, FinishReason::kLength);
}

TEST(AsyncEngineTest, ShutdownRefusesNewWorkAndAbortsAfterTheGrace) {
  Collector long_request;
  EngineParts parts = MakeEngine();
  AsyncEngine engine(std::move(parts.engine), {});
  ASSERT_TRUE(engine.Submit({Greedy({256, 1}, 1000)}, long_request.Sink()).ok());
  long_request.first_token.get_future().wait();
  engine.StopAccepting();
  auto refused = engine.Submit({Greedy({256, 2}, 2)}, [](RequestEvent) {});
  EXPECT_EQ(refused.status().code(), StatusCode::kUnavailable);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(engine.Drain(50ms), 1);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  long_request.Wait();
  EXPECT_EQ(long_request.finish, FinishReason::kAbort);
  engine.Shutdown();
}

TEST(AsyncEngineTest, DrainLetsShortRequestsFinish) {
  Collector collector;
  EngineParts parts = MakeEngine();
  AsyncEngine engine(std::move(parts.engine), {});
  ASSERT_TRUE(engine.Submit({Greedy({256, 1}, 8)}, collector.Sink()).ok());
  engine.StopAccepting();
  EXPECT_EQ(engine.Drain(10s), 0);
  collector.Wait();
  EXPECT_EQ(collector.finish, FinishReason::kLength);
  EXPECT_EQ(collector.tokens.size(), 8u);
}

// A sink may hold the last reference to its owner (the server's holds the connection), and
// Drain's caller may then destroy what that owner needs (the server's io_context): ASan saw a
// connection destroyed by the engine thread after its io_context, because Drain returned while
// the engine thread still held the sink it had just called. Here the sink dawdles after its final
// event, when the request is no longer in flight; Drain must still wait for the sink to be gone,
// for a finished request and for a rejected one.
TEST(AsyncEngineTest, DrainReturnsOnlyOnceTheSinksAreReleased) {
  EngineParts parts = MakeEngine();
  AsyncEngine engine(std::move(parts.engine), {});
  for (const std::vector<int32_t>& prompt :
       std::vector<std::vector<int32_t>>{{256, 1}, {256, 5000}}) {
    auto owner = std::make_shared<int>(0);
    const std::weak_ptr<int> watch = owner;
    auto final_event = std::make_shared<std::promise<void>>();
    std::future<void> final_seen = final_event->get_future();
    auto sink = [owner = std::move(owner), final_event](RequestEvent event) {
      if (event.kind == RequestEvent::Kind::kRejected || event.output.finished) {
        final_event->set_value();
        std::this_thread::sleep_for(100ms);
      }
    };
    ASSERT_TRUE(engine.Submit({Greedy(prompt, 4)}, std::move(sink)).ok());
    final_seen.wait();
    EXPECT_EQ(engine.Drain(10s), 0);
    EXPECT_TRUE(watch.expired()) << "prompt ending in " << prompt.back();
  }
  engine.Shutdown();
}

TEST(AsyncEngineTest, ManyThreadsSubmitAtOnce) {
  EngineParts parts = MakeEngine(/*max_num_seqs=*/8);
  AsyncEngine engine(std::move(parts.engine), {});
  constexpr int kThreads = 8;
  constexpr int kPerThread = 4;
  std::atomic<int> finished_tokens{0};
  std::vector<std::thread> threads;
  for (int thread = 0; thread < kThreads; ++thread) {
    threads.emplace_back([&, thread] {
      for (int index = 0; index < kPerThread; ++index) {
        // Shared with the sink: the engine thread may still be inside it when Wait returns.
        auto collector = std::make_shared<Collector>();
        RequestSink sink = [collector, inner = collector->Sink()](RequestEvent event) {
          inner(std::move(event));
        };
        auto tickets = engine.Submit(
            {Greedy({256, static_cast<int32_t>(thread), static_cast<int32_t>(index)}, 5)},
            std::move(sink));
        ASSERT_TRUE(tickets.ok());
        collector->Wait();
        std::lock_guard lock(collector->mutex);
        finished_tokens += static_cast<int>(collector->tokens.size());
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(finished_tokens.load(), kThreads * kPerThread * 5);
}

}  // namespace
}  // namespace sieve
