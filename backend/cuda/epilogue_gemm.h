// GEMMs with the op that follows them in their epilogue (sm_90a, epilogue_gemm_sm90.cu), so that
// their product never goes to memory and back:
// - SwiGluGemm, the MLP's gate_up GEMM with SiLU x mul: out = silu(s g) * (s u) with
//   g = x . w_gate^T and u = x . w_up^T, each rounded to bf16 first, so that the result equals the
//   unfused pair (GemmRunner's gate_up, then SiluMul) up to the GEMMs' order of summation;
// - QkvRopeGemm, the attention's qkv GEMM with RoPE and the K/V cache write of the step's prefill
//   tokens: equal in the same sense to the qkv GEMM, then RopeAndCacheWrite of those tokens.
// The design is in README_gemm.md.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/kernels.h"
#include "backend/cuda/row_rms.cuh"

namespace sieve::cuda {

// Experiments beside the default schedule (epilogue_gemm_sm90.cu), for the tests and the
// benchmark: `cluster` 2 makes CTA pairs share their w slices; `pingpong` has the two consumer
// warpgroups take tiles of 64 rows in turn instead of sharing tiles of 128 rows.
struct EpilogueGemmVariant {
  int cluster = 1;
  bool pingpong = false;
};
// All of them, the default first: what the tests check and the benchmark times.
inline constexpr EpilogueGemmVariant kEpilogueGemmVariants[4] = {
    {1, false}, {2, false}, {1, true}, {2, true}};

// Whether the fused kernel runs here (an H100/H200 and a build for sm_90a) and takes this shape:
// F a multiple of 128 (a tile's gate rows must not run into the up rows), K, the row strides a
// multiple of 8 and the pointers 16-byte aligned (what a tensor copy needs).
bool SwiGluGemmSupports(int64_t f, int64_t k, const __nv_bfloat16* x, int64_t ldx,
                        const __nv_bfloat16* w, const __nv_bfloat16* out, int64_t ldo);

// out[m][f] = silu(s_m bf16(x_m . w_j)) * (s_m bf16(x_m . w_{F+j})) for j < F, s_m from `norm`
// (row_rms.cuh; 1 without rows). w [2F][K]: gate rows, then up rows. `row_scales`: room for m
// floats on the device (where s goes between the two kernels this launches). Checked by
// SwiGluGemmSupports first.
void SwiGluGemm(int64_t m, int64_t f, int64_t k, const __nv_bfloat16* x, int64_t ldx,
                const __nv_bfloat16* w, const RowRmsView& norm, float* row_scales,
                __nv_bfloat16* out, int64_t ldo, cudaStream_t stream,
                const EpilogueGemmVariant& variant = {});

// Whether QkvRopeGemm runs here and takes this shape: head_dim 64 or 128, the qkv width
// (H + 2G) d a multiple of 256 (a tile's columns are whole heads), the operands as for
// SwiGluGemmSupports and the RoPE table 16-byte aligned.
bool QkvRopeGemmSupports(int64_t width, int head_dim, int64_t k, const __nv_bfloat16* x,
                         int64_t ldx, const __nv_bfloat16* w, const __nv_bfloat16* qkv, int64_t ldq,
                         const float* rope_table);

// qkv[m][(H + 2G) d] = x . w^T for the step's m = T tokens; then, as RopeAndCacheWrite over the
// prefill tokens [0, T_p) (kernels.h) does to the qkv rows it reads: their q and k rotated (table
// [max_pos][d/2][2] cos/sin), q, k and v scaled by s from `norm` first, and k, v and the position
// (and score) side pools written to the entries of sequences whose write_start[layer][s] >= 0.
// Decode rows [T_p, T) are the GEMM's product. `row_scales`: room for T_p floats on the device.
// Checked by QkvRopeGemmSupports first.
void QkvRopeGemm(int64_t m, int64_t k, const __nv_bfloat16* x, int64_t ldx, const __nv_bfloat16* w,
                 const float* rope_table, int num_heads, const StepView& step, int layer,
                 const PoolView& pool, const RowRmsView& norm, float* row_scales,
                 __nv_bfloat16* qkv, int64_t ldq, cudaStream_t stream,
                 const EpilogueGemmVariant& variant = {});

// The fused kernels' order of work (for them and their test): unit `unit` of a walk over
// row_units x column_tiles (a unit: the row tiles of one cluster) in groups of
// kEpilogueGemmGroupRows row units, column tiles across each group, rows fastest within it. The
// ~132 CTAs running together then span 8 row tiles (8 MiB of x at K = 4096) and ~17 column tiles
// (34 MiB of w), which the L2 holds.
constexpr int kEpilogueGemmGroupRows = 8;
struct EpilogueGemmUnit {
  int row_unit;
  int column_tile;
};
__host__ __device__ inline EpilogueGemmUnit EpilogueGemmUnitOf(int unit, int row_units,
                                                               int column_tiles) {
  const int per_group = kEpilogueGemmGroupRows * column_tiles;
  const int group = unit / per_group;
  const int first = group * kEpilogueGemmGroupRows;
  const int rows =
      row_units - first < kEpilogueGemmGroupRows ? row_units - first : kEpilogueGemmGroupRows;
  const int in_group = unit - group * per_group;
  return {first + in_group % rows, in_group / rows};
}

}  // namespace sieve::cuda
