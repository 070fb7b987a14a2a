// The GEMM paths of the CUDA backend (small_m_gemm.cu and the planner of gemm.cc) against a
// double-precision host product of the same bf16 inputs, on fresh random data. Tolerances are
// relative L2 errors: 1e-5 for f32 outputs (f32 accumulation over k <= 4096), 1e-2 for bf16
// outputs (one bf16 rounding of each output is ~4e-3 alone).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "backend/cuda/cuda_test_util.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/graph_pdl.h"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/small_m_gemm.h"

namespace sieve::cuda {
namespace {

using testing::DeviceBuffer;

constexpr double kF32Tolerance = 1e-5;
constexpr double kBf16Tolerance = 1e-2;

struct Problem {
  int m, n, k;
  int64_t ldx, ldw, ldo;
  std::vector<float> x, w;       // bf16-representable values, row-major with the strides above
  std::vector<double> expected;  // [m][n]

  Problem(int rows, int cols, int inner, std::mt19937_64& rng)
      : m(rows), n(cols), k(inner), ldx(inner + 24), ldw(inner + 8), ldo(cols + 8) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    x.resize(static_cast<size_t>(m) * ldx);
    w.resize(static_cast<size_t>(n) * ldw);
    for (float& value : x) value = normal(rng);
    for (float& value : w) value = 0.05f * normal(rng);
    testing::RoundToBf16(x);
    testing::RoundToBf16(w);
    expected.assign(static_cast<size_t>(m) * n, 0.0);
    for (int row = 0; row < m; ++row) {
      for (int col = 0; col < n; ++col) {
        double sum = 0;
        for (int index = 0; index < k; ++index) {
          sum += static_cast<double>(x[row * ldx + index]) * w[col * ldw + index];
        }
        expected[static_cast<size_t>(row) * n + col] = sum;
      }
    }
  }

  // The small-m kernel's operands for this problem on device copies of x and w, into `out`.
  SmallMGemmArgs Args(const __nv_bfloat16* w_device, const __nv_bfloat16* x_device, void* out,
                      bool out_f32) const {
    return MakeSmallMGemmArgs(m, n, k, w_device, ldw, x_device, ldx, out, ldo, out_f32);
  }

  // "MxNxK splits S f32|bf16 cluster|atomics", for failure messages.
  std::string Describe(int splits, bool out_f32, SmallMSplitReduce reduce) const {
    return std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k) + " splits " +
           std::to_string(splits) + (out_f32 ? " f32" : " bf16") +
           (reduce == SmallMSplitReduce::kCluster ? " cluster" : " atomics");
  }

  // Relative L2 error of a downloaded [m][ldo] output (f32 or bf16 bits) against `expected`, plus
  // `base` ([m][ldo], what an accumulating call added to) when given.
  template <typename T>
  double Error(const std::vector<T>& out, const std::vector<float>* base = nullptr) const {
    double diff = 0, norm = 0;
    for (int row = 0; row < m; ++row) {
      for (int col = 0; col < n; ++col) {
        double value;
        if constexpr (std::is_same_v<T, float>) {
          value = out[row * ldo + col];
        } else {
          value = Bf16ToFloat(static_cast<__nv_bfloat16_raw>(out[row * ldo + col]).x);
        }
        const double want = expected[static_cast<size_t>(row) * n + col] +
                            (base != nullptr ? (*base)[row * ldo + col] : 0.0);
        diff += (value - want) * (value - want);
        norm += want * want;
      }
    }
    return std::sqrt(diff / norm);
  }
};

class CudaGemmTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SIEVE_REQUIRE_GPU();
    rng_ = sieve::testing::MakeRng();
    SIEVE_CUDA_CHECK(cudaStreamCreate(&stream_));
  }
  void TearDown() override {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  std::mt19937_64 rng_;
  cudaStream_t stream_ = nullptr;
};

// Shapes with ragged edges: n not a multiple of the 128-row slab, k not a multiple of the
// 64-wide stage, m at and around the 16/32/64 token tiles.
const std::vector<std::tuple<int, int, int>> kShapes = {
    {1, 200, 264},    {5, 4096, 512},  {16, 384, 4096}, {17, 130, 72},
    {33, 1000, 1024}, {64, 640, 2048}, {48, 128, 8}};

