#include "tools/command_line.h"

namespace sieve {

namespace {

std::string& Stored() {
  static std::string command_line;
  return command_line;
}

std::string ShellQuoted(const std::string& argument) {
  if (!argument.empty() &&
      argument.find_first_of(" \t\n'\"\\$`*?[]{}()<>|&;!#~") == std::string::npos) {
    return argument;
  }
  std::string quoted = "'";
  for (const char c : argument) {
    if (c == '\'') {
      quoted += "'\\''";
    } else {
      quoted += c;
    }
  }
  quoted += '\'';
  return quoted;
}

}  // namespace

void SetCommandLine(int argc, char** argv) {
  std::string line = "sieve";
  for (int index = 1; index < argc; ++index) {
    line += ' ';
    line += ShellQuoted(argv[index]);
  }
  Stored() = line;
}

const std::string& CommandLine() { return Stored(); }

}  // namespace sieve
