// FP8 weights on the GPU (Backend::QuantizeWeightE4m3): the kernel that quantizes bf16 rows to
// e4m3 with one scale a row (weights at load, each GEMM's input as it runs), and the GEMM over
// e4m3 operands with those scales, through cuBLASLt's FP8 kernels (per-row x per-column scales:
// CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F) or the skinny kernel. The CPU twins are
// core/float8.h's QuantizeRowE4m3 and CpuBackend::GemmE4m3.
#pragma once

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

namespace sieve::cuda {

// codes[r][c] = e4m3(x[r][c] * 448 / amax_r), scales[r] = amax_r / 448 (E4m3ScaleForAmax's
// float operations, so that it matches the CPU bit for bit).    x [rows][cols] bf16 (row stride
// ldx), codes [rows][cols] e4m3 (row stride ldc), scales [rows] f32. Launched with PDL.
void QuantizeRowsE4m3(const __nv_bfloat16* x, int64_t ldx, int64_t rows, int64_t cols,
                      uint8_t* codes, int64_t ldc, float* scales, cudaStream_t stream);

// out[m][n] (+)= x_scales[m] w_scales[n] sum_k x[m][k] w[n][k], e4m3 operands with f32
// accumulation, out bf16 or f32. A shape's candidates:
// - kScaled - i: cuBLASLt's FP8 kernel with per-row x per-column scales
//   (CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F) applied in its epilogue, in the heuristic's
//   configuration i;
// - kRescaled - i, up to kRescaleMaxRows rows (or at any size where kScaled has no kernel):
//   cuBLASLt's unscaled FP8 product in configuration i into an f32 scratch and a kernel of ours
//   applying both scales (and the residual add) on its way to `out`: cuBLASLt's small tiles for
//   decode batches, which its scaled form lacks;
// - up to kSkinnyGemmMaxRows rows, the skinny kernel's e4m3 form at each k split (skinny_gemm.h).
// The first call of a shape outside graph capture times each on that call's operands (median of
// 5 after a warm-up) and keeps the fastest for every later call; a shape whose m is not a power
// of two takes the choice of its power-of-two bucket where one was timed. By default the
// heuristic offers its first configuration of each form and the timing meets warm caches; with
// SIEVE_AB_FP8_GEMM=all (an experiment waiting for its GPU A/B, README_gemm.md "FP8 weights") it
// offers up to kHeuristicConfigs of each, timed with the weights cold as a decode step meets them
// (a buffer twice the L2 read before each timed call, then the input read back into it).
class Fp8GemmRunner {
 public:
  // Candidate ids: kScaled - i or kRescaled - i (cuBLASLt in the heuristic's configuration i <
  // kHeuristicConfigs), or a k split (>= 1) of the skinny kernel.
  static constexpr int kScaled = -1;
  static constexpr int kRescaled = -100;
  static constexpr int kHeuristicConfigs = 8;
  // The rescaled path's largest m where the scaled kernel exists: cuBLASLt offers the scaled
  // form one 128-wide tile, slower than the unscaled product's small tiles plus the rescale at
  // decode sizes and faster from a few hundred rows (README_gemm.md, "FP8 weights").
  static constexpr int64_t kRescaleMaxRows = 256;

  explicit Fp8GemmRunner(cudaStream_t stream);
  ~Fp8GemmRunner();
  Fp8GemmRunner(const Fp8GemmRunner&) = delete;
  Fp8GemmRunner& operator=(const Fp8GemmRunner&) = delete;

