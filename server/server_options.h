// ServerOptions: how `sieve serve` listens and what it allows (the flags of server/).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/sampling_params.h"

namespace sieve {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;  // 0: any free port (HttpServer::port() says which)
  // Names clients may put in "model"; the first is the one responses and /v1/models report.
  std::vector<std::string> served_model_names = {"sieve"};
  std::string api_key;                        // "" : no authentication
  int64_t max_body_bytes = int64_t{8} << 20;  // larger bodies get 413
  int http_threads = 2;                       // I/O threads; generation runs on the engine thread
  double shutdown_timeout_s = 30.0;           // grace for in-flight requests on shutdown
  bool handle_signals = false;                // SIGINT / SIGTERM start a graceful shutdown
  int max_n = 128;                            // most choices per request
  SamplingParams sampling_defaults;           // what a request leaves unset (generation_config)
};

}  // namespace sieve
