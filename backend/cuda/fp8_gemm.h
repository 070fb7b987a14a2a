// FP8 weights on the GPU (Backend::QuantizeWeightE4m3): the kernel that quantizes bf16 rows to
// e4m3 with one scale a row (weights at load, each GEMM's input as it runs), and the GEMM over
// e4m3 operands with those scales, through cuBLASLt's FP8 kernels (per-row x per-column scales:
// CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F). The CPU twins are core/float8.h's
// QuantizeRowE4m3 and CpuBackend::GemmE4m3.
#pragma once

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <string>
#include <tuple>

namespace sieve::cuda {

// codes[r][c] = e4m3(x[r][c] * 448 / amax_r), scales[r] = amax_r / 448 (E4m3ScaleForAmax's
// float operations, so that it matches the CPU bit for bit).    x [rows][cols] bf16 (row stride
// ldx), codes [rows][cols] e4m3 (row stride ldc), scales [rows] f32. Launched with PDL.
void QuantizeRowsE4m3(const __nv_bfloat16* x, int64_t ldx, int64_t rows, int64_t cols,
                      uint8_t* codes, int64_t ldc, float* scales, cudaStream_t stream);

// out[m][n] (+)= x_scales[m] w_scales[n] sum_k x[m][k] w[n][k], e4m3 operands with f32
// accumulation, out bf16 or f32. A shape's candidates: cuBLASLt's heuristic's first configuration
// (split-k reductions allowed; with per-row x per-column scales where cuBLASLt has them, else
// unscaled into f32 and rescaled by a kernel of ours) and, up to kSkinnyGemmMaxRows rows, the
// skinny kernel's e4m3 form at each k split (skinny_gemm.h). The first call of a shape outside
// graph capture times each on that call's operands (median of 5 after a warm-up) and keeps the
// fastest for every later call.
class Fp8GemmRunner {
 public:
  explicit Fp8GemmRunner(cudaStream_t stream);
  ~Fp8GemmRunner();
  Fp8GemmRunner(const Fp8GemmRunner&) = delete;
  Fp8GemmRunner& operator=(const Fp8GemmRunner&) = delete;

  // Whether cuBLASLt has an FP8 kernel for the current device (sm_89 and newer) and this shape:
  // k a multiple of 16, row strides multiples of 16 bytes.
  static bool DeviceSupportsFp8();
  // Sizes the f32 product scratch of the rescaling path (below) for up to m x n, outside any
  // capture (CudaBackend::ReserveQuantizedInputs).
  void Reserve(int64_t m, int64_t n);
  void Run(int64_t m, int64_t n, int64_t k, const uint8_t* w, int64_t ldw, const float* w_scales,
           const uint8_t* x, int64_t ldx, const float* x_scales, void* out, int64_t ldo,
           bool out_f32, bool accumulate);
  const std::string& last_plan() const { return last_plan_; }

 private:
  struct Plan {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr;
    cublasLtMatrixLayout_t b = nullptr;
    cublasLtMatrixLayout_t c = nullptr;
    cublasLtMatmulAlgo_t algo{};
    bool has_cublas = false;
    // cuBLASLt without per-row x per-column scales (Hopper's cuBLASLt has none: its FP8 kernels
    // take one scale per operand): the unscaled product goes to an f32 scratch and a kernel
    // applies both scales (and the residual add) on its way to `out`.
    bool rescale = false;
    int skinny_splits = 0;  // the skinny kernel at this k split is the choice; 0: cuBLASLt
    bool settled = false;
    std::string name;
  };
  // Runs the plan's candidate: cuBLASLt (splits 0) or the skinny kernel at `splits`.
  void Launch(const Plan& plan, int splits, int64_t m, int64_t n, int64_t k, const uint8_t* w,
              int64_t ldw, const float* w_scales, const uint8_t* x, int64_t ldx,
              const float* x_scales, void* out, int64_t ldo, bool out_f32, bool accumulate);
  using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool, bool>;
  Plan& PlanFor(int64_t m, int64_t n, int64_t k, int64_t ldw, int64_t ldx, int64_t ldo,
                bool out_f32, bool accumulate);

  cudaStream_t stream_;
  cublasLtHandle_t lt_ = nullptr;
  void* workspace_ = nullptr;
  float* product_ = nullptr;  // [m][n] f32 of the rescaling path
  size_t product_bytes_ = 0;
  std::map<Key, Plan> plans_;
  std::string last_plan_;
};

}  // namespace sieve::cuda
