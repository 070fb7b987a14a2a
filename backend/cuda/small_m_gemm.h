// A GEMM for few rows: out[m][n] = x[m][k] . w[n][k]^T with m <= 64 (a decode step's tokens),
// bf16 inputs, f32 accumulation, bf16 or f32 output. At such m a layer's GEMMs only stream their
// weights; cuBLAS reaches ~72% of the copy rate there (PERF.md), and this kernel exists to close
// that gap: each CTA streams a 128-row slab of w through a 4-stage cp.async pipeline and
// multiplies it with all m rows of x on the tensor cores (wgmma on sm_90a, mma.sync elsewhere).
// When n / 128 slabs are too few to fill the GPU, k is split across CTAs. On sm_90 the splits of a
// slab form a
// thread-block cluster and add their partial sums through distributed shared memory; elsewhere
// (or with more than 8 splits) they meet in an f32 buffer by atomics, which the last CTA of each
// slab converts, writes out, and clears for the next call.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace sieve::cuda {

constexpr int kSmallMGemmMaxRows = 64;
constexpr int kSmallMGemmTileN = 128;           // rows of w per CTA
constexpr int kSmallMGemmTileK = 64;            // k per pipeline stage
constexpr int kSmallMGemmMaxClusterSplits = 8;  // the portable thread-block cluster size

// How the k-splits of a slab add up their partial sums.
enum class SmallMSplitReduce {
  kAuto,     // kCluster where the device has clusters (sm_90+) and splits <= 8, else kAtomics
  kAtomics,  // f32 atomics into split_sums; the last CTA of the slab writes the result
  kCluster,  // one cluster per slab, sums through distributed shared memory (sm_90+)
};

struct SmallMGemmArgs {
  const __nv_bfloat16* w = nullptr;  // [n][k], row stride ldw
  int64_t ldw = 0;
  const __nv_bfloat16* x = nullptr;  // [m][k], row stride ldx
  int64_t ldx = 0;
  void* out = nullptr;  // [m][n], row stride ldo; f32 when out_f32, else bf16
  int64_t ldo = 0;
  bool out_f32 = false;
  bool accumulate = false;  // out += x w^T (one rounding of the f32 sum) instead of out =
  int m = 0;
  int n = 0;
  int k = 0;
  int splits = 1;  // CTAs along k per slab (clamped so that none is empty)
  SmallMSplitReduce reduce = SmallMSplitReduce::kAuto;
  // Needed when splits > 1 add up by atomics: an f32 [m][n] buffer and one counter per slab, both
  // zero before the first call; every call leaves them zero again (graph replays rely on it).
  float* split_sums = nullptr;
  int* split_counters = nullptr;
};

// The operands of out[m][n] = x[m][k] . w[n][k]^T (row strides in elements), with the defaults
// for everything else: one split, no accumulation.
inline SmallMGemmArgs MakeSmallMGemmArgs(int64_t m, int64_t n, int64_t k, const __nv_bfloat16* w,
                                         int64_t ldw, const __nv_bfloat16* x, int64_t ldx,
                                         void* out, int64_t ldo, bool out_f32) {
  SmallMGemmArgs args;
  args.w = w;
  args.ldw = ldw;
  args.x = x;
  args.ldx = ldx;
  args.out = out;
  args.ldo = ldo;
  args.out_f32 = out_f32;
  args.m = static_cast<int>(m);
  args.n = static_cast<int>(n);
  args.k = static_cast<int>(k);
  return args;
}

// Whether the kernel takes these operands: m in [1, 64], k a multiple of 8, rows 16-byte aligned.
bool SmallMGemmSupports(const SmallMGemmArgs& args);

// Slabs of w (CTAs along n).
inline int SmallMGemmSlabs(int n) { return (n + kSmallMGemmTileN - 1) / kSmallMGemmTileN; }

// Splits that keep every CTA at least two pipeline stages of k.
inline int SmallMGemmMaxSplits(int k) {
  const int blocks = (k + kSmallMGemmTileK - 1) / kSmallMGemmTileK;
  return blocks / 2 > 1 ? blocks / 2 : 1;
}

// Whether the current device can add splits up in a cluster (sm_90+).
bool SmallMGemmHasClusters();

void SmallMGemm(const SmallMGemmArgs& args, cudaStream_t stream);

}  // namespace sieve::cuda
