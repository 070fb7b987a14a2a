// Dense elementwise and normalisation kernels. All are memory-bound: one pass, 16-byte vector
// accesses where the width allows, fp32 arithmetic.
#include <cuda_bf16.h>

#include <cstdint>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"

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

__global__ void EmbeddingKernel(const bf16* __restrict__ table, int64_t table_stride,
                                const int32_t* __restrict__ ids, int width, bf16* __restrict__ out,
                                int64_t out_stride) {
  const int row = blockIdx.x;
  const bf16* src = table + static_cast<int64_t>(ids[row]) * table_stride;
  bf16* dst = out + static_cast<int64_t>(row) * out_stride;
  for (int index = threadIdx.x; index < width; index += blockDim.x) dst[index] = src[index];
}

// One block per row. `residual` null: plain RmsNorm of x.
__global__ void RmsNormKernel(bf16* __restrict__ residual, int64_t residual_stride,
                              const bf16* __restrict__ x, int64_t x_stride,
                              const bf16* __restrict__ weight, float eps, int width,
                              bf16* __restrict__ out, int64_t out_stride) {
  extern __shared__ float row_values[];  // [width] fp32: the row read once
  const int row = blockIdx.x;
  const bf16* in = x + static_cast<int64_t>(row) * x_stride;
  bf16* res = residual ? residual + static_cast<int64_t>(row) * residual_stride : nullptr;
  float sum_squares = 0.0f;
  for (int index = threadIdx.x; index < width; index += blockDim.x) {
    float value = __bfloat162float(in[index]);
    if (res) {
      value += __bfloat162float(res[index]);
      const bf16 rounded = __float2bfloat16(value);
      res[index] = rounded;
      value = __bfloat162float(rounded);  // normalise what the residual stream now holds
    }
    row_values[index] = value;
    sum_squares += value * value;
  }
  const float inv_rms = rsqrtf(BlockSum(sum_squares) / static_cast<float>(width) + eps);
  bf16* dst = out + static_cast<int64_t>(row) * out_stride;
  for (int index = threadIdx.x; index < width; index += blockDim.x) {
    dst[index] = __float2bfloat16(row_values[index] * inv_rms * __bfloat162float(weight[index]));
  }
}

__global__ void SiluMulKernel(const bf16* __restrict__ gate_up, int64_t in_stride, int width,
                              bf16* __restrict__ out, int64_t out_stride) {
  const int row = blockIdx.y;
  const bf16* gate = gate_up + static_cast<int64_t>(row) * in_stride;
  const bf16* up = gate + width;
  bf16* dst = out + static_cast<int64_t>(row) * out_stride;
  for (int index = blockIdx.x * blockDim.x + threadIdx.x; index < width;
       index += gridDim.x * blockDim.x) {
    const float g = __bfloat162float(gate[index]);
    dst[index] = __float2bfloat16(g / (1.0f + __expf(-g)) * __bfloat162float(up[index]));
  }
}

__global__ void GatherRowsKernel(const bf16* __restrict__ x, int64_t x_stride,
                                 const int32_t* __restrict__ rows, int width,
                                 bf16* __restrict__ out, int64_t out_stride) {
  const bf16* src = x + static_cast<int64_t>(rows[blockIdx.x]) * x_stride;
  bf16* dst = out + static_cast<int64_t>(blockIdx.x) * out_stride;
  for (int index = threadIdx.x; index < width; index += blockDim.x) dst[index] = src[index];
}

__global__ void ScatterInt32Kernel(const int32_t* __restrict__ patches, int count,
                                   int32_t* __restrict__ dst) {
  const int index = blockIdx.x * blockDim.x + threadIdx.x;
  if (index < count) dst[patches[2 * index]] = patches[2 * index + 1];
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

int GridFor(int64_t count) {
  return static_cast<int>(std::min<int64_t>((count + kThreads - 1) / kThreads, 65535 * 4));
}

}  // namespace

void Embedding(const bf16* table, int64_t table_stride, const int32_t* ids, int rows, int width,
               bf16* out, int64_t out_stride, cudaStream_t stream) {
  if (rows == 0) return;
  EmbeddingKernel<<<rows, kThreads, 0, stream>>>(table, table_stride, ids, width, out, out_stride);
  SIEVE_CUDA_CHECK_LAUNCH();
}

void RmsNorm(const bf16* x, int64_t x_stride, const bf16* weight, float eps, int rows, int width,
             bf16* out, int64_t out_stride, cudaStream_t stream) {
  if (rows == 0) return;
  RmsNormKernel<<<rows, kThreads, width * sizeof(float), stream>>>(nullptr, 0, x, x_stride, weight,
                                                                   eps, width, out, out_stride);
  SIEVE_CUDA_CHECK_LAUNCH();
}

void AddRmsNorm(bf16* residual, int64_t residual_stride, const bf16* x, int64_t x_stride,
                const bf16* weight, float eps, int rows, int width, bf16* out, int64_t out_stride,
                cudaStream_t stream) {
  if (rows == 0) return;
  RmsNormKernel<<<rows, kThreads, width * sizeof(float), stream>>>(
      residual, residual_stride, x, x_stride, weight, eps, width, out, out_stride);
  SIEVE_CUDA_CHECK_LAUNCH();
}

void SiluMul(const bf16* gate_up, int64_t in_stride, int rows, int width, bf16* out,
             int64_t out_stride, cudaStream_t stream) {
  if (rows == 0) return;
  const dim3 grid((width + kThreads - 1) / kThreads, rows);
  SiluMulKernel<<<grid, kThreads, 0, stream>>>(gate_up, in_stride, width, out, out_stride);
  SIEVE_CUDA_CHECK_LAUNCH();
}

void GatherRows(const bf16* x, int64_t x_stride, const int32_t* rows, int count, int width,
                bf16* out, int64_t out_stride, cudaStream_t stream) {
  if (count == 0) return;
  GatherRowsKernel<<<count, kThreads, 0, stream>>>(x, x_stride, rows, width, out, out_stride);
  SIEVE_CUDA_CHECK_LAUNCH();
}

void ScatterInt32(const int32_t* patches, int count, int32_t* dst, cudaStream_t stream) {
  if (count == 0) return;
  ScatterInt32Kernel<<<(count + kThreads - 1) / kThreads, kThreads, 0, stream>>>(patches, count,
                                                                                 dst);
  SIEVE_CUDA_CHECK_LAUNCH();
}

void FillRandomBf16(bf16* out, int64_t count, uint64_t seed, float stddev, cudaStream_t stream) {
  if (count == 0) return;
  FillRandomKernel<<<GridFor(count), kThreads, 0, stream>>>(out, count, seed, stddev);
  SIEVE_CUDA_CHECK_LAUNCH();
}

void ConvertF32ToBf16(const float* in, int64_t count, bf16* out, cudaStream_t stream) {
  if (count == 0) return;
  ConvertKernel<<<GridFor(count), kThreads, 0, stream>>>(in, count, out);
  SIEVE_CUDA_CHECK_LAUNCH();
}

}  // namespace sieve::cuda
