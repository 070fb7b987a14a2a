// The sweep chart: output throughput and TTFT against concurrency, drawn into an RgbImage for
// png_writer. Two panels side by side, one colour per series (several sweeps can be overlaid, e.g.
// dense against sparse), axes with tick labels, and a legend.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "tools/bench/report.h"
#include "tools/bench/rgb_image.h"

namespace sieve::bench {

struct SweepSeries {
  std::string label;  // legend text; "" when there is only one series to show
  std::vector<SweepLevel> levels;
};

// Left: output tokens/s. Right: TTFT P50 (solid) and P99 (dashed), ms. Concurrency runs on a log2
// axis when it spans 8x or more, since 1..128 would otherwise crowd the low levels into a corner.
RgbImage DrawSweepChart(const std::vector<SweepSeries>& series, const std::string& title);

// The levels of a `sieve bench sweep` result JSON, labelled with its "label" (else
// `fallback_label`). InvalidArgument when the JSON holds no levels.
Result<SweepSeries> SweepSeriesFromJson(const nlohmann::json& json,
                                        const std::string& fallback_label);

}  // namespace sieve::bench
