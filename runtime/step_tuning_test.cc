#include "runtime/step_tuning.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <string>
#include <vector>

namespace sieve {
namespace {

// A backend's choices as TuneStep sees them: each option adds its cost to a step's time, captured
// graphs remember the options they were captured with, and timing samples carry small noise and,
// once per graph at a random sample, a large outlier (a replay slowed by something else).
class FakeChoices {
 public:
  struct Choice {
    std::string name;
    std::vector<double> costs;  // per option, ms
    int option = 0;
    bool open = true;
    bool opens_on_capture = false;  // becomes open at the first capture (planned inside one)
  };

  explicit FakeChoices(std::vector<Choice> choices, uint32_t seed)
      : choices_(std::move(choices)), rng_(seed) {}

  StepTuningHooks Hooks() {
    StepTuningHooks hooks;
    hooks.open_choices = [this] {
      std::vector<Backend::TuningChoice> open;
      for (const Choice& choice : choices_) {
        if (!Visible(choice)) continue;
        Backend::TuningChoice entry{choice.name, {}};
        for (size_t option = 0; option < choice.costs.size(); ++option) {
          entry.options.push_back(choice.name + "/" + std::to_string(option));
        }
        open.push_back(entry);
      }
      return open;
    };
    hooks.set_option = [this](int index, int option) { OpenAt(index).option = option; };
    hooks.close_choice = [this](int index) { OpenAt(index).open = false; };
    hooks.capture = [this] {
      ++captures_;
      std::vector<int> options;
      for (const Choice& choice : choices_) options.push_back(choice.option);
      graphs_[next_graph_] = options;
      outlier_at_[next_graph_] = std::uniform_int_distribution<int>(1, 5)(rng_);
      return next_graph_++;
    };
    hooks.time = [this](int graph) {
      EXPECT_TRUE(graphs_.count(graph)) << "timed a destroyed graph";
      double ms = 5.0;
      for (size_t i = 0; i < choices_.size(); ++i) {
        ms += choices_[i].costs[static_cast<size_t>(graphs_[graph][i])];
      }
      ms += std::uniform_real_distribution<double>(0.0, 0.004)(rng_);
      if (samples_[graph]++ == outlier_at_[graph]) ms += 0.5;  // sample 0 is the warm-up
      return ms;
    };
    hooks.destroy = [this](int graph) { EXPECT_EQ(graphs_.erase(graph), 1u); };
    return hooks;
  }

  const Choice& choice(size_t index) const { return choices_[index]; }
  size_t live_graphs() const { return graphs_.size(); }
  int captures() const { return captures_; }

 private:
  bool Visible(const Choice& choice) const {
    return choice.open && (!choice.opens_on_capture || captures_ > 0);
  }
  Choice& OpenAt(int index) {
    for (Choice& choice : choices_) {
      if (Visible(choice) && index-- == 0) return choice;
    }
    ADD_FAILURE() << "no open choice " << index;
    return choices_.front();
  }

  std::vector<Choice> choices_;
  std::mt19937 rng_;
  std::map<int, std::vector<int>> graphs_;
  std::map<int, int> outlier_at_;  // which sample of the graph is slowed
  std::map<int, int> samples_;
  int next_graph_ = 0;
  int captures_ = 0;
};

TEST(StepTuningTest, KeepsTheFastestOptionOfEveryChoiceAndFreesItsGraphs) {
  std::random_device seed;
  FakeChoices fake({{"qkv", {0.05, 0.0, 0.02}},
                    {"gate_up", {0.0, 0.12}},
                    {"down", {0.03, 0.0, 0.01}},
                    {"lm_head", {0.02, 0.0}, 0, true, true}},
                   seed());
  const std::vector<StepTuningOutcome> outcomes = TuneStep(fake.Hooks(), 5);
  ASSERT_EQ(outcomes.size(), 4u);
  EXPECT_EQ(outcomes[0].choice, "qkv");
  EXPECT_EQ(outcomes[1].choice, "gate_up");
  EXPECT_EQ(outcomes[2].choice, "down");
  EXPECT_EQ(outcomes[3].choice, "lm_head");  // opened during the first captures: decided last
  EXPECT_EQ(outcomes[0].chosen, 1);
  EXPECT_EQ(outcomes[1].chosen, 0);
  EXPECT_EQ(outcomes[2].chosen, 1);
  EXPECT_EQ(outcomes[3].chosen, 1);
  const int expected[] = {1, 0, 1, 1};
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(fake.choice(i).option, expected[i]) << fake.choice(i).name;
    EXPECT_FALSE(fake.choice(i).open) << fake.choice(i).name;
    EXPECT_EQ(outcomes[i].ms.size(), outcomes[i].options.size());
  }
  // The lower median of 5 samples shrugs off the outliers: the reported times are the costs.
  EXPECT_NEAR(outcomes[1].ms[1] - outcomes[1].ms[0], 0.12, 0.01);
  EXPECT_EQ(fake.live_graphs(), 0u);
  EXPECT_EQ(fake.captures(), 3 + 2 + 3 + 2);
  EXPECT_NE(DescribeStepTuning(outcomes).find("gate_up:"), std::string::npos);
}

TEST(StepTuningTest, AGainWithinTheNoiseKeepsThePickAlone) {
  std::random_device seed;
  // Option 1 is 0.1% faster (within the 0.2% margin), option 2 of the second choice 1%.
  FakeChoices fake({{"o", {0.005, 0.0}}, {"down", {0.05, 0.03, 0.0}}}, seed());
  const std::vector<StepTuningOutcome> outcomes = TuneStep(fake.Hooks(), 5);
  ASSERT_EQ(outcomes.size(), 2u);
  EXPECT_EQ(outcomes[0].chosen, 0);
  EXPECT_EQ(outcomes[1].chosen, 2);
}

TEST(StepTuningTest, ATieKeepsThePickAloneAndOneOptionNeedsNoCapture) {
  std::random_device seed;
  FakeChoices fake({{"o", {0.0, 0.0}}, {"single", {0.0}}}, seed());
  StepTuningHooks hooks = fake.Hooks();
  hooks.time = [](int) { return 5.0; };  // exactly equal
  const std::vector<StepTuningOutcome> outcomes = TuneStep(hooks, 3);
  ASSERT_EQ(outcomes.size(), 2u);
  EXPECT_EQ(outcomes[0].chosen, 0);
  EXPECT_EQ(outcomes[1].chosen, 0);
  EXPECT_TRUE(outcomes[1].ms.empty());
  EXPECT_EQ(fake.captures(), 2);  // the two options of "o" only
  EXPECT_FALSE(fake.choice(1).open);
}

}  // namespace
}  // namespace sieve
