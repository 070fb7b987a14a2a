#include "tools/bench/openai_protocol.h"

namespace sieve::bench {

namespace {

std::string_view TrimSpace(std::string_view text) {
  while (!text.empty() && (text.front() == ' ' || text.front() == '\t')) text.remove_prefix(1);
  while (!text.empty() && (text.back() == ' ' || text.back() == '\t')) text.remove_suffix(1);
  return text;
}

// Appends the string at `object[key]` when there is one (servers send null for "no content").
void AppendString(const nlohmann::json& object, const char* key, std::string& out) {
  const auto it = object.find(key);
  if (it != object.end() && it->is_string()) out += it->get_ref<const std::string&>();
}

std::optional<int64_t> IntegerField(const nlohmann::json& object, const char* key) {
  const auto it = object.find(key);
  if (it == object.end() || !it->is_number_integer()) return std::nullopt;
  return it->get<int64_t>();
}

}  // namespace

ApiKind ApiKindForEndpoint(std::string_view endpoint) {
  while (!endpoint.empty() && endpoint.back() == '/') endpoint.remove_suffix(1);
  constexpr std::string_view kChatSuffix = "chat/completions";
  const bool chat = endpoint.size() >= kChatSuffix.size() &&
                    endpoint.substr(endpoint.size() - kChatSuffix.size()) == kChatSuffix;
  return chat ? ApiKind::kChatCompletions : ApiKind::kCompletions;
}

nlohmann::json MakeRequestBody(const RequestBodyOptions& options, const std::string& prompt,
                               int max_tokens) {
  nlohmann::json body;
  body["model"] = options.model;
  if (options.api == ApiKind::kChatCompletions) {
    body["messages"] = nlohmann::json::array({{{"role", "user"}, {"content", prompt}}});
    // Newer servers read max_completion_tokens, older ones (and llama-server) max_tokens.
    body["max_completion_tokens"] = max_tokens;
  } else {
    body["prompt"] = prompt;
  }
  body["max_tokens"] = max_tokens;
  body["temperature"] = options.temperature;
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  if (options.ignore_eos) body["ignore_eos"] = true;
  if (options.extra.is_object()) body.update(options.extra);
  return body;
}

Result<StreamEvent> ParseStreamEvent(std::string_view data) {
  StreamEvent event;
  data = TrimSpace(data);
  if (data == "[DONE]") {
    event.done = true;
    return event;
  }
  nlohmann::json json = nlohmann::json::parse(data, nullptr, /*allow_exceptions=*/false);
  if (!json.is_object()) {
    constexpr size_t kShown = 200;
    return InvalidArgumentError("the stream sent an event that is not JSON: '" +
                                std::string(data.substr(0, kShown)) + "'");
  }
  if (const auto error = json.find("error"); error != json.end() && !error->is_null()) {
    if (error->is_object() && error->contains("message") && (*error)["message"].is_string()) {
      event.error = (*error)["message"].get<std::string>();
    } else {
      event.error = error->dump();
    }
    return event;
  }
  if (const auto choices = json.find("choices");
      choices != json.end() && choices->is_array() && !choices->empty()) {
    const nlohmann::json& choice = choices->front();
    if (choice.is_object()) {
      AppendString(choice, "text", event.text);
      if (const auto delta = choice.find("delta"); delta != choice.end() && delta->is_object()) {
        AppendString(*delta, "reasoning_content", event.text);
        AppendString(*delta, "content", event.text);
      }
    }
  }
  if (const auto usage = json.find("usage"); usage != json.end() && usage->is_object()) {
    event.completion_tokens = IntegerField(*usage, "completion_tokens");
    event.prompt_tokens = IntegerField(*usage, "prompt_tokens");
  }
  return event;
}

}  // namespace sieve::bench
