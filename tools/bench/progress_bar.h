// Progress of a benchmark run on stderr: a bar redrawn in place when stderr is a terminal, else a
// line every few seconds (so CI logs show that a long run is alive without filling up).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace sieve::bench {

class ProgressBar {
 public:
  // `enabled` false draws nothing (--no-progress). `unit` names what is counted in the rate
  // ("req/s"); chunks are shown only when some were counted.
  ProgressBar(std::string label, int total, bool enabled, std::string unit = "req");
  ~ProgressBar();
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  // The run's state; cheap to call often: it redraws at most a few times a second.
  void Update(int done, int failed = 0, int64_t chunks_received = 0);
  // Draws the final state and ends the line.
  void Finish();

 private:
  void Draw(bool final_draw);

  std::string label_;
  std::string unit_;
  int total_;
  bool enabled_;
  bool is_tty_;
  bool finished_ = false;
  int done_ = 0;
  int failed_ = 0;
  int64_t chunks_ = 0;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_draw_;
};

}  // namespace sieve::bench
