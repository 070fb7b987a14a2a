#include "backend/cuda/gemm.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/graph_pdl.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/small_m_gemm.h"
#include "core/dtype.h"

#define SIEVE_CUBLAS_CHECK(call)                                                       \
  do {                                                                                 \
    const cublasStatus_t sieve_cublas_status_ = (call);                                \
    if (sieve_cublas_status_ != CUBLAS_STATUS_SUCCESS) {                               \
      std::fprintf(stderr, "%s:%d: %s failed: status %d\n", __FILE__, __LINE__, #call, \
                   static_cast<int>(sieve_cublas_status_));                            \
      std::abort();                                                                    \
    }                                                                                  \
  } while (0)

namespace sieve::cuda {
namespace {

constexpr size_t kWorkspaceBytes = 32u << 20;
// k-splits only pay where n / 128 slabs leave SMs idle, so split shapes are bounded: the f32
// sums buffer holds 64 x 65536 values (16 MiB) and there is a counter per slab.
constexpr int64_t kMaxSplitN = 65536;
constexpr int kMaxSlabs = static_cast<int>(kMaxSplitN / kSmallMGemmTileN);
// Splits timed per plan: with clusters (sm_90) every count up to the cluster limit, since the
// count that fills the SMs best is shape-specific (48 qkv slabs x 5 = 240 CTAs, 32 o slabs x 8 =
// 256, against 264 CTA slots on an H200); with atomics a wider, sparser range.
constexpr int kClusterSplitCandidates[] = {1, 2, 3, 4, 5, 6, 7, 8};
constexpr int kAtomicSplitCandidates[] = {1, 2, 3, 4, 6, 8, 12, 16};
static_assert(kSmallMGemmMaxClusterSplits == 8);
constexpr int kDefaultCublasCandidates = 8;
constexpr int kMaxCublasCandidates = 64;

// How many of cuBLASLt's heuristic candidates a plan times: SIEVE_GEMM_CANDIDATES, default 8.
int CublasCandidates() {
  const char* value = std::getenv("SIEVE_GEMM_CANDIDATES");
  const int count = value != nullptr ? std::atoi(value) : 0;
  return count > 0 ? std::min(count, kMaxCublasCandidates) : kDefaultCublasCandidates;
}
// Timed calls per candidate and weight. With 3 calls each, one after another, and the best of them
// kept, the gate_up GEMM's six leading candidates (59-63 us apart by 2 us of noise) were ranked
// differently from run to run, and the ones picked in some runs cost the decode step 0.1 ms
// (session 9, README_gemm.md). Two per weight over four weights: 8 calls a candidate, about the 7
// on one weight of session 9, so the planning wait of a new shape (prefill chunks of each new
// size up to 1024 rows plan this way too) stays where it was.
constexpr int kTimedRounds = 2;
// How many of a decode shape's weights (one per layer) its candidates are timed on. Some kernels'
// speed depends on which layer's weights they read: cuBLASLt's third gate_up candidate took
// 0.0598-0.0643 ms on the first four layers' weights, the second 0.0590-0.0615 (session 10,
// device run 3). Timed on layer 0 alone, the third won in 2 of 31 processes (runs 1-2) and, 5%
// slower over the step's 32 layers, cost those steps 0.07-0.1 ms. So planning goes on through
// the first layers' calls of the eager step before a capture, and a candidate's time is its mean
// over the weights.
constexpr int kPlannedWeights = 4;
// Shapes up to this many rows (a decode step's batch) are probed for programmatic edges: graphs
// hold decode steps only. Larger ones (prefill chunks, planned on the first step of each new token
// count, with the request waiting) are compute-bound, where the candidates are far apart: 3 calls
// each, as before session 9, keep that wait where it was.
constexpr int64_t kMaxProbedRows = 1024;
constexpr int kTimedRoundsPrefill = 3;

// The 16-byte aligned part of [data, data + bytes), as ReadThrough takes it.
std::pair<const void*, size_t> AlignedInside(const void* data, int64_t bytes) {
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(data) + 15) / 16 * 16;
  const uintptr_t end =
      (reinterpret_cast<uintptr_t>(data) + static_cast<uintptr_t>(bytes)) / 16 * 16;
  return {reinterpret_cast<const void*>(begin), end > begin ? end - begin : 0};
}

uint32_t ReductionMaskFromEnvironment() {
  const char* value = std::getenv("SIEVE_GEMM_REDUCTION");
  if (value == nullptr || *value == '\0' || std::strcmp(value, "any") == 0) {
    return CUBLASLT_REDUCTION_SCHEME_MASK;
  }
  if (std::strcmp(value, "inplace") == 0) return CUBLASLT_REDUCTION_SCHEME_INPLACE;
  if (std::strcmp(value, "none") == 0) return CUBLASLT_REDUCTION_SCHEME_NONE;
  std::fprintf(stderr, "SIEVE_GEMM_REDUCTION=%s: expected any, inplace or none\n", value);
  std::exit(2);
}

// One uint32 attribute of an algo's configuration, or -1.
int AlgoConfig(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t attribute) {
  uint32_t value = 0;
  size_t written = 0;
  if (cublasLtMatmulAlgoConfigGetAttribute(&algo, attribute, &value, sizeof(value), &written) !=
      CUBLAS_STATUS_SUCCESS) {
    return -1;
  }
  return static_cast<int>(value);
}

// " (algo 21, tile 18, stages 12, split-k 3 in place)": what cuBLASLt's config holds, for logs.
std::string Describe(const cublasLtMatmulAlgo_t& algo) {
  const auto get = [&](cublasLtMatmulAlgoConfigAttributes_t what) {
    return AlgoConfig(algo, what);
  };
  const int splits = get(CUBLASLT_ALGO_CONFIG_SPLITK_NUM);
  const int scheme = get(CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME);
  std::string text = " (algo " + std::to_string(get(CUBLASLT_ALGO_CONFIG_ID)) + ", tile " +
                     std::to_string(get(CUBLASLT_ALGO_CONFIG_TILE_ID)) + ", stages " +
                     std::to_string(get(CUBLASLT_ALGO_CONFIG_STAGES_ID)) + ", split-k " +
                     std::to_string(splits);
  if (splits > 1) {
    text += scheme == CUBLASLT_REDUCTION_SCHEME_INPLACE        ? " in place"
            : scheme == CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE ? " via f32 workspace"
            : scheme == CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE  ? " via output-type workspace"
                                                               : "";
  }
  return text + ")";
}

}  // namespace

