// Charts of `sieve eval` as plain SVG text, drawn with tools/bench/svg_writer.h's pieces: the
// needle heatmap (length x depth, coloured by score, as gkamradt's needle-in-a-haystack charts) and
// the score-vs-budget chart (a line per policy, dense as a horizontal reference).
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace sieve::eval {

// `scores[depth][length]` in [0, 1] (nullopt: not measured, drawn grey). One <rect> per cell with
// class "cell", axis labels, and a colour scale from red (0) through yellow to green (1).
std::string NeedleHeatmapSvg(const std::string& title, const std::vector<int>& lengths,
                             const std::vector<double>& depths,
                             const std::vector<std::vector<std::optional<double>>>& scores);

struct ChartSeries {
  std::string name;
  std::vector<std::optional<double>> values;  // one per budget (nullopt: not measured)
};

// x: budgets (log scale when they span more than 4x), y: `y_label` from 0 to the largest value
// (percent scores: 0..100). A polyline with markers per series; `dense`, when set, a dashed
// horizontal line labelled "dense (full)".
std::string BudgetChartSvg(const std::string& title, const std::string& y_label,
                           const std::vector<int>& budgets, const std::vector<ChartSeries>& series,
                           std::optional<double> dense, bool percent);

// The colour of a score in [0, 1] on the heatmap's scale, "#rrggbb".
std::string ScoreColor(double score);

}  // namespace sieve::eval
