#include "tools/bench/svg_writer.h"

#include <algorithm>
#include <cmath>
#include <iterator>

#include <fmt/format.h>

namespace sieve::bench {

namespace {

constexpr const char* kFont = "font-family=\"sans-serif\"";
constexpr const char* kPalette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728",
                                    "#9467bd", "#8c564b", "#e377c2", "#17becf"};
constexpr int kTargetYTicks = 5;

// A step of 1, 2, 2.5 or 5 x 10^k giving about kTargetYTicks ticks up to `max_value`.
double NiceStep(double max_value) {
  const double raw = max_value / kTargetYTicks;
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  for (const double factor : {1.0, 2.0, 2.5, 5.0}) {
    if (factor * magnitude >= raw) return factor * magnitude;
  }
  return 10 * magnitude;
}

std::string DashAttribute(bool dashed) { return dashed ? " stroke-dasharray=\"8,5\"" : ""; }

}  // namespace

std::string XmlEscape(const std::string& text) {
  std::string out;
  for (const char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string SvgHeader(int width, int height) {
  return fmt::format(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" "
      "viewBox=\"0 0 {0} {1}\">\n<rect x=\"0\" y=\"0\" width=\"{0}\" height=\"{1}\" "
      "fill=\"white\"/>\n",
      width, height);
}

std::string SvgText(double x, double y, const std::string& text, int size, const char* anchor,
                    const std::string& extra) {
  return fmt::format(
      "<text x=\"{:.1f}\" y=\"{:.1f}\" {} font-size=\"{}\" text-anchor=\"{}\"{}>{}"
      "</text>\n",
      x, y, kFont, size, anchor, extra, XmlEscape(text));
}

const char* SeriesColor(size_t index) { return kPalette[index % std::size(kPalette)]; }

std::string LinePanelSvg(const SvgBox& box, const std::string& title, const std::string& x_label,
                         const std::vector<double>& x, bool log_x,
                         const std::vector<LineCurve>& curves) {
  double max_value = 0;
  for (const LineCurve& curve : curves) {
    for (const double value : curve.y) {
      if (std::isfinite(value)) max_value = std::max(max_value, value);
    }
  }
  if (max_value <= 0) max_value = 1;
  const double step = NiceStep(max_value);
  const double y_max = std::ceil(max_value / step) * step;
  double low = 0, high = 0;
  if (!x.empty()) {
    low = *std::min_element(x.begin(), x.end());
    high = *std::max_element(x.begin(), x.end());
  }
  const bool log = log_x && low > 0;
  // 0..1 across the plot, with a margin so that no marker sits on an axis.
  const auto x_of = [&](double value) {
    constexpr double kPad = 0.05;
    if (high == low) return box.left + box.width / 2;
    const double t = log ? (std::log2(value) - std::log2(low)) / (std::log2(high) - std::log2(low))
                         : (value - low) / (high - low);
    return box.left + (kPad + t * (1 - 2 * kPad)) * box.width;
  };
  const auto y_of = [&](double value) { return box.top + box.height * (1.0 - value / y_max); };
  std::string svg =
      SvgText(box.left + box.width / 2, box.top - 12, title, 15, "middle", " font-weight=\"bold\"");
  for (int tick = 0; tick * step <= y_max + step / 2; ++tick) {
    const double y = y_of(tick * step);
    svg += fmt::format(
        "<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#ddd\"/>\n",
        box.left, y, box.left + box.width, y);
    svg += SvgText(box.left - 6, y + 4, fmt::format("{:.10g}", tick * step), 11, "end");
  }
  for (const double value : x) {
    svg += SvgText(x_of(value), box.top + box.height + 16, fmt::format("{:g}", value), 11);
  }
  svg += SvgText(box.left + box.width / 2, box.top + box.height + 38,
                 log ? x_label + " (log scale)" : x_label, 13);
  svg += fmt::format(
      "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"none\" "
      "stroke=\"#444\"/>\n",
      box.left, box.top, box.width, box.height);
  double legend_y = box.top + 16;
  for (const LineCurve& curve : curves) {
    std::string points;
    std::string markers;
    for (size_t at = 0; at < x.size() && at < curve.y.size(); ++at) {
      if (!std::isfinite(curve.y[at])) continue;
      const double px = x_of(x[at]), py = y_of(curve.y[at]);
      points += fmt::format("{:.1f},{:.1f} ", px, py);
      markers += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3.5\" fill=\"{}\"/>\n", px,
                             py, curve.color);
    }
    svg += fmt::format(
        "<polyline class=\"series\" points=\"{}\" fill=\"none\" stroke=\"{}\" "
        "stroke-width=\"2\"{}/>\n",
        points, curve.color, DashAttribute(curve.dashed));
    svg += markers;
    if (curve.legend.empty()) continue;
    svg += fmt::format(
        "<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"{}\" "
        "stroke-width=\"2\"{}/>\n",
        box.left + 10, legend_y, box.left + 38, legend_y, curve.color, DashAttribute(curve.dashed));
    svg += SvgText(box.left + 44, legend_y + 4, curve.legend, 11, "start");
    legend_y += 16;
  }
  return svg;
}

}  // namespace sieve::bench