GemmChoice GemmChoiceFromEnvironment() {
  const char* value = std::getenv("SIEVE_GEMM");
  if (value == nullptr || *value == '\0' || std::strcmp(value, "cublaslt") == 0) {
    return GemmChoice::kCublasLt;
  }
  if (std::strcmp(value, "auto") == 0) return GemmChoice::kAuto;
  if (std::strcmp(value, "small_m") == 0) return GemmChoice::kSmallM;
  std::fprintf(stderr, "SIEVE_GEMM=%s: expected auto, cublaslt or small_m\n", value);
  std::exit(2);
}

GemmRunner::GemmRunner(cudaStream_t stream)
    : stream_(stream),
      choice_(GemmChoiceFromEnvironment()),
      reduction_mask_(ReductionMaskFromEnvironment()) {
  const char* verbose = std::getenv("SIEVE_GEMM_VERBOSE");
  verbose_ = verbose != nullptr && std::strcmp(verbose, "0") != 0 && *verbose != '\0';
  SIEVE_CUBLAS_CHECK(cublasLtCreate(&lt_));
  SIEVE_CUDA_CHECK(cudaMalloc(&workspace_, kWorkspaceBytes));
  SIEVE_CUDA_CHECK(cudaEventCreate(&start_));
  SIEVE_CUDA_CHECK(cudaEventCreate(&stop_));
  int device = 0;
  SIEVE_CUDA_CHECK(cudaGetDevice(&device));
  int l2_bytes = 0;
  SIEVE_CUDA_CHECK(cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, device));
  flush_bytes_ = 2 * static_cast<size_t>(l2_bytes);
}

