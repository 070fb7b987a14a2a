// What a benchmark prints and saves: the end-of-run table in vLLM's layout (so the two can be
// compared line by line), the sweep table (Markdown, ready for docs/benchmarks.md), error
// summaries, and the JSON file helpers.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "tools/bench/metrics.h"
#include "tools/bench/server_info.h"

namespace sieve::bench {

// "============ Serving Benchmark Result ============" and the lines under it. `max_concurrency`
// 0 and a non-finite `request_rate` print as vLLM prints them (no line / "inf").
std::string FormatServingTable(const BenchMetrics& metrics, int max_concurrency,
                               double request_rate);

// The server's prefix cache over one run: what its counters (server_info.h) moved by between a
// read just before the measured requests and one just after (the test request and the warm-up
// are before it). Other clients of the same server in that time count too.
struct PrefixCacheRun {
  bool reported = false;           // the server exposed the counters both times
  double queries = 0;              // prompt tokens looked up during the run
  double hits = 0;                 // of them, found cached
  std::optional<double> hit_rate;  // hits / queries; none with no lookups or counters that fell
  std::string family;              // "vllm" or "sieve": whose metric names
};
PrefixCacheRun PrefixCacheOfRun(const std::optional<PrefixCacheCounters>& before,
                                const std::optional<PrefixCacheCounters>& after);
// One line: "Prefix cache hit rate: 49.61% (...)", or "prefix cache: not reported by the server".
std::string FormatPrefixCacheLine(const PrefixCacheRun& run);
// {"hit_rate", "hits", "queries", "metrics"}, hit_rate null when there is none; null when the
// server did not report the counters.
nlohmann::json PrefixCacheJson(const PrefixCacheRun& run);

// --dataset-name multi-turn: TTFT of the conversations' first turns (a cold prompt) against their
// later turns' (whose prompt is mostly the turn before's prompt and answer, which a prefix cache
// holds), over the successful turns.
struct TurnSplit {
  int first_turns = 0;  // successful first turns
  int later_turns = 0;  // successful later turns
  Distribution first_ttft_ms;
  Distribution later_ttft_ms;
};
TurnSplit SplitTurns(const std::vector<RequestRecord>& records);
// "Multi-turn TTFT P50: first turns 12.34 ms (n = 10), later turns 5.67 ms (n = 90)".
std::string FormatTurnSplitLine(const TurnSplit& split);
// {"first_turns", "later_turns", "median_ttft_ms_first_turns", "mean_ttft_ms_first_turns",
//  "p99_ttft_ms_first_turns", and the same for later turns}
nlohmann::json TurnSplitJson(const TurnSplit& split);

struct SweepLevel {
  int concurrency = 0;
  int num_prompts = 0;
  BenchMetrics metrics;
  double bound_output_throughput = 0;     // tok/s (serving_bound.h); 0: none
  double roofline_output_throughput = 0;  // tok/s, the bound's roofline (serving_bound.h)
};

// One row per level: concurrency, requests, failures, req/s, output tok/s, TTFT P50/P99,
// TPOT P50/P99, ITL P99, as a Markdown table; with bounds, also the bound's output tok/s and the
// measured fraction of it, and where a level's roofline is below its bound (decode GEMMs past
// the ridge), the measured fraction of the roofline too.
std::string FormatSweepTable(const std::vector<SweepLevel>& levels);

// The distinct error messages of the failed requests, most frequent first, at most `limit`:
// [{"message": ..., "count": n}].
nlohmann::json SummarizeErrors(const std::vector<RequestRecord>& records, size_t limit);

// Local time as ISO 8601 with the UTC offset: "2025-11-30T15:34:02+0000".
std::string NowIso8601();

// Writes `json` (indented) to `path`; Internal with the path when it cannot.
Status WriteJsonFile(const std::string& path, const nlohmann::json& json);
Result<nlohmann::json> ReadJsonFile(const std::string& path);

}  // namespace sieve::bench