TEST_F(CudaGemmTest, SmallMKernelMatchesHostProductAtEverySplit) {
  DeviceBuffer<float> sums(static_cast<size_t>(kSmallMGemmMaxRows) * 4096);
  DeviceBuffer<int> counters(64);
  SIEVE_CUDA_CHECK(cudaMemset(sums.get(), 0, sums.size() * sizeof(float)));
  SIEVE_CUDA_CHECK(cudaMemset(counters.get(), 0, counters.size() * sizeof(int)));
  for (const auto& [m, n, k] : kShapes) {
    const Problem problem(m, n, k, rng_);
    DeviceBuffer<__nv_bfloat16> x(testing::ToBf16(problem.x));
    DeviceBuffer<__nv_bfloat16> w(testing::ToBf16(problem.w));
    std::vector<SmallMSplitReduce> reduces = {SmallMSplitReduce::kAtomics};
    if (SmallMGemmHasClusters()) reduces.push_back(SmallMSplitReduce::kCluster);
    for (int variant = 0; variant < 2 * static_cast<int>(reduces.size()); ++variant) {
      const bool out_f32 = variant % 2 == 0;
      const SmallMSplitReduce reduce = reduces[variant / 2];
      for (const int splits : {1, 3, 5, 8}) {
        const size_t out_count = static_cast<size_t>(m) * problem.ldo;
        DeviceBuffer<float> out_f(out_f32 ? out_count : 1);
        DeviceBuffer<__nv_bfloat16> out_b(out_f32 ? 1 : out_count);
        SmallMGemmArgs args = problem.Args(
            w.get(), x.get(),
            out_f32 ? static_cast<void*>(out_f.get()) : static_cast<void*>(out_b.get()), out_f32);
        args.splits = splits;
        args.reduce = reduce;
        args.split_sums = sums.get();
        args.split_counters = counters.get();
        ASSERT_TRUE(SmallMGemmSupports(args));
        // Twice: the split buffers must come back zero, as graph replays need.
        for (int call = 0; call < 2; ++call) {
          SmallMGemm(args, stream_);
          SIEVE_CUDA_CHECK(cudaStreamSynchronize(stream_));
          const std::string what =
              problem.Describe(splits, out_f32, reduce) + " call " + std::to_string(call);
          if (out_f32) {
            EXPECT_LE(problem.Error(out_f.ToHost()), kF32Tolerance) << what;
          } else {
            EXPECT_LE(problem.Error(out_b.ToHost()), kBf16Tolerance) << what;
          }
        }
      }
    }
  }
  for (const float value : sums.ToHost()) ASSERT_EQ(value, 0.0f);
  for (const int value : counters.ToHost()) ASSERT_EQ(value, 0);
}

// out += x w^T: every output adds the product to what it held once, whichever way the splits
// add up (one CTA or one cluster rank writes each output; atomics meet in the split buffer first).
TEST_F(CudaGemmTest, SmallMKernelAccumulatesOnce) {
  DeviceBuffer<float> sums(static_cast<size_t>(kSmallMGemmMaxRows) * 4096);
  DeviceBuffer<int> counters(64);
  SIEVE_CUDA_CHECK(cudaMemset(sums.get(), 0, sums.size() * sizeof(float)));
  SIEVE_CUDA_CHECK(cudaMemset(counters.get(), 0, counters.size() * sizeof(int)));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const auto& [m, n, k] :
       {std::tuple{5, 4096, 512}, std::tuple{33, 1000, 1024}, std::tuple{64, 640, 2048}}) {
    const Problem problem(m, n, k, rng_);
    DeviceBuffer<__nv_bfloat16> x(testing::ToBf16(problem.x));
    DeviceBuffer<__nv_bfloat16> w(testing::ToBf16(problem.w));
    std::vector<float> base(static_cast<size_t>(m) * problem.ldo);
    for (float& value : base) value = normal(rng_);
    testing::RoundToBf16(base);
    std::vector<SmallMSplitReduce> reduces = {SmallMSplitReduce::kAtomics};
    if (SmallMGemmHasClusters()) reduces.push_back(SmallMSplitReduce::kCluster);
    for (const SmallMSplitReduce reduce : reduces) {
      for (const bool out_f32 : {true, false}) {
        for (const int splits : {1, 3, 8}) {
          DeviceBuffer<float> out_f(base);
          DeviceBuffer<__nv_bfloat16> out_b(testing::ToBf16(base));
          SmallMGemmArgs args = problem.Args(
              w.get(), x.get(),
              out_f32 ? static_cast<void*>(out_f.get()) : static_cast<void*>(out_b.get()), out_f32);
          args.accumulate = true;
          args.splits = splits;
          args.reduce = reduce;
          args.split_sums = sums.get();
          args.split_counters = counters.get();
          SmallMGemm(args, stream_);
          SIEVE_CUDA_CHECK(cudaStreamSynchronize(stream_));
          const std::string what = problem.Describe(splits, out_f32, reduce);
          if (out_f32) {
            EXPECT_LE(problem.Error(out_f.ToHost(), &base), kF32Tolerance) << what;
          } else {
            EXPECT_LE(problem.Error(out_b.ToHost(), &base), kBf16Tolerance) << what;
          }
        }
      }
    }
  }
  for (const float value : sums.ToHost()) ASSERT_EQ(value, 0.0f);
  for (const int value : counters.ToHost()) ASSERT_EQ(value, 0);
}

