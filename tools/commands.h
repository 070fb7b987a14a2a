// The subcommands of `sieve`. Each Add*Command registers its flags on `app` and returns the
// function that runs it (after parsing) and gives the process exit code.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>

namespace sieve {

using CommandRunner = std::function<int()>;

CommandRunner AddGenerateCommand(CLI::App& app);
CommandRunner AddTokenizeCommand(CLI::App& app);
CommandRunner AddInspectCommand(CLI::App& app);
CommandRunner AddServeCommand(CLI::App& app);
// `sieve eval`: accuracy of KV policies on long-context tasks.
CommandRunner AddEvalCommand(CLI::App& app);
// `sieve bench` has its own subcommands (serve, sweep, kernels, ...).
CommandRunner AddBenchCommand(CLI::App& app);
// `sieve bench kernels` (GPU kernels and the decode step against PERF.md's bounds).
CommandRunner AddBenchKernelsCommand(CLI::App& app);
// sieve bench cpu: the CPU backend against the machine's ceilings (tools/cpu_bench_command.cc).
CommandRunner AddBenchCpuCommand(CLI::App& app);

}  // namespace sieve
