#include "tools/bench/server_info.h"

#include <cmath>
#include <cstdlib>
#include <sstream>

#include "sparsity/kv_policy_json.h"

namespace sieve::bench {

namespace {

constexpr size_t kMaxTextBytes = 4000;  // of a probe answer that is not JSON

Result<HttpResponse> Get(const HttpUrl& base_url, const std::string& route,
                         const std::string& api_key, std::chrono::milliseconds timeout) {
  HttpRequestSpec spec;
  spec.target = base_url.path + route;
  spec.timeout = timeout;
  if (!api_key.empty()) spec.headers.emplace_back("Authorization", "Bearer " + api_key);
  return HttpFetch(base_url, std::move(spec));
}

// The answer as JSON when it is JSON, else as (truncated) text; null for a non-2xx answer.
nlohmann::json Payload(const HttpResponse& response) {
  if (response.status < 200 || response.status >= 300) return nullptr;
  nlohmann::json json = nlohmann::json::parse(response.body, nullptr, /*allow_exceptions=*/false);
  if (!json.is_discarded()) return json;
  return response.body.substr(0, kMaxTextBytes);
}

// The sum of the samples of metric `name` in Prometheus text exposition (`name{labels} value
// [timestamp]` or `name value`), or nothing when it has none (or a value is not a finite number).
std::optional<double> SumOfMetric(std::string_view text, std::string_view name) {
  std::optional<double> sum;
  while (!text.empty()) {
    const size_t end = text.find('\n');
    std::string_view line = text.substr(0, end);
    text = end == std::string_view::npos ? std::string_view() : text.substr(end + 1);
    if (!line.starts_with(name)) continue;
    std::string_view rest = line.substr(name.size());
    if (rest.starts_with('{')) {
      const size_t close = rest.rfind('}');
      if (close == std::string_view::npos) continue;
      rest = rest.substr(close + 1);
    } else if (!rest.starts_with(' ') && !rest.starts_with('\t')) {
      continue;  // a longer name that starts with this one
    }
    const size_t start = rest.find_first_not_of(" \t");
    if (start == std::string_view::npos) continue;
    const std::string value_text(rest.substr(start, rest.find_first_of(" \t\r", start) - start));
    char* parsed_end = nullptr;
    const double value = std::strtod(value_text.c_str(), &parsed_end);
    if (parsed_end != value_text.c_str() + value_text.size() || !std::isfinite(value)) {
      return std::nullopt;
    }
    sum = sum.value_or(0.0) + value;
  }
  return sum;
}

}  // namespace

std::optional<PrefixCacheCounters> ParsePrefixCacheCounters(std::string_view metrics_text) {
  for (const char* family : {"vllm", "sieve"}) {
    const std::string head = std::string(family) + ":prefix_cache_";
    const std::optional<double> queries = SumOfMetric(metrics_text, head + "queries_total");
    const std::optional<double> hits = SumOfMetric(metrics_text, head + "hits_total");
    if (queries && hits) return PrefixCacheCounters{*queries, *hits, family};
  }
  return std::nullopt;
}

std::optional<PrefixCacheCounters> FetchPrefixCacheCounters(const HttpUrl& base_url,
                                                            const std::string& api_key,
                                                            std::chrono::milliseconds timeout) {
  auto metrics = Get(base_url, "/metrics", api_key, timeout);
  if (!metrics.ok() || metrics->status != 200) return std::nullopt;
  return ParsePrefixCacheCounters(metrics->body);
}

Result<nlohmann::json> FetchServerInfo(const HttpUrl& base_url, const std::string& api_key,
                                       std::chrono::milliseconds timeout) {
  nlohmann::json info;
  info["base_url"] = base_url.ToString();
  SIEVE_ASSIGN_OR_RETURN(HttpResponse models, Get(base_url, "/v1/models", api_key, timeout));
  if (models.status == 401 || models.status == 403) {
    return UnauthenticatedError("the server at " + base_url.ToString() +
                                " refused the request (HTTP " + std::to_string(models.status) +
                                "): pass --api-key or set OPENAI_API_KEY");
  }
  if (nlohmann::json payload = Payload(models); !payload.is_null()) info["models"] = payload;
  for (const char* route : {"/version", "/server_info", "/props"}) {
    auto response = Get(base_url, route, api_key, timeout);
    if (!response.ok()) continue;
    if (nlohmann::json payload = Payload(*response); !payload.is_null()) {
      info[std::string(route).substr(1)] = payload;
    }
  }
  if (auto metrics = Get(base_url, "/metrics", api_key, timeout);
      metrics.ok() && metrics->status == 200) {
    nlohmann::json lines = nlohmann::json::array();
    std::istringstream text(metrics->body);
    for (std::string line; std::getline(text, line);) {
      const size_t brace = line.find('{');
      if (line.empty() || line.front() == '#' || brace == std::string::npos) continue;
      if (line.substr(0, brace).ends_with("_info")) lines.push_back(line);
    }
    if (!lines.empty()) info["metrics_info"] = lines;
  }
  return info;
}

Result<std::string> FirstModelId(const nlohmann::json& server_info) {
  const auto models = server_info.find("models");
  if (models != server_info.end() && models->is_object()) {
    const auto data = models->find("data");
    if (data != models->end() && data->is_array() && !data->empty() && data->front().is_object() &&
        data->front().contains("id") && data->front()["id"].is_string()) {
      return data->front()["id"].get<std::string>();
    }
  }
  return NotFoundError("the server lists no model at GET /v1/models: pass --model");
}

const nlohmann::json* ServerInfoField(const nlohmann::json& server_info, const std::string& key) {
  const auto info = server_info.find("server_info");
  if (info == server_info.end() || !info->is_object()) return nullptr;
  const auto field = info->find(key);
  return field == info->end() ? nullptr : &*field;
}

std::optional<ServerKvPolicy> KvPolicyOf(const nlohmann::json& server_info) {
  const nlohmann::json* spec = ServerInfoField(server_info, "kv_policy");
  const nlohmann::json* options = ServerInfoField(server_info, "kv_policy_options");
  if (spec == nullptr || options == nullptr || !spec->is_string()) return std::nullopt;
  Result<KvPolicyOptions> parsed = KvPolicyOptionsFromJson(*options);
  if (!parsed.ok()) return std::nullopt;
  return ServerKvPolicy{spec->get<std::string>(), *parsed};
}

std::optional<ServerKvPool> KvPoolOf(const nlohmann::json& server_info) {
  const nlohmann::json* pages = ServerInfoField(server_info, "kv_cache_pages");
  const nlohmann::json* page_size = ServerInfoField(server_info, "page_size");
  if (pages == nullptr || page_size == nullptr || !pages->is_number_integer() ||
      !page_size->is_number_integer()) {
    return std::nullopt;
  }
  ServerKvPool pool{pages->get<int64_t>(), 0};
  const int64_t size = page_size->get<int64_t>();
  if (pool.pages <= 0 || size <= 0 || size > (int64_t{1} << 20)) return std::nullopt;
  pool.page_size = static_cast<int>(size);
  return pool;
}

}  // namespace sieve::bench