// The runner's accumulating calls (Backend::LinearAdd): planning times its candidates on a
// scratch output, so the first call also adds exactly once, and so does a call on the plan.
TEST_F(CudaGemmTest, RunnerAccumulatesOnceForEveryChoice) {
  GemmRunner runner(stream_);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const GemmChoice choice : {GemmChoice::kAuto, GemmChoice::kCublasLt, GemmChoice::kSmallM}) {
    runner.set_choice(choice);
    for (const auto& [m, n, k] : {std::tuple{16, 384, 4096}, std::tuple{64, 640, 2048}}) {
      const Problem problem(m, n, k, rng_);
      DeviceBuffer<__nv_bfloat16> x(testing::ToBf16(problem.x));
      DeviceBuffer<__nv_bfloat16> w(testing::ToBf16(problem.w));
      for (int call = 0; call < 2; ++call) {
        std::vector<float> base(static_cast<size_t>(m) * problem.ldo);
        for (float& value : base) value = normal(rng_);
        DeviceBuffer<float> out(base);
        runner.Run(m, n, k, w.get(), problem.ldw, x.get(), problem.ldx, out.get(), problem.ldo,
                   true, /*accumulate=*/true);
        SIEVE_CUDA_CHECK(cudaStreamSynchronize(stream_));
        EXPECT_LE(problem.Error(out.ToHost(), &base), kF32Tolerance)
            << m << "x" << n << "x" << k << " choice " << static_cast<int>(choice) << " call "
            << call << ": " << runner.last_plan();
      }
      if (choice == GemmChoice::kSmallM) {
        EXPECT_EQ(runner.last_plan().rfind("small-m", 0), 0u) << runner.last_plan();
      }
    }
  }
}

// A decode shape's plan times its candidates on the weights of the first calls (one per layer in
// a step) before it settles: every call on the way, plain or accumulating, is still the product of
// its own operands, exactly once, and once settled the plan no longer changes.
TEST_F(CudaGemmTest, PlanningOverSeveralWeightsKeepsEveryCallRight) {
  constexpr int kWeights = 6;  // more than the planner times
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const bool accumulate : {false, true}) {
    GemmRunner runner(stream_);
    const int m = 64, n = 640, k = 2048;
    std::vector<Problem> problems;
    std::vector<std::unique_ptr<DeviceBuffer<__nv_bfloat16>>> xs, ws;  // buffers do not move
    for (int layer = 0; layer < kWeights; ++layer) {
      problems.emplace_back(m, n, k, rng_);
      xs.push_back(
          std::make_unique<DeviceBuffer<__nv_bfloat16>>(testing::ToBf16(problems.back().x)));
      ws.push_back(
          std::make_unique<DeviceBuffer<__nv_bfloat16>>(testing::ToBf16(problems.back().w)));
    }
    std::string settled;
    for (int pass = 0; pass < 2; ++pass) {
      for (int layer = 0; layer < kWeights; ++layer) {
        const Problem& problem = problems[layer];
        std::vector<float> base(static_cast<size_t>(m) * problem.ldo);
        for (float& value : base) value = normal(rng_);
        DeviceBuffer<float> out(base);
        runner.Run(m, n, k, ws[layer]->get(), problem.ldw, xs[layer]->get(), problem.ldx, out.get(),
                   problem.ldo, true, accumulate);
        SIEVE_CUDA_CHECK(cudaStreamSynchronize(stream_));
        EXPECT_LE(problem.Error(out.ToHost(), accumulate ? &base : nullptr), kF32Tolerance)
            << "pass " << pass << " layer " << layer << (accumulate ? " +=" : "") << ": "
            << runner.last_plan();
        if (pass == 1 && layer == 0) settled = runner.last_plan();
        if (pass == 1) {
          EXPECT_EQ(runner.last_plan(), settled) << "layer " << layer;
        }
      }
    }
  }
}

