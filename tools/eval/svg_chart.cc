#include "tools/eval/svg_chart.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "tools/bench/svg_writer.h"

namespace sieve::eval {

std::string ScoreColor(double score) {
  // Red -> yellow -> green, the needle-in-a-haystack charts' scale.
  const double s = std::clamp(std::isfinite(score) ? score : 0.0, 0.0, 1.0);
  const auto mix = [](int a, int b, double t) {
    return static_cast<int>(std::lround(a + (b - a) * t));
  };
  int r = 0, g = 0, b = 0;
  if (s < 0.5) {
    r = mix(0xd7, 0xfe, s * 2);
    g = mix(0x30, 0xe0, s * 2);
    b = mix(0x27, 0x8b, s * 2);
  } else {
    r = mix(0xfe, 0x1a, (s - 0.5) * 2);
    g = mix(0xe0, 0x98, (s - 0.5) * 2);
    b = mix(0x8b, 0x50, (s - 0.5) * 2);
  }
  return fmt::format("#{:02x}{:02x}{:02x}", r, g, b);
}

std::string NeedleHeatmapSvg(const std::string& title, const std::vector<int>& lengths,
                             const std::vector<double>& depths,
                             const std::vector<std::vector<std::optional<double>>>& scores) {
  const int cell_w = std::max(40, 480 / std::max<int>(1, static_cast<int>(lengths.size())));
  const int cell_h = std::max(24, 300 / std::max<int>(1, static_cast<int>(depths.size())));
  const int left = 80, top = 50, scale_w = 20;
  const int plot_w = cell_w * static_cast<int>(lengths.size());
  const int plot_h = cell_h * static_cast<int>(depths.size());
  const int width = left + plot_w + 100;
  const int height = top + plot_h + 60;
  std::string svg = bench::SvgHeader(width, height);
  svg += bench::SvgText(width / 2.0, 28, title, 16, "middle", " font-weight=\"bold\"");
  for (size_t row = 0; row < depths.size(); ++row) {
    const double y = top + static_cast<double>(row) * cell_h;
    svg += bench::SvgText(left - 8, y + cell_h / 2.0 + 4, fmt::format("{:.0f}%", depths[row] * 100),
                          11, "end");
    for (size_t column = 0; column < lengths.size(); ++column) {
      const double x = left + static_cast<double>(column) * cell_w;
      const std::optional<double> score =
          row < scores.size() && column < scores[row].size() ? scores[row][column] : std::nullopt;
      svg += fmt::format(
          "<rect class=\"cell\" x=\"{:.1f}\" y=\"{:.1f}\" width=\"{}\" height=\"{}\" "
          "fill=\"{}\" stroke=\"white\"><title>length {}, depth {:.0f}%: {}</title></rect>\n",
          x, y, cell_w, cell_h, score ? ScoreColor(*score) : std::string("#cccccc"),
          lengths[column], depths[row] * 100,
          score ? fmt::format("{:.1f}%", *score * 100) : std::string("not measured"));
    }
  }
  for (size_t column = 0; column < lengths.size(); ++column) {
    svg += bench::SvgText(left + (static_cast<double>(column) + 0.5) * cell_w, top + plot_h + 16,
                          std::to_string(lengths[column]), 11);
  }
  svg += bench::SvgText(left + plot_w / 2.0, top + plot_h + 40, "context length (tokens)", 13);
  svg += bench::SvgText(20, top + plot_h / 2.0, "needle depth", 13, "middle",
                        fmt::format(" transform=\"rotate(-90 20 {:.1f})\"", top + plot_h / 2.0));
  // The colour scale: 0% at the bottom, 100% at the top.
  const int scale_x = left + plot_w + 30;
  constexpr int kSteps = 20;
  for (int step = 0; step < kSteps; ++step) {
    const double score = 1.0 - (step + 0.5) / kSteps;
    svg += fmt::format(
        "<rect class=\"scale\" x=\"{}\" y=\"{:.1f}\" width=\"{}\" height=\"{:.2f}\" "
        "fill=\"{}\"/>\n",
        scale_x, top + step * plot_h / static_cast<double>(kSteps), scale_w,
        plot_h / static_cast<double>(kSteps) + 0.5, ScoreColor(score));
  }
  svg += bench::SvgText(scale_x + scale_w + 4, top + 10, "100%", 10, "start");
  svg += bench::SvgText(scale_x + scale_w + 4, top + plot_h, "0%", 10, "start");
  svg += bench::SvgText(scale_x + scale_w / 2.0, top - 8, "score", 10);
  svg += bench::kSvgEnd;
  return svg;
}

std::string BudgetChartSvg(const std::string& title, const std::string& y_label,
                           const std::vector<int>& budgets, const std::vector<ChartSeries>& series,
                           std::optional<double> dense, bool percent) {
  const int width = 640, height = 400, left = 70, right = 170, top = 50, bottom = 60;
  const int plot_w = width - left - right, plot_h = height - top - bottom;
  std::string svg = bench::SvgHeader(width, height);
  svg += bench::SvgText(width / 2.0, 28, title, 16, "middle", " font-weight=\"bold\"");
  double y_max = percent ? 100.0 : 0.0;
  for (const ChartSeries& line : series) {
    for (const auto& value : line.values) {
      if (value && std::isfinite(*value)) y_max = std::max(y_max, *value);
    }
  }
  if (dense && std::isfinite(*dense)) y_max = std::max(y_max, *dense);
  if (y_max <= 0) y_max = 1;
  if (!percent) y_max *= 1.1;
  const int lo = budgets.empty() ? 1 : *std::min_element(budgets.begin(), budgets.end());
  const int hi = budgets.empty() ? 1 : *std::max_element(budgets.begin(), budgets.end());
  const bool log_x = lo > 0 && hi > 4 * lo;
  const auto x_of = [&](int budget) {
    if (hi == lo) return left + plot_w / 2.0;
    const double t =
        log_x ? std::log(static_cast<double>(budget) / lo) / std::log(static_cast<double>(hi) / lo)
              : static_cast<double>(budget - lo) / (hi - lo);
    return left + 20 + t * (plot_w - 40);
  };
  const auto y_of = [&](double value) { return top + plot_h * (1.0 - value / y_max); };
  svg += fmt::format(
      "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#444\"/>\n", left,
      top, plot_w, plot_h);
  for (int tick = 0; tick <= 4; ++tick) {
    const double value = y_max * tick / 4.0;
    const double y = y_of(value);
    svg += fmt::format("<line x1=\"{}\" y1=\"{:.1f}\" x2=\"{}\" y2=\"{:.1f}\" stroke=\"#ddd\"/>\n",
                       left, y, left + plot_w, y);
    svg += bench::SvgText(left - 6, y + 4,
                          percent ? fmt::format("{:.0f}", value) : fmt::format("{:.3g}", value), 11,
                          "end");
  }
  for (const int budget : budgets) {
    svg += bench::SvgText(x_of(budget), top + plot_h + 16, std::to_string(budget), 11);
  }
  svg += bench::SvgText(left + plot_w / 2.0, height - 18, "KV budget (entries per layer)", 13);
  svg += bench::SvgText(18, top + plot_h / 2.0, y_label, 13, "middle",
                        fmt::format(" transform=\"rotate(-90 18 {:.1f})\"", top + plot_h / 2.0));
  double legend_y = top + 10;
  if (dense) {
    svg += fmt::format(
        "<line class=\"dense\" x1=\"{}\" y1=\"{:.1f}\" x2=\"{}\" y2=\"{:.1f}\" stroke=\"#000\" "
        "stroke-dasharray=\"6,4\"/>\n",
        left, y_of(*dense), left + plot_w, y_of(*dense));
    svg += fmt::format(
        "<line x1=\"{}\" y1=\"{:.1f}\" x2=\"{}\" y2=\"{:.1f}\" stroke=\"#000\" "
        "stroke-dasharray=\"6,4\"/>\n",
        left + plot_w + 10, legend_y, left + plot_w + 30, legend_y);
    svg += bench::SvgText(left + plot_w + 34, legend_y + 4, "dense (full)", 11, "start");
    legend_y += 18;
  }
  for (size_t index = 0; index < series.size(); ++index) {
    const char* color = bench::SeriesColor(index);
    std::string points;
    std::string markers;
    for (size_t at = 0; at < budgets.size() && at < series[index].values.size(); ++at) {
      const auto& value = series[index].values[at];
      if (!value || !std::isfinite(*value)) continue;
      const double x = x_of(budgets[at]), y = y_of(*value);
      points += fmt::format("{:.1f},{:.1f} ", x, y);
      markers +=
          fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3.5\" fill=\"{}\"/>\n", x, y, color);
    }
    svg += fmt::format(
        "<polyline class=\"series\" points=\"{}\" fill=\"none\" stroke=\"{}\" "
        "stroke-width=\"2\"/>\n",
        points, color);
    svg += markers;
    svg += fmt::format(
        "<line x1=\"{}\" y1=\"{:.1f}\" x2=\"{}\" y2=\"{:.1f}\" stroke=\"{}\" "
        "stroke-width=\"2\"/>\n",
        left + plot_w + 10, legend_y, left + plot_w + 30, legend_y, color);
    svg += bench::SvgText(left + plot_w + 34, legend_y + 4, series[index].name, 11, "start");
    legend_y += 18;
  }
  svg += bench::kSvgEnd;
  return svg;
}

}  // namespace sieve::eval
