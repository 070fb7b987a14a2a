#include "server/completion_request.h"

#include <climits>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "server/json_util.h"

namespace sieve {

namespace {

constexpr int kMaxLogprobs = 20;

Result<std::vector<int32_t>> EncodeText(const RequestLimits& limits, const std::string& text,
                                        bool add_bos) {
  if (limits.tokenizer == nullptr) {
    return InvalidArgumentError("this model has no tokenizer: send the prompt as token ids");
  }
  return limits.tokenizer->Encode(text, add_bos);
}

// `prompt`: a string, an array of token ids, or a batch: an array of strings or of id arrays.
Status ReadPrompts(const FieldReader& fields, const RequestLimits& limits,
                   std::vector<std::vector<int32_t>>& prompts) {
  const nlohmann::json* prompt = fields.Find("prompt");
  if (prompt == nullptr) return fields.Error("prompt", "'prompt' is required");
  const auto bad = [&](const std::string& message) { return fields.Error("prompt", message); };
  const auto add_text = [&](const std::string& text) -> Status {
    // A BOS alone is no prompt: nothing to continue, nothing to score.
    if (text.empty()) return bad("'prompt' must not be an empty string");
    Result<std::vector<int32_t>> ids = EncodeText(limits, text, /*add_bos=*/true);
    if (!ids.ok()) return bad("'prompt': " + ids.status().message());
    prompts.push_back(std::move(ids).value());
    return Status::Ok();
  };
  const auto add_ids = [&](const nlohmann::json& array) -> Status {
    std::vector<int32_t> ids;
    for (const nlohmann::json& item : array) {
      if (!item.is_number_integer()) {
        return bad("'prompt' token ids must be integers, not " + JsonTypeName(item));
      }
      const int64_t id = item.get<int64_t>();
      if (id < 0 || id >= limits.vocab_size) {
        return bad("'prompt' token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                   std::to_string(limits.vocab_size) + ")");
      }
      ids.push_back(static_cast<int32_t>(id));
    }
    if (ids.empty()) return bad("'prompt' must not be empty");
    prompts.push_back(std::move(ids));
    return Status::Ok();
  };
  if (prompt->is_string()) return add_text(prompt->get<std::string>());
  if (!prompt->is_array()) {
    return bad("'prompt' must be a string, an array of token ids, or an array of those, not " +
               JsonTypeName(*prompt));
  }
  if (prompt->empty()) return bad("'prompt' must not be empty");
  const nlohmann::json& first = prompt->front();
  if (first.is_number()) return add_ids(*prompt);
  for (const nlohmann::json& item : *prompt) {
    if (item.is_string()) {
      SIEVE_RETURN_IF_ERROR(add_text(item.get<std::string>()));
    } else if (item.is_array()) {
      SIEVE_RETURN_IF_ERROR(add_ids(item));
    } else {
      return bad("'prompt' batch items must be strings or arrays of token ids, not " +
                 JsonTypeName(item));
    }
  }
  return Status::Ok();
}

// Echo: the text of each prompt, as sent where it was text, decoded where it was token ids (special
// tokens spelled out, as vLLM's detokenizer does by default).
Status ReadPromptTexts(const FieldReader& fields, const RequestLimits& limits,
                       CompletionRequest& request) {
  const nlohmann::json& prompt = *fields.Find("prompt");
  const auto decode = [&](size_t index) {
    return limits.tokenizer != nullptr
               ? limits.tokenizer->Decode(request.prompts[index], /*skip_special_tokens=*/false)
               : std::string();
  };
  if (prompt.is_string()) {
    request.prompt_texts.push_back(prompt.get<std::string>());
  } else if (prompt.front().is_number()) {
    request.prompt_texts.push_back(decode(0));
  } else {
    for (size_t index = 0; index < prompt.size(); ++index) {
      request.prompt_texts.push_back(prompt[index].is_string() ? prompt[index].get<std::string>()
                                                               : decode(index));
    }
  }
  SIEVE_CHECK(request.prompt_texts.size() == request.prompts.size());
  return Status::Ok();
}

// `content`: a string, null, or an array of {"type": "text", "text": ...} parts.
Result<std::string> MessageContent(const nlohmann::json& message, size_t index,
                                   const FieldReader& fields) {
  const std::string where = "'messages[" + std::to_string(index) + "].content'";
  const auto it = message.find("content");
  if (it == message.end() || it->is_null()) return std::string();
  if (it->is_string()) return it->get<std::string>();
  if (!it->is_array()) {
    return fields.Error("messages",
                        where + " must be a string or an array of parts, not " + JsonTypeName(*it));
  }
  std::string text;
  for (const nlohmann::json& part : *it) {
    const auto type = part.is_object() ? part.find("type") : part.end();
    const auto part_text = part.is_object() ? part.find("text") : part.end();
    if (!part.is_object() || type == part.end() || !type->is_string()) {
      return fields.Error("messages", where + " parts must be objects with a 'type'");
    }
    if (type->get<std::string>() != "text") {
      return fields.Error("messages", where + " part type '" + type->get<std::string>() +
                                          "' is not supported (text only)");
    }
    if (part_text == part.end() || !part_text->is_string()) {
      return fields.Error("messages", where + " text parts need a string 'text'");
    }
    text += part_text->get<std::string>();
  }
  return text;
}

Status ReadChatPrompt(const FieldReader& fields, const RequestLimits& limits,
                      std::vector<std::vector<int32_t>>& prompts) {
  const nlohmann::json* messages = fields.Find("messages");
  if (messages == nullptr) return fields.Error("messages", "'messages' is required");
  if (!messages->is_array()) {
    return fields.Error("messages",
                        "'messages' must be an array of messages, not " + JsonTypeName(*messages));
  }
  if (messages->empty()) return fields.Error("messages", "'messages' must not be empty");
  std::vector<ChatMessage> chat;
  for (size_t index = 0; index < messages->size(); ++index) {
    const nlohmann::json& message = (*messages)[index];
    const std::string where = "'messages[" + std::to_string(index) + "]'";
    if (!message.is_object()) {
      return fields.Error("messages", where + " must be an object, not " + JsonTypeName(message));
    }
    const auto role = message.find("role");
    if (role == message.end() || !role->is_string()) {
      return fields.Error("messages", where + " needs a string 'role'");
    }
    SIEVE_ASSIGN_OR_RETURN(std::string content, MessageContent(message, index, fields));
    std::string role_name = role->get<std::string>();
    // OpenAI's newer name for the system role.
    if (role_name == "developer") role_name = "system";
    chat.push_back(ChatMessage{std::move(role_name), std::move(content)});
  }
  if (limits.tokenizer == nullptr) {
    return fields.Error("messages", "this model has no tokenizer, so no chat template");
  }
  const ChatTemplate* chat_template = limits.tokenizer->chat_template();
  if (chat_template == nullptr) {
    return fields.Error("messages", "this model has no usable chat template (" +
                                        limits.tokenizer->chat_template_status().message() +
                                        "); use /v1/completions");
  }
  bool add_generation_prompt = true;
  SIEVE_RETURN_IF_ERROR(fields.Bool("add_generation_prompt", add_generation_prompt));
  Result<std::string> rendered = chat_template->Apply(chat, add_generation_prompt);
  if (!rendered.ok()) return fields.Error("messages", "'messages': " + rendered.status().message());
  // The rendered prompt holds the template's special tokens as text (BOS included).
  Result<std::vector<int32_t>> ids = limits.tokenizer->Encode(*rendered, /*add_bos=*/false);
  if (!ids.ok()) return fields.Error("messages", "'messages': " + ids.status().message());
  prompts.push_back(std::move(ids).value());
  return Status::Ok();
}

Status ReadSampling(const FieldReader& fields, ApiKind kind, const RequestLimits& limits,
                    CompletionRequest& request) {
  SamplingParams& s = request.sampling;
  SIEVE_RETURN_IF_ERROR(fields.Float("temperature", 0.0, 1.0e6, s.temperature));
  SIEVE_RETURN_IF_ERROR(fields.Float("top_p", 0.0, 1.0, s.top_p));
  if (fields.Has("top_p") && !(s.top_p > 0.0f)) {
    return fields.Error("top_p", "'top_p' must be in (0, 1], not 0");
  }
  SIEVE_RETURN_IF_ERROR(fields.Int("top_k", -1, INT_MAX, s.top_k));
  if (s.top_k == -1) s.top_k = 0;  // vLLM's spelling of "off"
  SIEVE_RETURN_IF_ERROR(fields.Float("min_p", 0.0, 1.0, s.min_p));
  SIEVE_RETURN_IF_ERROR(fields.Float("presence_penalty", -2.0, 2.0, s.presence_penalty));
  SIEVE_RETURN_IF_ERROR(fields.Float("frequency_penalty", -2.0, 2.0, s.frequency_penalty));
  SIEVE_RETURN_IF_ERROR(fields.Float("repetition_penalty", 0.0, 1.0e6, s.repetition_penalty));
  if (fields.Has("repetition_penalty") && !(s.repetition_penalty > 0.0f)) {
    return fields.Error("repetition_penalty", "'repetition_penalty' must be > 0");
  }
  int64_t seed = 0;
  if (fields.Has("seed")) {
    SIEVE_RETURN_IF_ERROR(fields.Int("seed", INT64_MIN, INT64_MAX, seed));
    s.seed = static_cast<uint64_t>(seed);
  }
  SIEVE_RETURN_IF_ERROR(fields.Strings("stop", s.stop));
  for (const std::string& stop : s.stop) {
    if (stop.empty()) return fields.Error("stop", "'stop' strings must not be empty");
  }
  if (!s.stop.empty() && limits.tokenizer == nullptr) {
    return fields.Error("stop", "'stop' strings need a tokenizer, which this model lacks");
  }
  SIEVE_RETURN_IF_ERROR(
      fields.IntArray("stop_token_ids", 0, limits.vocab_size - 1, s.stop_token_ids));
  SIEVE_RETURN_IF_ERROR(fields.Bool("ignore_eos", s.ignore_eos));

  if (kind == ApiKind::kCompletion) SIEVE_RETURN_IF_ERROR(fields.Bool("echo", request.echo));
  int max_tokens = 0;
  // As vLLM: 0 with echo returns the prompt alone (lm-evaluation-harness's loglikelihood).
  SIEVE_RETURN_IF_ERROR(fields.Int("max_tokens", 0, INT_MAX, max_tokens));
  if (fields.Has("max_tokens")) {
    if (max_tokens == 0 && !request.echo) {
      return fields.Error("max_tokens", "'max_tokens' must be at least 1 (0 only with 'echo')");
    }
    request.max_tokens = max_tokens;
  }
  if (kind == ApiKind::kChat) {
    SIEVE_RETURN_IF_ERROR(fields.Int("max_completion_tokens", 1, INT_MAX, max_tokens));
    if (fields.Has("max_completion_tokens")) request.max_tokens = max_tokens;
  }
  int min_tokens = 0;
  SIEVE_RETURN_IF_ERROR(fields.Int("min_tokens", 0, INT_MAX, min_tokens));
  if (min_tokens > 0) return fields.Error("min_tokens", "'min_tokens' is not supported");

  if (kind == ApiKind::kCompletion) {
    SIEVE_RETURN_IF_ERROR(fields.Int("logprobs", 0, kMaxLogprobs, request.logprobs));
  } else {
    bool logprobs = false;
    SIEVE_RETURN_IF_ERROR(fields.Bool("logprobs", logprobs));
    int top_logprobs = 0;
    SIEVE_RETURN_IF_ERROR(fields.Int("top_logprobs", 0, kMaxLogprobs, top_logprobs));
    if (fields.Has("top_logprobs") && !logprobs) {
      return fields.Error("top_logprobs", "'top_logprobs' needs 'logprobs': true");
    }
    if (logprobs) request.logprobs = top_logprobs;
  }
  s.logprobs = request.logprobs;

  // Fields that would change the output if silently ignored are refused, not ignored.
  if (const nlohmann::json* bias = fields.Find("logit_bias")) {
    if (!bias->is_object()) {
      return fields.Error("logit_bias",
                          "'logit_bias' must be an object, not " + JsonTypeName(*bias));
    }
    if (!bias->empty()) return fields.Error("logit_bias", "'logit_bias' is not supported");
  }
  if (kind == ApiKind::kCompletion) {
    std::string suffix;
    SIEVE_RETURN_IF_ERROR(fields.String("suffix", suffix));
    if (!suffix.empty()) return fields.Error("suffix", "'suffix' is not supported");
    int best_of = request.n;
    SIEVE_RETURN_IF_ERROR(fields.Int("best_of", 1, INT_MAX, best_of));
    if (best_of != request.n) {
      return fields.Error("best_of", "'best_of' other than 'n' is not supported");
    }
  }
  return Status::Ok();
}

Status CheckLengths(const CompletionRequest& request, const RequestLimits& limits,
                    std::string* param) {
  const std::string prompt_field = request.kind == ApiKind::kChat ? "messages" : "prompt";
  for (const std::vector<int32_t>& prompt : request.prompts) {
    const int length = static_cast<int>(prompt.size());
    if (length >= limits.max_model_len) {
      if (param != nullptr) *param = prompt_field;
      return OutOfRangeError("This model's maximum context length is " +
                             std::to_string(limits.max_model_len) + " tokens, but the " +
                             (request.kind == ApiKind::kChat ? "messages have " : "prompt has ") +
                             std::to_string(length) +
                             " tokens (it must leave room for at least one generated token). "
                             "Please reduce the length of the " +
                             prompt_field + ".");
    }
    // length < max_model_len here, so the difference cannot overflow (the sum could).
    if (request.max_tokens && *request.max_tokens > limits.max_model_len - length) {
      if (param != nullptr) *param = "max_tokens";
      return OutOfRangeError("This model's maximum context length is " +
                             std::to_string(limits.max_model_len) +
                             " tokens. However, you requested " +
                             std::to_string(int64_t{length} + *request.max_tokens) + " tokens (" +
                             std::to_string(length) + " in the " + prompt_field + ", " +
                             std::to_string(*request.max_tokens) +
                             " in the completion). Please reduce the length of the " +
                             prompt_field + " or completion.");
    }
  }
  return Status::Ok();
}

}  // namespace

Result<CompletionRequest> ParseCompletionRequest(const nlohmann::json& body, ApiKind kind,
                                                 const RequestLimits& limits, std::string* param) {
  if (!body.is_object()) {
    return InvalidArgumentError("the request body must be a JSON object, not " +
                                JsonTypeName(body));
  }
  const FieldReader fields(body, param);
  CompletionRequest request;
  request.kind = kind;
  request.sampling = limits.defaults;
  request.sampling.max_tokens = 1;  // resolved by EngineRequests
  SIEVE_RETURN_IF_ERROR(fields.String("model", request.model));
  SIEVE_RETURN_IF_ERROR(fields.Int("n", 1, limits.max_n, request.n));
  SIEVE_RETURN_IF_ERROR(fields.Bool("stream", request.stream));
  if (const nlohmann::json* options = fields.Find("stream_options")) {
    if (!options->is_object()) {
      return fields.Error("stream_options",
                          "'stream_options' must be an object, not " + JsonTypeName(*options));
    }
    if (!request.stream) {
      return fields.Error("stream_options", "'stream_options' is only allowed with 'stream': true");
    }
    const FieldReader option_fields(*options, param);
    SIEVE_RETURN_IF_ERROR(option_fields.Bool("include_usage", request.include_usage));
  }
  SIEVE_RETURN_IF_ERROR(fields.String("kv_policy", request.kv_policy));
  SIEVE_RETURN_IF_ERROR(ReadSampling(fields, kind, limits, request));
  if (kind == ApiKind::kChat) {
    SIEVE_RETURN_IF_ERROR(ReadChatPrompt(fields, limits, request.prompts));
  } else {
    SIEVE_RETURN_IF_ERROR(ReadPrompts(fields, limits, request.prompts));
    if (request.echo) SIEVE_RETURN_IF_ERROR(ReadPromptTexts(fields, limits, request));
  }
  SIEVE_RETURN_IF_ERROR(CheckLengths(request, limits, param));
  SamplingParams check = request.sampling;
  check.max_tokens = 1;
  SIEVE_RETURN_IF_ERROR(check.Validate());
  return request;
}

std::vector<Request> EngineRequests(const CompletionRequest& request, int max_model_len) {
  std::vector<Request> requests;
  requests.reserve(static_cast<size_t>(request.num_choices()));
  for (const std::vector<int32_t>& prompt : request.prompts) {
    for (int copy = 0; copy < request.n; ++copy) {
      const size_t choice = requests.size();
      Request engine_request;
      engine_request.prompt = prompt;
      engine_request.sampling = request.sampling;
      engine_request.sampling.max_tokens = request.max_tokens
                                               ? *request.max_tokens
                                               : max_model_len - static_cast<int>(prompt.size());
      if (request.sampling.seed) engine_request.sampling.seed = *request.sampling.seed + choice;
      if (request.echo && (request.logprobs >= 0 || engine_request.sampling.max_tokens == 0)) {
        // max_tokens 0 without logprobs still runs the prompt (the engine's one way to end a
        // request that generates nothing); its logprobs are then not reported.
        engine_request.sampling.prompt_logprobs = std::max(request.logprobs, 0);
      }
      engine_request.kv_policy = request.kv_policy;
      requests.push_back(std::move(engine_request));
    }
  }
  return requests;
}

}  // namespace sieve
