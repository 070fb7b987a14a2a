// Every GEMM of the CUDA backend: out[m][n] = x[m][k] . w[n][k]^T, bf16 in, f32 accumulation,
// bf16 or f32 out. The candidates of a shape: cuBLASLt's heuristic picks, up to 256 rows its first
// configuration re-tiled (gemm.cc), and up to 32 rows the skinny kernel (skinny_gemm.h). The first
// calls of a shape outside
// graph capture time every candidate with cold weights (the L2 refilled with other data before
// each timed call, as in a decode step whose weights never fit the L2), on the weights of up to 4
// calls (a step's first layers), and keep the fastest on average; later calls, captured or not,
// reuse that plan. Candidates within 3% of the pick stay options, which step tuning
// (runtime/step_tuning.h) decides by timing the captured decode step (README_gemm.md).
#pragma once

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace sieve::cuda {

// The matmul descriptor of every GEMM here: row-major out[m][n] = x[m][k] w[n][k]^T is
// column-major out'(n x m) = w'(k x n)^T x'(k x m), so A (the weight) is transposed and B (the
// input) is not ("TN", the layout cuBLASLt's FP8 kernels require); f32 compute and scale.
cublasLtMatmulDesc_t MakeWeightTransposedDesc();

// A heuristic preference: at most `workspace_bytes` of workspace, split-k reductions limited to
// `reduction_mask` (CUBLASLT_REDUCTION_SCHEME_MASK: any; CUBLASLT_REDUCTION_SCHEME_NONE: no
// split-k). The caller destroys it.
cublasLtMatmulPreference_t MakeGemmPreference(size_t workspace_bytes, uint32_t reduction_mask);

// The 16-byte aligned part of [data, data + bytes), as ReadThrough takes it.
std::pair<const void*, size_t> AlignedInside(const void* data, int64_t bytes);

class GemmRunner {
 public:
  explicit GemmRunner(cudaStream_t stream);
  ~GemmRunner();
  GemmRunner(const GemmRunner&) = delete;
  GemmRunner& operator=(const GemmRunner&) = delete;

  // Row strides in elements. Plans the shape on its first call (see above). `accumulate`: out +=
  // x . w^T instead (cuBLASLt with beta = 1; planned on a scratch output, never on `out`).
  void Run(int64_t m, int64_t n, int64_t k, const __nv_bfloat16* w, int64_t ldw,
           const __nv_bfloat16* x, int64_t ldx, void* out, int64_t ldo, bool out_f32,
           bool accumulate = false);

  // Batch invariance (README_gemm.md "Batch invariance"): from now on every shape is planned as
  // one fixed cuBLASLt configuration per (n, k, output type), the same for every m: the
  // heuristic's first configuration without split-k for kInvariantPlanRows rows, checked against
  // each m it runs. No timing, no skinny kernel, no step-tuning options: row r of the output is
  // then computed by the same kernel in the same order whatever m is. Drops every plan made
  // before (outside any capture, before graphs that replay them are made).
  void SetBatchInvariant(bool on);
  bool batch_invariant() const { return batch_invariant_; }
  static constexpr int64_t kInvariantPlanRows = 128;
  // The row counts the configuration must take (cublasLtMatmulAlgoCheck) to be chosen: one row,
  // decode batches, prefill chunks and more.
  static constexpr int64_t kInvariantProbeRows[] = {1, 7, 64, 128, 1000, 8192, 65536};

  // The plan the last Run used (call after one), e.g. "cuBLASLt, candidate 2 of 8 (algo 66, ...)"
  // or "skinny kernel, k split 2, candidate 10 of 11".
  const std::string& last_plan() const { return last_plan_->name; }

  // Step tuning (runtime/step_tuning.h). A settled plan whose next-fastest candidates timed within
  // 3% of its pick alone keeps up to 3 of them as options: which one makes a whole decode step
  // fastest is then found by timing captured steps. The open plans are those run since the last
  // MarkTuningScope() that have options and are not closed, in the order of their first run.
  void MarkTuningScope() { scope_.clear(); }
  struct OpenPlan {
    std::string shape;                 // "64 x 28672 x 4096", "(+=)" when accumulating
    std::vector<std::string> options;  // option 0: the plan's pick alone
  };
  std::vector<OpenPlan> OpenPlans() const;
  // Makes option `option` of open plan `index` the plan's choice (before a capture).
  void SetOpenPlanOption(int index, int option);
  // Closes open plan `index` with its current choice: no later scope reopens it.
  void CloseOpenPlan(int index);
  // Tests: every candidate a plan times (and does not refuse) becomes an option of plans settled
  // from now on, so that each can be set and checked.
  void KeepEveryCandidateAsOption() {
    tuning_options_ = static_cast<size_t>(-1);
    tuning_margin_ = 1e30f;
  }

 private:
  struct Plan {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr;
    cublasLtMatrixLayout_t b = nullptr;
    cublasLtMatrixLayout_t c = nullptr;
    cublasLtMatmulAlgo_t algo{};  // cuBLASLt's configuration (with `skinny`: where it refuses)
    int skinny = 0;               // the skinny kernel is the choice, at this many k splits
    std::string name;
    // Planning: the candidates (cuBLASLt's heuristic algos, then the re-tiled ones, then the
    // skinny kernel where it takes the shape), each one's median per weight it was timed on, those
    // weights, and whether the choice is final.
    std::vector<cublasLtMatmulAlgo_t> cublas_candidates;
    // Candidates cublas_candidates.size() + i: the skinny kernel at k splits skinny_splits[i].
    std::vector<int> skinny_splits;
    std::vector<std::vector<float>> medians;  // [candidate][weight]
    std::vector<const void*> timed_weights;
    bool settled = false;
    size_t heuristic_count = 0;  // cublas_candidates[0, heuristic_count): the heuristic's own
    int chosen = -1;             // the candidate picked, or -1 (untimed)
    // Step tuning: candidates within kTuningMargin of the pick alone, the pick first, set when
    // the plan settles; `closed` once a step chose among them.
    std::vector<int> options;
    bool closed = false;
    std::string shape;  // for logs
  };
  using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool, bool>;

  Plan& PlanFor(int64_t m, int64_t n, int64_t k, const __nv_bfloat16* w, int64_t ldw,
                const __nv_bfloat16* x, int64_t ldx, void* out, int64_t ldo, bool out_f32,
                bool accumulate);
  // Times the plan's candidates on this call's operands (if it is not capturing and `w` is new to
  // the plan) and picks the fastest so far; settles the plan after kPlannedWeights weights (one
  // for prefill shapes), when a timed weight comes round again, or inside a capture.
  void ContinuePlanning(Plan& plan, int64_t m, int64_t n, int64_t k, const __nv_bfloat16* w,
                        int64_t ldw, const __nv_bfloat16* x, int64_t ldx, void* out, int64_t ldo,
                        bool out_f32, bool accumulate);
  void TimeCandidates(Plan& plan, int64_t m, int64_t n, int64_t k, const __nv_bfloat16* w,
                      int64_t ldw, const __nv_bfloat16* x, int64_t ldx, void* out, int64_t ldo,
                      bool out_f32, bool accumulate);
  // Rows rounded up to a power of two. A shape whose m is not one shares the timed choice of its
  // bucket (prefill chunks and unpadded decode batches come in every size): the bucket's own m if
  // that was timed, else the first m timed in it. A power-of-two m (a padded decode batch, which
  // graphs replay) is always timed itself.
  static int64_t BucketRows(int64_t m);
  // Gives a new plan (descriptors made) the settled choice of its bucket's timed plan, if there is
  // one, and settles it: its cuBLASLt algo if cublasLtMatmulAlgoCheck accepts it for this m, else
  // `fallback` (the heuristic's first for this m). False when there is no such plan or nothing of
  // it fits: the shape is planned afresh. The skinny kernel, where the bucket's plan picked it,
  // for every m it takes.
  bool ReusePlanOfBucket(Plan& plan, const Key& key, int64_t m, int64_t n, int64_t k, bool out_f32,
                         const cublasLtMatmulAlgo_t* fallback);
  // cuBLASLt's heuristic's first configuration with other tiles and split-k counts (gemm.cc).
  std::vector<cublasLtMatmulAlgo_t> RetiledCandidates(
      const Plan& plan, int64_t m, int64_t n, const cublasLtMatmulHeuristicResult_t* heuristic,
      int heuristic_count);
  Plan& OpenPlanAt(int index);
  void DestroyPlans();  // every plan's descriptors, and the maps and pointers into plans_
  // Batch invariance: the plan of this shape, its algo the (n, k, out_f32) one for every m.
  Plan& InvariantPlan(const Key& key, int64_t m, int64_t n, int64_t k, int64_t ldw, int64_t ldx,
                      int64_t ldo, bool out_f32);
  // The configuration of every m for (n, k, out_f32), chosen on first use (see SetBatchInvariant).
  const cublasLtMatmulAlgo_t& InvariantAlgo(int64_t n, int64_t k, bool out_f32);
  static float CandidateTime(const Plan& plan, size_t index);
  static size_t CandidateCount(const Plan& plan) {
    return plan.cublas_candidates.size() + plan.skinny_splits.size();
  }
  static bool IsSkinny(const Plan& plan, size_t index) {
    return index >= plan.cublas_candidates.size();
  }
  // "cuBLASLt, candidate 2 of 8" (", re-tiled" past the heuristic's own), "skinny kernel, k split
  // 2, candidate 10 of 11".
  static std::string CandidateName(const Plan& plan, size_t index);
  // CandidateName plus cuBLASLt's configuration, e.g. " (algo 66, tile 164, ...)".
  static std::string OptionName(const Plan& plan, size_t index);
  // Picks the fastest candidate so far; cuBLASLt's fastest stays the algo either way (it serves
  // calls whose pointers the skinny kernel refuses).
  static void Choose(Plan& plan);
  // Makes candidate `index` the plan's choice.
  static void Apply(Plan& plan, int index);
  // Makes the choice final: step tuning's options, the verbose report.
  void Settle(Plan& plan, int64_t m, int64_t n, int64_t k, bool out_f32, bool accumulate);
  // Each launch's (lower) median milliseconds as a decode step meets it: its weights cold (a buffer
  // twice the L2 read before every call), its input (`warm`, 16-byte aligned bytes) read after the
  // flush. The launches are timed round-robin, `rounds` calls each, so drift (clocks,
  // temperature) falls on all of them alike. Negative for a launch that refused.
  std::vector<float> TimeLaunches(const std::vector<std::function<bool()>>& launches,
                                  std::pair<const void*, size_t> warm, int rounds);

  cudaStream_t stream_;
  bool verbose_;  // SIEVE_GEMM_VERBOSE=1: print each plan as it is made
  cublasLtHandle_t lt_ = nullptr;
  void* workspace_ = nullptr;
  std::map<Key, Plan> plans_;
  std::map<Key, Key> bucket_sources_;  // (m rounded by BucketRows, ...) -> the plan timed for it
  void* flush_ = nullptr;              // twice the L2, read before each timed call
  size_t flush_bytes_ = 0;
  cudaEvent_t start_ = nullptr;
  cudaEvent_t stop_ = nullptr;
  const Plan* last_plan_ = nullptr;  // map nodes do not move
  std::vector<Plan*> scope_;         // plans with options run since MarkTuningScope()
  size_t tuning_options_;            // kTuningOptions (gemm.cc) but in tests
  bool batch_invariant_ = false;
  std::map<std::tuple<int64_t, int64_t, bool>, cublasLtMatmulAlgo_t> invariant_algos_;
  float tuning_margin_;  // kTuningMargin but in tests
};

}  // namespace sieve::cuda
