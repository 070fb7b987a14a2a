// sieve: the command-line entry point. Subcommands live in *_command.cc.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <map>
#include <memory>
#include <string>

#include "core/logging.h"
#include "tools/command_line.h"
#include "tools/commands.h"

int main(int argc, char** argv) {
  sieve::InitLogging();
  sieve::SetCommandLine(argc, argv);
  CLI::App app{
      "Sieve: an LLM inference server for Llama-family models with per-layer KV-cache "
      "sparsity (SnapKV, PyramidKV, StreamingLLM, H2O).",
      "sieve"};
  app.require_subcommand(1);
  app.fallthrough();  // --log-level may also follow the subcommand
  std::string log_level;
  app.add_option("--log-level", log_level, "trace | debug | info | warn | error | off")
      ->envname("SIEVE_LOG_LEVEL");
  std::map<CLI::App*, sieve::CommandRunner> runners;
  const auto add = [&](const char* name, const char* description, auto adder) {
    CLI::App* sub = app.add_subcommand(name, description);
    runners[sub] = adder(*sub);
  };
  add("generate", "Generate text for one prompt or a file of prompts (batched)",
      sieve::AddGenerateCommand);
  add("tokenize", "Print the token ids of stdin as a JSON array", sieve::AddTokenizeCommand);
  add("inspect", "Describe a model directory: architecture, parameters, dtype, KV bytes",
      sieve::AddInspectCommand);
  add("serve", "Serve the OpenAI-compatible HTTP API (completions, chat, models, metrics)",
      sieve::AddServeCommand);
  add("eval",
      "Accuracy of KV policies on long-context tasks (passkey, needles, RULER-style, perplexity, "
      "jsonl), dense and per policy x budget",
      sieve::AddEvalCommand);
  add("bench", "Benchmarks: a serving load generator for any OpenAI-compatible server, and more",
      sieve::AddBenchCommand);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    return app.exit(error);
  }
  if (!log_level.empty()) {
    const sieve::Status status = sieve::SetLogLevel(log_level);
    if (!status.ok()) {
      std::fprintf(stderr, "error: %s\n", status.message().c_str());
      return 2;
    }
  }
  for (auto& [sub, runner] : runners) {
    if (sub->parsed()) return runner();
  }
  return 2;
}
