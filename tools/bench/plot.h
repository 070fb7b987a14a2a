// The sweep chart: output throughput and TTFT against concurrency, as SVG (svg_writer.h). Two
// panels side by side, one colour per series (several sweeps can be overlaid, e.g. dense against
// sparse), axes with tick labels, and a legend.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "tools/bench/report.h"

namespace sieve::bench {

struct SweepSeries {
  std::string label;  // legend text; "" when there is only one series to show
  std::vector<SweepLevel> levels;
};

// A 1200 x 560 SVG document. Left: output tokens/s. Right: TTFT P50 (solid) and P99 (dashed), ms.
// Concurrency runs on a log2 axis when it spans 8x or more, since 1..128 would otherwise crowd the
// low levels into a corner.
std::string SweepChartSvg(const std::vector<SweepSeries>& series, const std::string& title);

// The levels of a `sieve bench sweep` result JSON, labelled with its "label" (else
// `fallback_label`). InvalidArgument when the JSON holds no levels.
Result<SweepSeries> SweepSeriesFromJson(const nlohmann::json& json,
                                        const std::string& fallback_label);

}  // namespace sieve::bench
