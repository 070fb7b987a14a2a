#include "server/http_server.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <utility>  // before Asio: Boost 1.74's headers use std::exchange without it

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>

#include "core/logging.h"
#include "server/http_session.h"
#include "server/server_context.h"

namespace sieve {

namespace net = boost::asio;
using tcp = net::ip::tcp;

namespace {

// After the engine drained, how long responses may take to reach their clients before the I/O
// threads stop anyway.
constexpr auto kFlushTimeout = std::chrono::seconds(5);

// Descriptors the process holds besides its connections (the model's mapped files, the device
// driver's, logs): what the connection estimate leaves out.
constexpr rlim_t kReservedDescriptors = 64;

// Raises the soft limit on open files to the hard one, as vLLM does at start: every connection
// is a descriptor, and distributions default the soft limit to 1024. Returns the soft limit in
// force afterwards.
rlim_t RaiseOpenFilesLimit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return 0;
  if (limit.rlim_cur < limit.rlim_max) {
    rlimit raised = limit;
    raised.rlim_cur = limit.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &raised) == 0) {
      limit = raised;
    } else {
      spdlog::warn("cannot raise the open files limit from {} to {}: {}", limit.rlim_cur,
                   limit.rlim_max, std::strerror(errno));
    }
  }
  return limit.rlim_cur;
}

// What a connection accepted past the descriptor limit is told before it is closed.
const std::string& TooManyConnectionsResponse() {
  static const std::string response = [] {
    const std::string body =
        R"({"error":{"message":"too many open connections: the server is out of file )"
        R"(descriptors","type":"ServiceUnavailableError","code":503}})";
    return "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
           "Connection: close\r\nRetry-After: 1\r\nContent-Length: " +
           std::to_string(body.size()) + "\r\n\r\n" + body;
  }();
  return response;
}

// Reads and drops what `socket` has received, waiting up to `wait_ms` for the first bytes and
// stopping at the end of the stream or when nothing more is there.
void DiscardInput(int socket, int wait_ms) {
  pollfd ready{socket, POLLIN, 0};
  if (::poll(&ready, 1, wait_ms) <= 0) return;
  char buffer[4096];
  for (;;) {
    const ssize_t read = ::recv(socket, buffer, sizeof(buffer), MSG_DONTWAIT);
    if (read <= 0) return;
  }
}

ServerOptions Normalized(ServerOptions options) {
  if (options.served_model_names.empty()) options.served_model_names = {"sieve"};
  if (options.http_threads < 1) options.http_threads = 1;
  return options;
}

}  // namespace

struct HttpServer::Impl {
  Impl(AsyncEngine& engine, ServerOptions options)
      : context(engine, Normalized(std::move(options))),
        work(net::make_work_guard(io_context)),
        acceptor(net::make_strand(io_context)) {}

  void Accept();
  // Out of descriptors: takes one pending connection with the spare descriptor, tells it 503 and
  // closes it, so that clients are refused rather than left waiting, then accepts again after a
  // pause (the backlog would otherwise fail every accept at once, in a loop).
  void RefusePendingConnection();
  void WaitForSignal();

  // Declared first so that it outlives the io_context, whose destruction ends the sessions.
  ServerContext context;
  net::io_context io_context;
  net::executor_work_guard<net::io_context::executor_type> work;
  tcp::acceptor acceptor;
  std::optional<net::signal_set> signals;
  std::vector<std::thread> threads;
  int port = 0;
  int spare_descriptor = -1;  // /dev/null, held for RefusePendingConnection
  std::optional<net::steady_timer> accept_pause;
  int64_t refused = 0;  // connections refused for want of descriptors

  std::mutex mutex;
  std::condition_variable shutdown_requested_cv;
  bool started = false;
  bool shutdown_requested = false;
  bool stopped = false;
  int num_signals = 0;
};

void HttpServer::Impl::Accept() {
  acceptor.async_accept(net::make_strand(io_context),
                        [this](boost::system::error_code error, tcp::socket socket) {
                          if (error == net::error::operation_aborted || !acceptor.is_open()) {
                            return;
                          }
                          if (error == net::error::no_descriptors || error.value() == ENFILE) {
                            RefusePendingConnection();
                            return;
                          }
                          if (error) {
                            spdlog::warn("accept failed: {}", error.message());
                          } else {
                            boost::system::error_code ignored;
                            socket.set_option(tcp::no_delay(true), ignored);
                            std::make_shared<HttpSession>(std::move(socket), context)->Start();
                          }
                          Accept();
                        });
}

