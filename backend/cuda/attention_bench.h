// Timing of the attention kernels (prefill_attention.cu, decode_attention.cu) against the bars in
// PERF.md, for `sieve bench kernels`. Each row prints what it measured beside its bound and target;
// the same numbers come back as structs for the results file.
#pragma once

#include <string>
#include <vector>

namespace sieve::cuda {

struct AttentionBenchResult {
  std::string name;         // "prefill causal n=4096 x4 H32/G8 d128"
  std::string unit;         // "TFLOP/s" or "GB/s"
  double median_ms = 0.0;   // one call (prefill: calls back to back; decode: the whole op)
  double value = 0.0;       // achieved rate, in `unit`
  double bound = 0.0;       // the device ceiling PERF.md quotes (bf16 GEMM TFLOP/s, copy GB/s)
  double target = 0.0;      // PERF.md's bar for this row, in `unit`; 0 when it sets none
  std::string target_note;  // where the target comes from
};

struct AttentionBenchOptions {
  int warmup = 5;
  int iterations = 30;  // the median of these is reported (PERF.md: >= 20)
  bool quick = false;   // only the headline rows: prefill at 4k, decode at batch 64
  std::vector<AttentionBenchResult>* results = nullptr;  // appended to when set
};

// Runs and prints every case; returns 0 (CUDA errors abort, as everywhere in the backend).
int RunAttentionBenchmarks(const AttentionBenchOptions& options);

// `results` as a JSON array of objects with the fields above.
std::string AttentionBenchResultsToJson(const std::vector<AttentionBenchResult>& results);

}  // namespace sieve::cuda
