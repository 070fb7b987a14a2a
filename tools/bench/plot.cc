#include "tools/bench/plot.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <set>

#include <fmt/format.h>

namespace sieve::bench {

namespace {

constexpr int kImageWidth = 1200;
constexpr int kImageHeight = 560;
constexpr int kTextScale = 2;
constexpr int kMarginLeft = 96;  // room for y tick labels
constexpr int kMarginRight = 24;
constexpr int kMarginTop = 76;     // image title and panel title
constexpr int kMarginBottom = 64;  // x tick labels and axis title
constexpr int kTargetYTicks = 5;
constexpr int kMarkerSize = 7;
constexpr int kLineThickness = 2;
constexpr int kDash = 8;

constexpr Rgb kWhite{255, 255, 255};
constexpr Rgb kBlack{0, 0, 0};
constexpr Rgb kGrid{225, 225, 225};
constexpr Rgb kLegendBorder{170, 170, 170};
constexpr Rgb kPalette[] = {{31, 119, 180}, {255, 127, 14},  {44, 160, 44},
                            {214, 39, 40},  {148, 103, 189}, {140, 86, 75}};

Rgb SeriesColor(size_t index) { return kPalette[index % std::size(kPalette)]; }

struct Box {
  int left, top, right, bottom;
};

// The concurrency axis: positions of the levels, log2-spaced when they span 8x or more.
class XAxis {
 public:
  explicit XAxis(const std::set<int>& values) {
    low_ = values.empty() ? 1 : *values.begin();
    high_ = values.empty() ? 1 : *values.rbegin();
    log_ = low_ > 0 && high_ >= 8 * low_;
  }
  bool log() const { return log_; }
  // 0..1 across the plot, with a margin so that no marker sits on an axis.
  double Fraction(double value) const {
    constexpr double kPad = 0.05;
    if (high_ == low_) return 0.5;
    const double t =
        log_ ? (std::log2(value) - std::log2(low_)) / (std::log2(high_) - std::log2(low_))
             : (value - low_) / (high_ - low_);
    return kPad + t * (1 - 2 * kPad);
  }

