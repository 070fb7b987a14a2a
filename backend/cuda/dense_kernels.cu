// Dense elementwise and normalisation kernels. All are memory-bound: one pass, 16-byte vector
// accesses where the width allows, fp32 arithmetic. The ones a decode step runs are launched with
// programmatic dependent launch (pdl.cuh) and begin with PdlWait(). RMSNorm and SiLU x mul also
// write quantized activations (the FP8 GEMM's e4m3 input with a scale a row) in the same pass.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdint>

#include "backend/cuda/bf16x8.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/row_rms.cuh"
#include "core/check.h"

namespace sieve::cuda {

namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float BlockSum(float value) {
  __shared__ float warp_sums[32];
  for (int offset = 16; offset > 0; offset >>= 1)
    value += __shfl_xor_sync(0xffffffff, value, offset);
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (lane == 0) warp_sums[warp] = value;
  __syncthreads();
  // Only warp 0 reads the partial sums, and it writes the total after its own reads (racecheck
  // flags any other warp reading warp_sums[0] while it is overwritten).
  if (warp == 0) {
    const int warps = (blockDim.x + 31) / 32;
    value = lane < warps ? warp_sums[lane] : 0.0f;
    for (int offset = 16; offset > 0; offset >>= 1)
      value += __shfl_xor_sync(0xffffffff, value, offset);
    __syncwarp();
    if (lane == 0) warp_sums[0] = value;
  }
  __syncthreads();
  const float total = warp_sums[0];
  __syncthreads();  // warp_sums may be reused by a second call
  return total;
}

// The block's largest value (a max: exact in any order).
__device__ __forceinline__ float BlockMax(float value) {
  __shared__ float warp_maxes[32];
  for (int offset = 16; offset > 0; offset >>= 1)
    value = fmaxf(value, __shfl_xor_sync(0xffffffff, value, offset));
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (lane == 0) warp_maxes[warp] = value;
  __syncthreads();
  const int warps = (blockDim.x + 31) / 32;
  value = warp_maxes[0];
  for (int other = 1; other < warps; ++other) value = fmaxf(value, warp_maxes[other]);
  __syncthreads();  // warp_maxes may be reused by a second call
  return value;
}

// A quantized activation's row (kernels.h's E4m3Rows) from its bf16-rounded values, the float
// operations of core/float8.h's E4m3ScaleForAmax and FloatToE4m3 (cvt.rn.satfinite), as
// fp8_gemm.cu's QuantizeRowsE4m3 does them: the same row gives the same codes and scale.
constexpr float kE4m3Max = 448.0f;
constexpr float kE4m3MinAmax = 1e-12f;

struct E4m3RowScale {
  float scale;    // amax / 448, stored
  float inverse;  // 448 / amax, what each value is multiplied by
};

__device__ __forceinline__ E4m3RowScale E4m3ScaleForAmax(float amax) {
  const float clamped = fmaxf(amax, kE4m3MinAmax);
  return {clamped / kE4m3Max, kE4m3Max / clamped};
}

__device__ __forceinline__ uint8_t ToE4m3(float value, float inverse) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(value * inverse, __NV_SATFINITE, __NV_E4M3));
}

// Eight consecutive codes of a row at `codes` (8-byte aligned when `wide`, else byte stores).
__device__ __forceinline__ void StoreE4m3x8(const float (&values)[8], float inverse, uint8_t* codes,
                                            bool wide) {
  if (wide) {
    uint32_t words[2] = {0, 0};
#pragma unroll
    for (int i = 0; i < 8; ++i)
      words[i / 4] |= static_cast<uint32_t>(ToE4m3(values[i], inverse)) << (8 * (i % 4));
    *reinterpret_cast<uint2*>(codes) = make_uint2(words[0], words[1]);
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) codes[i] = ToE4m3(values[i], inverse);
  }
}

