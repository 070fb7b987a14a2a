// The flags `sieve generate` and `sieve serve` share: which model, on which device, with which
// engine and KV-cache settings. One definition, so both commands stay in step.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>

#include <memory>
#include <string>

#include "backend/backend.h"
#include "runtime/engine.h"
#include "runtime/model_loader.h"

namespace sieve {

struct EngineFlags {
  LoadModelOptions load;
  EngineOptions engine;
  std::string device = "auto";  // auto | cpu | cuda | cuda:N
  std::string kv_memory;        // bytes with optional K/M/G suffix
  std::string kv_pool = "max";
  std::string kv_group_reduce = "mean";
  bool no_chunked_prefill = false;
  std::string kv_decode_cap_by = "score";
  int threads = 0;
  bool enforce_eager = false;
  bool no_step_tuning = false;
};

// `policy_flags` false leaves out --kv-policy and --kv-budget, for a command that takes lists of
// them (sieve eval).
void AddEngineFlags(CLI::App& app, EngineFlags& flags, bool policy_flags = true);

// Parses a byte count like "512M", "4G", "1073741824".
Result<int64_t> ParseByteSize(const std::string& text);

struct EngineBundle {
  std::unique_ptr<Backend> backend;
  LoadedModel loaded;  // its model moves into the engine; tokenizer stays here
  std::unique_ptr<Engine> engine;
};

// Picks the backend, loads the model and builds the engine, logging what it did.
Result<EngineBundle> BuildEngine(EngineFlags& flags);

}  // namespace sieve
