// Timing of the GEMMs of one decoder layer and the lm_head at decode batch sizes, for
// `sieve bench kernels`: the backend's GemmRunner (cuBLASLt or the skinny kernel, the fastest of
// its candidates) as GB/s of weights streamed, beside the measured copy rate, and the skinny
// kernel alone. PERF.md's anchor: cuBLAS reaches ~72% of copy at M = 1..128 when timed one call
// at a time. Also the MLP's gate_up and SiLU and the attention's qkv GEMM and RoPE at prefill
// sizes, unfused against fused.
#pragma once

#include <string>
#include <vector>

#include "backend/cuda/epilogue_gemm.h"

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
};

struct GemmBenchOptions {
  std::vector<GemmBenchShape> shapes;
  std::vector<int> rows = {1, 16, 64};
  double copy_bandwidth = 0;  // bytes/s, read + write (the ceiling the fractions use)
  int iterations = 30;        // median of these
  std::vector<GemmBenchResult>* results = nullptr;
};

int RunGemmBenchmarks(const GemmBenchOptions& options);

// The MLP's gate_up GEMM and SiLU at prefill row counts: GemmRunner's gate_up then SiluMul, against
// the fused kernel (epilogue_gemm.h) where it runs, both with a folded norm's row scales.
struct SwiGluBenchResult {
  int m = 0, f = 0, k = 0;
  double gemm_ms = 0;     // GemmRunner's gate_up alone
  double unfused_ms = 0;  // gate_up, then SiluMul
  // The fused kernel's schedules, as kEpilogueGemmVariants; 0 where the fused kernel does not run.
  double fused_ms[4] = {};
  double skinny_ms = 0;  // the gated skinny kernel (skinny_gemm.h), up to its 32 rows; else 0
  double max_relative_difference = 0;  // fused against unfused, over the whole output
};
struct SwiGluBenchOptions {
  int f = 14336;
  int k = 4096;
  std::vector<int> rows = {1, 8, 16, 20, 32, 128, 256, 512, 1024, 2048, 8000};
  int iterations = 10;
  std::vector<SwiGluBenchResult>* results = nullptr;
};
int RunSwiGluBenchmarks(const SwiGluBenchOptions& options);

// The attention's qkv GEMM with RoPE and the cache write at prefill row counts (one prompt of m
// tokens writing its pages): GemmRunner's qkv then RopeAndCacheWrite, against the fused kernel
// (epilogue_gemm.h) in each schedule, with a folded norm's row scales.
struct QkvRopeBenchResult {
  int m = 0, width = 0, k = 0;
  double gemm_ms = 0;     // GemmRunner's qkv alone
  double unfused_ms = 0;  // qkv, then RopeAndCacheWrite
  // As kEpilogueGemmVariants; 0 where the fused kernel does not run.
  double fused_ms[4] = {};
  double max_relative_difference = 0;  // fused against unfused, over qkv
};
struct QkvRopeBenchOptions {
  int num_heads = 32;
  int num_kv_heads = 8;
  int head_dim = 128;
  int k = 4096;
  std::vector<int> rows = {1024, 2048, 8000};
  int iterations = 10;
  std::vector<QkvRopeBenchResult>* results = nullptr;
};
int RunQkvRopeBenchmarks(const QkvRopeBenchOptions& options);

}  // namespace sieve::cuda