// Row rows[i] of src into row i of dst, one block per row: the embedding lookup and GatherRows.
// kVector: 16-byte copies (every row 16-byte aligned, width % 8 == 0); a 4096-wide row is then two
// independent loads a thread instead of sixteen dependent 2-byte ones.
template <bool kVector>
__global__ void CopyRowsKernel(const bf16* __restrict__ src, int64_t src_stride,
                               const int32_t* __restrict__ rows, int width, bf16* __restrict__ dst,
                               int64_t dst_stride) {
  PdlWait();
  PdlLaunchDependents();
  const bf16* from = src + static_cast<int64_t>(rows[blockIdx.x]) * src_stride;
  bf16* to = dst + static_cast<int64_t>(blockIdx.x) * dst_stride;
  if constexpr (kVector) {
    const auto* from_vectors = reinterpret_cast<const uint4*>(from);
    auto* to_vectors = reinterpret_cast<uint4*>(to);
    for (int index = threadIdx.x; index < width / 8; index += blockDim.x) {
      to_vectors[index] = from_vectors[index];
    }
  } else {
    for (int index = threadIdx.x; index < width; index += blockDim.x) to[index] = from[index];
  }
}

// One block per row.
__global__ void RmsNormKernel(const bf16* __restrict__ x, int64_t x_stride,
                              const bf16* __restrict__ weight, float eps, int width,
                              bf16* __restrict__ out, int64_t out_stride) {
  extern __shared__ float row_values[];  // [width] fp32: the row read once
  PdlWait();
  PdlLaunchDependents();
  const int row = blockIdx.x;
  const bf16* in = x + static_cast<int64_t>(row) * x_stride;
  float sum_squares = 0.0f;
  for (int index = threadIdx.x; index < width; index += blockDim.x) {
    const float value = __bfloat162float(in[index]);
    row_values[index] = value;
    sum_squares += value * value;
  }
  const float inv_rms = rsqrtf(BlockSum(sum_squares) / static_cast<float>(width) + eps);
  bf16* dst = out + static_cast<int64_t>(row) * out_stride;
  for (int index = threadIdx.x; index < width; index += blockDim.x) {
    dst[index] = __float2bfloat16(row_values[index] * inv_rms * __bfloat162float(weight[index]));
  }
}

// RmsNormVectorKernel's row (and RmsNormE4m3VectorKernel's): thread t's 16-byte vectors t,
// t + kThreads, ... of the row, x * inv_rms * weight in f32 (`values[v]` of vector index
// threadIdx.x + v * kThreads, where that is below width / 8).
template <int kVectors>
__device__ __forceinline__ void NormedRowVectors(const bf16* __restrict__ x, int64_t x_stride,
                                                 const bf16* __restrict__ weight, float eps,
                                                 int width, float (&values)[kVectors][8]) {
  const int row = blockIdx.x;
  const int vectors = width / 8;
  // The norm's weight depends on no kernel: its loads leave before PdlWait, off the critical path.
  const auto* w = reinterpret_cast<const uint4*>(weight);
  uint4 scale_bits[kVectors];
#pragma unroll
  for (int v = 0; v < kVectors; ++v) {
    const int index = static_cast<int>(threadIdx.x) + v * kThreads;
    if (index < vectors) scale_bits[v] = w[index];
  }
  PdlWait();
  PdlLaunchDependents();
  const auto* in = reinterpret_cast<const uint4*>(x + static_cast<int64_t>(row) * x_stride);
  float sum_squares = 0.0f;
#pragma unroll
  for (int v = 0; v < kVectors; ++v) {
    const int index = static_cast<int>(threadIdx.x) + v * kThreads;
    if (index >= vectors) continue;
    Unpack8(in[index], values[v]);
#pragma unroll
    for (int i = 0; i < 8; ++i) sum_squares += values[v][i] * values[v][i];
  }
  const float inv_rms = rsqrtf(BlockSum(sum_squares) / static_cast<float>(width) + eps);
#pragma unroll
  for (int v = 0; v < kVectors; ++v) {
    const int index = static_cast<int>(threadIdx.x) + v * kThreads;
    if (index >= vectors) continue;
    float scale[8];
    Unpack8(scale_bits[v], scale);
#pragma unroll
    for (int i = 0; i < 8; ++i) values[v][i] = values[v][i] * inv_rms * scale[i];
  }
}