GemmRunner::~GemmRunner() {
  cudaStreamSynchronize(stream_);
  for (auto& [key, plan] : plans_) {
    if (plan.op != nullptr) cublasLtMatmulDescDestroy(plan.op);
    if (plan.a != nullptr) cublasLtMatrixLayoutDestroy(plan.a);
    if (plan.b != nullptr) cublasLtMatrixLayoutDestroy(plan.b);
    if (plan.c != nullptr) cublasLtMatrixLayoutDestroy(plan.c);
  }
  cudaFree(workspace_);
  cudaFree(split_sums_);
  cudaFree(split_counters_);
  cudaFree(flush_);
  cudaEventDestroy(start_);
  cudaEventDestroy(stop_);
  cublasLtDestroy(lt_);
}

void GemmRunner::EnsureSplitBuffers() {
  if (split_sums_ != nullptr) return;
  const size_t sums = static_cast<size_t>(kSmallMGemmMaxRows) * kMaxSplitN * sizeof(float);
  SIEVE_CUDA_CHECK(cudaMalloc(&split_sums_, sums));
  SIEVE_CUDA_CHECK(cudaMalloc(&split_counters_, kMaxSlabs * sizeof(int)));
  SIEVE_CUDA_CHECK(cudaMemsetAsync(split_sums_, 0, sums, stream_));
  SIEVE_CUDA_CHECK(cudaMemsetAsync(split_counters_, 0, kMaxSlabs * sizeof(int), stream_));
}

std::vector<float> GemmRunner::TimeLaunches(const std::vector<std::function<bool()>>& launches,
                                            std::pair<const void*, size_t> warm, int rounds) {
  std::vector<std::vector<float>> times(launches.size());
  std::vector<bool> runs(launches.size());
  for (size_t index = 0; index < launches.size(); ++index) {
    runs[index] = launches[index]();  // warm-up (first-call costs) and the check that it runs
  }
  for (int round = 0; round < rounds; ++round) {
    for (size_t index = 0; index < launches.size(); ++index) {
      if (!runs[index]) continue;
      if (flush_ != nullptr) {
        ReadThrough(flush_, flush_bytes_, stream_);
        ReadThrough(warm.first, warm.second, stream_, static_cast<uint32_t*>(flush_));
      }
      SIEVE_CUDA_CHECK(cudaEventRecord(start_, stream_));
      launches[index]();
      SIEVE_CUDA_CHECK(cudaEventRecord(stop_, stream_));
      SIEVE_CUDA_CHECK(cudaEventSynchronize(stop_));
      float ms = 0;
      SIEVE_CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_));
      times[index].push_back(ms);
    }
  }
  std::vector<float> medians(launches.size(), -1.0f);
  for (size_t index = 0; index < launches.size(); ++index) {
    if (times[index].empty()) continue;
    std::sort(times[index].begin(), times[index].end());
    // The lower median: of 2 calls, the faster. Interference only ever slows a call down; with the
    // upper one, a single 0.0707 ms call of gate_up's candidate 2 (0.060-0.062 otherwise) made it
    // lose to candidate 3 in one process (session 10, device run 9).
    medians[index] = times[index][(times[index].size() - 1) / 2];
  }
  return medians;
}

