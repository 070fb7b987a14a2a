#include "tools/eval/remote_evaluator.h"

#include <deque>

#include <nlohmann/json.hpp>

#include "tools/eval/scoring.h"

namespace sieve::eval {

Result<std::string> CompletionText(std::string_view body) {
  const nlohmann::json json = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (!json.is_object()) return InvalidArgumentError("the answer is not a JSON object");
  if (json.contains("error")) return InvalidArgumentError("server error: " + json["error"].dump());
  const auto choices = json.find("choices");
  if (choices == json.end() || !choices->is_array() || choices->empty() ||
      !(*choices)[0].is_object() || !(*choices)[0].contains("text") ||
      !(*choices)[0]["text"].is_string()) {
    return InvalidArgumentError("the answer has no choices[0].text");
  }
  return (*choices)[0]["text"].get<std::string>();
}

Result<std::vector<SampleRecord>> RunOnServer(const RemoteOptions& options,
                                              const std::vector<const EvalSample*>& samples,
                                              const EvalConfig& config,
                                              const std::function<void(int)>& progress) {
  boost::asio::io_context io;
  SIEVE_ASSIGN_OR_RETURN(bench::TcpEndpoints endpoints, bench::ResolveHost(io, options.base_url));
  std::vector<SampleRecord> records(samples.size());
  std::vector<int> http_status(samples.size(), 0);
  std::vector<std::string> bodies(samples.size());
  std::deque<size_t> waiting;
  for (size_t index = 0; index < samples.size(); ++index) {
    records[index].sample = samples[index];
    records[index].config = config.label;
    waiting.push_back(index);
  }
  int in_flight = 0;
  int done = 0;
  std::function<void()> send_waiting;
  const auto send = [&](size_t index) {
    const EvalSample& sample = *samples[index];
    nlohmann::json body = {{"model", options.model},
                           {"prompt", sample.prompt},
                           {"max_tokens", sample.max_tokens},
                           {"temperature", 0},
                           {"stop", {"\n"}}};
    bench::HttpRequestSpec spec;
    spec.method = "POST";
    spec.target = options.base_url.path + "/v1/completions";
    spec.body = body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    if (!options.api_key.empty()) {
      spec.headers.emplace_back("Authorization", "Bearer " + options.api_key);
    }
    spec.timeout = std::chrono::milliseconds(static_cast<int64_t>(options.request_timeout_s * 1e3));
    bench::HttpCallbacks callbacks;
    callbacks.on_status = [&, index](int status) { http_status[index] = status; };
    callbacks.on_body = [&, index](std::string_view bytes) {
      bodies[index].append(bytes);
      return true;
    };
    callbacks.on_done = [&, index](const Status& status) {
      SampleRecord& record = records[index];
      if (!status.ok()) {
        record.error = status.message();
      } else if (http_status[index] < 200 || http_status[index] >= 300) {
        record.error =
            "HTTP " + std::to_string(http_status[index]) + ": " + bodies[index].substr(0, 300);
      } else {
        auto text = CompletionText(bodies[index]);
        if (text.ok()) {
          record.output = *text;
          // A server that does not honour "stop" still ends at the first line for scoring.
          record.output = record.output.substr(0, record.output.find('\n'));
          record.score = ScoreOutput(*record.sample, record.output);
        } else {
          record.error = text.status().message();
        }
      }
      bodies[index].clear();
      --in_flight;
      progress(++done);
      send_waiting();
    };
    ++in_flight;
    bench::StartHttpCall(io, endpoints, options.base_url, std::move(spec), std::move(callbacks));
  };
  send_waiting = [&]() {
    while (!waiting.empty() &&
           (options.max_concurrency <= 0 || in_flight < options.max_concurrency)) {
      const size_t index = waiting.front();
      waiting.pop_front();
      send(index);
    }
  };
  send_waiting();
  io.run();
  return records;
}

}  // namespace sieve::eval
