// The serving metrics, computed exactly as vLLM's `benchmark_serving` does so that numbers from
// `sieve bench serve` and `vllm bench serve` can sit in one table:
//   TTFT  time from sending the request to the first chunk that carries generated text;
//   ITL   the gaps between consecutive chunks that carry text (one per chunk, not per token);
//   TPOT  per request, (E2E - TTFT) / (output tokens - 1), for requests with more than one token;
//   E2E   time from sending the request to the last event of its stream.
// Throughputs divide by the benchmark's wall time; only successful requests count towards tokens.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace sieve::bench {

// What happened to one request. Times are seconds.
struct RequestRecord {
  int prompt_len = 0;            // prompt tokens by the benchmark's tokenizer
  int output_len_requested = 0;  // max_tokens sent
  bool success = false;
  std::string error;     // why it failed
  double arrival_s = 0;  // when its arrival process released it, from the benchmark start
  double start_s = 0;    // when it was sent (later than arrival_s when --max-concurrency queued it)
  double ttft_s = 0;
  double e2e_s = 0;
  std::vector<double> itl_s;  // [number of text chunks - 1]
  int64_t output_tokens = 0;
  bool output_tokens_from_usage = false;  // else counted by re-tokenising generated_text
  std::string generated_text;
  // --dataset-name multi-turn: the conversation's index and the turn's (from 0); else -1
  int conversation = -1;
  int turn = -1;
};

// Over a set of values, all in the same unit.
struct Distribution {
  double mean = 0;
  double std = 0;  // population standard deviation (numpy's default)
  double median = 0;
  double p90 = 0;
  double p99 = 0;
  double min = 0;
  double max = 0;
};

// numpy.percentile with linear interpolation: rank p/100 * (n - 1) between the sorted values.
// `sorted` must be ascending and non-empty.
double Percentile(const std::vector<double>& sorted, double p);
// All zeros for no values, as vLLM reports them.
Distribution Summarize(std::vector<double> values);

struct BenchMetrics {
  int completed = 0;
  int failed = 0;
  int64_t total_input_tokens = 0;
  int64_t total_output_tokens = 0;
  double duration_s = 0;
  double request_throughput = 0;      // completed requests / s
  double output_throughput = 0;       // output tokens / s
  double total_token_throughput = 0;  // (input + output tokens) / s
  // The most text chunks received in any one-second bucket of the run (vLLM's "peak output token
  // throughput", which counts one token per chunk).
  double peak_output_throughput = 0;
  int peak_concurrent_requests = 0;  // the most requests in flight at one time
  Distribution ttft_ms;
  Distribution tpot_ms;
  Distribution itl_ms;
  Distribution e2el_ms;
};

BenchMetrics ComputeMetrics(const std::vector<RequestRecord>& records, double duration_s);

// Flat keys named as in vLLM's result JSON: "completed", "request_throughput", "mean_ttft_ms",
// "p99_itl_ms", ...
nlohmann::json MetricsToJson(const BenchMetrics& metrics);
// Reads back what MetricsToJson wrote (missing keys stay zero).
BenchMetrics MetricsFromJson(const nlohmann::json& json);

// One request as stored in --result-json (times in ms); the text only when asked.
nlohmann::json RecordToJson(const RequestRecord& record, bool with_text);

}  // namespace sieve::bench
