#include "tools/bench/http_client.h"

#include <fmt/format.h>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <array>
#include <charconv>
#include <limits>
#include <memory>
#include <optional>

namespace sieve::bench {

namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

constexpr char kUserAgent[] = "sieve-bench/0.1";

// One exchange: connect, write, read the header, then read the body piece by piece. Owned by the
// shared_ptr its pending operation holds, so it lives exactly as long as there is work for it.
class HttpCall : public std::enable_shared_from_this<HttpCall> {
 public:
  HttpCall(asio::io_context& io, const HttpUrl& url, HttpRequestSpec spec, HttpCallbacks callbacks)
      : stream_(io), url_(url), spec_(std::move(spec)), callbacks_(std::move(callbacks)) {}

  void Start(const TcpEndpoints& endpoints) {
    const http::verb verb = spec_.method == "POST" ? http::verb::post : http::verb::get;
    request_ = http::request<http::string_body>(verb, spec_.target, 11);
    request_.set(http::field::host, url_.port == "80" ? url_.host : url_.Authority());
    request_.set(http::field::user_agent, kUserAgent);
    // One request per connection: the server may close as soon as the response ends.
    request_.set(http::field::connection, "close");
    for (const auto& [name, value] : spec_.headers) request_.set(name, value);
    if (!spec_.body.empty()) {
      request_.set(http::field::content_type, "application/json");
      request_.body() = spec_.body;
    }
    request_.prepare_payload();
    // A response body can be as long as the generation: no size limit on it.
    parser_.body_limit(std::numeric_limits<std::uint64_t>::max());
    if (spec_.timeout.count() > 0) {
      // tcp_stream applies one deadline to every operation started until it is set again.
      stream_.expires_after(spec_.timeout);
    } else {
      stream_.expires_never();
    }
    stream_.async_connect(
        endpoints, [self = shared_from_this()](beast::error_code error, const tcp::endpoint&) {
          self->OnConnect(error);
        });
  }

 private:
  void OnConnect(beast::error_code error) {
    if (error) return Fail(error, "cannot connect to " + url_.Authority());
    http::async_write(stream_, request_,
                      [self = shared_from_this()](beast::error_code write_error, size_t) {
                        self->OnWrite(write_error);
                      });
  }

  void OnWrite(beast::error_code error) {
    if (error) return Fail(error, "sending the request to " + url_.Authority());
    http::async_read_header(stream_, buffer_, parser_,
                            [self = shared_from_this()](beast::error_code read_error, size_t) {
                              self->OnHeader(read_error);
                            });
  }

  void OnHeader(beast::error_code error) {
    if (error) return Fail(error, "reading the response header from " + url_.Authority());
    if (callbacks_.on_status) callbacks_.on_status(static_cast<int>(parser_.get().result_int()));
    ReadBody();
  }

  void ReadBody() {
    if (parser_.is_done()) return Finish(Status::Ok());
    parser_.get().body().data = piece_.data();
    parser_.get().body().size = piece_.size();
    // read_some returns after one read from the socket: a piece is timed when it arrives, not
    // when a buffer fills.
    http::async_read_some(stream_, buffer_, parser_,
                          [self = shared_from_this()](beast::error_code read_error, size_t) {
                            self->OnBody(read_error);
                          });
  }

  void OnBody(beast::error_code error) {
    // need_buffer only says that the piece buffer is full: it has been read, carry on.
    if (error == http::error::need_buffer) error = {};
    const size_t received = piece_.size() - parser_.get().body().size;
    if (received > 0 && callbacks_.on_body &&
        !callbacks_.on_body(std::string_view(piece_.data(), received))) {
      return Finish(Status::Ok());
    }
    if (error) return Fail(error, "reading the response from " + url_.Authority());
    ReadBody();
  }

  void Fail(beast::error_code error, const std::string& what) {
    std::string message = what + ": ";
    if (error == beast::error::timeout) {
      message += fmt::format("timed out after {:g} s",
                             std::chrono::duration<double>(spec_.timeout).count());
    } else if (error == http::error::end_of_stream || error == http::error::partial_message) {
      message += "the server closed the connection early";
    } else {
      message += error.message();
    }
    Finish(UnavailableError(message));
  }

