#include "backend/cuda/gemm.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/skinny_gemm.h"
#include "core/check.h"

namespace sieve::cuda {
namespace {

constexpr size_t kWorkspaceBytes = 32u << 20;
// How many of cuBLASLt's heuristic candidates a plan times. 16 or 32 picked the same plans of the
// decode step and did not make it faster (bench/results/2026-12-01-s9-h200-pdl-candidates.json,
// 2026-12-01-s10-h200-silu-order.json).
constexpr int kCublasCandidates = 8;
// Timed calls per candidate and weight. With 3 calls each, one after another, and the best of them
// kept, the gate_up GEMM's six leading candidates (59-63 us apart by 2 us of noise) were ranked
// differently from run to run, and the ones picked in some processes cost the decode step 0.1 ms
// (bench/results/2026-12-01-s9-h200-planner-warm-x.json, README_gemm.md). Two per weight over
// four weights: 8 calls a candidate, so the planning wait of a new shape (prefill chunks of each
// new size up to 1024 rows plan this way too) stays short.
constexpr int kTimedRounds = 2;
// How many of a decode shape's weights (one per layer) its candidates are timed on. Some kernels'
// speed depends on which layer's weights they read: cuBLASLt's third gate_up candidate took
// 0.0598-0.0643 ms on the first four layers' weights, the second 0.0590-0.0615
// (bench/results/2026-12-01-s10-h200-planner-weights.json); timed on layer 0 alone, the third
// sometimes won and, 5% slower over the step's 32 layers, cost the step 0.07-0.1 ms. So planning
// goes on through the first layers' calls of the eager step before a capture, and a candidate's
// time is its mean over the weights.
constexpr int kPlannedWeights = 4;
// Shapes up to this many rows are decode batches (or small prefill chunks) and are timed as above.
// Larger ones (prefill chunks, planned on the first step of each new token count, with the request
// waiting) are compute-bound, where the candidates are far apart: one weight, 3 calls each.
constexpr int64_t kMaxDecodeRows = 1024;
constexpr int kTimedRoundsPrefill = 3;

// Re-tiled candidates. cuBLASLt's heuristic offers 8 configurations of its one Hopper algo, and
// for the down GEMM at m = 64 none without a split-k (whose f32 reduction is a kernel more, 3 us a
// layer). The same algo re-tiled fills the GPU otherwise: 32 x 64 tiles give the down GEMM 128
// CTAs unsplit, 0.0349 ms against the heuristic's best 0.0355 alone and 1.06 against 1.11-1.15 ms
// a step (bench/results/2026-12-01-s11-h200-retile.json). So decode shapes (m <= kMaxRetiledRows)
// also time the heuristic's first configuration with each tile below (rows of w x rows of x, the
// cublasLtMatmulTile_t ids) and split-k 1-4, wherever the grid comes to half a wave to one wave
// (60-132 CTAs) or two full waves (232-264) on the H200's 132 SMs, and cublasLtMatmulAlgoCheck
// takes it. (All grids of 48-264 CTAs, 90-100 candidates a shape, picked no faster a step:
// bench/results/2026-12-01-s11-h200-retile-broad.json.)
struct TileShape {
  uint32_t id;
  int rows;
  int cols;
};
constexpr TileShape kRetiledTiles[] = {
    {3, 16, 8},     {6, 32, 8},     {10, 64, 8},    {393, 128, 8},  {448, 192, 8},  {486, 256, 8},
    {514, 320, 8},  {537, 384, 8},  {556, 448, 8},  {573, 512, 8},  {588, 576, 8},  {601, 640, 8},
    {612, 704, 8},  {622, 768, 8},  {5, 16, 16},    {9, 32, 16},    {312, 64, 16},  {394, 128, 16},
    {449, 192, 16}, {487, 256, 16}, {515, 320, 16}, {538, 384, 16}, {557, 448, 16}, {574, 512, 16},
    {589, 576, 16}, {602, 640, 16}, {613, 704, 16}, {623, 768, 16}, {8, 16, 32},    {11, 32, 32},
    {13, 64, 32},   {16, 128, 32},  {451, 192, 32}, {35, 256, 32},  {517, 320, 32}, {540, 384, 32},
    {559, 448, 32}, {576, 512, 32}, {591, 576, 32}, {604, 640, 32}, {615, 704, 32}, {625, 768, 32},
    {47, 16, 64},   {59, 24, 64},   {12, 32, 64},   {80, 40, 64},   {92, 48, 64},   {104, 56, 64},
    {15, 64, 64},   {124, 72, 64},  {134, 80, 64},  {143, 88, 64},  {27, 96, 64},   {157, 104, 64},
    {164, 112, 64}, {170, 120, 64}, {18, 128, 64},  {178, 136, 64}, {183, 144, 64}, {188, 152, 64},
    {193, 160, 64}, {196, 168, 64}, {200, 176, 64}, {204, 184, 64}, {208, 192, 64}, {211, 200, 64},
    {214, 208, 64}, {217, 216, 64}, {220, 224, 64}, {223, 232, 64}, {226, 240, 64}, {229, 248, 64},
    {21, 256, 64},  {233, 264, 64}, {235, 272, 64}, {237, 280, 64}, {239, 288, 64}, {241, 296, 64},
    {243, 304, 64}, {245, 312, 64}, {247, 320, 64}, {249, 328, 64}, {251, 336, 64}, {253, 344, 64},
    {255, 352, 64}, {257, 360, 64}, {259, 368, 64}, {261, 376, 64}, {263, 384, 64}, {265, 392, 64},
    {266, 400, 64}, {267, 408, 64}, {268, 416, 64}, {269, 424, 64}, {270, 432, 64}, {271, 440, 64},
    {272, 448, 64}, {273, 456, 64}, {274, 464, 64}, {275, 472, 64}, {276, 480, 64}, {277, 488, 64},
    {278, 496, 64}, {279, 504, 64}, {25, 512, 64},  {280, 520, 64}, {281, 528, 64}, {282, 536, 64},
    {283, 544, 64}, {284, 552, 64}, {285, 560, 64}, {286, 568, 64}, {287, 576, 64}, {288, 584, 64},
    {289, 592, 64}, {290, 600, 64}, {291, 608, 64}, {292, 616, 64}, {293, 624, 64}, {294, 632, 64},
    {295, 640, 64}, {296, 648, 64}, {297, 656, 64}, {298, 664, 64}, {299, 672, 64}, {300, 680, 64},
    {301, 688, 64}, {302, 696, 64}, {303, 704, 64}, {304, 712, 64}, {305, 720, 64}, {306, 728, 64},
    {307, 736, 64}, {308, 744, 64}, {309, 752, 64}, {310, 760, 64}, {311, 768, 64}};
constexpr int64_t kMaxRetiledRows = 256;
constexpr int kMaxRetiledSplits = 4;
bool RetiledGridFits(int64_t ctas) {
  return (ctas >= 60 && ctas <= 132) || (ctas >= 232 && ctas <= 264);
}

// Above the fastest candidate by at most this much (alone), a plan's next candidates stay options
// for step tuning (runtime/step_tuning.h), at most kTuningOptions in all: alone, gate_up's
// candidate 3 timed 0.0600 ms against candidate 2's 0.0604, yet made the step 0.12 ms slower (5.65
// against 5.53 ms; bench/results/2026-12-01-s11-h200-retile-broad.json).
constexpr float kTuningMargin = 0.03f;
constexpr size_t kTuningOptions = 3;

// One attribute of an algo's configuration, or -1.
int AlgoConfig(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t attribute) {
  uint32_t value = 0;
  size_t written = 0;
  if (cublasLtMatmulAlgoConfigGetAttribute(&algo, attribute, &value, sizeof(value), &written) ==
      CUBLAS_STATUS_SUCCESS) {
    return static_cast<int>(value);
  }
  uint16_t narrow = 0;  // the inner and cluster shape ids are 16-bit
  if (cublasLtMatmulAlgoConfigGetAttribute(&algo, attribute, &narrow, sizeof(narrow), &written) ==
      CUBLAS_STATUS_SUCCESS) {
    return narrow;
  }
  return -1;
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
  const int cluster = get(CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID);
  if (cluster > 0) text += ", cluster shape " + std::to_string(cluster);
  if (splits > 1) {
    text += scheme == CUBLASLT_REDUCTION_SCHEME_INPLACE        ? " in place"
            : scheme == CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE ? " via f32 workspace"
            : scheme == CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE  ? " via output-type workspace"
                                                               : "";
  }
  return text + ")";
}

}  // namespace

std::pair<const void*, size_t> AlignedInside(const void* data, int64_t bytes) {
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(data) + 15) / 16 * 16;
  const uintptr_t end =
      (reinterpret_cast<uintptr_t>(data) + static_cast<uintptr_t>(bytes)) / 16 * 16;
  return {reinterpret_cast<const void*>(begin), end > begin ? end - begin : 0};
}

