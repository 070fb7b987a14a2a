// Placeholder until the benchmarks land (being written now).
#include <cstdio>

#include "tools/commands.h"

namespace sieve {

CommandRunner AddBenchCommand(CLI::App&) {
  return [] {
    std::fprintf(stderr, "error: sieve bench is not built yet\n");
    return 1;
  };
}

}  // namespace sieve
