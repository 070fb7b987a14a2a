#include "runtime/step_tuning.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <random>

#include "core/check.h"

namespace sieve {
namespace {

// Replays per sample: one replay's timing carries the event overhead; two halve it.
constexpr int kReplaysPerSample = 2;
constexpr int kRounds = 7;
// Another option replaces option 0 when its step is faster by more than this share: between the
// options of one choice the sparse step's lower medians differ by 0.01-0.2% where the options
// are alike (bench/results/2026-12-01-s11-h200-step-tuning-first.json); a kernel misplaced among
// its neighbours costs 2%.
constexpr double kMargin = 0.002;
// A backend opens a bounded number of choices; this only stops a backend that keeps reopening.
constexpr int kMaxChoices = 256;

double LowerMedian(std::vector<double> samples) {
  std::sort(samples.begin(), samples.end());
  return samples[(samples.size() - 1) / 2];
}

}  // namespace

std::vector<StepTuningOutcome> TuneStep(const StepTuningHooks& hooks, int rounds) {
  SIEVE_CHECK(rounds > 0) << "step tuning needs at least one round";
  std::vector<StepTuningOutcome> outcomes;
  for (int decided = 0; decided < kMaxChoices; ++decided) {
    const std::vector<Backend::TuningChoice> open = hooks.open_choices();
    if (open.empty()) break;
    // The first open choice; any that open while its options are captured come after it.
    StepTuningOutcome outcome{open[0].name, open[0].options, {}, 0};
    const int count = static_cast<int>(outcome.options.size());
    if (count > 1) {
      std::vector<int> graphs;
      for (int option = 0; option < count; ++option) {
        hooks.set_option(0, option);
        graphs.push_back(hooks.capture());
      }
      std::vector<std::vector<double>> samples(static_cast<size_t>(count));
      for (const int graph : graphs) hooks.time(graph);  // warm-up: a new graph's first replay
      // Each round in its own order, so that no option always follows the same one.
      std::vector<int> order(static_cast<size_t>(count));
      std::iota(order.begin(), order.end(), 0);
      std::mt19937 rng(static_cast<uint32_t>(decided));
      for (int round = 0; round < rounds; ++round) {
        std::shuffle(order.begin(), order.end(), rng);
        for (const int option : order) {
          samples[static_cast<size_t>(option)].push_back(hooks.time(graphs[option]));
        }
      }
      for (int option = 0; option < count; ++option) {
        outcome.ms.push_back(LowerMedian(samples[static_cast<size_t>(option)]));
      }
      // Option 0, the pick alone, stays unless another is faster by more than the noise.
      const double keep = outcome.ms[0] * (1.0 - kMargin);
      for (int option = 1; option < count; ++option) {
        const double ms = outcome.ms[static_cast<size_t>(option)];
        if (ms < keep && ms < outcome.ms[static_cast<size_t>(outcome.chosen)]) {
          outcome.chosen = option;
        }
      }
      for (const int graph : graphs) hooks.destroy(graph);
      hooks.set_option(0, outcome.chosen);
    }
    hooks.close_choice(0);
    outcomes.push_back(std::move(outcome));
  }
  return outcomes;
}

int CaptureTunedGraph(Backend& backend, const std::function<void()>& step, bool replays_allowed,
                      std::vector<StepTuningOutcome>* outcomes) {
  const auto capture = [&] {
    backend.BeginCapture();
    step();
    return backend.EndCapture();
  };
  if (replays_allowed) {
    StepTuningHooks hooks;
    hooks.open_choices = [&] { return backend.OpenTuningChoices(); };
    hooks.set_option = [&](int choice, int option) { backend.SetTuningOption(choice, option); };
    hooks.close_choice = [&](int choice) { backend.CloseTuningChoice(choice); };
    hooks.capture = capture;
    hooks.time = [&](int graph) {
      const std::vector<double> ms = backend.TimeGraphReplays(graph, 1, kReplaysPerSample);
      SIEVE_CHECK(!ms.empty()) << "step tuning needs a backend that times graph replays";
      return ms.front();
    };
    hooks.destroy = [&](int graph) { backend.DestroyGraph(graph); };
    std::vector<StepTuningOutcome> decided = TuneStep(hooks, kRounds);
    const bool replayed = std::any_of(decided.begin(), decided.end(),
                                      [](const StepTuningOutcome& o) { return !o.ms.empty(); });
    if (outcomes != nullptr) *outcomes = std::move(decided);
    const int graph = capture();
    // The step's outputs (logits, the new K/V entries) are the last timed replay's, computed with
    // another option's rounding: computed once more as the chosen options compute them.
    if (replayed) backend.ReplayGraph(graph);
    return graph;
  }
  for (int closed = 0; closed < kMaxChoices && !backend.OpenTuningChoices().empty(); ++closed) {
    backend.CloseTuningChoice(0);
  }
  return capture();
}

std::string DescribeStepTuning(const std::vector<StepTuningOutcome>& outcomes) {
  std::string text;
  for (const StepTuningOutcome& outcome : outcomes) {
    text += outcome.choice + ":";
    for (size_t option = 0; option < outcome.ms.size(); ++option) {
      char ms[32];
      std::snprintf(ms, sizeof(ms), "%s %.3f", option == 0 ? "" : " |", outcome.ms[option]);
      text += ms;
    }
    text += outcome.ms.empty() ? " one option" : " ms";
    text += " -> option " + std::to_string(outcome.chosen) + " (" +
            outcome.options[static_cast<size_t>(outcome.chosen)] + ")\n";
  }
  return text;
}

}  // namespace sieve
