#include "core/logging.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <cstdlib>
#include <string>

namespace sieve {

Status SetLogLevel(std::string_view level) {
  const auto parsed = spdlog::level::from_str(std::string(level));
  if (parsed == spdlog::level::off && level != "off") {
    return InvalidArgumentError("unknown log level '" + std::string(level) +
                                "' (expected trace, debug, info, warn, error or off)");
  }
  spdlog::set_level(parsed);
  return Status::Ok();
}

void InitLogging() {
  static bool initialised = false;
  if (!initialised) {
    initialised = true;
    auto logger = spdlog::stderr_color_mt("sieve");
    spdlog::set_default_logger(logger);
    spdlog::set_pattern("[%H:%M:%S.%e] [%^%l%$] %v");
  }
  const char* env = std::getenv("SIEVE_LOG_LEVEL");
  if (env == nullptr || !SetLogLevel(env).ok()) spdlog::set_level(spdlog::level::info);
}

}  // namespace sieve
