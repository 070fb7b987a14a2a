// Charts as plain SVG text: no image library and no fonts of our own (the viewer draws the text).
// The pieces every chart of the `sieve` command shares — the document, text, the series palette
// and a line-chart panel — used by the sweep chart (plot.h) and `sieve eval`'s charts
// (tools/eval/svg_chart.h).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace sieve::bench {

// Text made safe for SVG: & < > " escaped.
std::string XmlEscape(const std::string& text);

// The opening <svg> tag of a `width` x `height` document and its white background; close the
// document with kSvgEnd.
std::string SvgHeader(int width, int height);
inline constexpr const char* kSvgEnd = "</svg>\n";

// One <text> at (x, y) in a sans-serif font; `anchor` is "start", "middle" or "end"; `extra` is
// appended to the tag's attributes (e.g. " font-weight=\"bold\"").
std::string SvgText(double x, double y, const std::string& text, int size,
                    const char* anchor = "middle", const std::string& extra = "");

// The colour of series `index`, "#rrggbb" (matplotlib's tab10, cycling).
const char* SeriesColor(size_t index);

struct SvgBox {
  double left = 0, top = 0, width = 0, height = 0;
};

struct LineCurve {
  std::string legend;  // "" for no legend entry
  std::string color;   // "#rrggbb"
  bool dashed = false;
  std::vector<double> y;  // one per x value of the panel; NaN: not measured, not drawn
};

// A line chart in `box`: a frame, a y axis from 0 to a round number above the largest value with
// about five ticks and a light grid, one tick per x value (log2-spaced when `log_x` and the values
// are positive), the curves as polylines with markers (class "series"), and a legend in the upper
// left corner. Returns SVG elements to place inside a document.
std::string LinePanelSvg(const SvgBox& box, const std::string& title, const std::string& x_label,
                         const std::vector<double>& x, bool log_x,
                         const std::vector<LineCurve>& curves);

}  // namespace sieve::bench