GemmRunner::Plan& GemmRunner::PlanFor(int64_t m, int64_t n, int64_t k, const __nv_bfloat16* w,
                                      int64_t ldw, const __nv_bfloat16* x, int64_t ldx, void* out,
                                      int64_t ldo, bool out_f32, bool accumulate) {
  const Key key{m, n, k, ldw, ldx, ldo, out_f32, static_cast<int>(choice_), accumulate};
  const auto found = plans_.find(key);
  if (found != plans_.end()) {
    Plan& plan = found->second;
    if (!plan.settled)
      ContinuePlanning(plan, m, n, k, w, ldw, x, ldx, out, ldo, out_f32, accumulate);
    return plan;
  }
  Plan plan;

  // cuBLASLt, column-major: out'(n x m) = w'(k x n)^T x'(k x m).
  SIEVE_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t transpose = CUBLAS_OP_T;
  const cublasOperation_t none = CUBLAS_OP_N;
  SIEVE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_TRANSA,
                                                    &transpose, sizeof(transpose)));
  SIEVE_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_TRANSB, &none, sizeof(none)));
  const cudaDataType_t out_type = out_f32 ? CUDA_R_32F : CUDA_R_16BF;
  SIEVE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.a, CUDA_R_16BF, k, n, ldw));
  SIEVE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.b, CUDA_R_16BF, k, m, ldx));
  SIEVE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.c, out_type, n, m, ldo));
  cublasLtMatmulPreference_t preference;
  SIEVE_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference));
  const size_t workspace = kWorkspaceBytes;
  SIEVE_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof(workspace)));
  SIEVE_CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                           &reduction_mask_, sizeof(reduction_mask_)));
  std::vector<cublasLtMatmulHeuristicResult_t> results(CublasCandidates());
  int cublas_count = 0;
  SIEVE_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(lt_, plan.op, plan.a, plan.b, plan.c, plan.c,
                                                    preference, static_cast<int>(results.size()),
                                                    results.data(), &cublas_count));
  cublasLtMatmulPreferenceDestroy(preference);

  if (ReusePlanOfBucket(plan, key, m, n, k, w, ldw, x, ldx, out, ldo, out_f32,
                        cublas_count > 0 ? &results[0].algo : nullptr)) {
    return plans_.emplace(key, std::move(plan)).first->second;
  }

  SmallMGemmArgs args = MakeSmallMGemmArgs(m, n, k, w, ldw, x, ldx, out, ldo, out_f32);
  const bool small_m_fits =
      SmallMGemmSupports(args) && n < (int64_t{1} << 31) && k < (int64_t{1} << 31);
  std::vector<int> splits;
  const bool clusters = SmallMGemmHasClusters();
  if (choice_ != GemmChoice::kCublasLt && small_m_fits) {
    const auto add = [&](int split) {
      if (split == 1 || (split <= SmallMGemmMaxSplits(args.k) && (clusters || n <= kMaxSplitN))) {
        splits.push_back(split);
      }
    };
    if (clusters) {
      for (const int split : kClusterSplitCandidates) add(split);
    } else {
      for (const int split : kAtomicSplitCandidates) add(split);
    }
  }
  const bool use_cublas = choice_ != GemmChoice::kSmallM || splits.empty();
  if (use_cublas && cublas_count == 0 && splits.empty()) {
    std::fprintf(stderr, "no GEMM for %lldx%lldx%lld\n", static_cast<long long>(m),
                 static_cast<long long>(n), static_cast<long long>(k));
    std::abort();
  }

  // Defaults without timing: the small-m kernel unsplit where it is allowed, else cuBLASLt's
  // first pick. The plan keeps a cuBLASLt algo whenever there is one: it also serves calls whose
  // operands the small-m kernel refuses (misaligned pointers of a planned shape).
  plan.has_cublas = cublas_count > 0;
  if (plan.has_cublas) plan.algo = results[0].algo;
  for (int candidate = 0; use_cublas && candidate < cublas_count; ++candidate) {
    plan.cublas_candidates.push_back(results[candidate].algo);
  }
  plan.split_candidates = splits;
  plan.medians.resize(plan.cublas_candidates.size() + splits.size());
  if (!splits.empty()) {
    plan.small_m_splits = 1;
    plan.name = "small-m, 1 split";
  } else {
    plan.name = "cuBLASLt, candidate 1 of " + std::to_string(cublas_count);
  }
  Plan& stored = plans_.emplace(key, std::move(plan)).first->second;
  ContinuePlanning(stored, m, n, k, w, ldw, x, ldx, out, ldo, out_f32, accumulate);
  // The bucket's source: its own m once that is timed (a decode batch padded to it), else the
  // first m timed in it. A plan made inside a capture (untimed) is no source.
  if (!stored.timed_weights.empty()) {
    Key bucket = key;
    std::get<0>(bucket) = BucketRows(m);
    if (m == BucketRows(m)) {
      bucket_sources_[bucket] = key;
    } else {
      bucket_sources_.emplace(bucket, key);
    }
  }
  return stored;
}

int64_t GemmRunner::BucketRows(int64_t m) {
  int64_t bucket = 1;
  while (bucket < m) bucket *= 2;
  return bucket;
}

