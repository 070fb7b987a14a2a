// Fuzzes what the server does with a request before the engine sees it: the HTTP/1.1 request
// (Boost.Beast's parser with the limits HttpSession sets), the route, the JSON body and
// ParseCompletionRequest with its tokenization and chat template, then EngineRequests and the
// error body. An input that starts with an HTTP method is a whole request; any other input is a
// JSON body, read as both a completions and a chat body (so the JSON fields are fuzzed without
// having to keep a Content-Length right). Bad input must give a 4xx error body, never a crash.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>

#include "core/check.h"
#include "server/api_error.h"
#include "server/completion_request.h"
#include "server/server_options.h"
#include "tokenizer/tokenizer_loader.h"

namespace {

namespace http = boost::beast::http;

constexpr size_t kHeaderLimit = 64 * 1024;  // HttpSession's
constexpr int kMaxModelLen = 512;

const sieve::RequestLimits& Limits() {
  static const std::unique_ptr<sieve::Tokenizer> tokenizer = sieve::MakeEmbeddedByteTokenizer();
  static const sieve::RequestLimits limits{.tokenizer = tokenizer.get(),
                                           .max_model_len = kMaxModelLen,
                                           .vocab_size = tokenizer->vocab_size(),
                                           .max_n = sieve::ServerOptions().max_n};
  return limits;
}

void HandleBody(std::string_view body, sieve::ApiKind kind) {
  const nlohmann::json json = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) return;  // HttpSession answers 400 before parsing fields
  std::string param;
  const sieve::Result<sieve::CompletionRequest> request =
      sieve::ParseCompletionRequest(json, kind, Limits(), &param);
  if (!request.ok()) {
    const sieve::ApiError error = sieve::ApiErrorFromStatus(request.status(), param);
    SIEVE_CHECK(error.http_status == 400) << request.status().ToString();
    SIEVE_CHECK(nlohmann::json::accept(sieve::ApiErrorBody(error)));
    return;
  }
  SIEVE_CHECK(!request->prompts.empty() && request->n >= 1);
  const std::vector<sieve::Request> engine_requests =
      sieve::EngineRequests(*request, Limits().max_model_len);
  SIEVE_CHECK(static_cast<int>(engine_requests.size()) == request->num_choices());
  for (const sieve::Request& engine_request : engine_requests) {
    const int prompt_length = static_cast<int>(engine_request.prompt.size());
    SIEVE_CHECK(prompt_length >= 1 && engine_request.sampling.max_tokens >= 1 &&
                prompt_length + engine_request.sampling.max_tokens <= kMaxModelLen)
        << prompt_length << " + " << engine_request.sampling.max_tokens;
    for (const int32_t id : engine_request.prompt) {
      SIEVE_CHECK(id >= 0 && id < Limits().vocab_size);
    }
  }
}

void HandleHttp(std::string_view bytes) {
  http::request_parser<http::string_body> parser;
  parser.header_limit(kHeaderLimit);
  parser.body_limit(static_cast<uint64_t>(sieve::ServerOptions().max_body_bytes));
  parser.eager(true);
  boost::beast::error_code error;
  // The bytes arrive in two reads, as from a socket; what the parser leaves unused stays buffered
  // for the next read, as in HttpSession's flat_buffer.
  std::string buffered;
  for (const std::string_view read :
       {bytes.substr(0, bytes.size() / 2), bytes.substr(bytes.size() / 2)}) {
    buffered += read;
    while (!buffered.empty() && !parser.is_done()) {
      const size_t used = parser.put(boost::asio::buffer(buffered), error);
      if (error == http::error::need_more) {
        error = {};
        break;
      }
      if (error) return;  // HttpSession answers 400 or 413
      buffered.erase(0, used);
      if (used == 0) break;
    }
  }
  if (!parser.is_done()) {
    parser.put_eof(error);
    if (error || !parser.is_done()) return;
  }
  const http::request<http::string_body>& request = parser.get();
  std::string path(request.target());
  if (const size_t query = path.find('?'); query != std::string::npos) path.resize(query);
  if (request.method() != http::verb::post) return;
  if (path == "/v1/completions") HandleBody(request.body(), sieve::ApiKind::kCompletion);
  if (path == "/v1/chat/completions") HandleBody(request.body(), sieve::ApiKind::kChat);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  for (const std::string_view method : {"POST ", "GET ", "PUT ", "HEAD ", "OPTIONS "}) {
    if (bytes.starts_with(method)) {
      HandleHttp(bytes);
      return 0;
    }
  }
  HandleBody(bytes, sieve::ApiKind::kCompletion);
  HandleBody(bytes, sieve::ApiKind::kChat);
  return 0;
}
