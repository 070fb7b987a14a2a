#include "tools/bench/plot.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "tools/bench/svg_writer.h"

namespace sieve::bench {

std::string SweepChartSvg(const std::vector<SweepSeries>& series, const std::string& title) {
  constexpr int kWidth = 1200;
  constexpr int kHeight = 560;
  std::set<int> levels;
  for (const SweepSeries& one : series) {
    for (const SweepLevel& level : one.levels) levels.insert(level.concurrency);
  }
  const std::vector<double> x(levels.begin(), levels.end());
  const bool log_x =
      !levels.empty() && *levels.begin() > 0 && *levels.rbegin() >= 8 * *levels.begin();
  // One value per x: NaN where a series has no such level, or (for latencies) where every request
  // of the level failed.
  const auto values = [&](const SweepSeries& one, const auto& value_of) {
    std::vector<double> y(x.size(), NAN);
    for (const SweepLevel& level : one.levels) {
      const auto at = std::find(x.begin(), x.end(), level.concurrency);
      if (at != x.end()) y[at - x.begin()] = value_of(level);
    }
    return y;
  };
  const auto if_completed = [](const SweepLevel& level, double value) {
    return level.metrics.completed > 0 ? value : NAN;
  };
  std::vector<LineCurve> throughput;
  std::vector<LineCurve> ttft;
  const bool many = series.size() > 1;
  for (size_t index = 0; index < series.size(); ++index) {
    const SweepSeries& one = series[index];
    const std::string color = SeriesColor(index);
    const bool named = many || !one.label.empty();
    const std::string prefix = named ? one.label + " " : "";
    throughput.push_back(
        {named ? one.label : "", color, false,
         values(one, [](const SweepLevel& l) { return l.metrics.output_throughput; })});
    ttft.push_back({prefix + "P50", color, false, values(one, [&](const SweepLevel& l) {
                      return if_completed(l, l.metrics.ttft_ms.median);
                    })});
    ttft.push_back({prefix + "P99", color, true, values(one, [&](const SweepLevel& l) {
                      return if_completed(l, l.metrics.ttft_ms.p99);
                    })});
  }
  const SvgBox left{80, 76, kWidth / 2.0 - 110, kHeight - 76 - 64};
  const SvgBox right{kWidth / 2.0 + 80, 76, kWidth / 2.0 - 110, kHeight - 76 - 64};
  std::string svg = SvgHeader(kWidth, kHeight);
  svg += SvgText(kWidth / 2.0, 28, title, 17, "middle", " font-weight=\"bold\"");
  svg += LinePanelSvg(left, "output tokens/s", "concurrency", x, log_x, throughput);
  svg += LinePanelSvg(right, "TTFT (ms)", "concurrency", x, log_x, ttft);
  svg += kSvgEnd;
  return svg;
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
