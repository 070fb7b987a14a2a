// What a server says about itself, stored with every result so that a number can be traced back
// to the server and flags that produced it. Each probe is best effort: one that fails (404, not
// JSON, no such route on this kind of server) is simply absent.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "sparsity/kv_policy.h"
#include "tools/bench/http_client.h"

namespace sieve::bench {

// Probes, under base_url's path:
//   GET /v1/models    -> "models"  (every OpenAI-compatible server)
//   GET /version      -> "version" (vLLM, Sieve)
//   GET /server_info  -> "server_info" (vLLM's engine config in dev mode; Sieve's engine
//                        configuration: KV policy, pool, batch limits)
//   GET /props        -> "props" (llama-server's settings)
//   GET /metrics      -> "metrics_info": the Prometheus *_info series, whose labels carry
//                        configuration (vLLM's cache_config_info)
// Unavailable when the server cannot be reached at all (the first probe cannot connect), so that
// a wrong --base-url fails fast with a clear message.
Result<nlohmann::json> FetchServerInfo(const HttpUrl& base_url, const std::string& api_key,
                                       std::chrono::milliseconds timeout);

// The first model id of a /v1/models answer ({"data": [{"id": ...}]}), or NotFound.
Result<std::string> FirstModelId(const nlohmann::json& server_info);

// Field `key` of the server's GET /server_info answer when that is a JSON object, else null.
const nlohmann::json* ServerInfoField(const nlohmann::json& server_info, const std::string& key);

// The server's KV pool as its GET /server_info gives it (Sieve: "kv_cache_pages" pages of
// "page_size" entries of one layer), or nothing when it does not say.
struct ServerKvPool {
  int64_t pages = 0;
  int page_size = 0;
};
std::optional<ServerKvPool> KvPoolOf(const nlohmann::json& server_info);

// The server's KV policy as its GET /server_info gives it (Sieve: "kv_policy", the spec, and
// "kv_policy_options"), or nothing when it does not say (or says something unreadable).
struct ServerKvPolicy {
  std::string spec;
  KvPolicyOptions options;
};
std::optional<ServerKvPolicy> KvPolicyOf(const nlohmann::json& server_info);

// The server's prefix-cache counters, from its GET /metrics: vLLM's
// vllm:prefix_cache_queries_total (prompt tokens looked up in the prefix cache since the server
// started) and vllm:prefix_cache_hits_total (of them, the tokens found cached), each summed over
// its series (one an engine); else the same counters named sieve:prefix_cache_*. Nothing when the
// server exposes neither pair.
struct PrefixCacheCounters {
  double queries = 0;
  double hits = 0;
  std::string family;  // "vllm" or "sieve": the names they were read under
};
std::optional<PrefixCacheCounters> ParsePrefixCacheCounters(std::string_view metrics_text);
// GET /metrics and ParsePrefixCacheCounters; nothing when the request fails or is not 200.
std::optional<PrefixCacheCounters> FetchPrefixCacheCounters(const HttpUrl& base_url,
                                                            const std::string& api_key,
                                                            std::chrono::milliseconds timeout);

}  // namespace sieve::bench