// RmsNormKernel for rows of whole 16-byte vectors (width % 8 == 0, aligned rows, width <=
// 8 * kThreads * kVectors): the row stays in registers, every access is 16 bytes wide. Same
// arithmetic as RmsNormKernel, so both give identical results.
template <int kVectors>
__global__ void __launch_bounds__(kThreads)
    RmsNormVectorKernel(const bf16* __restrict__ x, int64_t x_stride,
                        const bf16* __restrict__ weight, float eps, int width,
                        bf16* __restrict__ out, int64_t out_stride) {
  float values[kVectors][8];
  NormedRowVectors<kVectors>(x, x_stride, weight, eps, width, values);
  auto* dst = reinterpret_cast<uint4*>(out + static_cast<int64_t>(blockIdx.x) * out_stride);
#pragma unroll
  for (int v = 0; v < kVectors; ++v) {
    const int index = static_cast<int>(threadIdx.x) + v * kThreads;
    if (index < width / 8) dst[index] = Pack8(values[v]);
  }
}

// RmsNormKernel into a quantized activation: each value as RmsNormKernel stores it (rounded to
// bf16, kept in `row_values`), the row's amax, then the codes.
__global__ void RmsNormE4m3Kernel(const bf16* __restrict__ x, int64_t x_stride,
                                  const bf16* __restrict__ weight, float eps, int width,
                                  E4m3Rows out) {
  extern __shared__ float row_values[];  // [width] fp32: the row, then its normed bf16 values
  PdlWait();
  PdlLaunchDependents();
  const int row = blockIdx.x;
  const bf16* in = x + static_cast<int64_t>(row) * x_stride;
  float sum_squares = 0.0f;
  for (int index = threadIdx.x; index < width; index += blockDim.x) {
    const float value = __bfloat162float(in[index]);
    row_values[index] = value;
    sum_squares += value * value;
  }
  const float inv_rms = rsqrtf(BlockSum(sum_squares) / static_cast<float>(width) + eps);
  float amax = 0.0f;
  for (int index = threadIdx.x; index < width; index += blockDim.x) {
    const float value = __bfloat162float(
        __float2bfloat16(row_values[index] * inv_rms * __bfloat162float(weight[index])));
    row_values[index] = value;
    amax = fmaxf(amax, fabsf(value));
  }
  const E4m3RowScale scale = E4m3ScaleForAmax(BlockMax(amax));
  if (threadIdx.x == 0) out.scales[row] = scale.scale;
  uint8_t* codes = out.codes + static_cast<int64_t>(row) * out.ldc;
  for (int index = threadIdx.x; index < width; index += blockDim.x) {
    codes[index] = ToE4m3(row_values[index], scale.inverse);
  }
}

// RmsNormVectorKernel into a quantized activation (its conditions on x and the weight; `wide`:
// 8-byte code stores): each value as RmsNormVectorKernel stores it, then the codes.
template <int kVectors>
__global__ void __launch_bounds__(kThreads)
    RmsNormE4m3VectorKernel(const bf16* __restrict__ x, int64_t x_stride,
                            const bf16* __restrict__ weight, float eps, int width, E4m3Rows out,
                            bool wide) {
  const int row = blockIdx.x;
  const int vectors = width / 8;
  float values[kVectors][8];
  NormedRowVectors<kVectors>(x, x_stride, weight, eps, width, values);
  float amax = 0.0f;
#pragma unroll
  for (int v = 0; v < kVectors; ++v) {
    const int index = static_cast<int>(threadIdx.x) + v * kThreads;
    if (index >= vectors) continue;
    Unpack8(Pack8(values[v]), values[v]);  // rounded to bf16, as the bf16 kernel stores them
#pragma unroll
    for (int i = 0; i < 8; ++i) amax = fmaxf(amax, fabsf(values[v][i]));
  }
  const E4m3RowScale scale = E4m3ScaleForAmax(BlockMax(amax));
  if (threadIdx.x == 0) out.scales[row] = scale.scale;
  uint8_t* codes = out.codes + static_cast<int64_t>(row) * out.ldc;
#pragma unroll
  for (int v = 0; v < kVectors; ++v) {
    const int index = static_cast<int>(threadIdx.x) + v * kThreads;
    if (index < vectors) StoreE4m3x8(values[v], scale.inverse, codes + 8 * index, wide);
  }
}

