// Timing of the GEMMs of one decoder layer and the lm_head at decode batch sizes, for
// `sieve bench kernels`: the backend's GemmRunner (cuBLASLt or the skinny kernel, the fastest of
// its candidates) as GB/s of weights streamed, beside the measured copy rate, and the skinny
// kernel alone; at gate_up's few-row sizes also gate_up + SiLU x mul as the pair and as the gated
// skinny kernel. PERF.md's anchor: cuBLAS reaches ~72% of copy at M = 1..128 when timed one call
// at a time.
#pragma once

#include <cuda_runtime.h>

#include <functional>
#include <string>
#include <vector>

namespace sieve::cuda {

struct GemmBenchShape {
  std::string name;  // "qkv", "o", "gate_up", "down", "lm_head"
  int n = 0;         // output features (rows of the weight)
  int k = 0;         // input features
};

struct GemmBenchResult {
  std::string name;
  int m = 0, n = 0, k = 0;
  double cublas_ms = 0, cublas_gbs = 0;
  std::string plan;      // the runner's plan, e.g. "cuBLASLt, candidate 2 of 8 (...)"
  double skinny_ms = 0;  // the skinny kernel alone at its fastest k split; 0 where it cannot run
  // gate_up up to kSkinnyGemmSwiGluMaxRows rows (else 0): the runner then SiluMul, against the
  // gated skinny kernel (SkinnyGemmSwiGlu), both with a folded norm's row scales, and the largest
  // difference of the gated output from the pair's over the pair's largest value.
  double silu_pair_ms = 0, gated_skinny_ms = 0, gated_max_relative_difference = 0;
};

struct GemmBenchOptions {
  std::vector<GemmBenchShape> shapes;
  std::vector<int> rows = {1, 16, 64};
  double copy_bandwidth = 0;  // bytes/s, read + write (the ceiling the fractions use)
  int iterations = 30;        // median of these
  std::vector<GemmBenchResult>* results = nullptr;
};

int RunGemmBenchmarks(const GemmBenchOptions& options);

// Time of one call inside a CUDA graph of `iterations` back-to-back calls of `call`, the i-th on
// operand i % operands (weights that together are larger than the L2, so that every call streams
// its weight from memory as in a decode step); the median of 5 replays. A graph, as decode steps
// run, so that host launch costs are not counted. Each operand is called once before the capture
// (a runner plans on its first call).
double TimeGraphedCalls(cudaStream_t stream, int operands, int iterations,
                        const std::function<void(int operand)>& call);

}  // namespace sieve::cuda