bool GemmRunner::ReusePlanOfBucket(Plan& plan, const Key& key, int64_t m, int64_t n, int64_t k,
                                   const __nv_bfloat16* w, int64_t ldw, const __nv_bfloat16* x,
                                   int64_t ldx, void* out, int64_t ldo, bool out_f32,
                                   const cublasLtMatmulAlgo_t* fallback) {
  if (m == BucketRows(m)) return false;  // decode batches are padded to these: timed themselves
  Key bucket = key;
  std::get<0>(bucket) = BucketRows(m);
  const auto source_key = bucket_sources_.find(bucket);
  if (source_key == bucket_sources_.end()) return false;
  const auto source = plans_.find(source_key->second);
  if (source == plans_.end() || !source->second.settled) return false;
  const Plan& timed = source->second;
  // cuBLASLt's pick must also take this m (its tile and split-k are checked against the shape),
  // the small-m kernel these operands.
  cublasLtMatmulHeuristicResult_t check{};
  const bool timed_algo_fits =
      timed.has_cublas &&
      cublasLtMatmulAlgoCheck(lt_, plan.op, plan.a, plan.b, plan.c, plan.c, &timed.algo, &check) ==
          CUBLAS_STATUS_SUCCESS &&
      check.workspaceSize <= kWorkspaceBytes;
  SmallMGemmArgs args = MakeSmallMGemmArgs(m, n, k, w, ldw, x, ldx, out, ldo, out_f32);
  args.splits = timed.small_m_splits;
  const bool small_m_fits = timed.small_m_splits > 0 && SmallMGemmSupports(args);
  if (!timed_algo_fits && fallback == nullptr && !small_m_fits) return false;  // plan it afresh

  plan.has_cublas = timed_algo_fits || fallback != nullptr;
  if (plan.has_cublas) plan.algo = timed_algo_fits ? timed.algo : *fallback;
  plan.small_m_splits = small_m_fits ? timed.small_m_splits : 0;
  const std::string from = "the plan of m = " + std::to_string(std::get<0>(source_key->second));
  plan.name = small_m_fits      ? timed.name + ", " + from
              : timed_algo_fits ? "cuBLASLt, " + from
                                : "cuBLASLt, heuristic's first (" + from + " does not fit)";
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  SIEVE_CUDA_CHECK(cudaStreamIsCapturing(stream_, &capture));
  const bool accumulate = std::get<8>(key);
  Settle(plan, m, n, k, w, ldx, ldo, out_f32, accumulate, capture != cudaStreamCaptureStatusNone);
  return true;
}

void GemmRunner::ContinuePlanning(Plan& plan, int64_t m, int64_t n, int64_t k,
                                  const __nv_bfloat16* w, int64_t ldw, const __nv_bfloat16* x,
                                  int64_t ldx, void* out, int64_t ldo, bool out_f32,
                                  bool accumulate) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  SIEVE_CUDA_CHECK(cudaStreamIsCapturing(stream_, &capture));
  const bool capturing = capture != cudaStreamCaptureStatusNone;
  const bool comes_round = std::find(plan.timed_weights.begin(), plan.timed_weights.end(), w) !=
                           plan.timed_weights.end();
  const int weights_to_time = m <= kMaxProbedRows ? kPlannedWeights : 1;
  if (!capturing && !comes_round && plan.medians.size() > 1) {
    TimeCandidates(plan, m, n, k, w, ldw, x, ldx, out, ldo, out_f32, accumulate);
    plan.timed_weights.push_back(w);
  }
  Choose(plan);
  if (capturing || comes_round || plan.medians.size() <= 1 ||
      static_cast<int>(plan.timed_weights.size()) >= weights_to_time) {
    Settle(plan, m, n, k, w, ldx, ldo, out_f32, accumulate, capturing);
  }
}

