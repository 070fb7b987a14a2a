// The flags `sieve generate` and `sieve serve` share: which model, on which device, with which
// engine and KV-cache settings. One definition, so both commands stay in step.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>

#include <memory>
#include <string>

#include "backend/backend.h"
#include "backend/communicator.h"
#include "core/thread_pool.h"
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
  bool enable_prefix_caching = true;
  std::string preemption_mode = "recompute";
  double swap_space_gib = 4.0;
  std::string kv_decode_cap_by = "score";
  int threads = 0;
  bool enforce_eager = false;
  bool no_step_tuning = false;
  int tensor_parallel_size = 1;
};

// `policy_flags` false leaves out --kv-policy and --kv-budget, for a command that takes lists of
// them (sieve eval).
void AddEngineFlags(CLI::App& app, EngineFlags& flags, bool policy_flags = true);

// Parses a byte count like "512M", "4G", "1073741824".
Result<int64_t> ParseByteSize(const std::string& text);

struct EngineBundle {
  // Tensor parallelism on the CPU: each rank's threads (outlive the backends).
  std::vector<std::unique_ptr<ThreadPool>> thread_pools;
  std::unique_ptr<Backend> backend;                          // rank 0's
  std::vector<std::unique_ptr<Backend>> other_backends;      // ranks 1 .. N-1
  std::vector<std::unique_ptr<Communicator>> communicators;  // every rank's (N > 1)
  LoadedModel loaded;  // its model moves into the engine; tokenizer stays here
  std::unique_ptr<Engine> engine;
};

// Picks the backend (N of them with --tensor-parallel-size N: CPU ranks sharing the threads, or
// GPUs cuda:K .. cuda:K+N-1 joined by NCCL), loads the model (each rank its slices) and builds
// the engine, logging what it did.
Result<EngineBundle> BuildEngine(EngineFlags& flags);

}  // namespace sieve