void HttpServer::Impl::RefusePendingConnection() {
  if (spare_descriptor >= 0) {
    ::close(spare_descriptor);
    spare_descriptor = -1;
  }
  const int connection = ::accept4(acceptor.native_handle(), nullptr, nullptr, SOCK_CLOEXEC);
  if (connection >= 0) {
    // Closing a socket with unread input resets it, and a reset can destroy the response before
    // the client reads it: so what the client has sent is read and dropped (a request on its way
    // is given 10 ms), the 503 sent, and the rest read for up to 100 ms while the client closes.
    DiscardInput(connection, 10);
    const std::string& response = TooManyConnectionsResponse();
    const ssize_t written =
        ::send(connection, response.data(), response.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    (void)written;
    ::shutdown(connection, SHUT_WR);
    DiscardInput(connection, 100);
    ::close(connection);
  }
  spare_descriptor = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (refused++ % 1000 == 0) {
    spdlog::warn(
        "out of file descriptors: refusing new connections with 503 until some close ({} refused "
        "so far; the open files limit is `ulimit -n`)",
        refused);
  }
  accept_pause->expires_after(std::chrono::milliseconds(connection >= 0 ? 1 : 20));
  accept_pause->async_wait([this](boost::system::error_code error) {
    if (!error && acceptor.is_open()) Accept();
  });
}

void HttpServer::Impl::WaitForSignal() {
  signals->async_wait([this](boost::system::error_code error, int signal_number) {
    if (error) return;
    ++num_signals;
    if (num_signals == 1) {
      spdlog::info("received signal {}: shutting down (again to abort requests in flight)",
                   signal_number);
      {
        std::lock_guard lock(mutex);
        shutdown_requested = true;
        context.shutting_down.store(true);
      }
      shutdown_requested_cv.notify_all();
    } else {
      spdlog::warn("received signal {} again: aborting requests in flight", signal_number);
      context.engine.AbortAll();
    }
    WaitForSignal();
  });
}

HttpServer::HttpServer(AsyncEngine& engine, ServerOptions options)
    : impl_(std::make_unique<Impl>(engine, std::move(options))) {}

HttpServer::~HttpServer() {
  bool running = false;
  {
    std::lock_guard lock(impl_->mutex);
    running = impl_->started && !impl_->stopped;
  }
  if (running) {
    RequestShutdown();
    Wait();
  }
}

int HttpServer::port() const { return impl_->port; }

Status HttpServer::Start() {
  Impl& impl = *impl_;
  const ServerOptions& options = impl.context.options;
  boost::system::error_code error;
  tcp::resolver resolver(impl.io_context);
  const auto endpoints =
      resolver.resolve(options.host, std::to_string(options.port), tcp::resolver::passive, error);
  if (error || endpoints.empty()) {
    return InvalidArgumentError("cannot resolve --host '" + options.host + "': " + error.message());
  }
  const tcp::endpoint endpoint = endpoints.begin()->endpoint();
  const std::string where = options.host + ":" + std::to_string(options.port);
  if (impl.acceptor.open(endpoint.protocol(), error); error) {
    return UnavailableError("cannot open a socket for " + where + ": " + error.message());
  }
  impl.acceptor.set_option(net::socket_base::reuse_address(true), error);
  if (impl.acceptor.bind(endpoint, error); error) {
    return UnavailableError("cannot listen on " + where + ": " + error.message());
  }
  if (impl.acceptor.listen(net::socket_base::max_listen_connections, error); error) {
    return UnavailableError("cannot listen on " + where + ": " + error.message());
  }
  impl.port = impl.acceptor.local_endpoint().port();
  const rlim_t open_files = RaiseOpenFilesLimit();
  impl.spare_descriptor = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  impl.accept_pause.emplace(impl.acceptor.get_executor());
  if (open_files != RLIM_INFINITY && open_files > 0) {
    spdlog::info("open files limit {}: about {} connections at once", open_files,
                 open_files > kReservedDescriptors ? open_files - kReservedDescriptors : 0);
  }
  if (options.handle_signals) {
    impl.signals.emplace(impl.io_context, SIGINT, SIGTERM);
    impl.WaitForSignal();
  }
  impl.Accept();
  for (int index = 0; index < options.http_threads; ++index) {
    impl.threads.emplace_back([&impl] {
      for (;;) {
        try {
          impl.io_context.run();
          return;
        } catch (const std::exception& exception) {
          // Handlers catch their own errors; this is a last line so one bad request cannot stop
          // an I/O thread.
          spdlog::error("I/O thread: {}", exception.what());
        }
      }
    });
  }
  {
    std::lock_guard lock(impl.mutex);
    impl.started = true;
  }
  spdlog::info("serving {} on http://{}:{} ({} I/O threads)", impl.context.model_name(),
               endpoint.address().to_string(), impl.port, options.http_threads);
  return Status::Ok();
}

void HttpServer::RequestShutdown() {
  {
    std::lock_guard lock(impl_->mutex);
    impl_->shutdown_requested = true;
    impl_->context.shutting_down.store(true);
  }
  impl_->shutdown_requested_cv.notify_all();
}

int HttpServer::Wait() {
  Impl& impl = *impl_;
  {
    std::unique_lock lock(impl.mutex);
    if (!impl.started || impl.stopped) return 0;
    impl.shutdown_requested_cv.wait(lock, [&impl] { return impl.shutdown_requested; });
  }
  AsyncEngine& engine = impl.context.engine;
  net::post(impl.acceptor.get_executor(), [&impl] {
    boost::system::error_code ignored;
    impl.acceptor.close(ignored);
    impl.accept_pause->cancel();
  });
  engine.StopAccepting();
  const int in_flight = engine.Stats().num_in_flight;
  const auto grace = std::chrono::milliseconds(
      static_cast<int64_t>(impl.context.options.shutdown_timeout_s * 1000.0));
  if (in_flight > 0) {
    spdlog::info("waiting up to {} s for {} request(s) in flight",
                 impl.context.options.shutdown_timeout_s, in_flight);
  }
  const int aborted = engine.Drain(grace);
  if (aborted > 0) spdlog::info("aborted {} request(s) still running", aborted);
  // The engine is done; let the last chunks and bodies reach their clients.
  const auto deadline = std::chrono::steady_clock::now() + kFlushTimeout;
  while (impl.context.active_generations.load() > 0 &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  impl.work.reset();
  impl.io_context.stop();
  for (std::thread& thread : impl.threads) thread.join();
  impl.threads.clear();
  if (impl.spare_descriptor >= 0) {
    ::close(impl.spare_descriptor);
    impl.spare_descriptor = -1;
  }
  {
    std::lock_guard lock(impl.mutex);
    impl.stopped = true;
  }
  spdlog::info("server stopped");
  return aborted;
}

}  // namespace sieve
