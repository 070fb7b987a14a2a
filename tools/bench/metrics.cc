#include "tools/bench/metrics.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

namespace sieve::bench {

namespace {

constexpr double kMsPerS = 1000.0;

std::vector<double> ToMs(const std::vector<double>& seconds) {
  std::vector<double> ms;
  ms.reserve(seconds.size());
  for (double value : seconds) ms.push_back(value * kMsPerS);
  return ms;
}

// The distribution's keys, as vLLM names them: mean_ttft_ms, std_ttft_ms, median_ttft_ms, p99_...
void PutDistribution(nlohmann::json& json, const char* name, const Distribution& value) {
  const std::string suffix = std::string(name) + "_ms";
  json["mean_" + suffix] = value.mean;
  json["std_" + suffix] = value.std;
  json["median_" + suffix] = value.median;
  json["p90_" + suffix] = value.p90;
  json["p99_" + suffix] = value.p99;
  json["min_" + suffix] = value.min;
  json["max_" + suffix] = value.max;
}

Distribution GetDistribution(const nlohmann::json& json, const char* name) {
  const std::string suffix = std::string(name) + "_ms";
  const auto get = [&](const std::string& key) { return json.value(key, 0.0); };
  Distribution value;
  value.mean = get("mean_" + suffix);
  value.std = get("std_" + suffix);
  value.median = get("median_" + suffix);
  value.p90 = get("p90_" + suffix);
  value.p99 = get("p99_" + suffix);
  value.min = get("min_" + suffix);
  value.max = get("max_" + suffix);
  return value;
}

// The most chunk arrivals in one whole second of the run, counted per [k, k+1) s bucket.
double PeakChunksPerSecond(const std::vector<RequestRecord>& records) {
  std::map<int64_t, int64_t> chunks_by_second;
  for (const RequestRecord& record : records) {
    if (!record.success) continue;
    double at = record.start_s + record.ttft_s;
    ++chunks_by_second[static_cast<int64_t>(std::floor(at))];
    for (double gap : record.itl_s) {
      at += gap;
      ++chunks_by_second[static_cast<int64_t>(std::floor(at))];
    }
  }
  int64_t peak = 0;
  for (const auto& [second, count] : chunks_by_second) peak = std::max(peak, count);
  return static_cast<double>(peak);
}

int PeakConcurrency(const std::vector<RequestRecord>& records) {
  // +1 at each start, -1 at each end; an end sorts before a start at the same time.
  std::vector<std::pair<double, int>> edges;
  for (const RequestRecord& record : records) {
    edges.emplace_back(record.start_s, 1);
    edges.emplace_back(record.start_s + record.e2e_s, -1);
  }
  std::sort(edges.begin(), edges.end());
  int current = 0;
  int peak = 0;
  for (const auto& [time, delta] : edges) {
    current += delta;
    peak = std::max(peak, current);
  }
  return peak;
}

}  // namespace

double Percentile(const std::vector<double>& sorted, double p) {
  const double rank = p / 100.0 * static_cast<double>(sorted.size() - 1);
  const size_t below = static_cast<size_t>(std::floor(rank));
  const size_t above = std::min(below + 1, sorted.size() - 1);
  const double fraction = rank - static_cast<double>(below);
  return sorted[below] + (sorted[above] - sorted[below]) * fraction;
}

Distribution Summarize(std::vector<double> values) {
  Distribution result;
  if (values.empty()) return result;
  std::sort(values.begin(), values.end());
  double sum = 0;
  for (double value : values) sum += value;
  result.mean = sum / static_cast<double>(values.size());
  double squares = 0;
  for (double value : values) squares += (value - result.mean) * (value - result.mean);
  result.std = std::sqrt(squares / static_cast<double>(values.size()));
  result.median = Percentile(values, 50);
  result.p90 = Percentile(values, 90);
  result.p99 = Percentile(values, 99);
  result.min = values.front();
  result.max = values.back();
  return result;
}

BenchMetrics ComputeMetrics(const std::vector<RequestRecord>& records, double duration_s) {
  BenchMetrics metrics;
  metrics.duration_s = duration_s;
  std::vector<double> ttfts, tpots, itls, e2els;
  for (const RequestRecord& record : records) {
    if (!record.success) {
      ++metrics.failed;
      continue;
    }
    ++metrics.completed;
    metrics.total_input_tokens += record.prompt_len;
    metrics.total_output_tokens += record.output_tokens;
    if (record.output_tokens > 1) {
      tpots.push_back((record.e2e_s - record.ttft_s) /
                      static_cast<double>(record.output_tokens - 1));
    }
    ttfts.push_back(record.ttft_s);
    e2els.push_back(record.e2e_s);
    itls.insert(itls.end(), record.itl_s.begin(), record.itl_s.end());
  }
  if (duration_s > 0) {
    metrics.request_throughput = metrics.completed / duration_s;
    metrics.output_throughput = static_cast<double>(metrics.total_output_tokens) / duration_s;
    metrics.total_token_throughput =
        static_cast<double>(metrics.total_input_tokens + metrics.total_output_tokens) / duration_s;
  }
  metrics.peak_output_throughput = PeakChunksPerSecond(records);
  metrics.peak_concurrent_requests = PeakConcurrency(records);
  metrics.ttft_ms = Summarize(ToMs(ttfts));
  metrics.tpot_ms = Summarize(ToMs(tpots));
  metrics.itl_ms = Summarize(ToMs(itls));
  metrics.e2el_ms = Summarize(ToMs(e2els));
  return metrics;
}

nlohmann::json MetricsToJson(const BenchMetrics& metrics) {
  nlohmann::json json;
  json["completed"] = metrics.completed;
  json["failed"] = metrics.failed;
  json["duration"] = metrics.duration_s;
  json["total_input_tokens"] = metrics.total_input_tokens;
  json["total_output_tokens"] = metrics.total_output_tokens;
  json["request_throughput"] = metrics.request_throughput;
  json["output_throughput"] = metrics.output_throughput;
  json["total_token_throughput"] = metrics.total_token_throughput;
  json["max_output_tokens_per_s"] = metrics.peak_output_throughput;
  json["max_concurrent_requests"] = metrics.peak_concurrent_requests;
  PutDistribution(json, "ttft", metrics.ttft_ms);
  PutDistribution(json, "tpot", metrics.tpot_ms);
  PutDistribution(json, "itl", metrics.itl_ms);
  PutDistribution(json, "e2el", metrics.e2el_ms);
  return json;
}

BenchMetrics MetricsFromJson(const nlohmann::json& json) {
  BenchMetrics metrics;
  metrics.completed = json.value("completed", 0);
  metrics.failed = json.value("failed", 0);
  metrics.duration_s = json.value("duration", 0.0);
  metrics.total_input_tokens = json.value("total_input_tokens", int64_t{0});
  metrics.total_output_tokens = json.value("total_output_tokens", int64_t{0});
  metrics.request_throughput = json.value("request_throughput", 0.0);
  metrics.output_throughput = json.value("output_throughput", 0.0);
  metrics.total_token_throughput = json.value("total_token_throughput", 0.0);
  metrics.peak_output_throughput = json.value("max_output_tokens_per_s", 0.0);
  metrics.peak_concurrent_requests = json.value("max_concurrent_requests", 0);
  metrics.ttft_ms = GetDistribution(json, "ttft");
  metrics.tpot_ms = GetDistribution(json, "tpot");
  metrics.itl_ms = GetDistribution(json, "itl");
  metrics.e2el_ms = GetDistribution(json, "e2el");
  return metrics;
}

nlohmann::json RecordToJson(const RequestRecord& record, bool with_text) {
  nlohmann::json json;
  json["success"] = record.success;
  if (!record.success) json["error"] = record.error;
  json["prompt_len"] = record.prompt_len;
  json["output_len_requested"] = record.output_len_requested;
  json["output_tokens"] = record.output_tokens;
  json["output_tokens_from_usage"] = record.output_tokens_from_usage;
  json["arrival_ms"] = record.arrival_s * kMsPerS;
  json["start_ms"] = record.start_s * kMsPerS;
  json["ttft_ms"] = record.ttft_s * kMsPerS;
  json["e2el_ms"] = record.e2e_s * kMsPerS;
  json["itl_ms"] = ToMs(record.itl_s);
  if (record.conversation >= 0) {
    json["conversation"] = record.conversation;
    json["turn"] = record.turn;
  }
  if (with_text) json["generated_text"] = record.generated_text;
  return json;
}

}  // namespace sieve::bench
