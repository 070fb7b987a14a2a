// HttpServer: the OpenAI-compatible HTTP API of `sieve serve` over an AsyncEngine.
//
// A few I/O threads run one Asio io_context; every connection is asynchronous (Boost.Beast), so
// hundreds of streaming clients need no thread each, and all generation happens on the
// AsyncEngine's one engine thread. Routes: POST /v1/completions, POST /v1/chat/completions,
// GET /v1/models, /health, /metrics (Prometheus), /version. See docs/server.md.
//
// Lifecycle: Start() listens; Wait() blocks until RequestShutdown() (or SIGINT/SIGTERM with
// handle_signals), then shuts down gracefully: stop accepting connections and requests (503),
// let requests in flight finish for up to shutdown_timeout_s, abort the rest, flush their
// responses, stop the I/O threads. The AsyncEngine must outlive the server.
#pragma once

#include <memory>
#include <string>

#include "core/status.h"
#include "runtime/async_engine.h"
#include "server/server_options.h"

namespace sieve {

class HttpServer {
 public:
  HttpServer(AsyncEngine& engine, ServerOptions options);
  ~HttpServer();  // RequestShutdown() and Wait() if still running
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds and listens, then starts the I/O threads. Unavailable when the address is taken.
  Status Start();
  // The port listened on (useful with port 0), once started.
  int port() const;
  // Starts a graceful shutdown; returns at once. Safe from any thread.
  void RequestShutdown();
  // Blocks until a shutdown is requested and done. Returns the number of requests aborted.
  int Wait();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sieve