// Every candidate a plan times is right, set as a step-tuning option (runtime/step_tuning.h):
// cuBLASLt's heuristic configurations, the re-tiled ones and the small-m kernel's splits, for
// plain and accumulating calls; the names agree, and a closed plan is no longer open.
TEST_F(CudaGemmTest, EveryTuningOptionMatchesHostProduct) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const auto& [m, n, k] : {std::tuple{64, 4096, 1024}, std::tuple{16, 4096, 512}}) {
    const Problem problem(m, n, k, rng_);
    DeviceBuffer<__nv_bfloat16> x(testing::ToBf16(problem.x)), w(testing::ToBf16(problem.w));
    for (const bool accumulate : {false, true}) {
      GemmRunner runner(stream_);
      runner.set_choice(GemmChoice::kAuto);
      runner.KeepEveryCandidateAsOption();
      std::vector<float> base(static_cast<size_t>(m) * problem.ldo);
      for (float& value : base) value = normal(rng_);
      const auto run = [&] {
        DeviceBuffer<__nv_bfloat16> out(testing::ToBf16(base));
        runner.Run(m, n, k, w.get(), problem.ldw, x.get(), problem.ldx, out.get(), problem.ldo,
                   false, accumulate);
        SIEVE_CUDA_CHECK(cudaStreamSynchronize(stream_));
        return problem.Error(out.ToHost(), accumulate ? &base : nullptr);
      };
      run();  // times the candidates
      run();  // the weight comes round: the plan settles
      runner.MarkTuningScope();
      EXPECT_LE(run(), kBf16Tolerance) << runner.last_plan();
      std::vector<GemmRunner::OpenPlan> open = runner.OpenPlans();
      ASSERT_EQ(open.size(), 1u);
      const std::vector<std::string> options = open[0].options;
      ASSERT_GE(options.size(), 2u) << open[0].shape;
      int retiled = 0;
      for (int option = 0; option < static_cast<int>(options.size()); ++option) {
        runner.SetOpenPlanOption(0, option);
        const double error = run();
        EXPECT_LE(error, kBf16Tolerance) << options[option] << (accumulate ? " +=" : "");
        EXPECT_EQ(runner.last_plan(), options[option]);
        retiled += options[option].find("re-tiled") != std::string::npos;
      }
      std::printf("%d x %d x %d%s: %zu options, %d re-tiled\n", m, n, k, accumulate ? " +=" : "",
                  options.size(), retiled);
      runner.CloseOpenPlan(0);
      EXPECT_TRUE(runner.OpenPlans().empty());
      EXPECT_LE(run(), kBf16Tolerance) << runner.last_plan();
    }
  }
}

// A shape whose m shares a power-of-two bucket with a timed one takes that plan's choice without
// timing (prefill chunks come in every size), and its products are still right; another bucket
// is timed for itself, and so is a power-of-two m (a padded decode batch), which then serves its
// bucket. Prints how long a timed first call and a reusing one took.
TEST_F(CudaGemmTest, ShapesOfOneRowBucketShareTheTimedChoice) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const GemmChoice choice : {GemmChoice::kCublasLt, GemmChoice::kAuto}) {
    GemmRunner runner(stream_);
    runner.set_choice(choice);
    const int n = 1024, k = 2048;
    for (const auto& [m, reuses_from] :
         {std::pair{100, 0}, std::pair{120, 100}, std::pair{65, 100}, std::pair{200, 0},
          std::pair{40, 0}, std::pair{33, 40}, std::pair{64, 0}, std::pair{50, 64}}) {
      const Problem problem(m, n, k, rng_);
      DeviceBuffer<__nv_bfloat16> x(testing::ToBf16(problem.x));
      DeviceBuffer<__nv_bfloat16> w(testing::ToBf16(problem.w));
      for (const bool accumulate : {false, true}) {
        // Twice: the first call plans (a timed plan settles when its weight comes round again).
        for (int call = 0; call < 2; ++call) {
          std::vector<float> base(static_cast<size_t>(m) * problem.ldo);
          for (float& value : base) value = normal(rng_);
          DeviceBuffer<float> out(base);
          const auto start = std::chrono::steady_clock::now();
          runner.Run(m, n, k, w.get(), problem.ldw, x.get(), problem.ldx, out.get(), problem.ldo,
                     true, accumulate);
          SIEVE_CUDA_CHECK(cudaStreamSynchronize(stream_));
          const double ms =
              std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                  .count();
          if (call == 0) {
            std::printf("m %d%s, choice %d: first call %.2f ms, %s\n", m, accumulate ? " (+=)" : "",
                        static_cast<int>(choice), ms, runner.last_plan().c_str());
          }
          EXPECT_LE(problem.Error(out.ToHost(), accumulate ? &base : nullptr), kF32Tolerance)
              << m << (accumulate ? " +=" : "") << " call " << call << ": " << runner.last_plan();
          const std::string reused = "the plan of m = " + std::to_string(reuses_from);
          if (reuses_from > 0) {
            EXPECT_NE(runner.last_plan().find(reused), std::string::npos) << runner.last_plan();
          } else {
            EXPECT_EQ(runner.last_plan().find("the plan of"), std::string::npos)
                << runner.last_plan();
          }
        }
      }
    }
  }
}

