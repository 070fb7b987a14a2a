#include "server/server_context.h"

#include <algorithm>
#include <chrono>

namespace sieve {

namespace {

RequestLimits MakeLimits(const AsyncEngine& engine, const ServerOptions& options) {
  RequestLimits limits;
  limits.tokenizer = engine.tokenizer();
  limits.max_model_len = engine.max_model_len();
  limits.vocab_size = engine.vocab_size();
  limits.max_n = options.max_n;
  limits.defaults = options.sampling_defaults;
  return limits;
}

}  // namespace

ServerContext::ServerContext(AsyncEngine& engine_in, ServerOptions options_in)
    : engine(engine_in),
      options(std::move(options_in)),
      limits(MakeLimits(engine_in, options)),
      created(std::chrono::duration_cast<std::chrono::seconds>(
                  std::chrono::system_clock::now().time_since_epoch())
                  .count()),
      metrics(options.served_model_names.front()) {}

bool ServerContext::IsServedModel(const std::string& name) const {
  const std::vector<std::string>& names = options.served_model_names;
  return std::find(names.begin(), names.end(), name) != names.end();
}

}  // namespace sieve
