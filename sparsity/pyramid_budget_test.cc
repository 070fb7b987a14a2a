// SPARSITY.md test 3: per-layer budgets equal the PyramidKV formula for a table of
// (C, W, n, L', beta).
//
// The expected vectors below were not produced by Sieve's code: they are the output of this
// independent Python transcription of SPARSITY.md "Budgets per layer" (Python's // floors):
//
//   def pyramid(C, W, n, L, beta):
//       if n < C or n < 2 * (C - W):
//           return [C] * L
//       min_num = (C - W) // beta
//       max_num = 2 * (C - W) - min_num
//       if max_num >= n - W:
//           max_num = n - W
//           min_num = 2 * (C - W) - max_num
//       steps = (max_num - min_num) // (L - 1) if L > 1 else 0
//       return [max_num - l * steps + W for l in range(L)]
#include <gtest/gtest.h>

#include <numeric>
#include <random>
#include <vector>

#include "core/testing.h"
#include "sparsity/kv_policy.h"

namespace sieve {
namespace {

struct BudgetRow {
  const char* regime;
  int budget;  // C
  int window;  // W
  int n;
  int num_layers;  // L'
  int beta;
  std::vector<int> expected;
};

const std::vector<BudgetRow>& Table() {
  static const std::vector<BudgetRow> table = {
      {"n < C: no compression", 512, 32, 300, 8, 20, std::vector<int>(8, 512)},
      {"n == C: uniform", 512, 32, 512, 8, 20, std::vector<int>(8, 512)},
      {"C <= n < 2(C-W): uniform", 512, 32, 700, 8, 20, std::vector<int>(8, 512)},
      {"max_num clipped to n - W", 512, 32, 964, 4, 20, {964, 663, 362, 61}},
      {"n == 2(C-W), clipped", 512, 32, 960, 32, 20, {960, 932, 904, 876, 848, 820, 792, 764,
                                                      736, 708, 680, 652, 624, 596, 568, 540,
                                                      512, 484, 456, 428, 400, 372, 344, 316,
                                                      288, 260, 232, 204, 176, 148, 120, 92}},
      {"C <= 2W: no uniform regime, clipped", 64, 32, 80, 4, 20, {80, 70, 60, 50}},
      {"large n", 1024, 32, 10000, 32, 20, {1967, 1907, 1847, 1787, 1727, 1667, 1607, 1547,
                                            1487, 1427, 1367, 1307, 1247, 1187, 1127, 1067,
                                            1007, 947,  887,  827,  767,  707,  647,  587,
                                            527,  467,  407,  347,  287,  227,  167,  107}},
      {"one pyramid layer: steps 0", 256, 16, 5000, 1, 20, {484}},
      // Flooring of steps makes the total 4560 > 32 * 128 = 4096 (+11%).
      {"C=128 W=32: total exceeds L'C", 128, 32, 4096, 32, 20, {220, 215, 210, 205, 200, 195, 190,
                                                                185, 180, 175, 170, 165, 160, 155,
                                                                150, 145, 140, 135, 130, 125, 120,
                                                                115, 110, 105, 100, 95,  90,  85,
                                                                80,  75,  70,  65}},
      {"C=2048", 2048, 32, 32768, 32, 20, {3964, 3841, 3718, 3595, 3472, 3349, 3226, 3103,
                                           2980, 2857, 2734, 2611, 2488, 2365, 2242, 2119,
                                           1996, 1873, 1750, 1627, 1504, 1381, 1258, 1135,
                                           1012, 889,  766,  643,  520,  397,  274,  151}},
      {"beta 1: flat", 300, 20, 2000, 8, 1, std::vector<int>(8, 300)},
      {"29 layers of a 32-layer model", 400, 32, 4000, 29, 20, {750, 725, 700, 675, 650, 625,
                                                                600, 575, 550, 525, 500, 475,
                                                                450, 425, 400, 375, 350, 325,
                                                                300, 275, 250, 225, 200, 175,
                                                                150, 125, 100, 75,  50}},
  };
  return table;
}

TEST(PyramidBudgetTest, MatchesTheFormulaTable) {
  for (const BudgetRow& row : Table()) {
    EXPECT_EQ(PyramidBudgets(row.budget, row.window, row.n, row.num_layers, row.beta), row.expected)
        << row.regime << ": C=" << row.budget << " W=" << row.window << " n=" << row.n
        << " L'=" << row.num_layers << " beta=" << row.beta;
  }
}

// The plans of an all-pyramid policy use the same budgets (l' = layer when every layer is
// pyramidal), and compress exactly the layers whose budget is below n.
TEST(PyramidBudgetTest, PlansUseTheTable) {
  for (const BudgetRow& row : Table()) {
    KvPolicyOptions options;
    options.budget = row.budget;
    options.window = row.window;
    options.beta = row.beta;
    Result<KvPolicy> policy = KvPolicy::Parse("pyramidkv", row.num_layers, options);
    ASSERT_TRUE(policy.ok()) << policy.status().ToString();
    const std::vector<LayerPlan> plans = policy->PlanPrompt(row.n);
    for (int layer = 0; layer < row.num_layers; ++layer) {
      EXPECT_EQ(plans[layer].budget, row.expected[layer]) << row.regime << " layer " << layer;
      EXPECT_EQ(plans[layer].compress, row.n > row.expected[layer])
          << row.regime << " layer " << layer;
    }
  }
}

// Properties on random inputs: the total never falls below L' * C (floored steps only move
// budget up the pyramid) and exceeds it by less than L'(L'-1)/2; budgets fall with depth; each
// layer keeps at least the window and at most the prompt once it compresses.
TEST(PyramidBudgetTest, RandomInputsKeepTheTotalAndOrder) {
  auto rng = testing::MakeRng();
  const auto uniform = [&](int low, int high) {
    return std::uniform_int_distribution<int>(low, high)(rng);
  };
  for (int trial = 0; trial < 20000; ++trial) {
    const int budget = uniform(2, 8192);
    const int window = uniform(1, std::min(budget - 1, 512));
    const int num_layers = uniform(1, 128);
    const int beta = uniform(1, 64);
    const int n = uniform(1, 4 * budget);
    const std::vector<int> budgets = PyramidBudgets(budget, window, n, num_layers, beta);
    SCOPED_TRACE("C=" + std::to_string(budget) + " W=" + std::to_string(window) +
                 " n=" + std::to_string(n) + " L'=" + std::to_string(num_layers) +
                 " beta=" + std::to_string(beta));
    ASSERT_EQ(budgets.size(), static_cast<size_t>(num_layers));
    const int64_t total = std::accumulate(budgets.begin(), budgets.end(), int64_t{0});
    const int64_t target = int64_t{num_layers} * budget;
    ASSERT_GE(total, target - num_layers);
    ASSERT_GE(total, target);
    if (num_layers > 1) {
      ASSERT_LT(total, target + int64_t{num_layers} * (num_layers - 1) / 2 + 1);
    }
    for (int layer = 1; layer < num_layers; ++layer) {
      ASSERT_LE(budgets[layer], budgets[layer - 1]) << "layer " << layer;
    }
    for (int layer = 0; layer < num_layers; ++layer) {
      ASSERT_GE(budgets[layer], window) << "layer " << layer;
      if (n >= budget) {
        ASSERT_LE(budgets[layer], n) << "layer " << layer;
      }
    }
    if (n < budget || n < 2 * (budget - window)) {
      ASSERT_EQ(budgets, std::vector<int>(num_layers, budget));
    }
  }
}

}  // namespace
}  // namespace sieve