cublasLtMatmulPreference_t MakeGemmPreference(size_t workspace_bytes, uint32_t reduction_mask) {
  cublasLtMatmulPreference_t preference = nullptr;
  SIEVE_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference));
  SIEVE_CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                           &workspace_bytes, sizeof(workspace_bytes)));
  SIEVE_CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                           &reduction_mask, sizeof(reduction_mask)));
  return preference;
}

cublasLtMatmulDesc_t MakeWeightTransposedDesc() {
  cublasLtMatmulDesc_t op = nullptr;
  SIEVE_CUBLAS_CHECK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t transpose = CUBLAS_OP_T;
  const cublasOperation_t none = CUBLAS_OP_N;
  SIEVE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &transpose,
                                                    sizeof(transpose)));
  SIEVE_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &none, sizeof(none)));
  return op;
}

GemmRunner::GemmRunner(cudaStream_t stream)
    : stream_(stream), tuning_options_(kTuningOptions), tuning_margin_(kTuningMargin) {
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

void GemmRunner::DestroyPlans() {
  for (auto& [key, plan] : plans_) {
    if (plan.op != nullptr) cublasLtMatmulDescDestroy(plan.op);
    if (plan.a != nullptr) cublasLtMatrixLayoutDestroy(plan.a);
    if (plan.b != nullptr) cublasLtMatrixLayoutDestroy(plan.b);
    if (plan.c != nullptr) cublasLtMatrixLayoutDestroy(plan.c);
  }
  plans_.clear();
  bucket_sources_.clear();
  scope_.clear();
  last_plan_ = nullptr;
}

void GemmRunner::SetBatchInvariant(bool on) {
  if (on == batch_invariant_) return;
  // Plans made under the other mode are not this mode's: made again on their next use. Descriptors
  // a queued cuBLASLt call may still read are destroyed only once the stream is done with them.
  SIEVE_CUDA_CHECK(cudaStreamSynchronize(stream_));
  DestroyPlans();
  batch_invariant_ = on;
}

GemmRunner::~GemmRunner() {
  cudaStreamSynchronize(stream_);
  DestroyPlans();
  cudaFree(workspace_);
  cudaFree(flush_);
  cudaEventDestroy(start_);
  cudaEventDestroy(stop_);
  cublasLtDestroy(lt_);
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
    // upper one, a single slowed call of gate_up's candidate 2 made it lose to candidate 3 in one
    // process, 0.1 ms slower a step (bench/results/2026-12-01-s10-h200-silu-order.json).
    medians[index] = times[index][(times[index].size() - 1) / 2];
  }
  return medians;
}