  void Finish(const Status& status) {
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.close();
    if (callbacks_.on_done) callbacks_.on_done(status);
  }

  beast::tcp_stream stream_;
  HttpUrl url_;
  HttpRequestSpec spec_;
  HttpCallbacks callbacks_;
  http::request<http::string_body> request_;
  beast::flat_buffer buffer_;
  http::response_parser<http::buffer_body> parser_;
  std::array<char, 16384> piece_;  // where the parser writes body bytes
};

}  // namespace

std::string HttpUrl::Authority() const {
  const bool ipv6 = host.find(':') != std::string::npos;
  return (ipv6 ? "[" + host + "]" : host) + ":" + port;
}

std::string HttpUrl::ToString() const { return "http://" + Authority() + path; }

Result<HttpUrl> ParseHttpUrl(std::string_view text) {
  const std::string original(text);
  constexpr std::string_view kScheme = "http://";
  const size_t scheme_end = text.find("://");
  if (scheme_end == std::string_view::npos) {
    return InvalidArgumentError("bad URL '" + original + "': expected http://host[:port][/path]");
  }
  if (text.substr(0, scheme_end + 3) != kScheme) {
    return InvalidArgumentError("unsupported URL scheme in '" + original +
                                "': only http:// is supported");
  }
  text.remove_prefix(kScheme.size());
  HttpUrl url;
  const size_t path_start = text.find('/');
  std::string_view authority = text.substr(0, path_start);
  if (path_start != std::string_view::npos) {
    std::string_view path = text.substr(path_start);
    while (!path.empty() && path.back() == '/') path.remove_suffix(1);
    url.path = std::string(path);
  }
  std::string_view port;
  if (!authority.empty() && authority.front() == '[') {
    const size_t close = authority.find(']');
    if (close == std::string_view::npos) {
      return InvalidArgumentError("bad IPv6 host in URL '" + original + "'");
    }
    url.host = std::string(authority.substr(1, close - 1));
    std::string_view rest = authority.substr(close + 1);
    if (!rest.empty()) {
      if (rest.front() != ':') return InvalidArgumentError("bad URL '" + original + "'");
      port = rest.substr(1);
    }
  } else {
    const size_t colon = authority.rfind(':');
    url.host = std::string(authority.substr(0, colon));
    if (colon != std::string_view::npos) port = authority.substr(colon + 1);
  }
  if (url.host.empty()) return InvalidArgumentError("no host in URL '" + original + "'");
  if (!port.empty()) {
    int value = 0;
    const auto [end, error] = std::from_chars(port.data(), port.data() + port.size(), value);
    if (error != std::errc() || end != port.data() + port.size() || value <= 0 || value > 65535) {
      return InvalidArgumentError("bad port '" + std::string(port) + "' in URL '" + original + "'");
    }
    url.port = std::string(port);
  }
  return url;
}

Result<TcpEndpoints> ResolveHost(asio::io_context& io, const HttpUrl& url) {
  tcp::resolver resolver(io);
  beast::error_code error;
  TcpEndpoints endpoints = resolver.resolve(url.host, url.port, error);
  if (error) {
    return UnavailableError("cannot resolve host '" + url.host + "': " + error.message());
  }
  return endpoints;
}

void StartHttpCall(asio::io_context& io, const TcpEndpoints& endpoints, const HttpUrl& url,
                   HttpRequestSpec spec, HttpCallbacks callbacks) {
  std::make_shared<HttpCall>(io, url, std::move(spec), std::move(callbacks))->Start(endpoints);
}

Result<HttpResponse> HttpFetch(const HttpUrl& url, HttpRequestSpec spec) {
  asio::io_context io;
  SIEVE_ASSIGN_OR_RETURN(TcpEndpoints endpoints, ResolveHost(io, url));
  HttpResponse response;
  Status status;
  HttpCallbacks callbacks;
  callbacks.on_status = [&](int http_status) { response.status = http_status; };
  callbacks.on_body = [&](std::string_view bytes) {
    response.body.append(bytes);
    return true;
  };
  callbacks.on_done = [&](const Status& done) { status = done; };
  StartHttpCall(io, endpoints, url, std::move(spec), std::move(callbacks));
  io.run();
  if (!status.ok()) return status;
  return response;
}

}  // namespace sieve::bench