TEST_F(CudaGemmTest, SmallMKernelRefusesWhatItCannotTake) {
  SmallMGemmArgs args;
  DeviceBuffer<__nv_bfloat16> buffer(4096);
  args.w = buffer.get();
  args.x = buffer.get();
  args.ldw = args.ldx = 64;
  args.m = 4;
  args.n = 16;
  args.k = 64;
  EXPECT_TRUE(SmallMGemmSupports(args));
  args.m = kSmallMGemmMaxRows + 1;
  EXPECT_FALSE(SmallMGemmSupports(args));
  args.m = 4;
  args.k = 60;  // not whole 16-byte chunks
  EXPECT_FALSE(SmallMGemmSupports(args));
  args.k = 64;
  args.x = buffer.get() + 1;  // misaligned rows
  EXPECT_FALSE(SmallMGemmSupports(args));
}

TEST_F(CudaGemmTest, RunnerMatchesHostProductForEveryChoice) {
  GemmRunner runner(stream_);
  std::vector<std::tuple<int, int, int>> shapes = kShapes;
  shapes.emplace_back(100, 300, 256);  // m > 64: cuBLASLt whatever the choice
  for (const GemmChoice choice : {GemmChoice::kAuto, GemmChoice::kCublasLt, GemmChoice::kSmallM}) {
    runner.set_choice(choice);
    for (const auto& [m, n, k] : shapes) {
      const Problem problem(m, n, k, rng_);
      DeviceBuffer<__nv_bfloat16> x(testing::ToBf16(problem.x));
      DeviceBuffer<__nv_bfloat16> w(testing::ToBf16(problem.w));
      DeviceBuffer<float> out(static_cast<size_t>(m) * problem.ldo);
      // Twice: the first call plans (timing every candidate), the second reuses the plan.
      for (int call = 0; call < 2; ++call) {
        runner.Run(m, n, k, w.get(), problem.ldw, x.get(), problem.ldx, out.get(), problem.ldo,
                   true);
        SIEVE_CUDA_CHECK(cudaStreamSynchronize(stream_));
        EXPECT_LE(problem.Error(out.ToHost()), kF32Tolerance)
            << m << "x" << n << "x" << k << " choice " << static_cast<int>(choice) << ": "
            << runner.last_plan();
      }
      const bool small = runner.last_plan().rfind("small-m", 0) == 0;
      if (choice == GemmChoice::kCublasLt || m > kSmallMGemmMaxRows) {
        EXPECT_FALSE(small) << runner.last_plan();
      } else if (choice == GemmChoice::kSmallM) {
        EXPECT_TRUE(small) << runner.last_plan();
      }
    }
  }
}

// graph_pdl.h's probe on kernels whose behaviour is known: a copy that reads before it waits
// must come out stale (else the probe would pass anything), one that waits must come out right.
TEST_F(CudaGemmTest, ProgrammaticEdgeProbeTellsAKernelThatWaitsFromOneThatDoesNot) {
  if (!PdlActive()) GTEST_SKIP() << "programmatic edges need sm_90+ (and SIEVE_PDL not 0)";
  std::uniform_int_distribution<int32_t> uniform(1, 1 << 30);
  std::vector<int32_t> values(1 << 16);
  for (int32_t& value : values) value = uniform(rng_);
  const size_t bytes = values.size() * sizeof(int32_t);
  DeviceBuffer<int32_t> source(values);
  DeviceBuffer<int32_t> input(values.size());
  DeviceBuffer<int32_t> output(values.size());
  for (const bool wait : {false, true}) {
    SIEVE_CUDA_CHECK(cudaMemset(output.get(), 0, bytes));
    const std::vector<const void*> kernels = ProbeProgrammaticEdge(
        [&] { CopyBytesForProbeTest(input.get(), output.get(), bytes, wait, stream_); },
        {{source.get(), input.get(), bytes}}, stream_);
    ASSERT_EQ(kernels.size(), 1u);
    const std::vector<int32_t> copied = output.ToHost();
    if (wait) {
      EXPECT_EQ(copied, values) << "the copy that waits read stale input";
    } else {
      EXPECT_NE(copied, values) << "the copy that does not wait read fresh input";
    }
  }
}

