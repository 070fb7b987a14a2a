// Placeholder until the server lands (being written now).
#include <cstdio>

#include "tools/commands.h"

namespace sieve {

CommandRunner AddServeCommand(CLI::App&) {
  return [] {
    std::fprintf(stderr, "error: sieve serve is not built yet\n");
    return 1;
  };
}

}  // namespace sieve
