// The command line `sieve` was started with, kept for records that say how they were made
// (`sieve eval --result-json` stores it, so a number can be reproduced from its file).
#pragma once

#include <string>

namespace sieve {

// Called once by main(); arguments with spaces or quotes are single-quoted as a shell would need.
void SetCommandLine(int argc, char** argv);
// "sieve eval --task passkey ...": the program name as "sieve", then the arguments.
const std::string& CommandLine();

}  // namespace sieve
