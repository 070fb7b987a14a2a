#include "backend/cuda/fp8_gemm.h"

#include <cuda_fp8.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/skinny_gemm.h"
#include "core/check.h"

namespace sieve::cuda {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kQuantizeThreads = 256;
constexpr size_t kWorkspaceBytes = 32u << 20;
// core/float8.h's kE4m3Max and kE4m3MinAmax.
constexpr float kE4m3Max = 448.0f;
constexpr float kE4m3MinAmax = 1e-12f;

// One CTA a row: the row's largest magnitude (a max: exact in any order), then each element
// times 448 / amax rounded to e4m3 (round to nearest even, saturating: the CPU's FloatToE4m3).
__global__ void __launch_bounds__(kQuantizeThreads)
    QuantizeRowsE4m3Kernel(const bf16* __restrict__ x, int64_t ldx, int64_t cols,
                           uint8_t* __restrict__ codes, int64_t ldc, float* __restrict__ scales) {
  __shared__ float warp_max[kQuantizeThreads / 32];
  PdlWait();
  PdlLaunchDependents();
  const int64_t row = blockIdx.x;
  const bf16* in = x + row * ldx;
  float amax = 0.0f;
  for (int64_t col = threadIdx.x; col < cols; col += kQuantizeThreads) {
    amax = fmaxf(amax, fabsf(__bfloat162float(in[col])));
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
  }
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = amax;
  __syncthreads();
  amax = warp_max[0];
  for (int warp = 1; warp < kQuantizeThreads / 32; ++warp) amax = fmaxf(amax, warp_max[warp]);
  const float clamped = fmaxf(amax, kE4m3MinAmax);
  const float inverse = kE4m3Max / clamped;
  if (threadIdx.x == 0) scales[row] = clamped / kE4m3Max;
  uint8_t* out = codes + row * ldc;
  for (int64_t col = threadIdx.x; col < cols; col += kQuantizeThreads) {
    out[col] = static_cast<uint8_t>(
        __nv_cvt_float_to_fp8(__bfloat162float(in[col]) * inverse, __NV_SATFINITE, __NV_E4M3));
  }
}

// out[r][c] (+)= product[r][c] * x_scales[r] * w_scales[c] (the CPU twin's order of the two
// multiplications), bf16 or f32.    product [rows][cols] f32.
template <bool kOutF32, bool kAccumulate>
__global__ void __launch_bounds__(256)
    ScaleProductKernel(const float* __restrict__ product, int64_t rows, int64_t cols,
                       const float* __restrict__ x_scales, const float* __restrict__ w_scales,
                       void* __restrict__ out, int64_t ldo) {
  PdlWait();
  PdlLaunchDependents();
  const int64_t total = rows * cols;
  for (int64_t index = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; index < total;
       index += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = index / cols;
    const int64_t col = index % cols;
    const float value = product[index] * x_scales[row] * w_scales[col];
    if constexpr (kOutF32) {
      float* target = static_cast<float*>(out) + row * ldo + col;
      *target = kAccumulate ? *target + value : value;
    } else {
      bf16* target = static_cast<bf16*>(out) + row * ldo + col;
      *target = __float2bfloat16_rn(kAccumulate ? __bfloat162float(*target) + value : value);
    }
  }
}

}  // namespace

void QuantizeRowsE4m3(const bf16* x, int64_t ldx, int64_t rows, int64_t cols, uint8_t* codes,
                      int64_t ldc, float* scales, cudaStream_t stream) {
  if (rows == 0) return;
  SIEVE_CHECK(rows < (int64_t{1} << 31) && cols >= 1) << "quantize " << rows << " x " << cols;
  LaunchWithPdl(QuantizeRowsE4m3Kernel, dim3(static_cast<unsigned>(rows)), dim3(kQuantizeThreads),
                0, stream, x, ldx, cols, codes, ldc, scales);
  SIEVE_CUDA_CHECK_LAUNCH();
}

Fp8GemmRunner::Fp8GemmRunner(cudaStream_t stream) : stream_(stream) {
  SIEVE_CUBLAS_CHECK(cublasLtCreate(&lt_));
  SIEVE_CUDA_CHECK(cudaMalloc(&workspace_, kWorkspaceBytes));
}

Fp8GemmRunner::~Fp8GemmRunner() {
  for (auto& [key, plan] : plans_) {
    cublasLtMatrixLayoutDestroy(plan.a);
    cublasLtMatrixLayoutDestroy(plan.b);
    cublasLtMatrixLayoutDestroy(plan.c);
    cublasLtMatmulDescDestroy(plan.op);
  }
  cudaFree(workspace_);
  cudaFree(product_);
  cublasLtDestroy(lt_);
}

void Fp8GemmRunner::Reserve(int64_t m, int64_t n) {
  const size_t bytes = static_cast<size_t>(m * n) * sizeof(float);
  if (bytes <= product_bytes_) return;
  SIEVE_CUDA_CHECK(cudaStreamSynchronize(stream_));
  cudaFree(product_);
  SIEVE_CUDA_CHECK(cudaMalloc(&product_, bytes));
  product_bytes_ = bytes;
}

