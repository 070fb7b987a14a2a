#include "tools/bench/fake_openai_server.h"

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <algorithm>
#include <sstream>

namespace sieve::bench::testing {

namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

std::string HttpChunk(const std::string& data) {
  std::ostringstream chunk;
  chunk << std::hex << data.size() << "\r\n" << data << "\r\n";
  return chunk.str();
}

void WriteSimple(tcp::socket& socket, http::status status, const std::string& content_type,
                 const std::string& body) {
  http::response<http::string_body> response(status, 11);
  response.set(http::field::content_type, content_type);
  response.set(http::field::connection, "close");
  response.body() = body;
  response.prepare_payload();
  beast::error_code ignored;
  http::write(socket, response, ignored);
}

}  // namespace

struct FakeOpenAiServer::Impl {
  asio::io_context io;
  tcp::acceptor acceptor{io};
};

FakeOpenAiServer::FakeOpenAiServer(FakeServerOptions options)
    : options_(options),
      impl_(std::make_unique<Impl>()),
      prefix_cache_queries_(options.prefix_cache_initial_queries),
      prefix_cache_hits_(options.prefix_cache_initial_hits) {
  const tcp::endpoint endpoint(asio::ip::make_address("127.0.0.1"), 0);
  impl_->acceptor.open(endpoint.protocol());
  impl_->acceptor.set_option(tcp::acceptor::reuse_address(true));
  impl_->acceptor.bind(endpoint);
  impl_->acceptor.listen();
  port_ = impl_->acceptor.local_endpoint().port();
  accept_thread_ = std::thread([this] { AcceptLoop(); });
}

FakeOpenAiServer::~FakeOpenAiServer() {
  stopping_ = true;
  {
    // Wake the blocking accept with a connection of our own.
    asio::io_context io;
    tcp::socket waker(io);
    beast::error_code ignored;
    waker.connect(
        tcp::endpoint(asio::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port_)),
        ignored);
  }
  accept_thread_.join();
  std::vector<std::thread> threads;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    threads.swap(connection_threads_);
  }
  for (std::thread& thread : threads) thread.join();
}

nlohmann::json FakeOpenAiServer::last_request_body() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return last_request_body_;
}

std::vector<std::string> FakeOpenAiServer::prompts() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return prompts_;
}

std::string FakeOpenAiServer::TokenText(int index) { return "tok" + std::to_string(index) + " "; }

void FakeOpenAiServer::AcceptLoop() {
  while (!stopping_) {
    beast::error_code error;
    tcp::socket socket(impl_->io);
    impl_->acceptor.accept(socket, error);
    if (error || stopping_) continue;
    const int fd = socket.release();
    std::lock_guard<std::mutex> lock(mutex_);
    connection_threads_.emplace_back([this, fd] { Serve(fd); });
  }
}

