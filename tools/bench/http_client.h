// HTTP/1.1 client for the load generator, over Boost.Beast and Asio.
//
// Many exchanges run at once on one io_context and one thread, with no thread per request: each
// is a chain of async operations. A response body is handed over piece by piece as it arrives
// (de-chunked), so a streamed token is timed when it lands, not when the response ends. http://
// only, one connection per request (no keep-alive), which is also what `vllm bench serve` does:
// the connection set-up is then part of TTFT for every server alike.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>

#include <chrono>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"

namespace sieve::bench {

struct HttpUrl {
  std::string host;
  std::string port = "80";
  std::string path;  // a prefix for every target, without a trailing '/'; "" for the root

  // "http://host:port/path"
  std::string ToString() const;
  // "host:port", as the Host header and error messages want it.
  std::string Authority() const;
};

// Parses "http://host[:port][/path]" ("[::1]:8000" for IPv6). InvalidArgument for another scheme
// (https is not supported: put a plain-HTTP port of the server in front), a missing host or a bad
// port.
Result<HttpUrl> ParseHttpUrl(std::string_view text);

struct HttpRequestSpec {
  std::string method = "GET";  // GET or POST
  std::string target;          // origin-form, e.g. "/v1/models"
  std::string body;            // sent as application/json when not empty
  std::vector<std::pair<std::string, std::string>> headers;
  // A deadline for the whole exchange, connect to last byte; 0: none.
  std::chrono::milliseconds timeout{30000};
};

struct HttpCallbacks {
  // The status line arrived (200, 404, ...). Optional.
  std::function<void(int http_status)> on_status;
  // A piece of the body; return false to stop reading (the connection is then closed). Optional.
  std::function<bool(std::string_view bytes)> on_body;
  // The exchange ended: OK after the whole body or an early stop, else what failed (connecting,
  // sending, reading, the deadline). Called exactly once, last.
  std::function<void(const Status& status)> on_done;
};

using TcpEndpoints = boost::asio::ip::tcp::resolver::results_type;

// Unavailable (naming the host) when the name does not resolve.
Result<TcpEndpoints> ResolveHost(boost::asio::io_context& io, const HttpUrl& url);

// Starts one exchange on `io`; the callbacks run on the thread that runs `io`.
void StartHttpCall(boost::asio::io_context& io, const TcpEndpoints& endpoints, const HttpUrl& url,
                   HttpRequestSpec spec, HttpCallbacks callbacks);

struct HttpResponse {
  int status = 0;
  std::string body;
};

// One blocking exchange on a private io_context, for the few control requests (GET /v1/models).
// A non-2xx answer is a response, not an error; an error means no answer came.
Result<HttpResponse> HttpFetch(const HttpUrl& url, HttpRequestSpec spec);

}  // namespace sieve::bench
