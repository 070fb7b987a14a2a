// Timing of the KV-sparsity pass of one layer (WindowScores + SelectKept + WriteKeptKv) at
// Llama-3-8B's shape, printed next to the bound of the prefill it follows (PERF.md: the pass must
// cost under 3% of it), and of the GPU sampler at Llama-3's vocabulary.
#pragma once

#include <vector>

namespace sieve::cuda {

struct SparsityBenchOptions {
  std::vector<int> lengths = {4000, 16000};  // prompt lengths n
  std::vector<int> budgets = {400, 1024};    // C (entries kept per layer)
  int window = 32;                           // W
  int launches = 20;                         // back-to-back launches per timed batch
  int batches = 7;                           // timed batches (the median is reported)
  bool sampling = true;                      // also time SampleTokens
};

// Runs on the current CUDA device and prints one table per part. Returns 0 (CUDA errors abort).
int RunSparsityBenchmarks(const SparsityBenchOptions& options);

}  // namespace sieve::cuda