bool Fp8GemmRunner::DeviceSupportsFp8() {
  const int major = CurrentDeviceAttribute<cudaDevAttrComputeCapabilityMajor>();
  const int minor = CurrentDeviceAttribute<cudaDevAttrComputeCapabilityMinor>();
  return major > 8 || (major == 8 && minor >= 9);
}

Fp8GemmRunner::Plan& Fp8GemmRunner::PlanFor(int64_t m, int64_t n, int64_t k, int64_t ldw,
                                            int64_t ldx, int64_t ldo, bool out_f32,
                                            bool accumulate) {
  const Key key{m, n, k, ldw, ldx, ldo, out_f32, accumulate};
  auto found = plans_.find(key);
  if (found != plans_.end()) return found->second;
  Plan& plan = plans_[key];
  // The "TN" layout (gemm.h): A = w' (its scale vector has n entries), B = x' (m).
  plan.op = MakeWeightTransposedDesc();
  const cublasLtMatmulMatrixScale_t outer = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
  SIEVE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE,
                                                    &outer, sizeof(outer)));
  SIEVE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE,
                                                    &outer, sizeof(outer)));
  const cudaDataType_t out_type = out_f32 ? CUDA_R_32F : CUDA_R_16BF;
  SIEVE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.a, CUDA_R_8F_E4M3, k, n, ldw));
  SIEVE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.b, CUDA_R_8F_E4M3, k, m, ldx));
  SIEVE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.c, out_type, n, m, ldo));
  const auto heuristic = [&] {
    cublasLtMatmulPreference_t preference;
    SIEVE_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference));
    const size_t workspace = kWorkspaceBytes;
    SIEVE_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof(workspace)));
    cublasLtMatmulHeuristicResult_t result{};
    int count = 0;
    const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(
        lt_, plan.op, plan.a, plan.b, plan.c, plan.c, preference, 1, &result, &count);
    cublasLtMatmulPreferenceDestroy(preference);
    plan.has_cublas = status == CUBLAS_STATUS_SUCCESS && count > 0;
    plan.algo = result.algo;
  };
  heuristic();
  if (!plan.has_cublas) {
    // No per-row x per-column scales here: the unscaled product into f32 [m][n], rescaled after.
    cublasLtMatmulDescDestroy(plan.op);
    cublasLtMatrixLayoutDestroy(plan.c);
    plan.op = MakeWeightTransposedDesc();
    SIEVE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.c, CUDA_R_32F, n, m, n));
    heuristic();
    plan.rescale = plan.has_cublas;
  }
  return plan;
}

void Fp8GemmRunner::Launch(const Plan& plan, int splits, int64_t m, int64_t n, int64_t k,
                           const uint8_t* w, int64_t ldw, const float* w_scales, const uint8_t* x,
                           int64_t ldx, const float* x_scales, void* out, int64_t ldo, bool out_f32,
                           bool accumulate) {
  if (splits > 0) {
    SkinnyGemmE4m3(m, n, k, w, ldw, w_scales, x, ldx, x_scales, out, ldo, out_f32, accumulate,
                   splits, stream_);
    return;
  }
  if (plan.rescale) {
    SIEVE_CHECK(static_cast<size_t>(m * n) * sizeof(float) <= product_bytes_)
        << "the FP8 product scratch holds " << product_bytes_ << " bytes, " << m << " x " << n
        << " needs more: Reserve was not called for it";
    const float alpha = 1.0f;
    const float beta = 0.0f;
    SIEVE_CUBLAS_CHECK(cublasLtMatmul(lt_, plan.op, &alpha, w, plan.a, x, plan.b, &beta, product_,
                                      plan.c, product_, plan.c, &plan.algo, workspace_,
                                      kWorkspaceBytes, stream_));
    NoteNonTriggeringLaunch(stream_);
    const int64_t total = m * n;
    const unsigned blocks =
        static_cast<unsigned>(std::min<int64_t>((total + 255) / 256, int64_t{1} << 16));
    const auto launch = [&](auto kernel) {
      LaunchWithPdl(kernel, dim3(blocks), dim3(256), 0, stream_,
                    static_cast<const float*>(product_), m, n, x_scales, w_scales, out, ldo);
    };
    if (out_f32) {
      accumulate ? launch(ScaleProductKernel<true, true>) : launch(ScaleProductKernel<true, false>);
    } else {
      accumulate ? launch(ScaleProductKernel<false, true>)
                 : launch(ScaleProductKernel<false, false>);
    }
    SIEVE_CUDA_CHECK_LAUNCH();
    return;
  }
  SIEVE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                                    &w_scales, sizeof(w_scales)));
  SIEVE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                                                    &x_scales, sizeof(x_scales)));
  const float alpha = 1.0f;
  const float beta = accumulate ? 1.0f : 0.0f;
  SIEVE_CUBLAS_CHECK(cublasLtMatmul(lt_, plan.op, &alpha, w, plan.a, x, plan.b, &beta, out, plan.c,
                                    out, plan.c, &plan.algo, workspace_, kWorkspaceBytes, stream_));
  NoteNonTriggeringLaunch(stream_);  // pdl.cuh: the kernel after it launches plainly
}

