// The MLP's gate_up GEMM with SiLU x mul in its epilogue (sm_90a): out = silu(s g) * (s u) with
// g = x . w_gate^T and u = x . w_up^T, each rounded to bf16 first, so that the result equals the
// unfused pair (GemmRunner's gate_up, then SiluMul) up to the GEMMs' order of summation. The
// [T][2F] product never goes to memory. The design is in README_gemm.md.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/row_rms.cuh"

namespace sieve::cuda {

// Whether the fused kernel runs here (an H100/H200 and a build for sm_90a) and takes this shape:
// F a multiple of 128 (a tile's gate rows must not run into the up rows), K, the row strides a
// multiple of 8 and the pointers 16-byte aligned (what a tensor copy needs).
bool SwiGluGemmSupports(int64_t f, int64_t k, const __nv_bfloat16* x, int64_t ldx,
                        const __nv_bfloat16* w, const __nv_bfloat16* out, int64_t ldo);

// out[m][f] = silu(s_m bf16(x_m . w_j)) * (s_m bf16(x_m . w_{F+j})) for j < F, s_m from `norm`
// (row_rms.cuh; 1 without rows). w [2F][K]: gate rows, then up rows. `row_scales`: room for m
// floats on the device (where s goes between the two kernels this launches). `cluster`: 1, or 2
// for the experiment whose CTA pairs share their w slices (swiglu_gemm_sm90.cu). Checked by
// SwiGluGemmSupports first.
void SwiGluGemm(int64_t m, int64_t f, int64_t k, const __nv_bfloat16* x, int64_t ldx,
                const __nv_bfloat16* w, const RowRmsView& norm, float* row_scales,
                __nv_bfloat16* out, int64_t ldo, cudaStream_t stream, int cluster = 1);

// The fused kernel's order of work (for it and its test): unit `unit` of a walk over row_units x
// column_tiles (a unit: the row tiles of one cluster) in groups of kSwiGluGroupRows row units,
// column tiles across each group, rows fastest within it. The ~132 CTAs running together then
// span 8 row tiles (8 MiB of x at K = 4096) and ~17 column tiles (34 MiB of w), which the L2 holds.
constexpr int kSwiGluGroupRows = 8;
struct SwiGluUnit {
  int row_unit;
  int column_tile;
};
__host__ __device__ inline SwiGluUnit SwiGluUnitOf(int unit, int row_units, int column_tiles) {
  const int per_group = kSwiGluGroupRows * column_tiles;
  const int group = unit / per_group;
  const int first = group * kSwiGluGroupRows;
  const int rows = row_units - first < kSwiGluGroupRows ? row_units - first : kSwiGluGroupRows;
  const int in_group = unit - group * per_group;
  return {first + in_group % rows, in_group / rows};
}

}  // namespace sieve::cuda