// s of this block's row (row_rms.cuh): warp 0 computes it, the block shares it.
__device__ __forceinline__ float BlockRowScale(const RowRmsView& norm, int row) {
  if (norm.rows == nullptr) return 1.0f;
  __shared__ float row_scale;
  if (threadIdx.x < 32) {
    const float value = WarpRowInvRms(norm, row);
    if (threadIdx.x == 0) row_scale = value;
  }
  __syncthreads();
  return row_scale;
}

// silu(s gate) * (s up) in f32: every SiLU kernel here computes it so, so that the bf16 and the
// quantized outputs are of the same values.
__device__ __forceinline__ float SiluProduct(float gate, float up, float s) {
  const float g = gate * s;
  return g / (1.0f + __expf(-g)) * (up * s);
}

// SiluMulKernel over 16-byte vectors (width % 8 == 0, aligned rows).
__global__ void SiluMulVectorKernel(const bf16* __restrict__ gate_up, int64_t in_stride, int width,
                                    bf16* __restrict__ out, int64_t out_stride, RowRmsView norm) {
  PdlWait();
  PdlLaunchDependents();
  const int row = blockIdx.y;
  const float s = BlockRowScale(norm, row);
  const auto* gate =
      reinterpret_cast<const uint4*>(gate_up + static_cast<int64_t>(row) * in_stride);
  const auto* up =
      reinterpret_cast<const uint4*>(gate_up + static_cast<int64_t>(row) * in_stride + width);
  auto* dst = reinterpret_cast<uint4*>(out + static_cast<int64_t>(row) * out_stride);
  const int vectors = width / 8;
  for (int index = blockIdx.x * blockDim.x + threadIdx.x; index < vectors;
       index += gridDim.x * blockDim.x) {
    float g[8], u[8];
    Unpack8(gate[index], g);
    Unpack8(up[index], u);
#pragma unroll
    for (int i = 0; i < 8; ++i) g[i] = SiluProduct(g[i], u[i], s);
    dst[index] = Pack8(g);
  }
}

__global__ void SiluMulKernel(const bf16* __restrict__ gate_up, int64_t in_stride, int width,
                              bf16* __restrict__ out, int64_t out_stride, RowRmsView norm) {
  PdlWait();
  PdlLaunchDependents();
  const int row = blockIdx.y;
  const float s = BlockRowScale(norm, row);
  const bf16* gate = gate_up + static_cast<int64_t>(row) * in_stride;
  const bf16* up = gate + width;
  bf16* dst = out + static_cast<int64_t>(row) * out_stride;
  for (int index = blockIdx.x * blockDim.x + threadIdx.x; index < width;
       index += gridDim.x * blockDim.x) {
    dst[index] = __float2bfloat16(
        SiluProduct(__bfloat162float(gate[index]), __bfloat162float(up[index]), s));
  }
}

// SiLU x mul into a quantized activation, a block of kSiluE4m3Threads a row (the row's amax
// before any code), over 16-byte vectors (width % 8 == 0, aligned rows, width <= 8 *
// kSiluE4m3Threads * kVectors; `wide`: 8-byte code stores): each product rounded to bf16 as
// SiluMulVectorKernel stores it, held packed in registers until the row's scale is known. 512
// threads hold a 14336-wide row at 4 vectors a thread in 64 registers, 2 blocks an SM; at 256
// threads, 8 vectors a thread took 101 registers (ptxas), 2 blocks of 256 an SM.
constexpr int kSiluE4m3Threads = 512;

