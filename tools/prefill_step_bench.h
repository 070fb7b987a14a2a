// The prefill-step benchmark: one engine step that prefills S prompts of n tokens each (dummy
// weights, a fresh engine, warmed up as `sieve serve` is), timed end to end, beside its compute
// bound: the step's GEMM FLOPs at the rate cuBLASLt reaches on each of those GEMM shapes alone,
// plus its causal attention FLOPs at a given attention rate (cuDNN's SDPA, measured by
// scripts/sdpa_bench.py in the same run). Issue 19 item 3's measure.
#pragma once

#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/llama_model.h"
#include "model/model_config.h"
#include "sparsity/kv_policy.h"

namespace sieve {

struct PrefillStepBenchOptions {
  int num_seqs = 2;
  int prompt_len = 4000;
  std::string kv_policy = "full";
  KvPolicyOptions kv_policy_options;
  int iterations = 5;               // steps timed; the median is reported
  double attention_flops_rate = 0;  // FLOP/s of the bound's attention; <= 0: not counted
  bool profile = false;             // one more step between cudaProfilerStart and Stop
  // The layers' weights, and the GEMMs of the bound timed alone, in this format.
  WeightQuantization quantization = WeightQuantization::kNone;
};

// One GEMM shape of the step timed alone (every layer's calls of it): rows x n x k.
struct PrefillGemm {
  std::string name;
  int64_t m = 0, n = 0, k = 0;
  int calls = 0;          // per step (the layers that run it)
  double ms_alone = 0;    // one call, median
  double flops_rate = 0;  // FLOP/s alone
};

struct PrefillStepBenchResult {
  double step_ms = 0;  // host time of Engine::Step (launch, run, sample, synchronise), median
  double tokens_per_second = 0;
  double gemm_flops = 0;       // per step, every layer's GEMMs (the lm_head's few rows left out)
  double attention_flops = 0;  // causal QK^T and PV, every layer
  std::vector<PrefillGemm> gemms;
  double gemm_bound_ms = 0;       // each GEMM at its alone rate
  double attention_bound_ms = 0;  // at options.attention_flops_rate
  double bound_ms = 0;
};

// Runs on `backend` (fresh: its GEMM plans are made by this engine's warm-up).
PrefillStepBenchResult RunPrefillStepBench(Backend& backend, const ModelConfig& config,
                                           const PrefillStepBenchOptions& options);

}  // namespace sieve