void Fp8GemmRunner::Run(int64_t m, int64_t n, int64_t k, const uint8_t* w, int64_t ldw,
                        const float* w_scales, const uint8_t* x, int64_t ldx, const float* x_scales,
                        void* out, int64_t ldo, bool out_f32, bool accumulate) {
  SIEVE_CHECK(!(out_f32 && accumulate)) << "FP8 GEMMs accumulate into bf16 activations only";
  SIEVE_CHECK(k % 16 == 0 && ldw % 16 == 0 && ldx % 16 == 0 && Aligned16(w) && Aligned16(x))
      << "FP8 GEMM operands: k and row strides multiples of 16, 16-byte aligned (k " << k << ")";
  Plan& plan = PlanFor(m, n, k, ldw, ldx, ldo, out_f32, accumulate);
  if (!plan.settled && plan.rescale &&
      static_cast<size_t>(m * n) * sizeof(float) > product_bytes_) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    SIEVE_CUDA_CHECK(cudaStreamIsCapturing(stream_, &capture));
    if (capture == cudaStreamCaptureStatusNone) Reserve(m, n);
  }
  if (!plan.settled) {
    std::vector<int> candidates;  // k splits of the skinny kernel; 0: cuBLASLt
    if (plan.has_cublas) candidates.push_back(0);
    if (SkinnyGemmE4m3Supports(m, k, w, ldw, x, ldx)) {
      for (const int splits : SkinnyGemmE4m3Splits(k)) candidates.push_back(splits);
    }
    SIEVE_CHECK(!candidates.empty()) << "no FP8 GEMM kernel (cuBLASLt nor the skinny kernel) takes "
                                     << m << " x " << n << " x " << k;
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    SIEVE_CUDA_CHECK(cudaStreamIsCapturing(stream_, &capture));
    int chosen = candidates.front();
    if (candidates.size() > 1 && capture == cudaStreamCaptureStatusNone) {
      // Timed on this call's operands (`out` is rewritten: an accumulating call is replayed
      // from a copy of `out` first and left as one call leaves it).
      const size_t out_bytes = static_cast<size_t>(m) * ldo * (out_f32 ? 4 : 2);
      void* saved = nullptr;
      if (accumulate) {
        SIEVE_CUDA_CHECK(cudaMallocAsync(&saved, out_bytes, stream_));
        SIEVE_CUDA_CHECK(cudaMemcpyAsync(saved, out, out_bytes, cudaMemcpyDeviceToDevice, stream_));
      }
      cudaEvent_t start, stop;
      SIEVE_CUDA_CHECK(cudaEventCreate(&start));
      SIEVE_CUDA_CHECK(cudaEventCreate(&stop));
      float best = 0;
      for (const int candidate : candidates) {
        std::vector<float> times;
        for (int rep = 0; rep < 6; ++rep) {
          SIEVE_CUDA_CHECK(cudaEventRecord(start, stream_));
          Launch(plan, candidate, m, n, k, w, ldw, w_scales, x, ldx, x_scales, out, ldo, out_f32,
                 accumulate);
          SIEVE_CUDA_CHECK(cudaEventRecord(stop, stream_));
          SIEVE_CUDA_CHECK(cudaEventSynchronize(stop));
          float ms = 0;
          SIEVE_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
          if (rep > 0) times.push_back(ms);  // the first warms up
        }
        std::sort(times.begin(), times.end());
        const float median = times[times.size() / 2];
        if (best == 0 || median < best) best = median, chosen = candidate;
      }
      cudaEventDestroy(start);
      cudaEventDestroy(stop);
      if (accumulate) {
        SIEVE_CUDA_CHECK(cudaMemcpyAsync(out, saved, out_bytes, cudaMemcpyDeviceToDevice, stream_));
        SIEVE_CUDA_CHECK(cudaFreeAsync(saved, stream_));
      }
    }
    plan.skinny_splits = chosen;
    plan.settled = true;
    plan.name = std::string(chosen > 0     ? "skinny e4m3, k split " + std::to_string(chosen)
                            : plan.rescale ? "cuBLASLt FP8 + rescale"
                                           : "cuBLASLt FP8") +
                ", " + std::to_string(m) + " x " + std::to_string(n) + " x " + std::to_string(k) +
                (accumulate ? " (+=)" : "");
  }
  Launch(plan, plan.skinny_splits, m, n, k, w, ldw, w_scales, x, ldx, x_scales, out, ldo, out_f32,
         accumulate);
  last_plan_ = plan.name;
}

}  // namespace sieve::cuda