void GemmRunner::TimeCandidates(Plan& plan, int64_t m, int64_t n, int64_t k, const __nv_bfloat16* w,
                                int64_t ldw, const __nv_bfloat16* x, int64_t ldx, void* out,
                                int64_t ldo, bool out_f32, bool accumulate) {
  if (flush_ == nullptr && cudaMalloc(&flush_, flush_bytes_) != cudaSuccess) {
    cudaGetLastError();  // no room for the flush buffer: time with warm caches instead
    flush_ = nullptr;
  }
  const bool clusters = SmallMGemmHasClusters();
  if (!plan.split_candidates.empty() && !clusters) EnsureSplitBuffers();
  SmallMGemmArgs args = MakeSmallMGemmArgs(m, n, k, w, ldw, x, ldx, out, ldo, out_f32);
  args.split_sums = split_sums_;
  args.split_counters = split_counters_;
  const float alpha = 1.0f;
  const float beta = accumulate ? 1.0f : 0.0f;
  // An accumulating GEMM must not add its timing calls into `out` (the residual stream): they
  // write a scratch matrix of the same layout instead.
  void* target = out;
  void* scratch = nullptr;
  if (accumulate) {
    const size_t bytes = static_cast<size_t>(m) * ldo * (out_f32 ? 4 : 2);
    SIEVE_CUDA_CHECK(cudaMalloc(&scratch, bytes));
    SIEVE_CUDA_CHECK(cudaMemsetAsync(scratch, 0, bytes, stream_));
    target = scratch;
  }
  // The candidates: cuBLASLt's algos, then the small-m kernel's split counts.
  std::vector<std::function<bool()>> launches;
  for (const cublasLtMatmulAlgo_t& algo : plan.cublas_candidates) {
    launches.push_back([&, algo] {
      return cublasLtMatmul(lt_, plan.op, &alpha, w, plan.a, x, plan.b, &beta, target, plan.c,
                            target, plan.c, &algo, workspace_, kWorkspaceBytes,
                            stream_) == CUBLAS_STATUS_SUCCESS;
    });
  }
  args.out = target;
  args.accumulate = accumulate;
  for (const int split : plan.split_candidates) {
    launches.push_back([&, split] {
      SmallMGemmArgs split_args = args;
      split_args.splits = split;
      SmallMGemm(split_args, stream_);
      return true;
    });
  }
  // In a decode step x, the kernel before's output, sits in the L2 and the weights do not. The
  // output is not warmed: the residual stream the down GEMM adds into was last touched before
  // the 235 MB gate_up weights went through (warming it too, the down GEMM's pick cost the step
  // up to 0.1 ms; session 9, device run 5).
  const std::vector<float> medians =
      TimeLaunches(launches, AlignedInside(x, ((m - 1) * ldx + k) * 2),
                   m <= kMaxProbedRows ? kTimedRounds : kTimedRoundsPrefill);
  for (size_t index = 0; index < medians.size(); ++index) {
    plan.medians[index].push_back(medians[index]);
  }
  if (scratch != nullptr) {
    SIEVE_CUDA_CHECK(cudaStreamSynchronize(stream_));
    SIEVE_CUDA_CHECK(cudaFree(scratch));
  }
}

// A candidate's time: the mean of its medians over the weights it was timed on (a step runs it
// once per layer); negative if it refused any.
float GemmRunner::CandidateTime(const Plan& plan, size_t index) {
  const std::vector<float>& medians = plan.medians[index];
  if (medians.empty()) return -1.0f;
  float sum = 0.0f;
  for (const float median : medians) {
    if (median < 0) return -1.0f;
    sum += median;
  }
  return sum / static_cast<float>(medians.size());
}

void GemmRunner::Choose(Plan& plan) {
  const size_t cublas_count = plan.cublas_candidates.size();
  float best = -1.0f;
  float best_cublas = -1.0f;
  for (size_t index = 0; index < plan.medians.size(); ++index) {
    const float ms = CandidateTime(plan, index);
    if (ms < 0) continue;
    const bool is_cublas = index < cublas_count;
    if (is_cublas && (best_cublas < 0 || ms < best_cublas)) {
      best_cublas = ms;
      plan.algo = plan.cublas_candidates[index];
    }
    if (best < 0 || ms < best) {
      best = ms;
      if (is_cublas) {
        plan.small_m_splits = 0;
        plan.name = "cuBLASLt, candidate " + std::to_string(index + 1) + " of " +
                    std::to_string(cublas_count);
      } else {
        const int split = plan.split_candidates[index - cublas_count];
        plan.small_m_splits = split;
        plan.name = "small-m, " + std::to_string(split) + (split == 1 ? " split" : " splits");
      }
    }
  }
}