template <int kVectors>
__global__ void __launch_bounds__(kSiluE4m3Threads, 2)
    SiluMulE4m3VectorKernel(const bf16* __restrict__ gate_up, int64_t in_stride, int width,
                            E4m3Rows out, RowRmsView norm, bool wide) {
  PdlWait();
  PdlLaunchDependents();
  const int row = blockIdx.x;
  const float s = BlockRowScale(norm, row);
  const auto* gate =
      reinterpret_cast<const uint4*>(gate_up + static_cast<int64_t>(row) * in_stride);
  const auto* up =
      reinterpret_cast<const uint4*>(gate_up + static_cast<int64_t>(row) * in_stride + width);
  const int vectors = width / 8;
  uint4 products[kVectors];  // bf16 x 8 each
  float amax = 0.0f;
#pragma unroll
  for (int v = 0; v < kVectors; ++v) {
    const int index = static_cast<int>(threadIdx.x) + v * kSiluE4m3Threads;
    if (index >= vectors) continue;
    float g[8], u[8];
    Unpack8(gate[index], g);
    Unpack8(up[index], u);
#pragma unroll
    for (int i = 0; i < 8; ++i) g[i] = SiluProduct(g[i], u[i], s);
    products[v] = Pack8(g);
    Unpack8(products[v], g);
#pragma unroll
    for (int i = 0; i < 8; ++i) amax = fmaxf(amax, fabsf(g[i]));
  }
  const E4m3RowScale scale = E4m3ScaleForAmax(BlockMax(amax));
  if (threadIdx.x == 0) out.scales[row] = scale.scale;
  uint8_t* codes = out.codes + static_cast<int64_t>(row) * out.ldc;
#pragma unroll
  for (int v = 0; v < kVectors; ++v) {
    const int index = static_cast<int>(threadIdx.x) + v * kSiluE4m3Threads;
    if (index >= vectors) continue;
    float values[8];
    Unpack8(products[v], values);
    StoreE4m3x8(values, scale.inverse, codes + 8 * index, wide);
  }
}

// SiluMulE4m3VectorKernel for any width and alignment: the row's products computed twice, once
// for its amax and once for its codes (the same operations give the same values).
__global__ void SiluMulE4m3Kernel(const bf16* __restrict__ gate_up, int64_t in_stride, int width,
                                  E4m3Rows out, RowRmsView norm) {
  PdlWait();
  PdlLaunchDependents();
  const int row = blockIdx.x;
  const float s = BlockRowScale(norm, row);
  const bf16* gate = gate_up + static_cast<int64_t>(row) * in_stride;
  const bf16* up = gate + width;
  const auto product = [&](int index) {
    return __bfloat162float(__float2bfloat16(
        SiluProduct(__bfloat162float(gate[index]), __bfloat162float(up[index]), s)));
  };
  float amax = 0.0f;
  for (int index = threadIdx.x; index < width; index += blockDim.x) {
    amax = fmaxf(amax, fabsf(product(index)));
  }
  const E4m3RowScale scale = E4m3ScaleForAmax(BlockMax(amax));
  if (threadIdx.x == 0) out.scales[row] = scale.scale;
  uint8_t* codes = out.codes + static_cast<int64_t>(row) * out.ldc;
  for (int index = threadIdx.x; index < width; index += blockDim.x) {
    codes[index] = ToE4m3(product(index), scale.inverse);
  }
}