 private:
  double low_ = 1;
  double high_ = 1;
  bool log_ = false;
};

// A step of 1, 2, 2.5 or 5 x 10^k giving about kTargetYTicks ticks up to `max_value`.
double NiceStep(double max_value) {
  const double raw = max_value / kTargetYTicks;
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  for (double factor : {1.0, 2.0, 2.5, 5.0}) {
    if (factor * magnitude >= raw) return factor * magnitude;
  }
  return 10 * magnitude;
}

// "0.25", "1250": %g with enough digits that no tick value is rounded to its neighbour's.
std::string TickLabel(double value) { return fmt::format("{:.10g}", value); }

struct LegendEntry {
  std::string text;
  Rgb color;
  bool dashed = false;
};

void DrawLegend(RgbImage& image, const Box& plot, const std::vector<LegendEntry>& entries) {
  if (entries.empty()) return;
  constexpr int kSample = 28;  // length of the line sample
  constexpr int kPadding = 8;
  const int line_height = RgbImage::TextHeight(kTextScale) + 6;
  int text_width = 0;
  for (const LegendEntry& entry : entries) {
    text_width = std::max(text_width, RgbImage::TextWidth(entry.text, kTextScale));
  }
  const int width = kPadding * 3 + kSample + text_width;
  const int height = kPadding * 2 + line_height * static_cast<int>(entries.size()) - 6;
  const int left = plot.left + 12;
  const int top = plot.top + 12;
  image.FillRect(left, top, width, height, kLegendBorder);
  image.FillRect(left + 1, top + 1, width - 2, height - 2, kWhite);
  int y = top + kPadding;
  for (const LegendEntry& entry : entries) {
    const int middle = y + RgbImage::TextHeight(kTextScale) / 2 - 1;
    image.DrawLine(left + kPadding, middle, left + kPadding + kSample, middle, entry.color,
                   kLineThickness, entry.dashed ? kDash / 2 : 0);
    image.DrawText(left + kPadding * 2 + kSample, y, entry.text, kBlack, kTextScale);
    y += line_height;
  }
}

// One panel: frame, grid, ticks, the curves (value_of picks the y value of a level) and legend.
struct Curve {
  const SweepSeries* series;
  Rgb color;
  bool dashed;
  std::function<double(const SweepLevel&)> value_of;
};

void DrawPanel(RgbImage& image, const Box& plot, const std::string& title, const XAxis& x_axis,
               const std::set<int>& x_values, const std::vector<Curve>& curves,
               const std::vector<LegendEntry>& legend) {
  double max_value = 0;
  for (const Curve& curve : curves) {
    for (const SweepLevel& level : curve.series->levels) {
      const double value = curve.value_of(level);
      if (std::isfinite(value)) max_value = std::max(max_value, value);
    }
  }
  if (max_value <= 0) max_value = 1;
  const double step = NiceStep(max_value);
  const double y_max = std::ceil(max_value / step) * step;
  const auto to_x = [&](double value) {
    return plot.left +
           static_cast<int>(std::lround(x_axis.Fraction(value) * (plot.right - plot.left)));
  };
  const auto to_y = [&](double value) {
    return plot.bottom - static_cast<int>(std::lround(value / y_max * (plot.bottom - plot.top)));
  };
  const int text_height = RgbImage::TextHeight(kTextScale);
  image.DrawText((plot.left + plot.right - RgbImage::TextWidth(title, kTextScale)) / 2,
                 plot.top - text_height - 12, title, kBlack, kTextScale);
  // Grid and y ticks.
  for (int tick = 0; tick * step <= y_max + step / 2; ++tick) {
    const double value = tick * step;
    const int y = to_y(value);
    image.DrawLine(plot.left, y, plot.right, y, kGrid);
    const std::string label = TickLabel(value);
    image.DrawText(plot.left - 10 - RgbImage::TextWidth(label, kTextScale), y - text_height / 2,
                   label, kBlack, kTextScale);
  }
  // Grid and x ticks, one per level; a label that would overlap the previous one is left out.
  int last_label_right = -1000;
  for (int value : x_values) {
    const int x = to_x(value);
    image.DrawLine(x, plot.top, x, plot.bottom, kGrid);
    image.DrawLine(x, plot.bottom, x, plot.bottom + 5, kBlack);
    const std::string label = std::to_string(value);
    const int width = RgbImage::TextWidth(label, kTextScale);
    if (x - width / 2 > last_label_right + 6) {
      image.DrawText(x - width / 2, plot.bottom + 10, label, kBlack, kTextScale);
      last_label_right = x + width / 2;
    }
  }
  const std::string x_title = x_axis.log() ? "concurrency (log scale)" : "concurrency";
  image.DrawText((plot.left + plot.right - RgbImage::TextWidth(x_title, kTextScale)) / 2,
                 plot.bottom + 16 + text_height, x_title, kBlack, kTextScale);
  // Axes over the grid.
  image.DrawLine(plot.left, plot.top, plot.left, plot.bottom, kBlack);
  image.DrawLine(plot.left, plot.bottom, plot.right, plot.bottom, kBlack);
  for (const Curve& curve : curves) {
    bool has_previous = false;
    int previous_x = 0;
    int previous_y = 0;
    for (const SweepLevel& level : curve.series->levels) {
      const double value = curve.value_of(level);
      if (!std::isfinite(value)) continue;
      const int x = to_x(level.concurrency);
      const int y = to_y(value);
      if (has_previous) {
        image.DrawLine(previous_x, previous_y, x, y, curve.color, kLineThickness,
                       curve.dashed ? kDash : 0);
      }
      image.FillRect(x - kMarkerSize / 2, y - kMarkerSize / 2, kMarkerSize, kMarkerSize,
                     curve.color);
      has_previous = true;
      previous_x = x;
      previous_y = y;
    }
  }
  DrawLegend(image, plot, legend);
}

}  // namespace

RgbImage DrawSweepChart(const std::vector<SweepSeries>& series, const std::string& title) {
  RgbImage image(kImageWidth, kImageHeight, kWhite);
  image.DrawText((kImageWidth - RgbImage::TextWidth(title, kTextScale)) / 2, 10, title, kBlack,
                 kTextScale);
  std::set<int> x_values;
  for (const SweepSeries& one : series) {
    for (const SweepLevel& level : one.levels) x_values.insert(level.concurrency);
  }
  const XAxis x_axis(x_values);
  const int panel_width = kImageWidth / 2;
  const Box left{kMarginLeft, kMarginTop, panel_width - kMarginRight, kImageHeight - kMarginBottom};
  const Box right{panel_width + kMarginLeft, kMarginTop, kImageWidth - kMarginRight,
                  kImageHeight - kMarginBottom};
  // A level where every request failed has no latency to draw.
  const auto finite_if_completed = [](const SweepLevel& level, double value) {
    return level.metrics.completed > 0 ? value : NAN;
  };
  std::vector<Curve> throughput_curves;
  std::vector<Curve> ttft_curves;
  std::vector<LegendEntry> throughput_legend;
  std::vector<LegendEntry> ttft_legend;
  const bool many = series.size() > 1;
  for (size_t index = 0; index < series.size(); ++index) {
    const SweepSeries& one = series[index];
    const Rgb color = SeriesColor(index);
    throughput_curves.push_back({&one, color, false, [](const SweepLevel& level) {
                                   return level.metrics.output_throughput;
                                 }});
    ttft_curves.push_back({&one, color, false, [=](const SweepLevel& level) {
                             return finite_if_completed(level, level.metrics.ttft_ms.median);
                           }});
    ttft_curves.push_back({&one, color, true, [=](const SweepLevel& level) {
                             return finite_if_completed(level, level.metrics.ttft_ms.p99);
                           }});
    const std::string prefix = many || !one.label.empty() ? one.label + " " : "";
    if (many || !one.label.empty()) throughput_legend.push_back({one.label, color, false});
    ttft_legend.push_back({prefix + "P50", color, false});
    ttft_legend.push_back({prefix + "P99", color, true});
  }
  DrawPanel(image, left, "output tokens/s", x_axis, x_values, throughput_curves, throughput_legend);
  DrawPanel(image, right, "TTFT (ms)", x_axis, x_values, ttft_curves, ttft_legend);
  return image;
}

Result<SweepSeries> SweepSeriesFromJson(const nlohmann::json& json,
                                        const std::string& fallback_label) {
  const auto levels = json.find("levels");
  if (!json.is_object() || levels == json.end() || !levels->is_array() || levels->empty()) {
    return InvalidArgumentError("not a `sieve bench sweep` result: no \"levels\"");
  }
  SweepSeries series;
  series.label = json.value("label", std::string());
  if (series.label.empty()) series.label = fallback_label;
  for (const nlohmann::json& entry : *levels) {
    if (!entry.is_object() || !entry.contains("metrics")) {
      return InvalidArgumentError("a sweep level has no \"metrics\"");
    }
    SweepLevel level;
    level.concurrency = entry.value("concurrency", 0);
    level.num_prompts = entry.value("num_prompts", 0);
    level.metrics = MetricsFromJson(entry["metrics"]);
    series.levels.push_back(level);
  }
  std::sort(series.levels.begin(), series.levels.end(),
            [](const SweepLevel& a, const SweepLevel& b) { return a.concurrency < b.concurrency; });
  return series;
}

}  // namespace sieve::bench