// A captured GEMM (the runner's cuBLASLt plan, probed when it was made) whose incoming edge is
// made programmatic where its kernel was marked still computes the product of what the kernel
// before it wrote, plain or accumulating.
TEST_F(CudaGemmTest, CapturedGemmBehindProgrammaticEdgeMatchesHostProduct) {
  if (!PdlActive()) GTEST_SKIP() << "programmatic edges need sm_90+ (and SIEVE_PDL not 0)";
  const sieve::testing::ScopedEnvironment graph_pdl("SIEVE_GRAPH_PDL", "1");  // the runner probes
  ASSERT_TRUE(GraphPdlEnabled());
  GemmRunner runner(stream_);
  runner.set_choice(GemmChoice::kCublasLt);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const auto& [m, n, k] : {std::tuple{64, 4096, 4096}, std::tuple{64, 640, 2048}}) {
    for (const bool accumulate : {false, true}) {
      const Problem problem(m, n, k, rng_);
      DeviceBuffer<__nv_bfloat16> x_source(testing::ToBf16(problem.x));
      DeviceBuffer<__nv_bfloat16> x(problem.x.size());
      DeviceBuffer<__nv_bfloat16> w(testing::ToBf16(problem.w));
      std::vector<float> base(static_cast<size_t>(m) * problem.ldo, 0.0f);
      if (accumulate) {
        for (float& value : base) value = normal(rng_);
        testing::RoundToBf16(base);
      }
      DeviceBuffer<__nv_bfloat16> out(testing::ToBf16(base));
      const auto gemm = [&] {
        runner.Run(m, n, k, w.get(), problem.ldw, x.get(), problem.ldx, out.get(), problem.ldo,
                   false, accumulate);
      };
      gemm();  // plans (and probes) outside capture; `out` is reset below
      SIEVE_CUDA_CHECK(cudaStreamSynchronize(stream_));
      SIEVE_CUDA_CHECK(cudaMemcpy(out.get(), testing::ToBf16(base).data(),
                                  base.size() * sizeof(__nv_bfloat16), cudaMemcpyHostToDevice));
      SIEVE_CUDA_CHECK(cudaMemset(x.get(), 0, problem.x.size() * sizeof(__nv_bfloat16)));

      SIEVE_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
      CopyBytesForProbeTest(x_source.get(), x.get(), problem.x.size() * sizeof(__nv_bfloat16),
                            false, stream_);
      gemm();
      cudaGraph_t graph = nullptr;
      SIEVE_CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
      size_t count = 0;
      SIEVE_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &count));
      std::vector<cudaGraphNode_t> nodes(count);
      SIEVE_CUDA_CHECK(cudaGraphGetNodes(graph, nodes.data(), &count));
      int marked = 0;
      for (const cudaGraphNode_t node : nodes)
        marked += HonorsProgrammaticEdges(KernelOfNode(node));
      const int changed = MakeEdgesProgrammatic(graph);
      EXPECT_LE(changed, marked);
      cudaGraphExec_t exec = nullptr;
      SIEVE_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
      SIEVE_CUDA_CHECK(cudaGraphLaunch(exec, stream_));
      SIEVE_CUDA_CHECK(cudaStreamSynchronize(stream_));
      EXPECT_LE(problem.Error(out.ToHost(), accumulate ? &base : nullptr), kBf16Tolerance)
          << m << "x" << n << "x" << k << (accumulate ? " +=" : "") << ", " << changed
          << " edges made programmatic: " << runner.last_plan();
      std::printf("%dx%dx%d%s: %d of %zu graph nodes marked, %d edges made programmatic\n", m, n, k,
                  accumulate ? " (+=)" : "", marked, count, changed);
      SIEVE_CUDA_CHECK(cudaGraphExecDestroy(exec));
      SIEVE_CUDA_CHECK(cudaGraphDestroy(graph));
    }
  }
}

}  // namespace
}  // namespace sieve::cuda
