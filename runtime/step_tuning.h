// Step tuning: the choices a backend left open between options that timed alike alone (the CUDA
// backend: a decode GEMM's cuBLASLt configurations within 3% of each other) are decided by timing
// the whole step they serve, captured as a graph. Alone, gate_up's third configuration timed
// 0.0600 ms against the second's 0.0604, yet it made the sparse decode step 0.12 ms slower
// (bench/results/2026-12-01-s11-h200-retile-broad.json): what a kernel costs among its neighbours
// is not what it costs alone.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace sieve {

// What TuneStep needs of a backend (CaptureTunedGraph wires a Backend to it; tests, a fake).
struct StepTuningHooks {
  std::function<std::vector<Backend::TuningChoice>()> open_choices;
  std::function<void(int choice, int option)> set_option;
  std::function<void(int choice)> close_choice;
  std::function<int()> capture;           // the step as a graph
  std::function<double(int graph)> time;  // one sample of its replay time, ms
  std::function<void(int graph)> destroy;
};

struct StepTuningOutcome {
  std::string choice;
  std::vector<std::string> options;
  std::vector<double> ms;  // per option: the lower median of its samples (empty: not timed)
  int chosen = 0;
};

// Decides the open choices one at a time, first to last (one pass of coordinate descent; a choice
// that opens meanwhile, e.g. a GEMM first planned inside a capture, comes after): each option of
// the choice is captured, the graphs are timed `rounds` times each (a round visits them in a
// shuffled order) after one warm-up sample each, and the option with the lowest lower median is
// kept if it beats option 0, the pick alone, by more than 0.2%; then the choice is closed.
// Returns what was decided, in order.
std::vector<StepTuningOutcome> TuneStep(const StepTuningHooks& hooks, int rounds);

// `step` (ops on `backend` only, no host work) captured as a graph. The backend's choices opened
// since its last MarkTuningScope() are first settled by TuneStep if `replays_allowed`, else closed
// at their pick alone. Replays run the step again on its own buffers, so it must write the same
// values each time: a decode step does (the same new K/V entries, the same logits), except where
// H2O's score pool sums the step's attention into itself. After tuning, the returned graph is
// replayed once, so that the step's outputs are computed with the options chosen. `outcomes`
// (optional) gets what was decided.
int CaptureTunedGraph(Backend& backend, const std::function<void()>& step, bool replays_allowed,
                      std::vector<StepTuningOutcome>* outcomes = nullptr);

// One line per decided choice: "GEMM 64 x 28672 x 4096: 5.431 | 5.552 ms -> option 0 (...)".
std::string DescribeStepTuning(const std::vector<StepTuningOutcome>& outcomes);

}  // namespace sieve
