// Resident memory of this process, from /proc (Linux).
#pragma once

#include <cstdint>
#include <fstream>
#include <string>

namespace sieve {

// kB of the given /proc/self/status field ("VmRSS", "VmHWM"), 0 when unavailable.
inline int64_t ProcStatusKb(const std::string& field) {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind(field + ":", 0) == 0) return std::stoll(line.substr(field.size() + 1));
  }
  return 0;
}

}  // namespace sieve
