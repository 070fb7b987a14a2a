// Logging goes through spdlog; this header picks the level from a flag or SIEVE_LOG_LEVEL.
#pragma once

#include <spdlog/spdlog.h>

#include <string_view>

#include "core/status.h"

namespace sieve {

// "trace", "debug", "info", "warn", "error", "off".
Status SetLogLevel(std::string_view level);
// Reads SIEVE_LOG_LEVEL (default "info") and sends logs to stderr so stdout stays for output.
void InitLogging();

}  // namespace sieve
