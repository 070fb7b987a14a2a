#include "tools/bench/progress_bar.h"

#include <unistd.h>

#include <cstdio>
#include <string>

#include <fmt/format.h>

namespace sieve::bench {

namespace {

constexpr int kBarWidth = 30;
constexpr std::chrono::milliseconds kTtyRedrawEvery{100};
constexpr std::chrono::seconds kLineEvery{10};

std::string FormatDuration(double seconds) {
  const int total = static_cast<int>(seconds + 0.5);
  if (total >= 3600)
    return fmt::format("{}:{:02}:{:02}", total / 3600, total / 60 % 60, total % 60);
  return fmt::format("{:02}:{:02}", total / 60, total % 60);
}

}  // namespace

ProgressBar::ProgressBar(std::string label, int total, bool enabled, std::string unit)
    : label_(std::move(label)),
      unit_(std::move(unit)),
      total_(total),
      enabled_(enabled),
      is_tty_(isatty(fileno(stderr)) != 0),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_) {
  if (enabled_) Draw(false);
}

ProgressBar::~ProgressBar() { Finish(); }

void ProgressBar::Update(int done, int failed, int64_t chunks_received) {
  done_ = done;
  failed_ = failed;
  chunks_ = chunks_received;
  if (!enabled_ || finished_) return;
  const auto now = std::chrono::steady_clock::now();
  if (now - last_draw_ >= (is_tty_ ? std::chrono::milliseconds(kTtyRedrawEvery) : kLineEvery)) {
    Draw(false);
  }
}

void ProgressBar::Finish() {
  if (!enabled_ || finished_) return;
  Draw(true);
  finished_ = true;
}

void ProgressBar::Draw(bool final_draw) {
  last_draw_ = std::chrono::steady_clock::now();
  const double elapsed = std::chrono::duration<double>(last_draw_ - start_).count();
  const double fraction = total_ > 0 ? static_cast<double>(done_) / total_ : 1.0;
  std::string eta = "--:--";
  if (done_ > 0 && done_ < total_) eta = FormatDuration(elapsed / fraction - elapsed);
  if (done_ >= total_) eta = "00:00";
  const std::string chunks =
      chunks_ > 0 ? fmt::format(", {:.1f} chunks/s", elapsed > 0 ? chunks_ / elapsed : 0.0) : "";
  const std::string stats =
      fmt::format("{}/{} {} elapsed, {} left, {:.2f} {}/s{}{}", done_, total_,
                  FormatDuration(elapsed), eta, elapsed > 0 ? done_ / elapsed : 0.0, unit_, chunks,
                  failed_ > 0 ? fmt::format(", {} failed", failed_) : std::string());
  if (is_tty_) {
    const int filled = static_cast<int>(fraction * kBarWidth);
    const std::string bar = std::string(static_cast<size_t>(filled), '#') +
                            std::string(static_cast<size_t>(kBarWidth - filled), '.');
    // \033[K clears what a longer previous line left behind.
    std::fprintf(stderr, "\r%s [%s] %3d%% %s\033[K%s", label_.c_str(), bar.c_str(),
                 static_cast<int>(fraction * 100), stats.c_str(), final_draw ? "\n" : "");
  } else {
    std::fprintf(stderr, "%s %3d%% %s\n", label_.c_str(), static_cast<int>(fraction * 100),
                 stats.c_str());
  }
  std::fflush(stderr);
}

}  // namespace sieve::bench
