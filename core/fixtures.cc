#include "core/fixtures.h"

#include <cstdlib>
#include <filesystem>

#ifndef SIEVE_SOURCE_DIR_DEFAULT
#define SIEVE_SOURCE_DIR_DEFAULT "."
#endif

namespace sieve {

std::string ProjectSourceDir() {
  if (const char* env = std::getenv("SIEVE_SOURCE_DIR"); env && *env) return env;
  return SIEVE_SOURCE_DIR_DEFAULT;
}

std::optional<std::string> FindFixturesDir() {
  namespace fs = std::filesystem;
  std::error_code error;
  if (const char* env = std::getenv("SIEVE_FIXTURES"); env && *env) {
    if (fs::is_directory(env, error)) return std::string(env);
    return std::nullopt;
  }
  for (const fs::path& candidate :
       {fs::path(ProjectSourceDir()) / ".." / "shared" / "fixtures",
        fs::path(ProjectSourceDir()) / ".fixtures", fs::path("../shared/fixtures")}) {
    if (fs::is_directory(candidate, error)) return fs::weakly_canonical(candidate, error).string();
  }
  return std::nullopt;
}

std::string TestDataDir() { return ProjectSourceDir() + "/testdata"; }

}  // namespace sieve