GemmRunner::Plan& GemmRunner::PlanFor(int64_t m, int64_t n, int64_t k, const __nv_bfloat16* w,
                                      int64_t ldw, const __nv_bfloat16* x, int64_t ldx, void* out,
                                      int64_t ldo, bool out_f32, bool accumulate) {
  const Key key{m, n, k, ldw, ldx, ldo, out_f32, accumulate};
  const auto found = plans_.find(key);
  if (batch_invariant_ && found == plans_.end()) {
    return InvariantPlan(key, m, n, k, ldw, ldx, ldo, out_f32);
  }
  if (found != plans_.end()) {
    Plan& plan = found->second;
    if (!plan.settled) {
      ContinuePlanning(plan, m, n, k, w, ldw, x, ldx, out, ldo, out_f32, accumulate);
    }
    return plan;
  }
  Plan plan;

  plan.op = MakeWeightTransposedDesc();
  const cudaDataType_t out_type = out_f32 ? CUDA_R_32F : CUDA_R_16BF;
  SIEVE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.a, CUDA_R_16BF, k, n, ldw));
  SIEVE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.b, CUDA_R_16BF, k, m, ldx));
  SIEVE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.c, out_type, n, m, ldo));
  // Any split-k reduction: with none, the sparse decode step read 6.77 ms against 5.87
  // (bench/results/2026-12-01-s6-h200-step.json, "no split-k GEMMs").
  cublasLtMatmulPreference_t preference =
      MakeGemmPreference(kWorkspaceBytes, CUBLASLT_REDUCTION_SCHEME_MASK);
  std::vector<cublasLtMatmulHeuristicResult_t> results(kCublasCandidates);
  int cublas_count = 0;
  SIEVE_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(lt_, plan.op, plan.a, plan.b, plan.c, plan.c,
                                                    preference, static_cast<int>(results.size()),
                                                    results.data(), &cublas_count));
  cublasLtMatmulPreferenceDestroy(preference);

  if (SkinnyGemmSupports(m, k, w, ldw, x, ldx)) plan.skinny_splits = SkinnyGemmSplits(k);
  if (ReusePlanOfBucket(plan, key, m, n, k, out_f32,
                        cublas_count > 0 ? &results[0].algo : nullptr)) {
    return plans_.emplace(key, std::move(plan)).first->second;
  }
  if (cublas_count == 0) {
    std::fprintf(stderr, "no GEMM for %lldx%lldx%lld\n", static_cast<long long>(m),
                 static_cast<long long>(n), static_cast<long long>(k));
    std::abort();
  }

  // Without timing (inside a capture): cuBLASLt's first pick.
  plan.algo = results[0].algo;
  for (int candidate = 0; candidate < cublas_count; ++candidate) {
    plan.cublas_candidates.push_back(results[candidate].algo);
  }
  plan.heuristic_count = plan.cublas_candidates.size();
  if (m <= kMaxRetiledRows) {
    for (const cublasLtMatmulAlgo_t& algo :
         RetiledCandidates(plan, m, n, results.data(), cublas_count)) {
      plan.cublas_candidates.push_back(algo);
    }
  }
  plan.medians.resize(CandidateCount(plan));
  plan.name = "cuBLASLt, candidate 1 of " + std::to_string(CandidateCount(plan));
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