  // Whether cuBLASLt has an FP8 kernel for the current device (sm_89 and newer) and this shape:
  // k a multiple of 16, row strides multiples of 16 bytes.
  static bool DeviceSupportsFp8();
  // Sizes the f32 product scratch of the rescaled path for up to m x n (m capped at
  // kRescaleMaxRows where the scaled kernel exists), outside any capture
  // (CudaBackend::ReserveQuantizedInputs).
  void Reserve(int64_t m, int64_t n);
  void Run(int64_t m, int64_t n, int64_t k, const uint8_t* w, int64_t ldw, const float* w_scales,
           const uint8_t* x, int64_t ldx, const float* x_scales, void* out, int64_t ldo,
           bool out_f32, bool accumulate);
  // The candidates Run chooses between for this shape, and one of them run directly (tests).
  std::vector<int> Candidates(int64_t m, int64_t n, int64_t k, const uint8_t* w, int64_t ldw,
                              const uint8_t* x, int64_t ldx, int64_t ldo, bool out_f32,
                              bool accumulate);
  void RunCandidate(int candidate, int64_t m, int64_t n, int64_t k, const uint8_t* w, int64_t ldw,
                    const float* w_scales, const uint8_t* x, int64_t ldx, const float* x_scales,
                    void* out, int64_t ldo, bool out_f32, bool accumulate);
  const std::string& last_plan() const { return last_plan_; }
  // Batch invariance (README_gemm.md "Batch invariance"): every shape of one (n, k, output type)
  // runs one configuration whatever m is: cuBLASLt's scaled FP8 kernel where it has one for
  // GemmRunner::kInvariantPlanRows rows, else its unscaled product and the rescale (a kernel
  // per element), the heuristic's first configuration without split-k in either case. No timing,
  // no skinny kernel. Shapes planned before are planned again.
  void SetBatchInvariant(bool on);

 private:
  struct Plan {
    cublasLtMatmulDesc_t scaled_op = nullptr;  // per-row x per-column scales
    cublasLtMatmulDesc_t unscaled_op = nullptr;
    cublasLtMatrixLayout_t a = nullptr;
    cublasLtMatrixLayout_t b = nullptr;
    cublasLtMatrixLayout_t c = nullptr;                // out
    cublasLtMatrixLayout_t product = nullptr;          // the rescaled path's f32 [m][n]
    std::vector<cublasLtMatmulAlgo_t> scaled_algos;    // the heuristic's, best first
    std::vector<cublasLtMatmulAlgo_t> unscaled_algos;  // likewise
    bool has_scaled = false;                           // scaled_algos is not empty
    bool has_unscaled = false;
    int choice = kScaled;
    bool settled = false;
    std::string name;
  };
  void Launch(const Plan& plan, int candidate, int64_t m, int64_t n, int64_t k, const uint8_t* w,
              int64_t ldw, const float* w_scales, const uint8_t* x, int64_t ldx,
              const float* x_scales, void* out, int64_t ldo, bool out_f32, bool accumulate);
  using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool, bool>;
  Plan& PlanFor(int64_t m, int64_t n, int64_t k, int64_t ldw, int64_t ldx, int64_t ldo,
                bool out_f32, bool accumulate);
  // Up to kHeuristicConfigs configurations of cuBLASLt's heuristic, best first (none: no kernel);
  // `no_split`: configurations without split-k only.
  std::vector<cublasLtMatmulAlgo_t> Heuristic(cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t a,
                                              cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c,
                                              bool no_split = false);
  // Times `candidates` on this call's operands (cold weights, warm x) and returns the fastest.
  int TimeCandidates(const Plan& plan, const std::vector<int>& candidates, int64_t m, int64_t n,
                     int64_t k, const uint8_t* w, int64_t ldw, const float* w_scales,
                     const uint8_t* x, int64_t ldx, const float* x_scales, void* out, int64_t ldo,
                     bool out_f32, bool accumulate);
  // Batch invariance: settles `plan` (of m rows) on the (n, k, out_f32) configuration.
  void SettleInvariant(Plan& plan, int64_t m, int64_t n, int64_t k, bool out_f32, bool accumulate);
  struct InvariantChoice {
    int candidate = kScaled;  // kScaled or kRescaled (configuration 0 of the plan)
    cublasLtMatmulAlgo_t algo{};
  };
  std::string CandidateName(int candidate) const;
  void GrowProduct(int64_t m, int64_t n);  // outside capture

  cudaStream_t stream_;
  cublasLtHandle_t lt_ = nullptr;
  void* workspace_ = nullptr;
  bool scaled_available_ = false;  // cuBLASLt has per-row x per-column FP8 scales here
  float* product_ = nullptr;       // [m][n] f32 of the rescaled path
  size_t product_bytes_ = 0;
  std::map<Key, Plan> plans_;
  // A timed choice per (power-of-two m bucket, n, k, strides, output): taken by the bucket's
  // other (not power-of-two) m.
  std::map<Key, int> bucket_choices_;
  std::string last_plan_;
  bool batch_invariant_ = false;
  std::map<std::tuple<int64_t, int64_t, bool>, InvariantChoice> invariant_choices_;
};

}  // namespace sieve::cuda