// w[n][k] *= scale[k]; grid-stride over the n x k elements.
__global__ void ScaleColumnsKernel(bf16* __restrict__ w, int64_t w_stride, int rows, int cols,
                                   const bf16* __restrict__ scale) {
  const int64_t count = static_cast<int64_t>(rows) * cols;
  for (int64_t index = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; index < count;
       index += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = index / cols;
    const int col = static_cast<int>(index % cols);
    bf16& value = w[row * w_stride + col];
    value = __float2bfloat16(__bfloat162float(value) * __bfloat162float(scale[col]));
  }
}

__global__ void ScatterInt32Kernel(const int32_t* __restrict__ patches, int count,
                                   int32_t* __restrict__ dst) {
  const int index = blockIdx.x * blockDim.x + threadIdx.x;
  if (index < count) dst[patches[2 * index]] = patches[2 * index + 1];
}

__global__ void GatherInt32Kernel(const int32_t* __restrict__ src,
                                  const int32_t* __restrict__ pairs, int count,
                                  int32_t* __restrict__ dst) {
  const int index = blockIdx.x * blockDim.x + threadIdx.x;
  if (index < count) dst[pairs[2 * index]] = src[pairs[2 * index + 1]];
}

__device__ __forceinline__ uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

__global__ void FillRandomKernel(bf16* __restrict__ out, int64_t count, uint64_t seed,
                                 float stddev) {
  for (int64_t index = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; index < count;
       index += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    // Box-Muller from two 32-bit uniforms of one counter-based draw.
    const uint64_t bits = SplitMix64(seed * 0x100000001b3ull + static_cast<uint64_t>(index));
    const float u1 = (static_cast<float>(bits >> 40) + 1.0f) * (1.0f / 16777217.0f);
    const float u2 = static_cast<float>((bits >> 8) & 0xffffff) * (1.0f / 16777216.0f);
    const float normal = sqrtf(-2.0f * __logf(u1)) * __cosf(6.2831853f * u2);
    out[index] = __float2bfloat16(normal * stddev);
  }
}

__global__ void ConvertKernel(const float* __restrict__ in, int64_t count, bf16* __restrict__ out) {
  for (int64_t index = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; index < count;
       index += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[index] = __float2bfloat16(in[index]);
  }
}

// Reads every 16 bytes once; the xor guard keeps the loads from being optimised away.
__global__ void ReadThroughKernel(const uint4* __restrict__ data, int64_t count, uint32_t* sink) {
  uint32_t mix = 0;
  for (int64_t index = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; index < count;
       index += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint4 value = __ldcg(data + index);
    mix ^= value.x ^ value.y ^ value.z ^ value.w;
  }
  if (mix == 0x9e3779b9u) *sink = mix;
}

int GridFor(int64_t count) {
  return static_cast<int>(std::min<int64_t>((count + kThreads - 1) / kThreads, 65535 * 4));
}

}  // namespace

namespace {

void LaunchCopyRows(const bf16* src, int64_t src_stride, const int32_t* rows, int count, int width,
                    bf16* dst, int64_t dst_stride, cudaStream_t stream) {
  if (count == 0) return;
  const bool vector = width % 8 == 0 && src_stride % 8 == 0 && dst_stride % 8 == 0 &&
                      Aligned16(src) && Aligned16(dst);
  LaunchWithPdl(vector ? CopyRowsKernel<true> : CopyRowsKernel<false>, count, kThreads, 0, stream,
                src, src_stride, rows, width, dst, dst_stride);
}

}  // namespace

void RmsNorm(const bf16* x, int64_t x_stride, const bf16* weight, float eps, int rows, int width,
             bf16* out, int64_t out_stride, cudaStream_t stream) {
  if (rows == 0) return;
  const bool vector = width % 8 == 0 && x_stride % 8 == 0 && out_stride % 8 == 0 && Aligned16(x) &&
                      Aligned16(weight) && Aligned16(out);
  const int vectors_per_thread = (width / 8 + kThreads - 1) / kThreads;
  if (vector && vectors_per_thread <= 4) {
    const auto kernel = vectors_per_thread <= 1   ? RmsNormVectorKernel<1>
                        : vectors_per_thread <= 2 ? RmsNormVectorKernel<2>
                                                  : RmsNormVectorKernel<4>;
    LaunchWithPdl(kernel, rows, kThreads, 0, stream, x, x_stride, weight, eps, width, out,
                  out_stride);
  } else {
    LaunchWithPdl(RmsNormKernel, rows, kThreads, width * sizeof(float), stream, x, x_stride, weight,
                  eps, width, out, out_stride);
  }
}