const cublasLtMatmulAlgo_t& GemmRunner::InvariantAlgo(int64_t n, int64_t k, bool out_f32) {
  const auto key = std::make_tuple(n, k, out_f32);
  const auto found = invariant_algos_.find(key);
  if (found != invariant_algos_.end()) return found->second;
  // The heuristic asked once, for one m and contiguous operands: what it answers depends on
  // (n, k, output type), the device and the cuBLASLt version only, so every process with the
  // same model and GPU picks the same configuration.
  const int64_t m = kInvariantPlanRows;
  cublasLtMatmulDesc_t op = MakeWeightTransposedDesc();
  cublasLtMatrixLayout_t a = nullptr;
  cublasLtMatrixLayout_t b = nullptr;
  cublasLtMatrixLayout_t c = nullptr;
  SIEVE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&a, CUDA_R_16BF, k, n, k));
  SIEVE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&b, CUDA_R_16BF, k, m, k));
  SIEVE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&c, out_f32 ? CUDA_R_32F : CUDA_R_16BF, n, m, n));
  // No reduction scheme: no split-k, whose partial sums would be added in an order set by the
  // split count.
  cublasLtMatmulPreference_t preference =
      MakeGemmPreference(kWorkspaceBytes, CUBLASLT_REDUCTION_SCHEME_NONE);
  std::vector<cublasLtMatmulHeuristicResult_t> results(kCublasCandidates);
  int count = 0;
  if (cublasLtMatmulAlgoGetHeuristic(lt_, op, a, b, c, c, preference,
                                     static_cast<int>(results.size()), results.data(),
                                     &count) != CUBLAS_STATUS_SUCCESS) {
    count = 0;  // none: the check below says so
  }
  cublasLtMatmulPreferenceDestroy(preference);
  // The first of the heuristic's answers that takes every m a step may have (a configuration
  // refusing one at run time could not be replaced): the choice still depends on (n, k) only.
  std::vector<std::pair<cublasLtMatrixLayout_t, cublasLtMatrixLayout_t>> probes;
  for (const int64_t rows : kInvariantProbeRows) {
    cublasLtMatrixLayout_t probe_b = nullptr;
    cublasLtMatrixLayout_t probe_c = nullptr;
    SIEVE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&probe_b, CUDA_R_16BF, k, rows, k));
    SIEVE_CUBLAS_CHECK(
        cublasLtMatrixLayoutCreate(&probe_c, out_f32 ? CUDA_R_32F : CUDA_R_16BF, n, rows, n));
    probes.emplace_back(probe_b, probe_c);
  }
  std::optional<cublasLtMatmulAlgo_t> chosen;
  for (int index = 0; index < count && !chosen; ++index) {
    if (AlgoConfig(results[index].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM) > 1) continue;
    cublasLtMatmulAlgo_t algo = results[index].algo;
    // Stated, not left to the kernel's defaults: one piece of k, reduced by no one.
    const int32_t one = 1;
    const uint32_t none = CUBLASLT_REDUCTION_SCHEME_NONE;
    cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &one, sizeof(one));
    cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &none,
                                         sizeof(none));
    bool takes_every_m = true;
    for (const auto& [probe_b, probe_c] : probes) {
      cublasLtMatmulHeuristicResult_t check{};
      takes_every_m = takes_every_m &&
                      cublasLtMatmulAlgoCheck(lt_, op, a, probe_b, probe_c, probe_c, &algo,
                                              &check) == CUBLAS_STATUS_SUCCESS &&
                      check.workspaceSize <= kWorkspaceBytes;
    }
    if (takes_every_m) chosen = algo;
  }
  for (const auto& [probe_b, probe_c] : probes) {
    cublasLtMatrixLayoutDestroy(probe_b);
    cublasLtMatrixLayoutDestroy(probe_c);
  }
  cublasLtMatrixLayoutDestroy(a);
  cublasLtMatrixLayoutDestroy(b);
  cublasLtMatrixLayoutDestroy(c);
  cublasLtMatmulDescDestroy(op);
  SIEVE_CHECK(chosen.has_value())
      << "cuBLASLt offers no GEMM without split-k for n " << n << ", k " << k
      << " that takes every row count: --batch-invariant cannot run this model here";
  const cublasLtMatmulAlgo_t algo = *chosen;
  if (verbose_) {
    std::fprintf(stderr, "GEMM plan of every m x %lld x %lld%s (batch-invariant):%s\n",
                 static_cast<long long>(n), static_cast<long long>(k), out_f32 ? " (f32 out)" : "",
                 Describe(algo).c_str());
  }
  return invariant_algos_.emplace(key, algo).first->second;
}

