// ServerMetrics: what /metrics exposes, named like vLLM's (`vllm:` becomes `sieve:`) plus Sieve's
// KV-sparsity counters. Latencies are observed by the connections as outputs arrive; engine
// gauges and totals are copied from the AsyncEngine's published stats at scrape time.
#pragma once

#include <string>
#include <string_view>

#include "runtime/async_engine.h"
#include "server/metrics.h"

namespace sieve {

class ServerMetrics {
 public:
  explicit ServerMetrics(std::string model_name);

  void ObserveTimeToFirstToken(double seconds);
  void ObserveInterTokenLatency(double seconds);
  // One engine request ended (a choice of an HTTP request).
  void ObserveRequestFinished(FinishReason reason, double e2e_seconds, int prompt_tokens,
                              int generation_tokens);
  void CountHttpResponse(std::string_view endpoint, int status);

  // The KV cache as vLLM's vllm:cache_config_info states it (block = page).
  struct CacheConfig {
    int page_size = 0;
    int num_pages = 0;
    // vLLM's cache_dtype: "auto" where the pool holds the activation dtype (--kv-cache-dtype
    // auto, or bf16 where that is it), "fp8" for e4m3 (--kv-cache-dtype fp8, as vLLM's flag).
    std::string cache_dtype = "auto";
    bool enable_prefix_caching = false;
  };
  static CacheConfig CacheConfigOf(const AsyncEngine& engine);
  // Updates the engine-derived metrics from `stats`, then renders everything.
  std::string Render(const AsyncEngineStats& stats, const CacheConfig& cache);

 private:
  MetricLabels Labels(MetricLabels extra = {}) const;

  const std::string model_name_;
  MetricsRegistry registry_;
  Histogram* time_to_first_token_;
  Histogram* inter_token_latency_;
  Histogram* e2e_request_latency_;
  Histogram* request_prompt_tokens_;
  Histogram* request_generation_tokens_;
};

}  // namespace sieve
