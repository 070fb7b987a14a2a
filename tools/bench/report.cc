#include "tools/bench/report.h"

#include <algorithm>
#include <cmath>
#include <ctime>
#include <fstream>
#include <map>
#include <sstream>

#include <fmt/format.h>

namespace sieve::bench {

namespace {

constexpr int kTableWidth = 50;

// A title centred in dashes, as Python's "{:-^50}" does (the odd dash goes to the right).
std::string Section(const std::string& title) {
  const int padding = std::max(0, kTableWidth - static_cast<int>(title.size()));
  return std::string(static_cast<size_t>(padding / 2), '-') + title +
         std::string(static_cast<size_t>(padding - padding / 2), '-') + "\n";
}

std::string Row(const std::string& name, const std::string& value) {
  return fmt::format("{:<40} {:<10}\n", name, value);
}

std::string Row(const std::string& name, double value) {
  return Row(name, fmt::format("{:.2f}", value));
}

std::string DistributionRows(const std::string& title, const std::string& short_name,
                             const Distribution& value) {
  std::string text = Section(title);
  text += Row("Mean " + short_name + " (ms):", value.mean);
  text += Row("Std " + short_name + " (ms):", value.std);
  text += Row("Median " + short_name + " (ms):", value.median);
  text += Row("P90 " + short_name + " (ms):", value.p90);
  text += Row("P99 " + short_name + " (ms):", value.p99);
  return text;
}

}  // namespace

std::string FormatServingTable(const BenchMetrics& metrics, int max_concurrency,
                               double request_rate) {
  std::string text = "============ Serving Benchmark Result ============\n";
  text += Row("Successful requests:", std::to_string(metrics.completed));
  text += Row("Failed requests:", std::to_string(metrics.failed));
  if (max_concurrency > 0) {
    text += Row("Maximum request concurrency:", std::to_string(max_concurrency));
  }
  text += Row("Request rate configured (RPS):", std::isfinite(request_rate) && request_rate > 0
                                                    ? fmt::format("{:.2f}", request_rate)
                                                    : std::string("inf"));
  text += Row("Benchmark duration (s):", metrics.duration_s);
  text += Row("Total input tokens:", std::to_string(metrics.total_input_tokens));
  text += Row("Total generated tokens:", std::to_string(metrics.total_output_tokens));
  text += Row("Request throughput (req/s):", metrics.request_throughput);
  text += Row("Output token throughput (tok/s):", metrics.output_throughput);
  text += Row("Peak output token throughput (tok/s):", metrics.peak_output_throughput);
  text += Row("Peak concurrent requests:", std::to_string(metrics.peak_concurrent_requests));
  text += Row("Total Token throughput (tok/s):", metrics.total_token_throughput);
  text += DistributionRows("Time to First Token", "TTFT", metrics.ttft_ms);
  text += DistributionRows("Time per Output Token (excl. 1st token)", "TPOT", metrics.tpot_ms);
  text += DistributionRows("Inter-token Latency", "ITL", metrics.itl_ms);
  text += DistributionRows("End-to-end Latency", "E2EL", metrics.e2el_ms);
  text += std::string(kTableWidth, '=') + "\n";
  return text;
}

PrefixCacheRun PrefixCacheOfRun(const std::optional<PrefixCacheCounters>& before,
                                const std::optional<PrefixCacheCounters>& after) {
  PrefixCacheRun run;
  if (!before || !after || before->family != after->family) return run;
  run.reported = true;
  run.family = after->family;
  run.queries = after->queries - before->queries;
  run.hits = after->hits - before->hits;
  // Counters that fell (a server restarted mid-run) or hits past the lookups give no rate.
  if (run.queries > 0 && run.hits >= 0 && run.hits <= run.queries) {
    run.hit_rate = run.hits / run.queries;
  }
  return run;
}

std::string FormatPrefixCacheLine(const PrefixCacheRun& run) {
  if (!run.reported) return "prefix cache: not reported by the server\n";
  const std::string names =
      run.family + ":prefix_cache_hits_total / " + run.family + ":prefix_cache_queries_total";
  if (run.hit_rate) {
    return fmt::format(
        "Prefix cache hit rate: {:.2f}% ({:.0f} of {:.0f} prompt tokens looked up; {})\n",
        100 * *run.hit_rate, run.hits, run.queries, names);
  }
  if (run.queries == 0 && run.hits == 0) {
    return fmt::format("Prefix cache hit rate: none (no lookups during the run; {})\n", names);
  }
  return fmt::format(
      "Prefix cache hit rate: none (the counters moved by {:.0f} hits of {:.0f} lookups during the "
      "run: restarted?; {})\n",
      run.hits, run.queries, names);
}

nlohmann::json PrefixCacheJson(const PrefixCacheRun& run) {
  if (!run.reported) return nullptr;
  nlohmann::json json;
  json["hit_rate"] = run.hit_rate ? nlohmann::json(*run.hit_rate) : nlohmann::json(nullptr);
  json["hits"] = run.hits;
  json["queries"] = run.queries;
  json["metrics"] = {run.family + ":prefix_cache_hits_total",
                     run.family + ":prefix_cache_queries_total"};
  return json;
}

std::string FormatSweepTable(const std::vector<SweepLevel>& levels) {
  const bool bounds = std::any_of(levels.begin(), levels.end(), [](const SweepLevel& level) {
    return level.bound_output_throughput > 0;
  });
  const auto below_bound = [](const SweepLevel& level) {
    return level.roofline_output_throughput > 0 &&
           level.roofline_output_throughput < level.bound_output_throughput;
  };
  const bool rooflines = bounds && std::any_of(levels.begin(), levels.end(), below_bound);
  std::string text =
      "| concurrency | requests | failed | req/s | output tok/s | TTFT P50 (ms) | TTFT P99 (ms) "
      "| TPOT P50 (ms) | TPOT P99 (ms) | ITL P99 (ms) |";
  text += bounds ? " bound tok/s | of bound |" : "";
  text += rooflines ? " of roofline |\n" : "\n";
  text += "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |";
  text += bounds ? " ---: | ---: |" : "";
  text += rooflines ? " ---: |\n" : "\n";
  for (const SweepLevel& level : levels) {
    const BenchMetrics& m = level.metrics;
    text += fmt::format(
        "| {} | {} | {} | {:.2f} | {:.1f} | {:.1f} | {:.1f} | {:.2f} | {:.2f} | {:.2f} |",
        level.concurrency, level.num_prompts, m.failed, m.request_throughput, m.output_throughput,
        m.ttft_ms.median, m.ttft_ms.p99, m.tpot_ms.median, m.tpot_ms.p99, m.itl_ms.p99);
    if (bounds) {
      const double bound = level.bound_output_throughput;
      text += bound > 0
                  ? fmt::format(" {:.1f} | {:.0f}% |", bound, 100 * m.output_throughput / bound)
                  : std::string(" | |");
    }
    if (rooflines) {
      // Blank where the roofline is the bound: only the levels it changes show it.
      text += below_bound(level) ? fmt::format(" {:.0f}% |", 100 * m.output_throughput /
                                                                 level.roofline_output_throughput)
                                 : std::string(" |");
    }
    text += "\n";
  }
  return text;
}

nlohmann::json SummarizeErrors(const std::vector<RequestRecord>& records, size_t limit) {
  std::vector<std::pair<std::string, int>> counts;  // in order of first occurrence
  std::map<std::string, size_t> index_of;
  for (const RequestRecord& record : records) {
    if (record.success) continue;
    const auto [it, inserted] = index_of.emplace(record.error, counts.size());
    if (inserted) counts.emplace_back(record.error, 0);
    ++counts[it->second].second;
  }
  std::stable_sort(counts.begin(), counts.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });
  nlohmann::json errors = nlohmann::json::array();
  for (size_t index = 0; index < counts.size() && index < limit; ++index) {
    errors.push_back({{"message", counts[index].first}, {"count", counts[index].second}});
  }
  return errors;
}

