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

// The k splits SkinnyGemm takes for this k on the current device: 1, and on sm_90 and newer
// (clusters) 2 and 4 where every warp still gets k.
std::vector<int> SkinnyGemmSplits(int64_t k);

// out[m][n] = x . w^T, or out += x . w^T with `accumulate` (the residual stream). Row strides in
// elements; `out` is f32 with `out_f32`, else bf16. `splits`: CTAs (a cluster) sharing each 16
// columns, one of SkinnyGemmSplits(k). Call only where SkinnyGemmSupports.
void SkinnyGemm(int64_t m, int64_t n, int64_t k, const __nv_bfloat16* w, int64_t ldw,
                const __nv_bfloat16* x, int64_t ldx, void* out, int64_t ldo, bool out_f32,
                bool accumulate, int splits, cudaStream_t stream);

// The same kernel over e4m3 operands (fp8_gemm.h): out[m][n] (+)= x_scales[m] w_scales[n] sum_k
// x[m][k] w[n][k], codes row-quantized, f32 accumulation (e4m3 mma, 64 k a load). Takes 1 <= m <=
// kSkinnyGemmMaxRows, k a multiple of 16, 16-byte aligned rows, and device code for sm_89 or newer.
bool SkinnyGemmE4m3Supports(int64_t m, int64_t k, const uint8_t* w, int64_t ldw, const uint8_t* x,
                            int64_t ldx);
std::vector<int> SkinnyGemmE4m3Splits(int64_t k);
void SkinnyGemmE4m3(int64_t m, int64_t n, int64_t k, const uint8_t* w, int64_t ldw,
                    const float* w_scales, const uint8_t* x, int64_t ldx, const float* x_scales,
                    void* out, int64_t ldo, bool out_f32, bool accumulate, int splits,
                    cudaStream_t stream);

// The rows SkinnyGemmSwiGlu takes (one row tile); the backend runs it at one row, where it beat
// the skinny GEMM + SiluMul pair (README_gemm.md, "The gated form").
inline constexpr int64_t kSkinnyGemmSwiGluMaxRows = 8;

// The MLP's gate_up GEMM with SiLU x mul fused: out[m][j] = silu(s bf16(x . w_j)) *
// (s bf16(x . w_{F+j})) for j < F, s of each row from `norm` (1 without rows), w [2F][K] (gate
// rows, then up rows, row stride K). Up to kSkinnyGemmSwiGluMaxRows rows, where
// SkinnyGemmSupports; the norm's rows 16-byte aligned with width and stride multiples of 8.
void SkinnyGemmSwiGlu(int64_t m, int64_t f, int64_t k, const __nv_bfloat16* w,
                      const __nv_bfloat16* x, int64_t ldx, const RowRmsView& norm,
                      __nv_bfloat16* out, int64_t ldo, cudaStream_t stream);

}  // namespace sieve::cuda