void GemmRunner::Settle(Plan& plan, int64_t m, int64_t n, int64_t k, const __nv_bfloat16* w,
                        int64_t ldx, int64_t ldo, bool out_f32, bool accumulate, bool capturing) {
  plan.settled = true;
  if (plan.small_m_splits > 1 && !SmallMGemmHasClusters()) EnsureSplitBuffers();
  if (plan.small_m_splits == 0) plan.name += Describe(plan.algo);
  if (plan.small_m_splits == 0 && plan.has_cublas && m <= kMaxProbedRows && !capturing &&
      !(accumulate && out_f32) && GraphPdlEnabled()) {
    plan.pdl = ProbeProgrammaticEdge(plan, m, n, k, w, ldx, ldo, out_f32, accumulate);
  }
  if (!verbose_) return;
  const size_t cublas_count = plan.cublas_candidates.size();
  for (size_t index = 0; index < plan.medians.size() && !plan.timed_weights.empty(); ++index) {
    const bool is_cublas = index < cublas_count;
    std::string label =
        is_cublas
            ? "cuBLASLt" + Describe(plan.cublas_candidates[index])
            : "small-m, " + std::to_string(plan.split_candidates[index - cublas_count]) + " splits";
    label += ", per weight";
    for (const float median : plan.medians[index]) {
      char text[16];
      std::snprintf(text, sizeof(text), " %.4f", median);
      label += text;
    }
    std::fprintf(stderr, "  %lld x %lld x %lld candidate %zu: %.4f ms, %s\n",
                 static_cast<long long>(m), static_cast<long long>(n), static_cast<long long>(k),
                 index + 1, CandidateTime(plan, index), label.c_str());
  }
  const std::string timed =
      plan.timed_weights.empty()
          ? ""
          : " (" + std::to_string(plan.timed_weights.size()) + " weights timed)";
  std::fprintf(stderr, "GEMM plan %lld x %lld x %lld%s%s: %s%s%s\n", static_cast<long long>(m),
               static_cast<long long>(n), static_cast<long long>(k), out_f32 ? " (f32 out)" : "",
               accumulate ? " (+=)" : "", plan.name.c_str(), timed.c_str(), plan.pdl.c_str());
}