void SiluMul(const bf16* gate_up, int64_t in_stride, int rows, int width, bf16* out,
             int64_t out_stride, const RowRmsView& norm, cudaStream_t stream) {
  if (rows == 0) return;
  SIEVE_CHECK(norm.rows == nullptr ||
              (norm.width % 8 == 0 && norm.stride % 8 == 0 && Aligned16(norm.rows)))
      << "a folded RMSNorm's rows must be 16-byte aligned, width and stride multiples of 8";
  if (width % 8 == 0 && in_stride % 8 == 0 && out_stride % 8 == 0 && Aligned16(gate_up) &&
      Aligned16(out)) {
    // With a folded RMSNorm every block first reads its row of the residual stream for the row's
    // scale: long prefills keep one block per row (as RopeAndCacheWrite), so that the row is
    // read once, not by each of the width / 2048 blocks a decode-size step spreads a row over.
    const int blocks_per_row =
        norm.rows != nullptr && rows > 256 ? 1 : (width / 8 + kThreads - 1) / kThreads;
    const dim3 grid(blocks_per_row, rows);
    LaunchWithPdl(SiluMulVectorKernel, grid, kThreads, 0, stream, gate_up, in_stride, width, out,
                  out_stride, norm);
    return;
  }
  const dim3 grid((width + kThreads - 1) / kThreads, rows);
  LaunchWithPdl(SiluMulKernel, grid, kThreads, 0, stream, gate_up, in_stride, width, out,
                out_stride, norm);
}

void RmsNormE4m3(const bf16* x, int64_t x_stride, const bf16* weight, float eps, int rows,
                 int width, const E4m3Rows& out, cudaStream_t stream) {
  if (rows == 0) return;
  // The bf16 RmsNorm's choice of kernel (its sum of squares in that kernel's order), with the
  // output's conditions left out: a bf16 output of the same rows would be aligned.
  const bool vector = width % 8 == 0 && x_stride % 8 == 0 && Aligned16(x) && Aligned16(weight);
  const int vectors_per_thread = (width / 8 + kThreads - 1) / kThreads;
  if (vector && vectors_per_thread <= 4) {
    const bool wide = out.ldc % 8 == 0 && reinterpret_cast<uintptr_t>(out.codes) % 8 == 0;
    const auto kernel = vectors_per_thread <= 1   ? RmsNormE4m3VectorKernel<1>
                        : vectors_per_thread <= 2 ? RmsNormE4m3VectorKernel<2>
                                                  : RmsNormE4m3VectorKernel<4>;
    LaunchWithPdl(kernel, rows, kThreads, 0, stream, x, x_stride, weight, eps, width, out, wide);
  } else {
    LaunchWithPdl(RmsNormE4m3Kernel, rows, kThreads, width * sizeof(float), stream, x, x_stride,
                  weight, eps, width, out);
  }
}

