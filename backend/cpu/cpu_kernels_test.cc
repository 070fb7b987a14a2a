// cpu_kernels.h: the dot product and the weighted sum of rows follow their definitions exactly
// (checked against the definition written out here, and against double precision), and every
// vector unit this machine has gives the scalar form's bits for every shape: tails past the last
// 16 elements, edge tiles, rows given as pointers or strided, and a row's result whatever the
// table it is part of.
#include "backend/cpu/cpu_kernels.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/testing.h"

namespace sieve::cpu {
namespace {

std::vector<Isa> VectorIsas() {
  std::vector<Isa> isas;
  for (Isa isa : {Isa::kAvx2, Isa::kAvx512}) {
    if (IsaSupported(isa)) isas.push_back(isa);
  }
  return isas;
}

std::vector<float> Random(size_t count, std::mt19937_64& rng) {
  std::vector<float> values(count);
  sieve::testing::FillRandom(values.data(), values.size(), rng);
  return values;
}

bool SameBits(float a, float b) { return std::memcmp(&a, &b, sizeof(float)) == 0; }

// The definition of cpu_kernels.h, written out.
float DefinitionDot(const float* a, const float* b, int64_t n) {
  float lanes[16] = {};
  const int64_t body = n - n % 16;
  for (int64_t i = 0; i < body; ++i) lanes[i % 16] = std::fma(a[i], b[i], lanes[i % 16]);
  for (int width = 8; width >= 1; width /= 2) {
    for (int l = 0; l < width; ++l) lanes[l] = lanes[l] + lanes[l + width];
  }
  float sum = lanes[0];
  for (int64_t i = body; i < n; ++i) sum = std::fma(a[i], b[i], sum);
  return sum;
}

TEST(CpuKernelsTest, DotFollowsItsDefinitionOnEveryVectorUnit) {
  auto rng = sieve::testing::MakeRng();
  for (int64_t n : {1, 7, 15, 16, 17, 31, 64, 100, 256, 257, 768}) {
    const std::vector<float> a = Random(n, rng), b = Random(n, rng);
    const float want = DefinitionDot(a.data(), b.data(), n);
    EXPECT_TRUE(SameBits(Dot(Isa::kScalar, a.data(), b.data(), n), want)) << "n " << n;
    for (Isa isa : VectorIsas()) {
      EXPECT_TRUE(SameBits(Dot(isa, a.data(), b.data(), n), want)) << IsaName(isa) << " n " << n;
    }
    // And it is a dot product: within f32 rounding of the double-precision one.
    double exact = 0, magnitude = 0;
    for (int64_t i = 0; i < n; ++i) {
      exact += static_cast<double>(a[i]) * b[i];
      magnitude += std::abs(static_cast<double>(a[i]) * b[i]);
    }
    EXPECT_NEAR(want, exact, 1e-6 * magnitude * std::sqrt(static_cast<double>(n)) + 1e-30)
        << "n " << n;
  }
}

TEST(CpuKernelsTest, TablesGiveEachDotsBitsWhateverTheTileOrTheTable) {
  auto rng = sieve::testing::MakeRng();
  std::uniform_int_distribution<int> size(1, 11);
  for (int64_t n : {16, 40, 64, 256, 129}) {
    for (int trial = 0; trial < 6; ++trial) {
      const int rows = size(rng), cols = size(rng);
      const int64_t lda = n + trial, ldb = n + 2 * trial;  // strided rows, not packed
      const std::vector<float> a = Random(rows * lda, rng), b = Random(cols * ldb, rng);
      std::vector<const float*> b_pointers(cols);
      for (int j = 0; j < cols; ++j) b_pointers[j] = b.data() + (cols - 1 - j) * ldb;  // shuffled
      const std::vector<float> start = Random(rows * cols, rng);
      for (Isa isa : [] {
             std::vector<Isa> all = VectorIsas();
             all.push_back(Isa::kScalar);
             return all;
           }()) {
        std::vector<float> table(rows * cols), pointer_table(rows * cols), summed = start;
        DotTable(isa, Rows::Strided(a.data(), lda), rows, Rows::Strided(b.data(), ldb), cols, n,
                 table.data(), cols, /*accumulate=*/false);
        DotTable(isa, Rows::Strided(a.data(), lda), rows, Rows::Pointers(b_pointers.data()), cols,
                 n, pointer_table.data(), cols, /*accumulate=*/false);
        DotTable(isa, Rows::Strided(a.data(), lda), rows, Rows::Strided(b.data(), ldb), cols, n,
                 summed.data(), cols, /*accumulate=*/true);
        for (int i = 0; i < rows; ++i) {
          // Row i alone, as a table of one row (a batch of one).
          std::vector<float> alone(cols);
          DotTable(isa, Rows::Strided(a.data() + i * lda, lda), 1, Rows::Strided(b.data(), ldb),
                   cols, n, alone.data(), cols, false);
          for (int j = 0; j < cols; ++j) {
            const float want = DefinitionDot(a.data() + i * lda, b.data() + j * ldb, n);
            const std::string where = std::string(IsaName(isa)) + " " + std::to_string(rows) + "x" +
                                      std::to_string(cols) + " n " + std::to_string(n) + " at " +
                                      std::to_string(i) + "," + std::to_string(j);
            ASSERT_TRUE(SameBits(table[i * cols + j], want)) << where;
            ASSERT_TRUE(SameBits(alone[j], want)) << where;
            ASSERT_TRUE(SameBits(pointer_table[i * cols + cols - 1 - j], want)) << where;
            ASSERT_TRUE(SameBits(summed[i * cols + j], start[i * cols + j] + want)) << where;
          }
        }
      }
    }
  }
}

TEST(CpuKernelsTest, WeightedSumsAddEachRowInOrderOnEveryVectorUnit) {
  auto rng = sieve::testing::MakeRng();
  std::uniform_int_distribution<int> size(1, 9);
  for (int64_t dim : {64, 128, 16, 72, 5, 200}) {
    for (int trial = 0; trial < 4; ++trial) {
      const int rows = size(rng);
      const int count = 3 * size(rng);
      const int64_t ldv = dim + trial;
      const std::vector<float> weights = Random(rows * count, rng);
      const std::vector<float> values = Random(count * ldv, rng);
      const std::vector<float> start = Random(rows * dim, rng);
      // The definition: out[d] = fma(w_j, v_j[d], out[d]) for j in order.
      std::vector<float> want = start;
      for (int r = 0; r < rows; ++r) {
        for (int j = 0; j < count; ++j) {
          for (int64_t d = 0; d < dim; ++d) {
            want[r * dim + d] =
                std::fma(weights[r * count + j], values[j * ldv + d], want[r * dim + d]);
          }
        }
      }
      std::vector<const float*> pointers(count);
      for (int j = 0; j < count; ++j) pointers[j] = values.data() + j * ldv;
      std::vector<Isa> isas = VectorIsas();
      isas.push_back(Isa::kScalar);
      for (Isa isa : isas) {
        std::vector<float> strided = start, pointed = start;
        WeightedSumRows(isa, weights.data(), count, rows, Rows::Strided(values.data(), ldv), count,
                        dim, strided.data(), dim);
        WeightedSumRows(isa, weights.data(), count, rows, Rows::Pointers(pointers.data()), count,
                        dim, pointed.data(), dim);
        // In two parts (the first rows' shared keys, then the rest): the same sequence.
        std::vector<float> split = start;
        const int first = count / 3;
        WeightedSumRows(isa, weights.data(), count, rows, Rows::Strided(values.data(), ldv), first,
                        dim, split.data(), dim);
        WeightedSumRows(isa, weights.data() + first, count, rows,
                        Rows::Strided(values.data() + first * ldv, ldv), count - first, dim,
                        split.data(), dim);
        for (size_t index = 0; index < want.size(); ++index) {
          ASSERT_TRUE(SameBits(strided[index], want[index]))
              << IsaName(isa) << " dim " << dim << " rows " << rows << " at " << index;
          ASSERT_TRUE(SameBits(pointed[index], want[index])) << IsaName(isa) << " at " << index;
          ASSERT_TRUE(SameBits(split[index], want[index])) << IsaName(isa) << " at " << index;
        }
      }
    }
  }
}

TEST(CpuKernelsTest, ExpIsWithinTwoUlpOfTheLibrarysOverTheSoftmaxRange) {
  auto rng = sieve::testing::MakeRng();
  std::uniform_real_distribution<float> range(-87.0f, 0.5f);
  for (int trial = 0; trial < 100000; ++trial) {
    const float x = trial < 3 ? static_cast<float>(-trial) : range(rng);
    const double exact = std::exp(static_cast<double>(x));
    const float got = Exp(x);
    const double ulp =
        std::nextafter(static_cast<float>(exact), INFINITY) - static_cast<float>(exact);
    ASSERT_LE(std::abs(got - exact), 2 * ulp) << "x " << x;
  }
  EXPECT_EQ(Exp(0.0f), 1.0f);
  EXPECT_GT(Exp(-1000.0f), 0.0f);  // clamped, not a NaN or an infinity
  EXPECT_LT(Exp(-1000.0f), 1e-37f);
}

TEST(CpuKernelsTest, SoftmaxRowsAreTheSameBitsOnEveryVectorUnitAndSumToOne) {
  auto rng = sieve::testing::MakeRng();
  for (int64_t count : {1, 5, 16, 17, 33, 100, 1000, 4099}) {
    std::vector<float> scores = Random(count, rng);
    for (float& score : scores) score *= 8.0f;
    const float scale = 0.125f;
    std::vector<float> want = scores;
    const float want_lse = SoftmaxRow(Isa::kScalar, want.data(), count, scale);
    double sum = 0, max_score = -INFINITY;
    for (float score : scores) max_score = std::max<double>(max_score, scale * score);
    double exact_sum = 0;
    for (float score : scores) exact_sum += std::exp(scale * score - max_score);
    for (int64_t j = 0; j < count; ++j) {
      sum += want[j];
      EXPECT_NEAR(want[j], std::exp(scale * scores[j] - max_score) / exact_sum, 1e-6)
          << "count " << count << " j " << j;
    }
    EXPECT_NEAR(sum, 1.0, 1e-5) << "count " << count;
    EXPECT_NEAR(want_lse, max_score + std::log(exact_sum), 1e-5) << "count " << count;
    for (Isa isa : VectorIsas()) {
      std::vector<float> got = scores;
      const float lse = SoftmaxRow(isa, got.data(), count, scale);
      EXPECT_TRUE(SameBits(lse, want_lse)) << IsaName(isa) << " count " << count;
      for (int64_t j = 0; j < count; ++j) {
        ASSERT_TRUE(SameBits(got[j], want[j])) << IsaName(isa) << " count " << count << " j " << j;
      }
    }
  }
}

}  // namespace
}  // namespace sieve::cpu
