#include "runtime/step_tuning.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
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

// The lower median of each graph's samples: one warm-up sample each (a new graph's first replay),
// then `rounds` rounds, each visiting the graphs in its own shuffled order so that no graph always
// follows the same one.
std::vector<double> TimeGraphs(const StepTuningHooks& hooks, const std::vector<int>& graphs,
                               int rounds, uint32_t seed) {
  const size_t count = graphs.size();
  std::vector<std::vector<double>> samples(count);
  for (const int graph : graphs) hooks.time(graph);
  std::vector<size_t> order(count);
  std::iota(order.begin(), order.end(), size_t{0});
  std::mt19937 rng(seed);
  for (int round = 0; round < rounds; ++round) {
    std::shuffle(order.begin(), order.end(), rng);
    for (const size_t index : order) samples[index].push_back(hooks.time(graphs[index]));
  }
  std::vector<double> ms;
  for (auto& of_graph : samples) ms.push_back(LowerMedian(std::move(of_graph)));
  return ms;
}

// The option among `ms` that the tuner keeps: `incumbent` unless another is faster by more than
// the noise (kMargin), then the fastest.
int Keep(const std::vector<double>& ms, int incumbent) {
  const double keep = ms[static_cast<size_t>(incumbent)] * (1.0 - kMargin);
  int chosen = incumbent;
  for (size_t option = 0; option < ms.size(); ++option) {
    if (ms[option] < keep && ms[option] < ms[static_cast<size_t>(chosen)]) {
      chosen = static_cast<int>(option);
    }
  }
  return chosen;
}

}  // namespace

std::vector<StepTuningOutcome> TuneStep(const StepTuningHooks& hooks, int rounds) {
  SIEVE_CHECK(rounds > 0) << "step tuning needs at least one round";
  std::vector<StepTuningOutcome> outcomes;
  // Where each choice's descent starts, by name: its overlapping option where the joint probe
  // kept those, else option 0.
  std::map<std::string, int> start;
  {
    const std::vector<Backend::TuningChoice> open = hooks.open_choices();
    std::vector<int> overlapping;  // indices into `open`
    for (size_t index = 0; index < open.size(); ++index) {
      if (open[index].overlapping_option > 0) overlapping.push_back(static_cast<int>(index));
    }
    // One alone is tried by the descent anyway.
    if (overlapping.size() >= 2) {
      StepTuningOutcome outcome{"every overlapping option at once",
                                {"each choice at its pick", "each at its overlapping option"},
                                {},
                                0};
      std::vector<int> graphs{hooks.capture()};
      for (const int index : overlapping) {
        hooks.set_option(index, open[static_cast<size_t>(index)].overlapping_option);
      }
      graphs.push_back(hooks.capture());
      outcome.ms = TimeGraphs(hooks, graphs, rounds, /*seed=*/kMaxChoices);
      outcome.chosen = Keep(outcome.ms, 0);
      for (const int graph : graphs) hooks.destroy(graph);
      for (const int index : overlapping) {
        const Backend::TuningChoice& choice = open[static_cast<size_t>(index)];
        const int option = outcome.chosen == 1 ? choice.overlapping_option : 0;
        hooks.set_option(index, option);
        start[choice.name] = option;
      }
      outcomes.push_back(std::move(outcome));
    }
  }
  for (int decided = 0; decided < kMaxChoices; ++decided) {
    const std::vector<Backend::TuningChoice> open = hooks.open_choices();
    if (open.empty()) break;
    // The first open choice; any that open while its options are captured come after it.
    const auto started = start.find(open[0].name);
    const int incumbent = started != start.end() ? started->second : 0;
    StepTuningOutcome outcome{open[0].name, open[0].options, {}, incumbent};
    const int count = static_cast<int>(outcome.options.size());
    if (count > 1) {
      std::vector<int> graphs;
      for (int option = 0; option < count; ++option) {
        hooks.set_option(0, option);
        graphs.push_back(hooks.capture());
      }
      outcome.ms = TimeGraphs(hooks, graphs, rounds, static_cast<uint32_t>(decided));
      // The incumbent stays unless another option is faster by more than the noise.
      outcome.chosen = Keep(outcome.ms, incumbent);
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