void SiluMulE4m3(const bf16* gate_up, int64_t in_stride, int rows, int width, const E4m3Rows& out,
                 const RowRmsView& norm, cudaStream_t stream) {
  if (rows == 0) return;
  SIEVE_CHECK(norm.rows == nullptr ||
              (norm.width % 8 == 0 && norm.stride % 8 == 0 && Aligned16(norm.rows)))
      << "a folded RMSNorm's rows must be 16-byte aligned, width and stride multiples of 8";
  // A block a row: its amax is needed before its first code. At decode sizes that is fewer
  // blocks than the bf16 kernel spreads the rows over, each with all its loads in flight at once;
  // rows over 16384 wide (kSiluE4m3Threads x 4 vectors) take the kernel that computes twice.
  const int vectors_per_thread = (width / 8 + kSiluE4m3Threads - 1) / kSiluE4m3Threads;
  if (width % 8 == 0 && in_stride % 8 == 0 && Aligned16(gate_up) && vectors_per_thread <= 4) {
    const bool wide = out.ldc % 8 == 0 && reinterpret_cast<uintptr_t>(out.codes) % 8 == 0;
    const auto kernel = vectors_per_thread <= 1   ? SiluMulE4m3VectorKernel<1>
                        : vectors_per_thread <= 2 ? SiluMulE4m3VectorKernel<2>
                                                  : SiluMulE4m3VectorKernel<4>;
    LaunchWithPdl(kernel, rows, kSiluE4m3Threads, 0, stream, gate_up, in_stride, width, out, norm,
                  wide);
    return;
  }
  LaunchWithPdl(SiluMulE4m3Kernel, rows, kSiluE4m3Threads, 0, stream, gate_up, in_stride, width,
                out, norm);
}

void ScaleColumns(bf16* w, int64_t w_stride, int rows, int cols, const bf16* scale,
                  cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  ScaleColumnsKernel<<<GridFor(static_cast<int64_t>(rows) * cols), kThreads, 0, stream>>>(
      w, w_stride, rows, cols, scale);
  SIEVE_CUDA_CHECK_LAUNCH();
}

void Embedding(const bf16* table, int64_t table_stride, const int32_t* ids, int rows, int width,
               bf16* out, int64_t out_stride, cudaStream_t stream) {
  LaunchCopyRows(table, table_stride, ids, rows, width, out, out_stride, stream);
}

void GatherRows(const bf16* x, int64_t x_stride, const int32_t* rows, int count, int width,
                bf16* out, int64_t out_stride, cudaStream_t stream) {
  LaunchCopyRows(x, x_stride, rows, count, width, out, out_stride, stream);
}

void ScatterInt32(const int32_t* patches, int count, int32_t* dst, cudaStream_t stream) {
  if (count == 0) return;
  ScatterInt32Kernel<<<(count + kThreads - 1) / kThreads, kThreads, 0, stream>>>(patches, count,
                                                                                 dst);
  SIEVE_CUDA_CHECK_LAUNCH();
}

void GatherInt32(const int32_t* src, const int32_t* pairs, int count, int32_t* dst,
                 cudaStream_t stream) {
  if (count == 0) return;
  GatherInt32Kernel<<<(count + kThreads - 1) / kThreads, kThreads, 0, stream>>>(src, pairs, count,
                                                                                dst);
  SIEVE_CUDA_CHECK_LAUNCH();
}

void FillRandomBf16(bf16* out, int64_t count, uint64_t seed, float stddev, cudaStream_t stream) {
  if (count == 0) return;
  FillRandomKernel<<<GridFor(count), kThreads, 0, stream>>>(out, count, seed, stddev);
  SIEVE_CUDA_CHECK_LAUNCH();
}

void ReadThrough(const void* buffer, size_t bytes, cudaStream_t stream, uint32_t* sink) {
  const int64_t count = static_cast<int64_t>(bytes / sizeof(uint4));
  if (count == 0) return;
  auto* data = static_cast<const uint4*>(buffer);
  ReadThroughKernel<<<GridFor(count), kThreads, 0, stream>>>(
      data, count, sink != nullptr ? sink : static_cast<uint32_t*>(const_cast<void*>(buffer)));
  SIEVE_CUDA_CHECK_LAUNCH();
}

void ConvertF32ToBf16(const float* in, int64_t count, bf16* out, cudaStream_t stream) {
  if (count == 0) return;
  ConvertKernel<<<GridFor(count), kThreads, 0, stream>>>(in, count, out);
  SIEVE_CUDA_CHECK_LAUNCH();
}

}  // namespace sieve::cuda
