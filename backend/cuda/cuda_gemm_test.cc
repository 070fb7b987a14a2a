// The GEMMs of the CUDA backend (the planner of gemm.cc over cuBLASLt's candidates and the skinny
// kernel of skinny_gemm.cu) against a double-precision host product of the same bf16 inputs, on
// fresh random data. Tolerances are
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
#include "backend/cuda/skinny_gemm.h"

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

// Shapes with ragged edges: n and k not multiples of the usual tiles, m at and around 16/32/64.
const std::vector<std::tuple<int, int, int>> kShapes = {
    {1, 200, 264},    {5, 4096, 512},  {16, 384, 4096}, {17, 130, 72},
    {33, 1000, 1024}, {64, 640, 2048}, {48, 128, 8}};

// The runner's accumulating calls (Backend::LinearAdd): planning times its candidates on a
// scratch output, so the first call also adds exactly once, and so does a call on the plan.
TEST_F(CudaGemmTest, RunnerAccumulatesOnce) {
  GemmRunner runner(stream_);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const auto& [m, n, k] : {std::tuple{16, 384, 4096}, std::tuple{64, 640, 2048}}) {
    const Problem problem(m, n, k, rng_);
    DeviceBuffer<__nv_bfloat16> x(testing::ToBf16(problem.x));
    DeviceBuffer<__nv_bfloat16> w(testing::ToBf16(problem.w));
    for (int call = 0; call < 2; ++call) {
      std::vector<float> base(static_cast<size_t>(m) * problem.ldo);
      for (float& value : base) value = normal(rng_);
      DeviceBuffer<float> out(base);
      runner.Run(m, n, k, w.get(), problem.ldw, x.get(), problem.ldx, out.get(), problem.ldo, true,
                 /*accumulate=*/true);
      SIEVE_CUDA_CHECK(cudaStreamSynchronize(stream_));
      EXPECT_LE(problem.Error(out.ToHost(), &base), kF32Tolerance)
          << m << "x" << n << "x" << k << " call " << call << ": " << runner.last_plan();
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
// cuBLASLt's heuristic configurations and the re-tiled ones, for plain and accumulating calls; the
// names agree, and a closed plan is no longer open.
TEST_F(CudaGemmTest, EveryTuningOptionMatchesHostProduct) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const auto& [m, n, k] : {std::tuple{64, 4096, 1024}, std::tuple{16, 4096, 512}}) {
    const Problem problem(m, n, k, rng_);
    DeviceBuffer<__nv_bfloat16> x(testing::ToBf16(problem.x)), w(testing::ToBf16(problem.w));
    for (const bool accumulate : {false, true}) {
      GemmRunner runner(stream_);
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
      int skinny = 0;
      for (int option = 0; option < static_cast<int>(options.size()); ++option) {
        runner.SetOpenPlanOption(0, option);
        const double error = run();
        EXPECT_LE(error, kBf16Tolerance) << options[option] << (accumulate ? " +=" : "");
        EXPECT_EQ(runner.last_plan(), options[option]);
        retiled += options[option].find("re-tiled") != std::string::npos;
        skinny += options[option].find("skinny") != std::string::npos;
      }
      // The skinny kernel is a candidate exactly where it takes the rows.
      EXPECT_EQ(skinny, m <= kSkinnyGemmMaxRows ? static_cast<int>(SkinnyGemmSplits(k).size()) : 0)
          << m << " rows";
      std::printf("%d x %d x %d%s: %zu options, %d re-tiled, %d skinny\n", m, n, k,
                  accumulate ? " +=" : "", options.size(), retiled, skinny);
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
  {
    GemmRunner runner(stream_);
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
            std::printf("m %d%s: first call %.2f ms, %s\n", m, accumulate ? " (+=)" : "", ms,
                        runner.last_plan().c_str());
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

// (accumulate, k split) for each of `splits`, both ways.
std::vector<std::pair<bool, int>> Combinations(const std::vector<int>& splits) {
  std::vector<std::pair<bool, int>> out;
  for (const bool accumulate : {false, true}) {
    for (const int split : splits) out.emplace_back(accumulate, split);
  }
  return out;
}

// The skinny kernel alone, at every row count it takes (its three x-tile widths and their edges)
// and every k split, on ragged n and k (k a multiple of 8, as it requires), plain and
// accumulating, f32 and bf16 out. Up to 8 rows a grid that fits 2 CTAs an SM loads 8 blocks a
// group and a wider one 4: n = 9000 (563 CTAs) is past 2 an SM on GPUs of up to 281 SMs.
TEST_F(CudaGemmTest, SkinnyKernelMatchesHostProduct) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const int m : {1, 2, 7, 8, 9, 16, 17, 31, 32}) {
    for (const auto& [n, k] : {std::pair{1, 8}, std::pair{40, 72}, std::pair{200, 264},
                               std::pair{130, 4096}, std::pair{1000, 1032}, std::pair{9000, 264}}) {
      const Problem problem(m, n, k, rng_);
      DeviceBuffer<__nv_bfloat16> x(testing::ToBf16(problem.x));
      DeviceBuffer<__nv_bfloat16> w(testing::ToBf16(problem.w));
      ASSERT_TRUE(SkinnyGemmSupports(m, k, w.get(), problem.ldw, x.get(), problem.ldx));
      for (const auto& [accumulate, splits] : Combinations(SkinnyGemmSplits(k))) {
        std::vector<float> base(static_cast<size_t>(m) * problem.ldo);
        for (float& value : base) value = normal(rng_);
        testing::RoundToBf16(base);
        const std::string shape = std::to_string(m) + "x" + std::to_string(n) + "x" +
                                  std::to_string(k) + (accumulate ? " +=" : "") + " split " +
                                  std::to_string(splits);
        DeviceBuffer<float> out_f32(base);
        SkinnyGemm(m, n, k, w.get(), problem.ldw, x.get(), problem.ldx, out_f32.get(), problem.ldo,
                   true, accumulate, splits, stream_);
        DeviceBuffer<__nv_bfloat16> out_bf16(testing::ToBf16(base));
        SkinnyGemm(m, n, k, w.get(), problem.ldw, x.get(), problem.ldx, out_bf16.get(), problem.ldo,
                   false, accumulate, splits, stream_);
        SIEVE_CUDA_CHECK(cudaStreamSynchronize(stream_));
        const std::vector<float>* added = accumulate ? &base : nullptr;
        EXPECT_LE(problem.Error(out_f32.ToHost(), added), kF32Tolerance) << shape << " f32";
        EXPECT_LE(problem.Error(out_bf16.ToHost(), added), kBf16Tolerance) << shape << " bf16";
        // Outside the [m][n] block (the stride's padding) nothing is written.
        const std::vector<float> after = out_f32.ToHost();
        for (int row = 0; row < m; ++row) {
          for (int col = n; col < problem.ldo; ++col) {
            ASSERT_EQ(after[row * problem.ldo + col], base[row * problem.ldo + col]) << shape;
          }
        }
      }
    }
  }
}

// Wherever the skinny kernel takes the shape, it is the plan's pick or one of its step-tuning
// options, however it timed alone (its overlap with the kernel before shows only in a step); at
// one row it is the plan, with nothing left open.
TEST_F(CudaGemmTest, SkinnyKernelIsPickedOrAStepTuningOption) {
  for (const auto& [m, n, k] : {std::tuple{1, 4096, 4096}, std::tuple{1, 4096, 14336},
                                std::tuple{4, 4096, 14336}, std::tuple{32, 6144, 4096}}) {
    const Problem problem(m, n, k, rng_);
    DeviceBuffer<__nv_bfloat16> x(testing::ToBf16(problem.x)), w(testing::ToBf16(problem.w));
    DeviceBuffer<__nv_bfloat16> out(static_cast<size_t>(m) * problem.ldo);
    GemmRunner runner(stream_);
    const auto run = [&] {
      runner.Run(m, n, k, w.get(), problem.ldw, x.get(), problem.ldx, out.get(), problem.ldo,
                 false);
      SIEVE_CUDA_CHECK(cudaStreamSynchronize(stream_));
    };
    run();  // times the candidates
    run();  // the weight comes round: the plan settles
    runner.MarkTuningScope();
    run();
    const std::vector<GemmRunner::OpenPlan> open = runner.OpenPlans();
    bool skinny = runner.last_plan().find("skinny") != std::string::npos;
    for (const GemmRunner::OpenPlan& plan : open) {
      for (const std::string& option : plan.options) {
        skinny = skinny || option.find("skinny") != std::string::npos;
      }
    }
    EXPECT_TRUE(skinny) << m << " x " << n << " x " << k << ": " << runner.last_plan();
    if (m == 1) {
      EXPECT_NE(runner.last_plan().find("skinny"), std::string::npos) << runner.last_plan();
      EXPECT_TRUE(open.empty()) << open.size() << " open plan(s) at one row";
    }
    std::printf("%d x %d x %d: %s, %zu open plan(s)\n", m, n, k, runner.last_plan().c_str(),
                open.size());
  }
}

// What the skinny kernel refuses, so that the runner keeps cuBLASLt for it.
TEST_F(CudaGemmTest, SkinnyKernelRefusesWhatItCannotRead) {
  DeviceBuffer<__nv_bfloat16> buffer(4096);
  const __nv_bfloat16* aligned = buffer.get();
  EXPECT_TRUE(SkinnyGemmSupports(32, 64, aligned, 64, aligned, 64));
  EXPECT_FALSE(SkinnyGemmSupports(33, 64, aligned, 64, aligned, 64));  // too many rows
  EXPECT_FALSE(SkinnyGemmSupports(0, 64, aligned, 64, aligned, 64));
  EXPECT_FALSE(SkinnyGemmSupports(4, 60, aligned, 64, aligned, 64));      // k not a multiple of 8
  EXPECT_FALSE(SkinnyGemmSupports(4, 64, aligned, 68, aligned, 64));      // w's rows unaligned
  EXPECT_FALSE(SkinnyGemmSupports(4, 64, aligned + 1, 64, aligned, 64));  // w unaligned
  EXPECT_FALSE(SkinnyGemmSupports(4, 64, aligned, 64, aligned + 4, 64));  // x unaligned
}

TEST_F(CudaGemmTest, RunnerMatchesHostProduct) {
  GemmRunner runner(stream_);
  std::vector<std::tuple<int, int, int>> shapes = kShapes;
  shapes.emplace_back(100, 300, 256);
  for (const auto& [m, n, k] : shapes) {
    const Problem problem(m, n, k, rng_);
    DeviceBuffer<__nv_bfloat16> x(testing::ToBf16(problem.x));
    DeviceBuffer<__nv_bfloat16> w(testing::ToBf16(problem.w));
    DeviceBuffer<float> out(static_cast<size_t>(m) * problem.ldo);
    // Twice: the first call plans (timing every candidate), the second reuses the plan.
    for (int call = 0; call < 2; ++call) {
      runner.Run(m, n, k, w.get(), problem.ldw, x.get(), problem.ldx, out.get(), problem.ldo, true);
      SIEVE_CUDA_CHECK(cudaStreamSynchronize(stream_));
      EXPECT_LE(problem.Error(out.ToHost()), kF32Tolerance)
          << m << "x" << n << "x" << k << ": " << runner.last_plan();
    }
  }
}

// Batch invariance (GemmRunner::SetBatchInvariant, README_gemm.md "Batch invariance"): a row of
// x gives the same output bits whether it is multiplied alone (m = 1), among 37 rows or among
// 4096, at any position, for bf16 and f32 outputs and accumulating calls; every m runs the same
// configuration; and the product is right (double-precision host rows, the tolerances above).
TEST_F(CudaGemmTest, BatchInvariantRowsEqualAtEveryM) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  constexpr int kRows = 4096;
  for (const auto& [n, k] : {std::pair{1024, 4096}, std::pair{6144, 1024}, std::pair{1000, 512}}) {
    std::vector<float> x(static_cast<size_t>(kRows) * k), w(static_cast<size_t>(n) * k);
    for (float& value : x) value = normal(rng_);
    for (float& value : w) value = 0.05f * normal(rng_);
    testing::RoundToBf16(x);
    testing::RoundToBf16(w);
    DeviceBuffer<__nv_bfloat16> x_dev(testing::ToBf16(x)), w_dev(testing::ToBf16(w));
    std::vector<float> base(static_cast<size_t>(kRows) * n);
    for (float& value : base) value = normal(rng_);
    testing::RoundToBf16(base);
    for (const auto& [out_f32, accumulate] :
         {std::pair{false, false}, std::pair{true, false}, std::pair{false, true}}) {
      SCOPED_TRACE(std::to_string(n) + " x " + std::to_string(k) + (out_f32 ? " f32" : " bf16") +
                   (accumulate ? " +=" : ""));
      GemmRunner runner(stream_);
      runner.SetBatchInvariant(true);
      // Rows [first, first + m) of x into an output of m rows (starting from `base`'s rows when
      // accumulating), downloaded as f32 values.
      std::string config;
      const auto product = [&](int first, int m) {
        std::vector<float> out_host;
        std::vector<float> start(base.begin() + static_cast<int64_t>(first) * n,
                                 base.begin() + static_cast<int64_t>(first + m) * n);
        if (out_f32) {
          DeviceBuffer<float> out(start);
          runner.Run(m, n, k, w_dev.get(), k, x_dev.get() + static_cast<int64_t>(first) * k, k,
                     out.get(), n, true, accumulate);
          out_host = out.ToHost();
        } else {
          DeviceBuffer<__nv_bfloat16> out(testing::ToBf16(start));
          runner.Run(m, n, k, w_dev.get(), k, x_dev.get() + static_cast<int64_t>(first) * k, k,
                     out.get(), n, false, accumulate);
          out_host = testing::ToFloat(out.ToHost());
        }
        if (config.empty()) config = runner.last_plan();
        EXPECT_EQ(runner.last_plan(), config) << "m " << m;
        EXPECT_NE(runner.last_plan().find("batch-invariant"), std::string::npos);
        return out_host;
      };
      const std::vector<float> all = product(0, kRows);
      const auto row_of = [&](const std::vector<float>& out, int row) {
        return std::vector<float>(out.begin() + static_cast<int64_t>(row) * n,
                                  out.begin() + static_cast<int64_t>(row + 1) * n);
      };
      const int picked = static_cast<int>(rng_() % kRows);
      struct Run {
        int first, m;
      };
      for (const Run run : {Run{0, 1}, Run{0, 37}, Run{picked, 1}, Run{kRows - 37, 37},
                            Run{static_cast<int>(rng_() % (kRows - 300)), 300}}) {
        const std::vector<float> some = product(run.first, run.m);
        for (int row = 0; row < run.m; ++row) {
          ASSERT_EQ(row_of(some, row), row_of(all, run.first + row))
              << "row " << run.first + row << " among " << run.m << " (from " << run.first
              << ") differs from the same row among " << kRows << ": " << runner.last_plan();
        }
      }
      // Right, too: a few rows against the host product.
      for (const int row : {0, picked, kRows - 1}) {
        double diff = 0, norm = 0;
        for (int col = 0; col < n; ++col) {
          double want = accumulate ? base[static_cast<size_t>(row) * n + col] : 0.0;
          for (int index = 0; index < k; ++index) {
            want += static_cast<double>(x[static_cast<size_t>(row) * k + index]) *
                    w[static_cast<size_t>(col) * k + index];
          }
          const double got = all[static_cast<size_t>(row) * n + col];
          diff += (got - want) * (got - want);
          norm += want * want;
        }
        EXPECT_LE(std::sqrt(diff / norm), out_f32 ? kF32Tolerance : kBf16Tolerance)
            << "row " << row;
      }
    }
  }
}

}  // namespace
}  // namespace sieve::cuda