std::string NowIso8601() {
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char text[64];
  std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%S%z", &local);
  return text;
}

Status WriteJsonFile(const std::string& path, const nlohmann::json& json) {
  std::ofstream file(path);
  // Replace invalid UTF-8 (a server's broken text) rather than throw while saving hours of data.
  file << json.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  file.close();
  if (!file) return InternalError("cannot write '" + path + "'");
  return Status::Ok();
}

Result<nlohmann::json> ReadJsonFile(const std::string& path) {
  std::ifstream file(path);
  if (!file) return NotFoundError("cannot read '" + path + "'");
  std::stringstream text;
  text << file.rdbuf();
  nlohmann::json json = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) return DataLossError("'" + path + "' is not valid JSON");
  return json;
}

TurnSplit SplitTurns(const std::vector<RequestRecord>& records) {
  std::vector<double> first;
  std::vector<double> later;
  for (const RequestRecord& record : records) {
    if (!record.success || record.turn < 0) continue;
    (record.turn == 0 ? first : later).push_back(record.ttft_s * 1000);
  }
  TurnSplit split;
  split.first_turns = static_cast<int>(first.size());
  split.later_turns = static_cast<int>(later.size());
  split.first_ttft_ms = Summarize(std::move(first));
  split.later_ttft_ms = Summarize(std::move(later));
  return split;
}

std::string FormatTurnSplitLine(const TurnSplit& split) {
  return fmt::format(
      "Multi-turn TTFT P50: first turns {:.2f} ms (n = {}), later turns {:.2f} ms (n = {})\n",
      split.first_ttft_ms.median, split.first_turns, split.later_ttft_ms.median, split.later_turns);
}

nlohmann::json TurnSplitJson(const TurnSplit& split) {
  return {{"first_turns", split.first_turns},
          {"later_turns", split.later_turns},
          {"median_ttft_ms_first_turns", split.first_ttft_ms.median},
          {"mean_ttft_ms_first_turns", split.first_ttft_ms.mean},
          {"p99_ttft_ms_first_turns", split.first_ttft_ms.p99},
          {"median_ttft_ms_later_turns", split.later_ttft_ms.median},
          {"mean_ttft_ms_later_turns", split.later_ttft_ms.mean},
          {"p99_ttft_ms_later_turns", split.later_ttft_ms.p99}};
}

}  // namespace sieve::bench