GemmRunner::Plan& GemmRunner::InvariantPlan(const Key& key, int64_t m, int64_t n, int64_t k,
                                            int64_t ldw, int64_t ldx, int64_t ldo, bool out_f32) {
  Plan plan;
  plan.op = MakeWeightTransposedDesc();
  SIEVE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.a, CUDA_R_16BF, k, n, ldw));
  SIEVE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.b, CUDA_R_16BF, k, m, ldx));
  SIEVE_CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&plan.c, out_f32 ? CUDA_R_32F : CUDA_R_16BF, n, m, ldo));
  plan.algo = InvariantAlgo(n, k, out_f32);
  cublasLtMatmulHeuristicResult_t check{};
  const cublasStatus_t status =
      cublasLtMatmulAlgoCheck(lt_, plan.op, plan.a, plan.b, plan.c, plan.c, &plan.algo, &check);
  // A tile covers any m; only strides the configuration cannot read would fail, and no other
  // configuration may stand in (its rows would differ).
  SIEVE_CHECK(status == CUBLAS_STATUS_SUCCESS && check.workspaceSize <= kWorkspaceBytes)
      << "the batch-invariant GEMM configuration of n " << n << ", k " << k << " does not take m "
      << m << " (strides " << ldw << ", " << ldx << ", " << ldo << "): cuBLASLt status "
      << static_cast<int>(status);
  plan.settled = true;
  plan.closed = true;
  plan.name = "cuBLASLt, batch-invariant" + Describe(plan.algo);
  plan.shape = std::to_string(m) + " x " + std::to_string(n) + " x " + std::to_string(k) +
               (out_f32 ? " (f32 out)" : "") + (std::get<7>(key) ? " (+=)" : "");
  return plans_.emplace(key, std::move(plan)).first->second;
}

std::vector<cublasLtMatmulAlgo_t> GemmRunner::RetiledCandidates(
    const Plan& plan, int64_t m, int64_t n, const cublasLtMatmulHeuristicResult_t* heuristic,
    int heuristic_count) {
  std::vector<cublasLtMatmulAlgo_t> retiled;
  for (const TileShape& tile : kRetiledTiles) {
    for (int32_t split = 1; split <= kMaxRetiledSplits; ++split) {
      const int64_t ctas =
          (n + tile.rows - 1) / tile.rows * ((m + tile.cols - 1) / tile.cols) * split;
      if (!RetiledGridFits(ctas)) continue;
      const uint32_t scheme =
          split > 1 ? CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE : CUBLASLT_REDUCTION_SCHEME_NONE;
      bool offered = false;  // by the heuristic already
      for (int index = 0; index < heuristic_count && !offered; ++index) {
        offered = AlgoConfig(heuristic[index].algo, CUBLASLT_ALGO_CONFIG_TILE_ID) ==
                      static_cast<int>(tile.id) &&
                  AlgoConfig(heuristic[index].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM) == split;
      }
      if (offered) continue;
      // The heuristic's first configuration re-tiled; the first cluster shape the algo accepts
      // for it (auto, 1x1, 2x1, 1x2).
      for (const uint16_t cluster : {CUBLASLT_CLUSTER_SHAPE_AUTO, CUBLASLT_CLUSTER_SHAPE_1x1x1,
                                     CUBLASLT_CLUSTER_SHAPE_2x1x1, CUBLASLT_CLUSTER_SHAPE_1x2x1}) {
        cublasLtMatmulAlgo_t algo = heuristic[0].algo;
        cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile.id,
                                             sizeof(tile.id));
        cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &split,
                                             sizeof(split));
        cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme,
                                             sizeof(scheme));
        cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cluster,
                                             sizeof(cluster));
        cublasLtMatmulHeuristicResult_t check{};
        if (cublasLtMatmulAlgoCheck(lt_, plan.op, plan.a, plan.b, plan.c, plan.c, &algo, &check) ==
                CUBLAS_STATUS_SUCCESS &&
            check.workspaceSize <= kWorkspaceBytes) {
          retiled.push_back(algo);
          break;
        }
      }
    }
  }
  return retiled;
}

