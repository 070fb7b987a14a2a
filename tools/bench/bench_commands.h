// The flows behind `sieve bench serve`, `sieve bench sweep` and `sieve bench plot`: settings in,
// tables on stdout, progress on stderr, results in JSON and SVG files. tools/bench_command.cc
// maps flags onto these structs; tests call the functions directly.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "tools/bench/serving_bound.h"

namespace sieve::bench {

// Which prompts to send.
struct DatasetConfig {
  // random | prefix-repetition (or prefix_repetition) | multi-turn (or multi_turn) | jsonl
  std::string name = "random";
  std::string path;       // the JSONL file
  std::string tokenizer;  // "" : Sieve's embedded byte-level tokenizer
  int input_len = 1024;
  int output_len = 128;
  double range_ratio = 0.0;
  int num_prompts = 1000;  // for jsonl, 0 takes every line
  uint64_t seed = 0;
  // prefix-repetition (dataset.h's PrefixRepetitionOptions; vLLM's flags and defaults)
  int prefix_len = 256;
  int suffix_len = 256;
  int num_prefixes = 10;
  int prefix_output_len = 128;
  // multi-turn (dataset.h's MultiTurnOptions; num_prompts is the number of conversations)
  int num_turns = 10;
  int first_len = 256;
  int message_len = 64;
  int multi_turn_output_len = 64;
};

// Whether `name` is the prefix-repetition dataset, in either spelling.
bool IsPrefixRepetition(const std::string& name);
// Whether `name` is the multi-turn dataset, in either spelling.
bool IsMultiTurn(const std::string& name);

// How to talk to the server, and what to record.
struct ClientConfig {
  std::string base_url = "http://127.0.0.1:8000";
  std::string endpoint = "/v1/completions";
  std::string model;  // "" : the first model of GET /v1/models
  std::string api_key;
  bool ignore_eos = false;
  double temperature = 0.0;
  std::string extra_body;  // a JSON object merged into every request
  double request_timeout_s = 6 * 3600.0;
  int warmup = 0;  // requests sent and discarded before measuring
  bool progress = true;
  std::string label;
  std::vector<std::string> metadata;  // KEY=VALUE
  std::string result_json;
  bool save_texts = false;  // generated text of every request in the JSON
};

struct ServeConfig {
  DatasetConfig dataset;
  ClientConfig client;
  int max_concurrency = 0;           // 0: no cap
  std::string request_rate = "inf";  // requests/s, or inf
  double burstiness = 1.0;
  BoundConfig bound;  // printed beside the measurement when bound.model_config is set
};

// The concurrency levels of PERF.md's headline workload.
inline const std::vector<int> kPerfConcurrencyLevels = {1, 10, 20, 64, 128};

struct SweepConfig {
  DatasetConfig dataset;
  ClientConfig client;
  std::vector<int> concurrency = kPerfConcurrencyLevels;
  // One count for every level, or one per level; empty or 0: max(10, 2 x concurrency).
  std::vector<int> num_prompts_per_level;
  std::string plot;   // SVG path (*.svg), "" for none
  BoundConfig bound;  // each level's bound, when bound.model_config is set
};

struct PlotConfig {
  std::vector<std::string> result_jsons;  // sweep results, one curve each
  std::string plot;                       // SVG path (*.svg)
  std::string title;
};

// The number of prompts sweep level `level` (an index into config.concurrency) sends.
int PromptsForLevel(const SweepConfig& config, size_t level);

Status RunBenchServe(const ServeConfig& config);
Status RunBenchSweep(const SweepConfig& config);
Status RunBenchPlot(const PlotConfig& config);

}  // namespace sieve::bench