std::string GemmRunner::ProbeProgrammaticEdge(const Plan& plan, int64_t m, int64_t n, int64_t k,
                                              const __nv_bfloat16* w, int64_t ldx, int64_t ldo,
                                              bool out_f32, bool accumulate) {
  const size_t x_bytes = static_cast<size_t>(m) * ldx * 2;
  const size_t out_count = static_cast<size_t>(m) * ldo;
  const DType out_type = out_f32 ? DType::kF32 : DType::kBF16;
  const size_t out_bytes = out_count * DTypeSize(out_type);
  // The probe's sources (x and, when accumulating, the output's prior values: bf16, since
  // accumulating f32 outputs are not probed) and the copies of them that the GEMM reads.
  void* x_source = nullptr;
  void* out_source = nullptr;
  __nv_bfloat16* x = nullptr;
  void* out = nullptr;
  SIEVE_CUDA_CHECK(cudaMalloc(&x_source, x_bytes));
  SIEVE_CUDA_CHECK(cudaMalloc(&x, x_bytes));
  SIEVE_CUDA_CHECK(cudaMalloc(&out, out_bytes));
  FillRandomBf16(static_cast<bf16*>(x_source), static_cast<int64_t>(x_bytes / 2), 0x5eed + n + k,
                 1.0f, stream_);
  std::vector<ProbeInput> inputs = {{x_source, x, x_bytes}};
  if (accumulate) {
    SIEVE_CUDA_CHECK(cudaMalloc(&out_source, out_bytes));
    FillRandomBf16(static_cast<bf16*>(out_source), static_cast<int64_t>(out_count), 0xacc + n, 1.0f,
                   stream_);
    inputs.push_back({out_source, out, out_bytes});
  }
  const float alpha = 1.0f;
  const float beta = accumulate ? 1.0f : 0.0f;
  const auto matmul = [&] {
    SIEVE_CUBLAS_CHECK(cublasLtMatmul(lt_, plan.op, &alpha, w, plan.a, x, plan.b, &beta, out,
                                      plan.c, out, plan.c, &plan.algo, workspace_, kWorkspaceBytes,
                                      stream_));
  };
  const auto download = [&] {
    std::vector<unsigned char> bytes(out_bytes);
    SIEVE_CUDA_CHECK(cudaMemcpy(bytes.data(), out, out_bytes, cudaMemcpyDeviceToHost));
    std::vector<float> values(out_count);
    ConvertToFloat(bytes.data(), out_type, out_count, values.data());
    return values;
  };
  // The reference: the same plan in plain stream order, on the same inputs.
  for (const ProbeInput& input : inputs) {
    SIEVE_CUDA_CHECK(cudaMemcpyAsync(input.target, input.source, input.bytes,
                                     cudaMemcpyDeviceToDevice, stream_));
  }
  matmul();
  SIEVE_CUDA_CHECK(cudaStreamSynchronize(stream_));
  const std::vector<float> reference = download();
  std::vector<std::string> names;
  const std::vector<const void*> kernels =
      sieve::cuda::ProbeProgrammaticEdge(matmul, inputs, stream_, &names);
  const std::vector<float> probed = download();
  for (void* buffer : {x_source, out_source, static_cast<void*>(x), out}) {
    if (buffer != nullptr) SIEVE_CUDA_CHECK(cudaFree(buffer));
  }
  if (kernels.empty()) return "; programmatic edges: none (no kernel right after its input)";

  // Agree within a few bf16 roundings of each value (split-k sums may be ordered differently);
  // a stale read is off by the size of the values themselves.
  double sum_squares = 0;
  for (int64_t row = 0; row < m; ++row) {
    for (int64_t col = 0; col < n; ++col) {
      const double r = reference[row * ldo + col];
      sum_squares += r * r;
    }
  }
  const double rms = std::sqrt(sum_squares / static_cast<double>(m * n));
  bool agree = true;
  for (int64_t row = 0; row < m && agree; ++row) {
    for (int64_t col = 0; col < n && agree; ++col) {
      const double r = reference[row * ldo + col];
      agree = std::fabs(probed[row * ldo + col] - r) <= 0.02 * std::fabs(r) + 0.02 * rms;
    }
  }
  std::string found =
      agree ? "; programmatic edges honoured by" : "; programmatic edges NOT honoured by";
  for (const std::string& name : names) {
    found.push_back(' ');
    found.append(name, 0, 60);
  }
  if (agree) MarkHonorsProgrammaticEdges(kernels);
  return found;
}

void GemmRunner::Run(int64_t m, int64_t n, int64_t k, const __nv_bfloat16* w, int64_t ldw,
                     const __nv_bfloat16* x, int64_t ldx, void* out, int64_t ldo, bool out_f32,
                     bool accumulate) {
  if (m == 0 || n == 0) return;
  const Plan& plan = PlanFor(m, n, k, w, ldw, x, ldx, out, ldo, out_f32, accumulate);
  last_plan_ = &plan;
  if (plan.small_m_splits > 0) {
    SmallMGemmArgs args = MakeSmallMGemmArgs(m, n, k, w, ldw, x, ldx, out, ldo, out_f32);
    args.splits = plan.small_m_splits;
    args.accumulate = accumulate;
    args.split_sums = split_sums_;
    args.split_counters = split_counters_;
    if (SmallMGemmSupports(args)) {
      SmallMGemm(args, stream_);
      return;
    }
    if (!plan.has_cublas) {
      std::fprintf(stderr, "GEMM %lldx%lldx%lld: misaligned operands and no cuBLASLt algo\n",
                   static_cast<long long>(m), static_cast<long long>(n), static_cast<long long>(k));
      std::abort();
    }
  }
  const float alpha = 1.0f;
  const float beta = accumulate ? 1.0f : 0.0f;
  SIEVE_CUBLAS_CHECK(cublasLtMatmul(lt_, plan.op, &alpha, w, plan.a, x, plan.b, &beta, out, plan.c,
                                    out, plan.c, &plan.algo, workspace_, kWorkspaceBytes, stream_));
  NoteNonTriggeringLaunch(stream_);  // pdl.cuh: the kernel after it launches plainly
}

}  // namespace sieve::cuda