int64_t GemmRunner::BucketRows(int64_t m) {
  int64_t bucket = 1;
  while (bucket < m) bucket *= 2;
  return bucket;
}

bool GemmRunner::ReusePlanOfBucket(Plan& plan, const Key& key, int64_t m, int64_t n, int64_t k,
                                   bool out_f32, const cublasLtMatmulAlgo_t* fallback) {
  if (m == BucketRows(m)) return false;  // decode batches are padded to these: timed themselves
  Key bucket = key;
  std::get<0>(bucket) = BucketRows(m);
  const auto source_key = bucket_sources_.find(bucket);
  if (source_key == bucket_sources_.end()) return false;
  const auto source = plans_.find(source_key->second);
  if (source == plans_.end() || !source->second.settled) return false;
  const Plan& timed = source->second;
  // cuBLASLt's pick must also take this m (its tile and split-k are checked against the shape).
  cublasLtMatmulHeuristicResult_t check{};
  const bool timed_algo_fits =
      cublasLtMatmulAlgoCheck(lt_, plan.op, plan.a, plan.b, plan.c, plan.c, &timed.algo, &check) ==
          CUBLAS_STATUS_SUCCESS &&
      check.workspaceSize <= kWorkspaceBytes;
  if (!timed_algo_fits && fallback == nullptr) return false;  // plan it afresh

  plan.algo = timed_algo_fits ? timed.algo : *fallback;
  const std::string from = "the plan of m = " + std::to_string(std::get<0>(source_key->second));
  plan.skinny = plan.skinny_splits.empty() ? 0 : timed.skinny;
  plan.name = plan.skinny > 0
                  ? "skinny kernel, k split " + std::to_string(plan.skinny) + ", " + from
              : timed_algo_fits ? "cuBLASLt, " + from
                                : "cuBLASLt, heuristic's first (" + from + " does not fit)";
  const bool accumulate = std::get<7>(key);
  Settle(plan, m, n, k, out_f32, accumulate);
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
  const int weights_to_time = m <= kMaxDecodeRows ? kPlannedWeights : 1;
  if (!capturing && !comes_round && plan.medians.size() > 1) {
    TimeCandidates(plan, m, n, k, w, ldw, x, ldx, out, ldo, out_f32, accumulate);
    plan.timed_weights.push_back(w);
  }
  Choose(plan);
  if (capturing || comes_round || plan.medians.size() <= 1 ||
      static_cast<int>(plan.timed_weights.size()) >= weights_to_time) {
    Settle(plan, m, n, k, out_f32, accumulate);
  }
}

