// The HTTP server end to end on the CPU backend with the tiny random-weight model: real sockets,
// a small synchronous Beast client, and `sieve serve` itself (default model) for the signal test.
// The tiny model's text is noise, so tests compare the server with itself (stream vs. not, text vs.
// token ids, a run with a stop string vs. one without) rather than with expected words.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <functional>
#include <future>
#include <map>
#include <regex>
#include <thread>

#include <utility>  // before Asio: Boost 1.74's headers use std::exchange without it

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "core/fixtures.h"
#include "core/testing.h"
#include "runtime/async_engine.h"
#include "runtime/model_loader.h"
#include "server/http_server.h"
#include "tokenizer/tokenizer_loader.h"

namespace sieve {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;
using json = nlohmann::json;
using namespace std::chrono_literals;

constexpr char kModel[] = "sieve-embedded";

struct ServerConfig {
  ServerOptions server;
  // The model: the tiny random-weight one (fast; these tests check the protocol, not the text),
  // else `model_dir` ("" : the default model, sieve-tiny-10m).
  bool tiny_random = true;
  std::string model_dir;
  std::string quantization = "none";    // --quantization
  std::string kv_cache_dtype = "auto";  // --kv-cache-dtype
  int max_model_len = 512;
  int max_num_seqs = 64;
  int max_queue = 0;
  std::string kv_policy = "full";  // the engine's --kv-policy and knobs
  KvPolicyOptions kv_policy_options;
  bool enable_prefix_caching = false;  // --enable-prefix-caching
  // An engine-thread warm-up before serving (CPU: its prefill steps), reporting to this.
  std::function<void(int done, int total)> warm_up_progress;
};

// An in-process server on a free port.
class TestServer {
 public:
  explicit TestServer(ServerConfig config = {}) {
    backend_ = MakeCpuBackend();
    LoadModelOptions load;
    load.tiny_random = config.tiny_random;
    load.model_dir = config.model_dir;
    load.quantization = config.quantization;
    load.max_model_len = config.max_model_len;
    auto loaded = LoadModel(load, *backend_);
    SIEVE_CHECK(loaded.ok()) << loaded.status().ToString();
    loaded_ = std::move(loaded).value();
    EngineOptions options;
    options.max_model_len = config.max_model_len;
    options.max_num_seqs = config.max_num_seqs;
    options.kv_memory_bytes = int64_t{32} << 20;
    options.kv_policy = config.kv_policy;
    options.kv_policy_options = config.kv_policy_options;
    options.kv_cache_dtype = config.kv_cache_dtype;
    options.enable_prefix_caching = config.enable_prefix_caching;
    auto engine =
        Engine::Create(std::move(loaded_.model), loaded_.tokenizer.get(), loaded_.eos_ids, options);
    SIEVE_CHECK(engine.ok()) << engine.status().ToString();
    AsyncEngineOptions engine_options{.max_queue = config.max_queue};
    if (config.warm_up_progress) {
      engine_options.warm_up = true;
      engine_options.warm_up_plan_prefill_anyway = true;
      engine_options.warm_up_progress = config.warm_up_progress;
    }
    engine_ = std::make_unique<AsyncEngine>(std::move(engine).value(), engine_options);
    config.server.port = 0;
    config.server.served_model_names = {kModel};
    server_ = std::make_unique<HttpServer>(*engine_, config.server);
    const Status started = server_->Start();
    SIEVE_CHECK(started.ok()) << started.ToString();
  }
  ~TestServer() {
    server_->RequestShutdown();
    server_->Wait();
    server_.reset();
    engine_->Shutdown();
  }

  int port() const { return server_->port(); }
  HttpServer& server() { return *server_; }
  const Tokenizer& tokenizer() const { return *loaded_.tokenizer; }

 private:
  std::unique_ptr<Backend> backend_;
  LoadedModel loaded_;
  std::unique_ptr<AsyncEngine> engine_;
  std::unique_ptr<HttpServer> server_;
};

struct Response {
  int status = 0;  // -1: the connection failed
  std::string body;
  std::string content_type;
  json Json() const { return json::parse(body, nullptr, /*allow_exceptions=*/false); }
};

using Headers = std::vector<std::pair<std::string, std::string>>;

// Connects to the server; reads time out (so a server bug fails a test instead of hanging it).
void Connect(tcp::socket& socket, int port) {
  socket.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), static_cast<uint16_t>(port)));
  timeval timeout{};
  timeout.tv_sec = 60;
  setsockopt(socket.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
}

http::request<http::string_body> MakeRequest(http::verb verb, const std::string& target,
                                             const std::string& body, const Headers& headers) {
  http::request<http::string_body> request{verb, target, 11};
  request.set(http::field::host, "127.0.0.1");
  if (!body.empty()) request.set(http::field::content_type, "application/json");
  for (const auto& [name, value] : headers) request.set(name, value);
  request.body() = body;
  request.prepare_payload();
  return request;
}

Response ReadResponse(tcp::socket& socket, beast::flat_buffer& buffer) {
  http::response_parser<http::string_body> parser;
  parser.body_limit(64 << 20);
  http::read(socket, buffer, parser);
  Response response;
  response.status = static_cast<int>(parser.get().result_int());
  response.body = parser.get().body();
  response.content_type = std::string(parser.get()[http::field::content_type]);
  return response;
}

Response Send(int port, http::verb verb, const std::string& target, const std::string& body = "",
              const Headers& headers = {}) {
  try {
    net::io_context io_context;
    tcp::socket socket(io_context);
    Connect(socket, port);
    http::write(socket, MakeRequest(verb, target, body, headers));
    beast::flat_buffer buffer;
    return ReadResponse(socket, buffer);
  } catch (const std::exception& error) {
    Response response;
    response.status = -1;
    response.body = error.what();
    return response;
  }
}

Response Post(int port, const std::string& target, const json& body, const Headers& headers = {}) {
  return Send(port, http::verb::post, target, body.dump(), headers);
}

Response Get(int port, const std::string& target, const Headers& headers = {}) {
  return Send(port, http::verb::get, target, "", headers);
}

// The head of a raw POST (request line, fields, blank line); `fields` are "Name: value\r\n" lines.
std::string RawPost(const std::string& target, const std::string& fields) {
  return "POST " + target + " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + fields +
         "\r\n";
}

// `body` in the chunked transfer coding, `chunk_size` bytes a chunk, each size followed by
// `extension` (";name=value"); `trailer` ("Name: value\r\n" lines) follows the last chunk.
std::string Chunked(const std::string& body, size_t chunk_size, const std::string& extension = "",
                    const std::string& trailer = "") {
  std::string coded;
  for (size_t start = 0; start < body.size(); start += chunk_size) {
    const std::string chunk = body.substr(start, chunk_size);
    char size[32];
    std::snprintf(size, sizeof(size), "%zx", chunk.size());
    coded += size + extension + "\r\n" + chunk + "\r\n";
  }
  return coded + "0\r\n" + trailer + "\r\n";
}

// Writes `raw` in pieces of `piece_size` bytes, pausing between them so that the server reads
// the request in parts (mid-field, mid-chunk-size), then reads responses until the server closes
// the connection: every response the connection carried. A status of -1 ends the list when the
// connection failed otherwise.
std::vector<Response> Converse(int port, const std::string& raw, size_t piece_size = 0) {
  std::vector<Response> responses;
  try {
    net::io_context io_context;
    tcp::socket socket(io_context);
    Connect(socket, port);
    if (piece_size == 0) piece_size = raw.size();
    for (size_t start = 0; start < raw.size(); start += piece_size) {
      if (start > 0) std::this_thread::sleep_for(1ms);
      net::write(socket, net::buffer(raw.data() + start, std::min(piece_size, raw.size() - start)));
    }
    beast::flat_buffer buffer;
    while (true) responses.push_back(ReadResponse(socket, buffer));
  } catch (const beast::system_error& error) {
    if (error.code() != http::error::end_of_stream) {
      responses.push_back({.status = -1, .body = error.what()});
    }
  } catch (const std::exception& error) {
    responses.push_back({.status = -1, .body = error.what()});
  }
  return responses;
}

