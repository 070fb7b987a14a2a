// The GEMM of decode batches of up to kSkinnyGemmMaxRows rows: out[m][n] (+)= x[m][k] . w[n][k]^T,
// bf16 in, f32 accumulation, bf16 or f32 out. Every weight is read once from memory, so the kernel
// only has to stream the weights at the copy rate; it starts its first weight loads before it waits
// on the kernel before it (PDL, pdl.cuh), and lets the kernel after it start early. GemmRunner
// (gemm.h) times it beside cuBLASLt's candidates and keeps it where it is fastest
// (README_gemm.md). The CPU twin is CpuBackend::Linear.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "backend/cuda/row_rms.cuh"

namespace sieve::cuda {

inline constexpr int64_t kSkinnyGemmMaxRows = 32;

// Whether SkinnyGemm takes these operands: 1 <= m <= kSkinnyGemmMaxRows, k a multiple of 8, and
// w and x (pointers and row strides) on 16-byte boundaries.
bool SkinnyGemmSupports(int64_t m, int64_t k, const __nv_bfloat16* w, int64_t ldw,
                        const __nv_bfloat16* x, int64_t ldx);

// The k splits SkinnyGemm takes for this k: 1, and 2 and 4 where every warp still gets k.
std::vector<int> SkinnyGemmSplits(int64_t k);

// What a skinny GEMM may do besides out (+)= x w^T: the two halves of a layer's MLP at one row
// without the SiLU kernel between them (CudaBackend::Mlp).
struct SkinnyGemmExtras {
  // Gated input (up to kSkinnyGemmMaxGatedRows rows): x holds rows of gate then up, `up_offset`
  // elements apart (a multiple of 8), and the GEMM's input is SiluMul8(gate, up, x_scale[row])
  // (bf16x8.cuh) over k = the gate's width: the bits the SiLU kernel would have written.
  const float* x_scale = nullptr;  // [m] f32; null: x is the input as it is
  int64_t up_offset = 0;
  // Row scales out: the first CTA writes scale_out[row] = WarpRowInvRms(scale_norm, row) for
  // every row (row_rms.cuh), after the kernel before it has finished: the gate_up GEMM gives the
  // down GEMM the scale of the residual stream it reads, which the down GEMM cannot read itself
  // while its own CTAs add into it.
  RowRmsView scale_norm{};
  float* scale_out = nullptr;  // [m] f32; null: none
};
inline constexpr int64_t kSkinnyGemmMaxGatedRows = 8;

// out[m][n] = x . w^T, or out += x . w^T with `accumulate` (the residual stream). Row strides in
// elements; `out` is f32 with `out_f32`, else bf16. `splits`: CTAs (a cluster) sharing each 16
// columns, one of SkinnyGemmSplits(k). Call only where SkinnyGemmSupports (and, with a gated
// input, m <= kSkinnyGemmMaxGatedRows and up_offset a multiple of 8).
void SkinnyGemm(int64_t m, int64_t n, int64_t k, const __nv_bfloat16* w, int64_t ldw,
                const __nv_bfloat16* x, int64_t ldx, void* out, int64_t ldo, bool out_f32,
                bool accumulate, int splits, cudaStream_t stream,
                const SkinnyGemmExtras& extras = {});

}  // namespace sieve::cuda
