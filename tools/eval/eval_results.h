// EvalResults: the records of a `sieve eval` run, aggregated into cells (task x length x depth x
// configuration) and summaries (task x configuration), printed as tables and written as JSON.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tools/eval/eval_sample.h"

namespace sieve::eval {

// One evaluated configuration: dense ("full", no budget) or a policy at a budget.
struct EvalConfig {
  std::string label;  // "full", "snapkv@512", "full:0-2,pyramidkv:3-7@256", --label remotely
  std::string policy;
  std::optional<int> budget;
};

struct EvalCell {
  std::string task;
  int length = 0;
  std::optional<double> depth;
  std::string config;
  int samples = 0;
  double score_sum = 0;  // of sample scores in [0, 1]
  double nll_sum = 0;    // perplexity: over every scored token
  int64_t tokens = 0;    // perplexity: scored tokens
  int truncated = 0;     // jsonl: prompts cut in the middle
  int errors = 0;        // requests that failed (scored 0)
  bool perplexity() const { return task == "perplexity"; }
  // Mean score in [0, 1]; perplexity: exp(mean NLL).
  double value() const;
};

class EvalResults {
 public:
  // `tasks` and `configs` fix the order of tables and JSON.
  EvalResults(std::vector<std::string> tasks, std::vector<EvalConfig> configs);

  // The record's sample must outlive the results.
  void Add(SampleRecord record);
  const std::vector<SampleRecord>& records() const { return records_; }
  const std::vector<EvalConfig>& configs() const { return configs_; }

  // Sorted by task, length, depth (null first), configuration (in the given orders).
  std::vector<EvalCell> Cells() const;
  // Per task x configuration: accuracy averaged over its cells (each length and depth weighs
  // the same); perplexity over every scored token. `length` and `depth` are unset.
  std::vector<EvalCell> Summary() const;

  // Scores in % (perplexity as is), one table per task with a column per configuration, then the
  // summary.
  std::string Table() const;
  // {"cells": [...], "summary": [...], "records": [...]}
  nlohmann::json ToJson() const;

 private:
  int TaskOrder(const std::string& task) const;
  int ConfigOrder(const std::string& config) const;

  std::vector<std::string> tasks_;
  std::vector<EvalConfig> configs_;
  std::vector<SampleRecord> records_;
};

}  // namespace sieve::eval