// The statuses of `responses`, for messages.
std::string Statuses(const std::vector<Response>& responses) {
  std::string statuses;
  for (const Response& response : responses) {
    statuses += std::to_string(response.status) + " " + response.body.substr(0, 200) + "\n";
  }
  return statuses;
}

// The JSON payloads of an SSE body, "[DONE]" excluded; `done` says whether it was there last.
std::vector<json> SseEvents(const std::string& body, bool* done = nullptr) {
  std::vector<json> events;
  if (done) *done = false;
  size_t position = 0;
  while (position < body.size()) {
    size_t end = body.find("\n\n", position);
    if (end == std::string::npos) end = body.size();
    const std::string event = body.substr(position, end - position);
    position = end + 2;
    if (event.rfind("data: ", 0) != 0) continue;
    const std::string data = event.substr(6);
    if (data == "[DONE]") {
      if (done) *done = position >= body.size();
      continue;
    }
    events.push_back(json::parse(data));
  }
  return events;
}

// The value of the first sample of `name` whose line contains `label` ("" : any).
double Metric(const std::string& text, const std::string& name, const std::string& label = "") {
  size_t position = 0;
  while (position < text.size()) {
    size_t end = text.find('\n', position);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(position, end - position);
    position = end + 1;
    if (line.rfind(name, 0) != 0 || line.size() <= name.size()) continue;
    if (line[name.size()] != '{' && line[name.size()] != ' ') continue;
    if (!label.empty() && line.find(label) == std::string::npos) continue;
    return std::stod(line.substr(line.rfind(' ') + 1));
  }
  return -1.0;
}

json Completion(std::string prompt, int max_tokens) {
  return {{"model", kModel},
          {"prompt", std::move(prompt)},
          {"max_tokens", max_tokens},
          {"temperature", 0},
          {"ignore_eos", true}};
}

json Chat(std::string content, int max_tokens) {
  return {{"model", kModel},
          {"messages", json::array({{{"role", "system"}, {"content", "Be brief."}},
                                    {{"role", "user"}, {"content", std::move(content)}}})},
          {"max_tokens", max_tokens},
          {"temperature", 0},
          {"ignore_eos", true}};
}

// Concatenated text of completion or chat chunks, per choice index.
std::map<int, std::string> StreamedText(const std::vector<json>& events) {
  std::map<int, std::string> texts;
  for (const json& event : events) {
    for (const json& choice : event["choices"]) {
      const int index = choice["index"];
      if (choice.contains("text")) texts[index] += choice["text"].get<std::string>();
      if (choice.contains("delta") && choice["delta"].contains("content")) {
        texts[index] += choice["delta"]["content"].get<std::string>();
      }
    }
  }
  return texts;
}

