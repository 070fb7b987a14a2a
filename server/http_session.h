// HttpSession: one client connection of the HTTP server (internal to server/).
//
// Callback-style Beast on a strand: every handler of a session runs serialized on its strand,
// including the engine's events, which the engine thread posts there (so a session never blocks
// the engine thread and never needs a lock). A connection serves its requests one after another
// (keep-alive); while a generation runs it also watches the socket so that a client who leaves
// aborts its requests at once, which frees their KV pages.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include <utility>  // before Asio: Boost 1.74's headers use std::exchange without it

#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "runtime/async_engine.h"
#include "server/api_error.h"
#include "server/completion_request.h"
#include "server/server_context.h"

namespace sieve {

class HttpSession : public std::enable_shared_from_this<HttpSession> {
 public:
  HttpSession(boost::asio::ip::tcp::socket socket, ServerContext& context);
  ~HttpSession();
  HttpSession(const HttpSession&) = delete;
  HttpSession& operator=(const HttpSession&) = delete;

  void Start();

 private:
  struct Generation;
  using Request = boost::beast::http::request<boost::beast::http::string_body>;

  void ReadHeader();
  void OnReadHeader(boost::beast::error_code error);
  void ReadBody();
  void OnReadBody(boost::beast::error_code error);
  void OnReadError(boost::beast::error_code error);
  void Dispatch();
  void Route(const Request& request);
  bool Authorized(const Request& request) const;

  // /tokenize, /detokenize, /tokenizer_info (server/tokenizer_endpoints.h).
  void HandleTokenizer(const Request& request, const std::string& path);
  void HandleCompletion(const Request& request, ApiKind kind);
  void StartGeneration(CompletionRequest request);
  void OnEvent(uint64_t serial, RequestEvent event, std::chrono::steady_clock::time_point when);
  void RecordTimes(Generation& generation, size_t index, const RequestOutput& output,
                   std::chrono::steady_clock::time_point when);
  void StartStream();
  void Pump();
  void OnStreamWrite(uint64_t serial, boost::beast::error_code error);
  void MaybeFinish();
  void WatchDisconnect();
  void OnReadable(uint64_t serial, boost::beast::error_code error);
  void OnClientGone();
  void EndGeneration();

  void SendResponse(int status, std::string content_type, std::string body, bool close = false,
                    bool linger = false);
  void SendError(const ApiError& error, bool close = false, bool linger = false);
  void OnResponseWritten(bool close, bool linger, boost::beast::error_code error);
  void Linger();
  void DiscardInput();
  void Close();

  boost::beast::tcp_stream stream_;
  ServerContext& context_;
  boost::beast::flat_buffer buffer_;
  std::optional<boost::beast::http::request_parser<boost::beast::http::string_body>> parser_;
  std::optional<boost::beast::http::response<boost::beast::http::string_body>> response_;
  std::optional<boost::beast::http::response<boost::beast::http::empty_body>> continue_;
  std::unique_ptr<Generation> generation_;
  uint64_t next_serial_ = 0;
  bool keep_alive_ = false;
  std::string endpoint_;              // of the request being served, for metrics
  std::array<char, 4096> discard_{};  // lingering close reads the unread body into here
};

}  // namespace sieve