void GemmRunner::TimeCandidates(Plan& plan, int64_t m, int64_t n, int64_t k, const __nv_bfloat16* w,
                                int64_t ldw, const __nv_bfloat16* x, int64_t ldx, void* out,
                                int64_t ldo, bool out_f32, bool accumulate) {
  if (flush_ == nullptr && cudaMalloc(&flush_, flush_bytes_) != cudaSuccess) {
    cudaGetLastError();  // no room for the flush buffer: time with warm caches instead
    flush_ = nullptr;
  }
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
  std::vector<std::function<bool()>> launches;
  for (const cublasLtMatmulAlgo_t& algo : plan.cublas_candidates) {
    launches.push_back([&, algo] {
      return cublasLtMatmul(lt_, plan.op, &alpha, w, plan.a, x, plan.b, &beta, target, plan.c,
                            target, plan.c, &algo, workspace_, kWorkspaceBytes,
                            stream_) == CUBLAS_STATUS_SUCCESS;
    });
  }
  for (const int splits : plan.skinny_splits) {
    launches.push_back([&, splits] {
      if (!SkinnyGemmSupports(m, k, w, ldw, x, ldx)) return false;
      // A plain launch: with PDL its first weight loads could start before the timing's start
      // event, under the flush, and time it short.
      NoteNonTriggeringLaunch(stream_);
      SkinnyGemm(m, n, k, w, ldw, x, ldx, target, ldo, out_f32, accumulate, splits, stream_);
      return true;
    });
  }
  // In a decode step x, the kernel before's output, sits in the L2 and the weights do not. The
  // output is not warmed: the residual stream the down GEMM adds into was last touched before
  // the 235 MB gate_up weights went through (warming it too moved the down GEMM's pick and cost
  // the step up to 0.1 ms: bench/results/2026-12-01-s9-h200-final-ab.json, the appended run).
  const std::vector<float> medians =
      TimeLaunches(launches, AlignedInside(x, ((m - 1) * ldx + k) * 2),
                   m <= kMaxDecodeRows ? kTimedRounds : kTimedRoundsPrefill);
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

std::string GemmRunner::CandidateName(const Plan& plan, size_t index) {
  const std::string of = " of " + std::to_string(CandidateCount(plan));
  if (IsSkinny(plan, index)) {
    const int splits = plan.skinny_splits[index - plan.cublas_candidates.size()];
    return "skinny kernel, k split " + std::to_string(splits) + ", candidate " +
           std::to_string(index + 1) + of;
  }
  return "cuBLASLt, candidate " + std::to_string(index + 1) + of +
         (index >= plan.heuristic_count ? ", re-tiled" : "");
}

std::string GemmRunner::OptionName(const Plan& plan, size_t index) {
  if (IsSkinny(plan, index)) return CandidateName(plan, index);
  return CandidateName(plan, index) + Describe(plan.cublas_candidates[index]);
}

void GemmRunner::Apply(Plan& plan, int index) {
  const size_t at = static_cast<size_t>(index);
  plan.chosen = index;
  plan.skinny = IsSkinny(plan, at) ? plan.skinny_splits[at - plan.cublas_candidates.size()] : 0;
  if (plan.skinny == 0) plan.algo = plan.cublas_candidates[at];
  plan.name = CandidateName(plan, at);
}

void GemmRunner::Choose(Plan& plan) {
  // cuBLASLt's fastest first, so that its algo stays the plan's whatever wins.
  for (const bool skinny : {false, true}) {
    int best = -1;
    float best_ms = -1.0f;
    for (size_t index = 0; index < plan.medians.size(); ++index) {
      const float ms = CandidateTime(plan, index);
      if (ms < 0 || (!skinny && IsSkinny(plan, index))) continue;
      if (best_ms < 0 || ms < best_ms) {
        best_ms = ms;
        best = static_cast<int>(index);
      }
    }
    if (best >= 0) Apply(plan, best);
  }
}

void GemmRunner::Settle(Plan& plan, int64_t m, int64_t n, int64_t k, bool out_f32,
                        bool accumulate) {
  plan.settled = true;
  plan.shape = std::to_string(m) + " x " + std::to_string(n) + " x " + std::to_string(k) +
               (out_f32 ? " (f32 out)" : "") + (accumulate ? " (+=)" : "");
  if (plan.chosen >= 0) {
    // The skinny kernel's fastest split, if it is a candidate.
    int skinny = -1;
    for (size_t index = plan.cublas_candidates.size(); index < plan.medians.size(); ++index) {
      const float ms = CandidateTime(plan, index);
      if (ms >= 0 && (skinny < 0 || ms < CandidateTime(plan, static_cast<size_t>(skinny)))) {
        skinny = static_cast<int>(index);
      }
    }
    if (m == 1 && skinny >= 0) {
      // One row (a batch-1 decode step): the skinny kernel, with no other option. Its gain is in
      // the chain: each skinny GEMM streams its weights under the kernel before it, which a
      // cuBLASLt kernel (never triggering its dependents early) does not allow. Step tuning,
      // deciding one GEMM at a time, kept cuBLASLt's down GEMM and mostly its o GEMM (a skinny one
      // alone among cuBLASLt neighbours tied or lost); the skinny kernel in every GEMM made the
      // served C = 1 step 4.26 ms against 4.35
      // (bench/results/2026-12-04-h200-serve-c1-skinny-everywhere.json).
      Apply(plan, skinny);
      plan.options = {skinny};
    } else {
      // Step tuning's options: the pick, then the candidates within kTuningMargin of it alone.
      const float best = CandidateTime(plan, static_cast<size_t>(plan.chosen));
      std::vector<std::pair<float, int>> near;
      for (size_t index = 0; index < plan.medians.size(); ++index) {
        const float ms = CandidateTime(plan, index);
        if (ms >= 0 && static_cast<int>(index) != plan.chosen &&
            ms <= best * (1 + tuning_margin_)) {
          near.emplace_back(ms, static_cast<int>(index));
        }
      }
      std::sort(near.begin(), near.end());
      plan.options = {plan.chosen};
      for (const auto& [ms, index] : near) {
        if (plan.options.size() < tuning_options_) plan.options.push_back(index);
      }
      // The skinny kernel's fastest split is an option however it timed alone: in a step it
      // starts streaming its weights while the kernel before still runs, which no timing alone
      // shows. At batch 1 the step took the skinny down GEMM though cuBLASLt's was faster alone
      // (4.35 against 4.47 ms a step; bench/results/2026-12-03-h200-decode-skinny-gemm-ab.json).
      const bool has_skinny = std::any_of(plan.options.begin(), plan.options.end(), [&](int index) {
        return IsSkinny(plan, static_cast<size_t>(index));
      });
      if (skinny >= 0 && !has_skinny) {
        if (plan.options.size() >= std::max<size_t>(tuning_options_, 2)) plan.options.pop_back();
        plan.options.push_back(skinny);
      }
    }
  }
  if (plan.skinny == 0) plan.name += Describe(plan.algo);
  if (!verbose_) return;
  for (size_t index = 0; index < plan.medians.size() && !plan.timed_weights.empty(); ++index) {
    std::string label = OptionName(plan, index) + ", per weight";
    for (const float median : plan.medians[index]) {
      char text[16];
      std::snprintf(text, sizeof(text), " %.4f", median);
      label += text;
    }
    std::fprintf(stderr, "  %s: %.4f ms, %s\n", plan.shape.c_str(), CandidateTime(plan, index),
                 label.c_str());
  }
  const std::string timed =
      plan.timed_weights.empty()
          ? ""
          : " (" + std::to_string(plan.timed_weights.size()) + " weights timed)";
  std::fprintf(stderr, "GEMM plan %s: %s%s\n", plan.shape.c_str(), plan.name.c_str(),
               timed.c_str());
}

void GemmRunner::Run(int64_t m, int64_t n, int64_t k, const __nv_bfloat16* w, int64_t ldw,
                     const __nv_bfloat16* x, int64_t ldx, void* out, int64_t ldo, bool out_f32,
                     bool accumulate) {
  if (m == 0 || n == 0) return;
  Plan& plan = PlanFor(m, n, k, w, ldw, x, ldx, out, ldo, out_f32, accumulate);
  last_plan_ = &plan;
  if (plan.options.size() > 1 && !plan.closed &&
      std::find(scope_.begin(), scope_.end(), &plan) == scope_.end()) {
    scope_.push_back(&plan);
  }
  if (plan.skinny > 0 && SkinnyGemmSupports(m, k, w, ldw, x, ldx)) {
    SkinnyGemm(m, n, k, w, ldw, x, ldx, out, ldo, out_f32, accumulate, plan.skinny, stream_);
    return;
  }
  const float alpha = 1.0f;
  const float beta = accumulate ? 1.0f : 0.0f;
  SIEVE_CUBLAS_CHECK(cublasLtMatmul(lt_, plan.op, &alpha, w, plan.a, x, plan.b, &beta, out, plan.c,
                                    out, plan.c, &plan.algo, workspace_, kWorkspaceBytes, stream_));
  NoteNonTriggeringLaunch(stream_);  // pdl.cuh: the kernel after it launches plainly
}

std::vector<GemmRunner::OpenPlan> GemmRunner::OpenPlans() const {
  std::vector<OpenPlan> open;
  for (const Plan* plan : scope_) {
    if (plan->closed) continue;
    OpenPlan entry{plan->shape, {}};
    for (const int option : plan->options) {
      entry.options.push_back(OptionName(*plan, static_cast<size_t>(option)));
    }
    open.push_back(std::move(entry));
  }
  return open;
}

// The index-th plan of scope_ that is still open.
GemmRunner::Plan& GemmRunner::OpenPlanAt(int index) {
  int seen = 0;
  for (Plan* plan : scope_) {
    if (!plan->closed && seen++ == index) return *plan;
  }
  SIEVE_CHECK(false) << "no open GEMM plan " << index << " (" << seen << " open)";
  std::abort();
}

void GemmRunner::SetOpenPlanOption(int index, int option) {
  Plan& plan = OpenPlanAt(index);
  SIEVE_CHECK(option >= 0 && static_cast<size_t>(option) < plan.options.size())
      << "plan " << plan.shape << " has " << plan.options.size() << " options, not " << option;
  const int candidate = plan.options[static_cast<size_t>(option)];
  Apply(plan, candidate);
  plan.name = OptionName(plan, static_cast<size_t>(candidate));
}

void GemmRunner::CloseOpenPlan(int index) {
  Plan& plan = OpenPlanAt(index);
  plan.closed = true;
  if (verbose_) {
    std::fprintf(stderr, "GEMM plan %s after step tuning: %s\n", plan.shape.c_str(),
                 plan.name.c_str());
  }
}

}  // namespace sieve::cuda