TEST(ServerTest, CompletionStreamedEqualsNonStreamed) {
  TestServer server;
  const Response plain = Post(server.port(), "/v1/completions", Completion("Hello", 16));
  ASSERT_EQ(plain.status, 200) << plain.body;
  EXPECT_EQ(plain.content_type, "application/json");
  const json body = plain.Json();
  EXPECT_EQ(body["object"], "text_completion");
  EXPECT_EQ(body["id"].get<std::string>().rfind("cmpl-", 0), 0u);
  EXPECT_EQ(body["model"], kModel);
  EXPECT_TRUE(body["created"].is_number_integer());
  ASSERT_EQ(body["choices"].size(), 1u);
  EXPECT_EQ(body["choices"][0]["index"], 0);
  EXPECT_EQ(body["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(body["choices"][0]["logprobs"].is_null());
  const std::string text = body["choices"][0]["text"];
  EXPECT_FALSE(text.empty());
  EXPECT_EQ(body["usage"]["prompt_tokens"], 6);  // BOS + 5 bytes
  EXPECT_EQ(body["usage"]["completion_tokens"], 16);
  EXPECT_EQ(body["usage"]["total_tokens"], 22);

  json request = Completion("Hello", 16);
  request["stream"] = true;
  request["stream_options"] = {{"include_usage", true}};
  const Response streamed = Post(server.port(), "/v1/completions", request);
  ASSERT_EQ(streamed.status, 200) << streamed.body;
  EXPECT_EQ(streamed.content_type, "text/event-stream");
  bool done = false;
  const std::vector<json> events = SseEvents(streamed.body, &done);
  EXPECT_TRUE(done);
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(StreamedText(events)[0], text);
  for (size_t index = 0; index + 1 < events.size(); ++index) {
    EXPECT_EQ(events[index]["object"], "text_completion");
    EXPECT_TRUE(events[index]["usage"].is_null());
  }
  EXPECT_EQ(events[events.size() - 2]["choices"][0]["finish_reason"], "length");
  const json& last = events.back();
  EXPECT_TRUE(last["choices"].empty());
  EXPECT_EQ(last["usage"]["completion_tokens"], 16);
  EXPECT_EQ(last["usage"]["prompt_tokens"], 6);
}

TEST(ServerTest, ChatStreamedEqualsNonStreamed) {
  TestServer server;
  const Response plain = Post(server.port(), "/v1/chat/completions", Chat("Hi there", 12));
  ASSERT_EQ(plain.status, 200) << plain.body;
  const json body = plain.Json();
  EXPECT_EQ(body["object"], "chat.completion");
  EXPECT_EQ(body["id"].get<std::string>().rfind("chatcmpl-", 0), 0u);
  EXPECT_EQ(body["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(body["choices"][0]["finish_reason"], "length");
  const std::string content = body["choices"][0]["message"]["content"];
  // The prompt is the Llama 3 template's rendering, BOS included.
  const std::vector<ChatMessage> messages = {{"system", "Be brief."}, {"user", "Hi there"}};
  const auto rendered = server.tokenizer().chat_template()->Apply(messages, true);
  ASSERT_TRUE(rendered.ok());
  const auto ids = server.tokenizer().Encode(*rendered, false);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(body["usage"]["prompt_tokens"], ids->size());
  EXPECT_EQ(body["usage"]["completion_tokens"], 12);

  json request = Chat("Hi there", 12);
  request["stream"] = true;
  const Response streamed = Post(server.port(), "/v1/chat/completions", request);
  ASSERT_EQ(streamed.status, 200);
  bool done = false;
  const std::vector<json> events = SseEvents(streamed.body, &done);
  EXPECT_TRUE(done);
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(events.front()["object"], "chat.completion.chunk");
  EXPECT_EQ(events.front()["choices"][0]["delta"]["role"], "assistant");
  EXPECT_FALSE(events.front().contains("usage"));  // only with include_usage
  EXPECT_EQ(StreamedText(events)[0], content);
  EXPECT_EQ(events.back()["choices"][0]["finish_reason"], "length");
}

TEST(ServerTest, TokenIdPromptsAndBatches) {
  TestServer server;
  const Response text = Post(server.port(), "/v1/completions", Completion("Hello", 8));
  json by_ids = Completion("", 8);
  by_ids["prompt"] = {256, 'H', 'e', 'l', 'l', 'o'};
  const Response ids = Post(server.port(), "/v1/completions", by_ids);
  ASSERT_EQ(text.status, 200);
  ASSERT_EQ(ids.status, 200) << ids.body;
  EXPECT_EQ(ids.Json()["choices"][0]["text"], text.Json()["choices"][0]["text"]);
  EXPECT_EQ(ids.Json()["usage"]["prompt_tokens"], 6);

  json batch = Completion("", 8);
  batch["prompt"] = json::array({"Hello", json::array({256, 'H', 'e', 'l', 'l', 'o'}), "Bye"});
  const Response batched = Post(server.port(), "/v1/completions", batch);
  ASSERT_EQ(batched.status, 200) << batched.body;
  const json choices = batched.Json()["choices"];
  ASSERT_EQ(choices.size(), 3u);
  EXPECT_EQ(choices[0]["text"], text.Json()["choices"][0]["text"]);
  EXPECT_EQ(choices[1]["text"], text.Json()["choices"][0]["text"]);
  EXPECT_EQ(batched.Json()["usage"]["prompt_tokens"], 6 + 6 + 4);
  EXPECT_EQ(batched.Json()["usage"]["completion_tokens"], 24);
}

TEST(ServerTest, StopStringsEndTheTextBeforeThem) {
  TestServer server;
  const Response free_run = Post(server.port(), "/v1/completions", Completion("Hello", 64));
  ASSERT_EQ(free_run.status, 200);
  const std::string text = free_run.Json()["choices"][0]["text"];
  // A two-byte ASCII piece from the middle of the noise; the stopped text ends before its first
  // occurrence.
  std::string stop;
  for (size_t position = text.size() / 3; position + 1 < text.size(); ++position) {
    const auto ascii = [](char c) { return static_cast<unsigned char>(c) < 0x80; };
    if (ascii(text[position]) && ascii(text[position + 1])) {
      stop = text.substr(position, 2);
      break;
    }
  }
  ASSERT_FALSE(stop.empty()) << "no ASCII pair in " << text;
  const std::string expected = text.substr(0, text.find(stop));
  json request = Completion("Hello", 64);
  request["stop"] = json::array({stop, "\x01\x02never"});
  const Response stopped = Post(server.port(), "/v1/completions", request);
  ASSERT_EQ(stopped.status, 200) << stopped.body;
  EXPECT_EQ(stopped.Json()["choices"][0]["text"], expected);
  EXPECT_EQ(stopped.Json()["choices"][0]["finish_reason"], "stop");
  EXPECT_LT(stopped.Json()["usage"]["completion_tokens"].get<int>(), 64);

  request["stream"] = true;
  request["stop"] = stop;  // a plain string works too
  const Response streamed = Post(server.port(), "/v1/completions", request);
  ASSERT_EQ(streamed.status, 200);
  const std::vector<json> events = SseEvents(streamed.body);
  const std::string streamed_text = StreamedText(events)[0];
  EXPECT_EQ(streamed_text, expected);
  EXPECT_EQ(streamed_text.find(stop), std::string::npos);
  EXPECT_EQ(events.back()["choices"][0]["finish_reason"], "stop");
}

TEST(ServerTest, SeededChoicesAreReproducible) {
  TestServer server;
  json request = Completion("Once", 12);
  request["n"] = 3;
  request["seed"] = 1234;
  request["temperature"] = 1.0;
  const Response first = Post(server.port(), "/v1/completions", request);
  const Response second = Post(server.port(), "/v1/completions", request);
  ASSERT_EQ(first.status, 200) << first.body;
  ASSERT_EQ(second.status, 200);
  const json choices = first.Json()["choices"];
  ASSERT_EQ(choices.size(), 3u);
  std::set<std::string> distinct;
  for (int index = 0; index < 3; ++index) {
    EXPECT_EQ(choices[index]["index"], index);
    EXPECT_EQ(choices[index]["text"], second.Json()["choices"][index]["text"]);
    distinct.insert(choices[index]["text"].get<std::string>());
  }
  EXPECT_GE(distinct.size(), 2u) << "three seeded choices should not all be equal";
  EXPECT_EQ(first.Json()["usage"]["completion_tokens"], 36);
  EXPECT_EQ(first.Json()["usage"]["prompt_tokens"], 5);  // counted once, not per choice

  request["stream"] = true;
  const Response streamed = Post(server.port(), "/v1/completions", request);
  const std::map<int, std::string> texts = StreamedText(SseEvents(streamed.body));
  ASSERT_EQ(texts.size(), 3u);
  for (int index = 0; index < 3; ++index)
    EXPECT_EQ(texts.at(index), choices[index]["text"].get<std::string>());
}

TEST(ServerTest, LogprobsHaveOpenAiShapes) {
  TestServer server;
  json request = Completion("Hello", 5);
  request["logprobs"] = 2;
  const Response completion = Post(server.port(), "/v1/completions", request);
  ASSERT_EQ(completion.status, 200) << completion.body;
  const json logprobs = completion.Json()["choices"][0]["logprobs"];
  ASSERT_EQ(logprobs["tokens"].size(), 5u);
  ASSERT_EQ(logprobs["token_logprobs"].size(), 5u);
  ASSERT_EQ(logprobs["top_logprobs"].size(), 5u);
  ASSERT_EQ(logprobs["text_offset"].size(), 5u);
  for (size_t index = 0; index < 5; ++index) {
    EXPECT_LE(logprobs["token_logprobs"][index].get<double>(), 0.0);
    const size_t top = logprobs["top_logprobs"][index].size();
    EXPECT_GE(top, 1u);
    EXPECT_LE(top, 3u);  // the top 2, plus the chosen token when it is not among them
    if (index > 0) {
      EXPECT_GE(logprobs["text_offset"][index], logprobs["text_offset"][index - 1]);
    }
  }

  json chat = Chat("Hi", 5);
  chat["logprobs"] = true;
  chat["top_logprobs"] = 2;
  const Response chat_response = Post(server.port(), "/v1/chat/completions", chat);
  ASSERT_EQ(chat_response.status, 200) << chat_response.body;
  const json content = chat_response.Json()["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 5u);
  for (const json& entry : content) {
    EXPECT_TRUE(entry["token"].is_string());
    EXPECT_LE(entry["logprob"].get<double>(), 0.0);
    EXPECT_TRUE(entry["bytes"].is_array());
    ASSERT_EQ(entry["top_logprobs"].size(), 2u);
    EXPECT_GE(entry["top_logprobs"][0]["logprob"].get<double>(),
              entry["top_logprobs"][1]["logprob"].get<double>());
    EXPECT_GE(entry["top_logprobs"][0]["logprob"].get<double>(), entry["logprob"].get<double>());
  }
  // Streaming carries each chunk's tokens' logprobs.
  chat["stream"] = true;
  const Response streamed = Post(server.port(), "/v1/chat/completions", chat);
  size_t streamed_tokens = 0;
  for (const json& event : SseEvents(streamed.body)) {
    const json& choice_logprobs = event["choices"][0]["logprobs"];
    if (!choice_logprobs.is_null()) streamed_tokens += choice_logprobs["content"].size();
  }
  EXPECT_EQ(streamed_tokens, 5u);
}

TEST(ServerTest, SixtyFourConcurrentStreamsAllComplete) {
  TestServer server;
  constexpr int kClients = 64;
  constexpr int kMaxTokens = 24;
  std::vector<int> tokens(kClients, -1);
  std::vector<int> usage(kClients, -1);
  std::vector<std::string> finish(kClients);
  std::vector<std::thread> clients;
  for (int client = 0; client < kClients; ++client) {
    clients.emplace_back([&, client] {
      json request = Completion("client " + std::to_string(client), kMaxTokens);
      request["stream"] = true;
      request["logprobs"] = 0;  // one logprob entry per token: counts the tokens streamed
      request["stream_options"] = {{"include_usage", true}};
      const Response response = Post(server.port(), "/v1/completions", request);
      if (response.status != 200) return;
      bool done = false;
      int count = 0;
      for (const json& event : SseEvents(response.body, &done)) {
        if (!event["usage"].is_null()) usage[client] = event["usage"]["completion_tokens"];
        for (const json& choice : event["choices"]) {
          if (!choice["logprobs"].is_null()) count += choice["logprobs"]["tokens"].size();
          if (!choice["finish_reason"].is_null()) finish[client] = choice["finish_reason"];
        }
      }
      if (done) tokens[client] = count;
    });
  }
  for (std::thread& client : clients) client.join();
  for (int client = 0; client < kClients; ++client) {
    EXPECT_EQ(tokens[client], kMaxTokens) << "client " << client;
    EXPECT_EQ(usage[client], kMaxTokens) << "client " << client;
    EXPECT_EQ(finish[client], "length") << "client " << client;
  }
  const std::string metrics = Get(server.port(), "/metrics").body;
  EXPECT_EQ(Metric(metrics, "sieve:generation_tokens_total"), kClients * kMaxTokens);
  EXPECT_EQ(Metric(metrics, "sieve:request_success_total", "finished_reason=\"length\""), kClients);
}

void ExpectError(const Response& response, int status, const std::string& message_part,
                 const std::string& param = "") {
  EXPECT_EQ(response.status, status) << response.body;
  const json body = response.Json();
  ASSERT_TRUE(body.is_object()) << response.body;
  ASSERT_TRUE(body.contains("error")) << response.body;
  const json& error = body["error"];
  EXPECT_TRUE(error["message"].is_string());
  EXPECT_TRUE(error["type"].is_string());
  EXPECT_TRUE(error.contains("param"));
  EXPECT_TRUE(error.contains("code"));
  EXPECT_NE(error["message"].get<std::string>().find(message_part), std::string::npos)
      << error["message"];
  if (!param.empty()) {
    EXPECT_EQ(error["param"], param) << response.body;
  }
}

TEST(ServerTest, BadRequestsGetOpenAiErrors) {
  TestServer server;
  const int port = server.port();
  ExpectError(Send(port, http::verb::post, "/v1/completions", "{\"prompt\": \"x\""), 400, "JSON");
  ExpectError(Send(port, http::verb::post, "/v1/completions", "[1, 2]"), 400, "object");
  json request = Completion("Hello", 4);
  request["max_tokens"] = "ten";
  ExpectError(Post(port, "/v1/completions", request), 400, "max_tokens", "max_tokens");
  request = Completion("Hello", 4);
  request["temperature"] = "hot";
  ExpectError(Post(port, "/v1/completions", request), 400, "temperature", "temperature");
  request = Completion("Hello", 4);
  request["top_p"] = 1.5;
  ExpectError(Post(port, "/v1/completions", request), 400, "top_p", "top_p");
  request = Completion("Hello", 4);
  request["prompt"] = 42;
  ExpectError(Post(port, "/v1/completions", request), 400, "prompt", "prompt");
  request = Completion("Hello", 4);
  request["prompt"] = {256, 9999};
  ExpectError(Post(port, "/v1/completions", request), 400, "9999", "prompt");
  request = Completion("Hello", 4);
  request["stop"] = 7;
  ExpectError(Post(port, "/v1/completions", request), 400, "stop", "stop");
  json chat = Chat("Hi", 4);
  chat["messages"] = 5;
  ExpectError(Post(port, "/v1/chat/completions", chat), 400, "messages", "messages");
  chat = Chat("Hi", 4);
  chat["messages"] = json::array({{{"role", "wizard"}, {"content", "x"}}});
  ExpectError(Post(port, "/v1/chat/completions", chat), 400, "wizard", "messages");
  ExpectError(Post(port, "/v1/chat/completions", {{"model", kModel}}), 400, "messages");
  // The context is 512 tokens.
  ExpectError(Post(port, "/v1/completions", Completion(std::string(600, 'a'), 4)), 400,
              "maximum context length", "prompt");
  ExpectError(Post(port, "/v1/completions", Completion("Hello", 510)), 400,
              "maximum context length", "max_tokens");
  // A per-request KV policy the engine refuses: its error, as a 400.
  request = Completion("Hello", 4);
  request["kv_policy"] = "bogus";
  ExpectError(Post(port, "/v1/completions", request), 400, "bogus");
  request = Completion("Hello", 4);
  request["model"] = "gpt-4";
  const Response unknown_model = Post(port, "/v1/completions", request);
  ExpectError(unknown_model, 404, "gpt-4", "model");
  EXPECT_EQ(unknown_model.Json()["error"]["code"], "model_not_found");
  ExpectError(Get(port, "/v2/nothing"), 404, "/v2/nothing");
  ExpectError(Get(port, "/v1/completions"), 405, "POST");
  // Unknown fields are ignored, nulls mean unset, and the server still works after all that.
  request = Completion("Hello", 4);
  request["frobnicate"] = {{"x", 1}};
  request["top_k"] = nullptr;
  request["user"] = "someone";
  EXPECT_EQ(Post(port, "/v1/completions", request).status, 200);
  request["kv_policy"] = "snapkv";
  EXPECT_EQ(Post(port, "/v1/completions", request).status, 200);
  const std::string metrics = Get(port, "/metrics").body;
  EXPECT_GE(Metric(metrics, "sieve:http_requests_total", "status=\"400\""), 1.0);
}

TEST(ServerTest, BodiesOverTheLimitGet413) {
  ServerConfig config;
  config.server.max_body_bytes = 1024;
  TestServer server(config);
  ExpectError(Post(server.port(), "/v1/completions", Completion(std::string(4000, 'a'), 4)), 413,
              "limit");
  // A chunked body carries no length up front: it is cut off while read, whether it comes in
  // one chunk over the limit or in chunks each under it; then the connection closes.
  const std::string large = Completion(std::string(4000, 'b'), 4).dump();
  for (const size_t chunk_size : {large.size(), size_t{100}}) {
    SCOPED_TRACE("chunks of " + std::to_string(chunk_size) + " bytes");
    const std::vector<Response> responses =
        Converse(server.port(), RawPost("/v1/completions", "Transfer-Encoding: chunked\r\n") +
                                    Chunked(large, chunk_size));
    ASSERT_EQ(responses.size(), 1u) << Statuses(responses);
    ExpectError(responses[0], 413, "larger than the limit of 1024 bytes");
  }
  // --max-body-bytes counts only the chunks' data: what bounds a chunk-size line's extensions and
  // the trailer section is the session's read buffer (128 KiB), not the memory a client can fill.
  const std::string small = Completion("Hi", 2).dump();
  const std::string huge(300 * 1024, 'x');
  for (const auto& [what, coded] :
       {std::pair{"chunk extension", Chunked(small, 64, ";name=" + huge)},
        std::pair{"trailer", Chunked(small, 64, "", "X-Padding: " + huge + "\r\n")}}) {
    SCOPED_TRACE(what);
    const std::vector<Response> responses = Converse(
        server.port(), RawPost("/v1/completions", "Transfer-Encoding: chunked\r\n") + coded);
    ASSERT_EQ(responses.size(), 1u) << Statuses(responses);
    ExpectError(responses[0], 413, "chunked request body is longer than 131072 bytes");
  }
  // Under the limit, in small chunks, extensions and a trailer included: served.
  const std::vector<Response> served =
      Converse(server.port(),
               RawPost("/v1/completions", "Transfer-Encoding: chunked\r\nConnection: close\r\n") +
                   Chunked(small, 10, ";part=1", "X-Checksum: none\r\n"));
  ASSERT_EQ(served.size(), 1u) << Statuses(served);
  EXPECT_EQ(served[0].status, 200) << served[0].body;
  // curl's way: headers with "Expect: 100-continue", the body only after "100 Continue", so a
  // body too large is refused before it is sent.
  const auto send_expecting = [&](const std::string& body, bool send_body) {
    net::io_context io_context;
    tcp::socket socket(io_context);
    Connect(socket, server.port());
    const std::string head =
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        "Expect: 100-continue\r\nContent-Length: " +
        std::to_string(body.size()) + "\r\n\r\n";
    net::write(socket, net::buffer(head));
    if (send_body) {
      std::string interim;
      std::array<char, 256> chunk;
      while (interim.find("\r\n\r\n") == std::string::npos) {
        interim.append(chunk.data(), socket.read_some(net::buffer(chunk)));
      }
      EXPECT_EQ(interim.rfind("HTTP/1.1 100 Continue\r\n", 0), 0u) << interim;
      net::write(socket, net::buffer(body));
    }
    beast::flat_buffer buffer;
    return ReadResponse(socket, buffer);
  };
  try {
    EXPECT_EQ(send_expecting(Completion("Hi", 2).dump(), true).status, 200);
    ExpectError(send_expecting(std::string(5000, ' '), false), 413, "limit");
  } catch (const std::exception& error) {
    ADD_FAILURE() << error.what();
  }
  EXPECT_EQ(Post(server.port(), "/v1/completions", Completion("Hi", 2)).status, 200);
}

TEST(ServerTest, ChunkedBodiesAreRead) {
  TestServer server;
  const int port = server.port();
  const json request = Completion("Hello", 8);
  const Response plain = Post(port, "/v1/completions", request);
  ASSERT_EQ(plain.status, 200) << plain.body;
  const std::string text = plain.Json()["choices"][0]["text"];
  const std::string body = request.dump();
  // 7-byte chunks with an extension and a trailer, arriving 5 bytes at a time; then, on the same
  // connection, a request with a Content-Length: answered only if the chunked body was read to
  // exactly its end.
  std::vector<Response> responses = Converse(
      port,
      RawPost("/v1/completions", "Transfer-Encoding: chunked\r\n") +
          Chunked(body, 7, ";piece=yes", "X-Checksum: none\r\n") +
          RawPost("/v1/completions",
                  "Connection: close\r\nContent-Length: " + std::to_string(body.size()) + "\r\n") +
          body,
      5);
  ASSERT_EQ(responses.size(), 2u) << Statuses(responses);
  for (const Response& response : responses) {
    ASSERT_EQ(response.status, 200) << response.body;
    EXPECT_EQ(response.Json()["choices"][0]["text"], text);
  }
  // Streamed, the coding's name in any case, the body in one chunk.
  json streamed = request;
  streamed["stream"] = true;
  responses = Converse(
      port, RawPost("/v1/completions", "transfer-encoding: Chunked\r\nConnection: close\r\n") +
                Chunked(streamed.dump(), 4096));
  ASSERT_EQ(responses.size(), 1u) << Statuses(responses);
  ASSERT_EQ(responses[0].status, 200) << responses[0].body;
  bool done = false;
  EXPECT_EQ(StreamedText(SseEvents(responses[0].body, &done))[0], text);
  EXPECT_TRUE(done);
  // curl sends a chunked upload with "Expect: 100-continue": "100 Continue", then the answer.
  responses = Converse(port, RawPost("/v1/chat/completions",
                                     "Transfer-Encoding: chunked\r\nExpect: 100-continue\r\n"
                                     "Connection: close\r\n") +
                                 Chunked(Chat("Hi", 4).dump(), 16));
  ASSERT_EQ(responses.size(), 2u) << Statuses(responses);
  EXPECT_EQ(responses[0].status, 100);
  EXPECT_EQ(responses[1].status, 200) << responses[1].body;
  EXPECT_EQ(responses[1].Json()["object"], "chat.completion");
}

TEST(ServerTest, TransferCodingsOtherThanChunkedAreRefused) {
  TestServer server;
  const int port = server.port();
  const std::string body = Completion("Hello", 4).dump();
  // A request smuggled in the body: served only if the server took the body for no body.
  const std::string smuggled = "GET /v2/smuggled HTTP/1.1\r\nHost: x\r\n\r\n";
  struct Case {
    std::string fields;
    std::string payload;
    int status;
    std::string message;
  };
  const Case cases[] = {
      // Only chunked is decoded: a gzip body would reach the JSON parser compressed.
      {"Transfer-Encoding: gzip, chunked\r\n", Chunked(body, 64), 501,
       "transfer coding 'gzip' is not supported"},
      // Not ending with chunked, the body's length is unknown (RFC 9112 6.3).
      {"Transfer-Encoding: chunked, gzip\r\n", smuggled, 400, "does not end with chunked"},
      {"Transfer-Encoding: identity\r\n", smuggled, 400, "does not end with chunked"},
      {"Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n", Chunked(body, 64), 501,
       "'gzip, chunked'"},
      {"Transfer-Encoding: chunked, chunked\r\n", Chunked(Chunked(body, 64), 64), 400,
       "applies chunked twice"},
      // Both framings at once: the shape of request smuggling, refused whichever comes first.
      {"Transfer-Encoding: chunked\r\nContent-Length: 5\r\n", Chunked(body, 64), 400,
       "both Content-Length and Transfer-Encoding"},
      {"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n", Chunked(body, 64), 400,
       "both Content-Length and Transfer-Encoding"},
  };
  for (const Case& refused : cases) {
    SCOPED_TRACE(refused.fields);
    // One response, then the connection closes: what followed the head is never served.
    const std::vector<Response> responses =
        Converse(port, RawPost("/v1/completions", refused.fields) + refused.payload + smuggled);
    ASSERT_EQ(responses.size(), 1u) << Statuses(responses);
    ExpectError(responses[0], refused.status, refused.message);
  }
  const std::string metrics = Get(port, "/metrics").body;
  EXPECT_EQ(Metric(metrics, "sieve:http_requests_total", "status=\"404\""), -1.0)
      << "a smuggled request was served";
  EXPECT_EQ(Post(port, "/v1/completions", Completion("Hi", 2)).status, 200);
}

TEST(ServerTest, ApiKeyIsRequiredOnV1) {
  ServerConfig config;
  config.server.api_key = "s3cret";
  TestServer server(config);
  const int port = server.port();
  ExpectError(Post(port, "/v1/completions", Completion("Hi", 2)), 401, "API key");
  const Response wrong =
      Post(port, "/v1/completions", Completion("Hi", 2), {{"Authorization", "Bearer nope"}});
  ExpectError(wrong, 401, "API key");
  ExpectError(Get(port, "/v1/models", {{"Authorization", "s3cret"}}), 401, "API key");
  ExpectError(Get(port, "/server_info"), 401, "API key");
  EXPECT_EQ(Get(port, "/server_info", {{"Authorization", "Bearer s3cret"}}).status, 200);
  EXPECT_EQ(Post(port, "/v1/completions", Completion("Hi", 2), {{"Authorization", "Bearer s3cret"}})
                .status,
            200);
  EXPECT_EQ(Get(port, "/health").status, 200);
  EXPECT_EQ(Get(port, "/metrics").status, 200);
}

TEST(ServerTest, FullQueueGets429) {
  ServerConfig config;
  config.max_num_seqs = 1;
  config.max_queue = 1;
  config.max_model_len = 4096;
  TestServer server(config);
  const int port = server.port();
  // One long request runs, a second waits, a third finds the queue full.
  json long_request = Completion("long", 4000);
  long_request["stream"] = true;
  net::io_context io_context;
  tcp::socket long_socket(io_context);
  Connect(long_socket, port);
  http::write(long_socket,
              MakeRequest(http::verb::post, "/v1/completions", long_request.dump(), {}));
  std::string received;
  std::array<char, 4096> chunk;
  while (received.find("data: ") == std::string::npos) {
    received.append(chunk.data(), long_socket.read_some(net::buffer(chunk)));
  }
  std::thread waiting([&] {
    const Response response = Post(port, "/v1/completions", Completion("short", 2));
    EXPECT_EQ(response.status, 200) << response.body;
  });
  for (int attempt = 0; attempt < 500; ++attempt) {
    if (Metric(Get(port, "/metrics").body, "sieve:num_requests_waiting") == 1.0) break;
    std::this_thread::sleep_for(5ms);
  }
  ExpectError(Post(port, "/v1/completions", Completion("third", 2)), 429, "queue");
  long_socket.close();  // lets the waiting request run
  waiting.join();
}

TEST(ServerTest, ClientThatLeavesFreesItsPages) {
  ServerConfig config;
  config.max_model_len = 4096;
  TestServer server(config);
  const int port = server.port();
  const auto metrics = [&] { return Get(port, "/metrics").body; };
  for (const bool stream : {true, false}) {
    SCOPED_TRACE(stream ? "streaming" : "not streaming");
    const double generated_before = Metric(metrics(), "sieve:generation_tokens_total");
    json request = Completion("leave early", 4000);  // seconds of work on the CPU
    request["stream"] = stream;
    net::io_context io_context;
    tcp::socket socket(io_context);
    Connect(socket, port);
    http::write(socket, MakeRequest(http::verb::post, "/v1/completions", request.dump(), {}));
    if (stream) {
      std::string received;
      std::array<char, 4096> chunk;
      while (received.find("data: ") == std::string::npos) {
        received.append(chunk.data(), socket.read_some(net::buffer(chunk)));
      }
    } else {
      for (int attempt = 0; attempt < 500; ++attempt) {
        if (Metric(metrics(), "sieve:generation_tokens_total") > generated_before) break;
        std::this_thread::sleep_for(2ms);
      }
    }
    std::string during = metrics();
    EXPECT_EQ(Metric(during, "sieve:num_requests_running"), 1.0);
    EXPECT_GT(Metric(during, "sieve:kv_cache_usage_perc"), 0.0);
    const auto left = std::chrono::steady_clock::now();
    socket.close();
    std::string after = metrics();
    while (Metric(after, "sieve:kv_cache_pages_used") != 0.0 &&
           std::chrono::steady_clock::now() - left < 2s) {
      std::this_thread::sleep_for(2ms);
      after = metrics();
    }
    EXPECT_EQ(Metric(after, "sieve:kv_cache_pages_used"), 0.0);
    EXPECT_EQ(Metric(after, "sieve:kv_cache_usage_perc"), 0.0);
    EXPECT_EQ(Metric(after, "sieve:num_requests_running"), 0.0);
    // Freed long before the 4000 tokens could have been generated.
    EXPECT_LT(Metric(after, "sieve:generation_tokens_total") - generated_before, 2000.0);
  }
  const std::string after = metrics();
  EXPECT_EQ(Metric(after, "sieve:request_success_total", "finished_reason=\"abort\""), 2.0);
  EXPECT_EQ(Metric(after, "sieve:num_requests_aborted_total"), 2.0);
}

TEST(ServerTest, MetricsModelsAndHealth) {
  TestServer server;
  const int port = server.port();
  ASSERT_EQ(Post(port, "/v1/completions", Completion("Hello", 4)).status, 200);
  const Response metrics = Get(port, "/metrics");
  ASSERT_EQ(metrics.status, 200);
  EXPECT_EQ(metrics.content_type.rfind("text/plain", 0), 0u);
  for (const char* name : {"sieve:num_requests_running",
                           "sieve:num_requests_waiting",
                           "sieve:kv_cache_usage_perc",
                           "sieve:num_preemptions_total",
                           "sieve:num_swapped_out_total",
                           "sieve:num_swapped_in_total",
                           "sieve:num_swap_fallbacks_total",
                           "sieve:num_requests_swapped",
                           "sieve:num_replayed_tokens_total",
                           "sieve:prompt_tokens_total",
                           "sieve:generation_tokens_total",
                           "sieve:kv_entries_kept_total",
                           "sieve:kv_prompt_tokens_total",
                           "sieve:kv_compression_ratio",
                           "sieve:time_to_first_token_seconds_count",
                           "sieve:inter_token_latency_seconds_count",
                           "sieve:e2e_request_latency_seconds_count",
                           "sieve:kv_cache_pages_used_by_layer",
                           "sieve:engine_steps_total",
                           "sieve:engine_steps_launched_ahead_total"}) {
    EXPECT_GE(Metric(metrics.body, name), 0.0) << name << " missing";
  }
  EXPECT_LE(Metric(metrics.body, "sieve:engine_steps_launched_ahead_total"),
            Metric(metrics.body, "sieve:engine_steps_total"));
  EXPECT_NE(metrics.body.find("# TYPE sieve:time_to_first_token_seconds histogram"),
            std::string::npos);
  EXPECT_NE(metrics.body.find("# TYPE sieve:generation_tokens_total counter"), std::string::npos);
  EXPECT_NE(metrics.body.find("model_name=\"sieve-embedded\""), std::string::npos);
  EXPECT_EQ(Metric(metrics.body, "sieve:time_to_first_token_seconds_count"), 1.0);
  EXPECT_EQ(Metric(metrics.body, "sieve:inter_token_latency_seconds_count"), 3.0);
  EXPECT_EQ(Metric(metrics.body, "sieve:generation_tokens_total"), 4.0);
  EXPECT_EQ(Metric(metrics.body, "sieve:kv_prompt_tokens_total"), 6.0);
  // Dense policy: every layer keeps every prompt entry.
  EXPECT_EQ(Metric(metrics.body, "sieve:kv_entries_kept_total"), 6.0 * 4);
  EXPECT_EQ(Metric(metrics.body, "sieve:kv_compression_ratio"), 1.0);

  const Response models = Get(port, "/v1/models");
  ASSERT_EQ(models.status, 200);
  EXPECT_EQ(models.Json()["object"], "list");
  EXPECT_EQ(models.Json()["data"][0]["id"], kModel);
  EXPECT_EQ(models.Json()["data"][0]["max_model_len"], 512);
  EXPECT_EQ(Get(port, "/health").status, 200);
}

// What routers that front vLLM replicas read of a server, as the Gateway API Inference
// Extension's model-server protocol lists it (llm-d's scheduler reads the same): the queue and
// running gauges, the KV-cache usage, and vllm:cache_config_info's block_size and num_gpu_blocks
// labels; each equal to Sieve's own number. /health and /v1/models answer as vLLM's do.
TEST(ServerTest, RouterProtocolMetricsAreVllms) {
  TestServer server;
  const int port = server.port();
  ASSERT_EQ(Post(port, "/v1/completions", Completion("Hello", 4)).status, 200);
  const Response metrics = Get(port, "/metrics");
  ASSERT_EQ(metrics.status, 200);
  const std::string& body = metrics.body;
  const std::pair<const char*, const char*> kProtocol[] = {
      {"vllm:num_requests_waiting", "sieve:num_requests_waiting"},
      {"vllm:num_requests_running", "sieve:num_requests_running"},
      {"vllm:kv_cache_usage_perc", "sieve:kv_cache_usage_perc"},
      {"vllm:gpu_cache_usage_perc", "sieve:kv_cache_usage_perc"},
  };
  for (const auto& [vllm, own] : kProtocol) {
    EXPECT_GE(Metric(body, vllm), 0.0) << vllm << " missing";
    EXPECT_EQ(Metric(body, vllm), Metric(body, own)) << vllm;
    EXPECT_NE(body.find(std::string("# TYPE ") + vllm + " gauge"), std::string::npos) << vllm;
  }
  const Response info = Get(port, "/server_info");
  ASSERT_EQ(info.status, 200);
  const json engine = info.Json();
  const std::string pages = "num_gpu_blocks=\"" + engine["kv_cache_pages"].dump() + "\"";
  const std::string page_size = "block_size=\"" + engine["page_size"].dump() + "\"";
  EXPECT_EQ(Metric(body, "vllm:cache_config_info", pages), 1.0) << pages;
  EXPECT_EQ(Metric(body, "vllm:cache_config_info", page_size), 1.0) << page_size;

  const Response health = Get(port, "/health");
  EXPECT_EQ(health.status, 200);
  EXPECT_TRUE(health.body.empty());
  const json model = Get(port, "/v1/models").Json()["data"][0];
  for (const char* field :
       {"id", "object", "created", "owned_by", "root", "parent", "max_model_len", "permission"}) {
    EXPECT_TRUE(model.contains(field)) << field;
  }
  EXPECT_TRUE(model["parent"].is_null());
  EXPECT_EQ(model["permission"][0]["object"], "model_permission");
}

// GET /server_info: the engine's configuration as it runs (what `sieve bench` records and takes
// its bound's KV pool from), agreeing with the flags it was given and with /metrics.
TEST(ServerTest, ServerInfoDescribesTheEngine) {
  auto rng = ::sieve::testing::MakeRng();
  ServerConfig config;
  config.max_num_seqs = 1 + static_cast<int>(rng() % 64);
  config.kv_policy = "snapkv:1-3,full:0";
  config.kv_policy_options.budget = 64 + static_cast<int>(rng() % 256);
  config.kv_policy_options.window = 1 + static_cast<int>(rng() % 32);
  TestServer server(config);
  const int port = server.port();
  const Response info = Get(port, "/server_info");
  ASSERT_EQ(info.status, 200) << info.body;
  EXPECT_EQ(info.content_type, "application/json");
  const nlohmann::json json = info.Json();
  EXPECT_EQ(json["model"], kModel);
  EXPECT_EQ(json["max_num_seqs"], config.max_num_seqs);
  EXPECT_EQ(json["max_model_len"], config.max_model_len);
  EXPECT_EQ(json["page_size"], EngineOptions{}.page_size);
  EXPECT_EQ(json["tensor_parallel_size"], 1);
  EXPECT_EQ(json["enforce_eager"],
            false);  // the engine's default: graphs where the backend has them
  EXPECT_EQ(json["overlap_steps"], true);
  EXPECT_EQ(json["batch_invariant"], false);
  // The policy as its canonical spec (what --kv-policy reads), its knobs and in words.
  EXPECT_EQ(json["kv_policy"], "full:0,snapkv:1-3") << json.dump();
  EXPECT_EQ(json["kv_policy_options"]["budget"], config.kv_policy_options.budget);
  EXPECT_EQ(json["kv_policy_options"]["window"], config.kv_policy_options.window);
  EXPECT_EQ(json["kv_policy_description"].get<std::string>().rfind(
                "full:0,snapkv:1-3 (budget " + std::to_string(config.kv_policy_options.budget), 0),
            0u)
      << json.dump();
  const Response metrics = Get(port, "/metrics");
  ASSERT_EQ(metrics.status, 200);
  EXPECT_EQ(json["kv_cache_pages"].get<double>(),
            Metric(metrics.body, "sieve:kv_cache_pages_total"));
  EXPECT_GT(json["kv_cache_pages"].get<int>(), 0);
  // The pool is what the server was given (TestServer: 32 MiB), or a little less.
  EXPECT_GT(json["kv_cache_bytes"].get<int64_t>(), 0);
  EXPECT_LE(json["kv_cache_bytes"].get<int64_t>(), int64_t{32} << 20);
  // Unquantized weights, the KV pool in the activation dtype: what a bare server runs.
  EXPECT_EQ(json["quantization"], "none");
  EXPECT_EQ(json["kv_cache_dtype"], "auto");
  ExpectError(Send(port, http::verb::post, "/server_info", "{}"), 405, "GET");
}

// The precision the engine runs at, in GET /server_info (`sieve bench` takes its bound's weight
// and KV bytes from them: tools/bench/serving_bound.cc) and in vllm:cache_config_info's
// cache_dtype label (vLLM's: auto, or fp8 as --kv-cache-dtype fp8 names it), on sieve-tiny-10m
// with and without --quantization fp8 and --kv-cache-dtype fp8, and on an FP8 checkpoint loaded
// without --quantization: its weights are FP8 as loaded, and the server says so.
TEST(ServerTest, ServerInfoAndMetricsGiveThePrecision) {
  struct Case {
    std::string model_dir;  // "" : sieve-tiny-10m
    std::string quantization;
    std::string kv_cache_dtype;
    std::string served_quantization;
    std::string cache_dtype_label;
  };
  const std::string fp8_checkpoint = TestDataDir() + "/models/llama_fp8_compressed";
  const Case kCases[] = {
      {"", "none", "auto", "none", "auto"},
      {"", "fp8", "auto", "fp8", "auto"},
      {"", "none", "fp8", "none", "fp8"},
      {"", "fp8", "fp8", "fp8", "fp8"},
      {fp8_checkpoint, "none", "auto", "fp8", "auto"},
      {fp8_checkpoint, "none", "fp8", "fp8", "fp8"},
  };
  std::map<std::string, std::map<std::string, int>> pages;  // [model_dir][kv_cache_dtype]
  for (const Case& test : kCases) {
    SCOPED_TRACE("model '" + test.model_dir + "' --quantization " + test.quantization +
                 " --kv-cache-dtype " + test.kv_cache_dtype);
    ServerConfig config;
    config.tiny_random = false;
    config.model_dir = test.model_dir;
    config.quantization = test.quantization;
    config.kv_cache_dtype = test.kv_cache_dtype;
    config.max_model_len = 256;  // the FP8 fixture's positions
    TestServer server(config);
    const int port = server.port();
    const Response info = Get(port, "/server_info");
    ASSERT_EQ(info.status, 200) << info.body;
    const json engine = info.Json();
    EXPECT_EQ(engine["quantization"], test.served_quantization) << info.body;
    EXPECT_EQ(engine["kv_cache_dtype"], test.kv_cache_dtype) << info.body;
    pages[test.model_dir][test.kv_cache_dtype] = engine["kv_cache_pages"].get<int>();

    ASSERT_EQ(Post(port, "/v1/completions", Completion("Hello", 2)).status, 200);
    const Response metrics = Get(port, "/metrics");
    ASSERT_EQ(metrics.status, 200);
    const std::string label = "cache_dtype=\"" + test.cache_dtype_label + "\"";
    EXPECT_EQ(Metric(metrics.body, "vllm:cache_config_info", label), 1.0) << metrics.body;
  }
  // The pool is what the dtype says: 32 MiB of e4m3 entries hold four times the pages of f32
  // ones (the FP8 fixture's pool is capped by its sequences' most pages either way).
  EXPECT_GE(pages[""]["fp8"], 3 * pages[""]["auto"]);
}

// Prefix caching as the server reports it: /server_info's enable_prefix_caching, vLLM's
// cache_config_info label, and its prefix_cache_queries / prefix_cache_hits counters (and Sieve's
// own): a prompt sent twice is looked up twice and its second admission finds every whole page
// that leaves its last token to compute; the answers are equal (greedy). Off: nothing counted.
TEST(ServerTest, PrefixCacheIsReportedAsVllmReportsIt) {
  for (const bool caching : {true, false}) {
    SCOPED_TRACE(caching ? "cache on" : "cache off");
    ServerConfig config;
    config.enable_prefix_caching = caching;
    TestServer server(config);
    const int port = server.port();
    const Response info = Get(port, "/server_info");
    ASSERT_EQ(info.status, 200) << info.body;
    EXPECT_EQ(info.Json()["enable_prefix_caching"], caching) << info.body;
    const std::string prompt(100, 'x');  // 100 bytes: the tiny model's tokens are bytes (+ BOS)
    const Response first = Post(port, "/v1/completions", Completion(prompt, 4));
    const Response second = Post(port, "/v1/completions", Completion(prompt, 4));
    ASSERT_EQ(first.status, 200) << first.body;
    ASSERT_EQ(second.status, 200) << second.body;
    EXPECT_EQ(first.Json()["choices"][0]["text"], second.Json()["choices"][0]["text"]);
    const int prompt_tokens = first.Json()["usage"]["prompt_tokens"].get<int>();
    const int page_size = info.Json()["page_size"].get<int>();
    const Response metrics = Get(port, "/metrics");
    ASSERT_EQ(metrics.status, 200);
    const double queries = caching ? 2.0 * prompt_tokens : 0.0;
    const double hits = caching ? (prompt_tokens - 1) / page_size * page_size : 0.0;
    EXPECT_EQ(Metric(metrics.body, "vllm:prefix_cache_queries_total"), queries) << metrics.body;
    EXPECT_EQ(Metric(metrics.body, "vllm:prefix_cache_hits_total"), hits) << metrics.body;
    EXPECT_EQ(Metric(metrics.body, "sieve:prefix_cache_hits_total"), hits) << metrics.body;
    const std::string label =
        std::string("enable_prefix_caching=\"") + (caching ? "True" : "False") + "\"";
    EXPECT_EQ(Metric(metrics.body, "vllm:cache_config_info", label), 1.0) << metrics.body;
  }
}

// Warm start: the server listens while the engine warms up; /health answers 503 until the warm-up
// ends, and a request sent meanwhile waits and is served after it.
TEST(ServerTest, HealthIs503UntilTheWarmUpEnds) {
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<int> pieces{0};
  ServerConfig config;
  config.warm_up_progress = [&](int, int) {
    if (pieces++ == 0) released.wait();  // hold the engine thread inside the warm-up
  };
  TestServer server(config);
  const int port = server.port();
  const Response warming = Get(port, "/health");
  EXPECT_EQ(warming.status, 503);
  EXPECT_NE(warming.body.find("warming up"), std::string::npos) << warming.body;
  Response queued;
  std::thread client([&] { queued = Post(port, "/v1/completions", Completion("queued", 4)); });
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(Get(port, "/health").status, 503);
  release.set_value();
  // The rest of the warm-up (prefill steps up to 2048 tokens) takes seconds under the sanitizers.
  int status = 0;
  const auto deadline = std::chrono::steady_clock::now() + 120s;
  while (status != 200 && std::chrono::steady_clock::now() < deadline) {
    status = Get(port, "/health").status;
    if (status != 200) std::this_thread::sleep_for(20ms);
  }
  EXPECT_EQ(status, 200);
  EXPECT_GT(pieces.load(), 1);  // the warm-up went on after the hold
  client.join();
  ASSERT_EQ(queued.status, 200) << queued.body;
  EXPECT_EQ(queued.Json()["usage"]["completion_tokens"], 4);
}

TEST(ServerTest, ShutdownFinishesOrAbortsRequestsInFlight) {
  ServerConfig config;
  config.max_model_len = 4096;
  config.server.shutdown_timeout_s = 1.0;
  TestServer server(config);
  const int port = server.port();
  // A kept-alive connection, to see the 503 after shutdown began.
  net::io_context io_context;
  tcp::socket idle(io_context);
  Connect(idle, port);
  beast::flat_buffer idle_buffer;
  http::write(idle, MakeRequest(http::verb::get, "/health", "", {}));
  ASSERT_EQ(ReadResponse(idle, idle_buffer).status, 200);

  json request = Completion("long", 4000);
  request["stream"] = true;
  Response streamed;
  std::thread client([&] { streamed = Post(port, "/v1/completions", request); });
  for (int attempt = 0; attempt < 500; ++attempt) {
    if (Metric(Get(port, "/metrics").body, "sieve:num_requests_running") == 1.0) break;
    std::this_thread::sleep_for(2ms);
  }
  int aborted = -1;
  server.server().RequestShutdown();
  std::thread waiter([&] { aborted = server.server().Wait(); });
  http::write(idle, MakeRequest(http::verb::get, "/health", "", {}));
  EXPECT_EQ(ReadResponse(idle, idle_buffer).status, 503);
  client.join();
  waiter.join();
  EXPECT_EQ(aborted, 1);
  ASSERT_EQ(streamed.status, 200);
  bool done = false;
  const std::vector<json> events = SseEvents(streamed.body, &done);
  EXPECT_TRUE(done) << "the aborted stream still ends properly";
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back()["choices"][0]["finish_reason"], "abort");
}

#ifdef SIEVE_BINARY_PATH
TEST(ServerTest, SigtermShutsDownSieveServeCleanly) {
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    dup2(pipe_fds[1], STDERR_FILENO);
    close(pipe_fds[0]);
    close(pipe_fds[1]);
    execl(SIEVE_BINARY_PATH, "sieve", "serve", "--device", "cpu", "--port", "0", "--kv-memory",
          "32M", "--max-model-len", "4096", "--shutdown-timeout", "0.5", "--threads", "1",
          "--served-model-name", kModel, static_cast<char*>(nullptr));
    _exit(127);
  }
  close(pipe_fds[1]);
  // Read the log until the port shows up; keep draining it so the child never blocks on stderr.
  std::mutex log_mutex;
  std::condition_variable log_cv;
  std::string log;
  std::thread reader([&] {
    char buffer[4096];
    for (ssize_t count; (count = read(pipe_fds[0], buffer, sizeof(buffer))) > 0;) {
      std::lock_guard lock(log_mutex);
      log.append(buffer, static_cast<size_t>(count));
      log_cv.notify_all();
    }
    close(pipe_fds[0]);
  });
  int port = 0;
  {
    std::unique_lock lock(log_mutex);
    const std::regex listening("on http://[^ ]+:([0-9]+)");
    log_cv.wait_for(lock, 30s, [&] {
      std::smatch match;
      if (std::regex_search(log, match, listening)) port = std::stoi(match[1]);
      return port != 0 || log.find("error") != std::string::npos;
    });
  }
  if (port == 0) {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    reader.join();
    FAIL() << "sieve serve did not start:\n" << log;
  }
  json request = Completion("long", 4000);
  request["stream"] = true;
  Response streamed;
  std::atomic<bool> streaming{false};
  std::thread client([&] {
    try {
      net::io_context io_context;
      tcp::socket socket(io_context);
      Connect(socket, port);
      http::write(socket, MakeRequest(http::verb::post, "/v1/completions", request.dump(), {}));
      beast::flat_buffer buffer;
      http::response_parser<http::string_body> parser;
      http::read_header(socket, buffer, parser);
      streaming = true;
      http::read(socket, buffer, parser);
      streamed.status = static_cast<int>(parser.get().result_int());
      streamed.body = parser.get().body();
    } catch (const std::exception& error) {
      streamed.status = -1;
      streamed.body = error.what();
    }
  });
  for (int attempt = 0; attempt < 2000 && !streaming; ++attempt) std::this_thread::sleep_for(5ms);
  ASSERT_TRUE(streaming.load());
  kill(pid, SIGTERM);
  int status = 0;
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  pid_t waited = 0;
  while ((waited = waitpid(pid, &status, WNOHANG)) == 0 &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(10ms);
  }
  if (waited == 0) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
  }
  client.join();
  reader.join();
  ASSERT_EQ(waited, pid) << "sieve serve did not exit after SIGTERM:\n" << log;
  ASSERT_TRUE(WIFEXITED(status)) << log;
  EXPECT_EQ(WEXITSTATUS(status), 0) << log;
  ASSERT_EQ(streamed.status, 200) << streamed.body;
  bool done = false;
  const std::vector<json> events = SseEvents(streamed.body, &done);
  EXPECT_TRUE(done) << "the stream in flight ends with [DONE]";
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back()["choices"][0]["finish_reason"], "abort");
}
#endif

}  // namespace
}  // namespace sieve
