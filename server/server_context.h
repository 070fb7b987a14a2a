// ServerContext: what every connection of one HttpServer shares. Created before the I/O threads
// start and destroyed after they stop; its members are immutable or thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "runtime/async_engine.h"
#include "server/completion_request.h"
#include "server/server_metrics.h"
#include "server/server_options.h"

namespace sieve {

struct ServerContext {
  ServerContext(AsyncEngine& engine_in, ServerOptions options_in);

  const std::string& model_name() const { return options.served_model_names.front(); }
  bool IsServedModel(const std::string& name) const;

  AsyncEngine& engine;
  const ServerOptions options;
  const RequestLimits limits;
  const int64_t created;  // Unix seconds, for /v1/models
  ServerMetrics metrics;
  std::atomic<bool> shutting_down{false};
  // HTTP requests between submission and their last byte (or their client leaving).
  std::atomic<int> active_generations{0};
};

}  // namespace sieve