void FakeOpenAiServer::Serve(int socket_fd) {
  asio::io_context io;
  tcp::socket socket(io, tcp::v4(), socket_fd);
  socket.set_option(tcp::no_delay(true));
  beast::flat_buffer buffer;
  http::request<http::string_body> request;
  beast::error_code error;
  http::read(socket, buffer, request, error);
  if (error) return;
  const std::string target(request.target());
  if (request.method() == http::verb::get) {
    if (target == "/v1/models") {
      WriteSimple(socket, http::status::ok, "application/json",
                  R"({"object": "list", "data": [{"id": "fake-model", "object": "model"}]})");
    } else if (target == "/version") {
      WriteSimple(socket, http::status::ok, "application/json", R"({"version": "fake-1.0"})");
    } else if (target == "/metrics") {
      std::string text =
          "# HELP fake_server_info Server flags.\n# TYPE fake_server_info gauge\n"
          "fake_server_info{kv_policy=\"snapkv\",max_num_seqs=\"64\"} 1\n"
          "fake_requests_total 3\n";
      if (options_.prefix_cache_metrics) {
        std::lock_guard<std::mutex> lock(mutex_);
        // As vLLM writes them: a counter of floats, labelled by engine and model.
        text +=
            "# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number "
            "of queried tokens.\n# TYPE vllm:prefix_cache_queries_total counter\n"
            "vllm:prefix_cache_queries_total{engine=\"0\",model_name=\"fake-model\"} " +
            std::to_string(prefix_cache_queries_) +
            ".0\n# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of "
            "cached tokens.\n# TYPE vllm:prefix_cache_hits_total counter\n"
            "vllm:prefix_cache_hits_total{engine=\"0\",model_name=\"fake-model\"} " +
            std::to_string(prefix_cache_hits_) + ".0\n";
      }
      WriteSimple(socket, http::status::ok, "text/plain", text);
    } else {
      WriteSimple(socket, http::status::not_found, "application/json",
                  R"({"error": {"message": "no such route"}})");
    }
    return;
  }
  const bool chat = target == "/v1/chat/completions";
  if (target != "/v1/completions" && !chat) {
    WriteSimple(socket, http::status::not_found, "application/json",
                R"({"error": {"message": "Not Found"}})");
    return;
  }
  nlohmann::json body = nlohmann::json::parse(request.body(), nullptr, false);
  std::string prompt;
  if (chat && body.contains("messages") && body["messages"].is_array() &&
      !body["messages"].empty()) {
    prompt = body["messages"][0].value("content", std::string());
  } else if (!chat && body.contains("prompt") && body["prompt"].is_string()) {
    prompt = body["prompt"].get<std::string>();
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    last_request_body_ = body;
    size_t longest = 0;  // the longest common prefix with a prompt cached before
    for (const std::string& earlier : prompts_) {
      const auto differ =
          std::mismatch(prompt.begin(), prompt.end(), earlier.begin(), earlier.end()).first;
      longest = std::max(longest, static_cast<size_t>(differ - prompt.begin()));
    }
    prefix_cache_queries_ += static_cast<int64_t>(prompt.size());
    prefix_cache_hits_ += static_cast<int64_t>(longest);
    prompts_.push_back(prompt);
  }
  const int sequence = ++generation_requests_;
  if (options_.fail_every > 0 && sequence % options_.fail_every == 0) {
    WriteSimple(socket, http::status::internal_server_error, "application/json",
                R"({"error": {"message": "injected failure"}})");
    return;
  }
  const int num_tokens = std::min(body.value("max_tokens", 16), options_.max_tokens_cap);
  const bool include_usage =
      body.contains("stream_options") && body["stream_options"].value("include_usage", false);
  asio::write(socket,
              asio::buffer(std::string("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                                       "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n")),
              error);
  const auto send_event = [&](const std::string& data) {
    const std::string event = "data: " + data + "\n\n";
    if (options_.split_events) {
      for (size_t offset = 0; offset < event.size(); offset += 3) {
        asio::write(socket, asio::buffer(HttpChunk(event.substr(offset, 3))), error);
      }
    } else {
      asio::write(socket, asio::buffer(HttpChunk(event)), error);
    }
  };
  if (chat) {
    // vLLM and llama-server open a chat stream with a role-only delta: no text, so not the TTFT.
    send_event(R"({"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": )"
               R"({"role": "assistant", "content": ""}}]})");
  }
  std::this_thread::sleep_for(options_.first_token_delay);
  for (int index = 0; index < num_tokens && !error; ++index) {
    if (index > 0) std::this_thread::sleep_for(options_.token_delay);
    nlohmann::json chunk;
    if (chat) {
      chunk["object"] = "chat.completion.chunk";
      chunk["choices"] = {{{"index", 0}, {"delta", {{"content", TokenText(index)}}}}};
    } else {
      chunk["object"] = "text_completion";
      chunk["choices"] = {{{"index", 0}, {"text", TokenText(index)}, {"finish_reason", nullptr}}};
    }
    send_event(chunk.dump());
  }
  // A finish chunk with no text: must not count as a token.
  send_event(chat ? R"({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})"
                  : R"({"choices": [{"index": 0, "text": "", "finish_reason": "length"}]})");
  if (include_usage && options_.send_usage) {
    send_event(nlohmann::json({{"choices", nlohmann::json::array()},
                               {"usage",
                                {{"prompt_tokens", 7},
                                 {"completion_tokens", num_tokens},
                                 {"total_tokens", 7 + num_tokens}}}})
                   .dump());
  }
  send_event("[DONE]");
  asio::write(socket, asio::buffer(std::string("0\r\n\r\n")), error);
  socket.shutdown(tcp::socket::shutdown_both, error);
}

}  // namespace sieve::bench::testing
