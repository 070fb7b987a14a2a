#include "server/tokenizer_endpoints.h"

#include <climits>

#include <nlohmann/json.hpp>

#include "server/json_util.h"

namespace sieve {

namespace {

Status NoTokenizer() {
  return InvalidArgumentError("this model has no tokenizer: it is served as token ids only");
}

Status RequireObject(const nlohmann::json& body) {
  if (!body.is_object()) {
    return InvalidArgumentError("the request body must be a JSON object, not " +
                                JsonTypeName(body));
  }
  return Status::Ok();
}

// A token's text as the logprobs spell it: its bytes, invalid UTF-8 replaced.
std::string TokenText(const Tokenizer& tokenizer, int32_t id) {
  return ToValidUtf8(tokenizer.TokenBytes(id));
}

}  // namespace

Result<nlohmann::json> TokenizeResponse(const nlohmann::json& body, const RequestLimits& limits,
                                        std::string* param) {
  SIEVE_RETURN_IF_ERROR(RequireObject(body));
  if (limits.tokenizer == nullptr) return NoTokenizer();
  const Tokenizer& tokenizer = *limits.tokenizer;
  const FieldReader fields(body, param);
  bool return_token_strs = false;
  SIEVE_RETURN_IF_ERROR(fields.Bool("return_token_strs", return_token_strs));
  std::vector<int32_t> tokens;
  if (fields.Has("messages")) {
    // The chat form: the prompt /v1/chat/completions would run, whatever its length (vLLM's
    // tokenize has no length limit).
    RequestLimits unlimited = limits;
    unlimited.max_model_len = INT_MAX;
    SIEVE_ASSIGN_OR_RETURN(CompletionRequest chat,
                           ParseCompletionRequest(body, ApiKind::kChat, unlimited, param));
    tokens = std::move(chat.prompts.front());
  } else {
    const nlohmann::json* prompt = fields.Find("prompt");
    if (prompt == nullptr) return fields.Error("prompt", "'prompt' (or 'messages') is required");
    if (!prompt->is_string()) {
      return fields.Error("prompt", "'prompt' must be a string, not " + JsonTypeName(*prompt));
    }
    bool add_special_tokens = true;  // vLLM's default: BOS where the tokenizer adds one
    SIEVE_RETURN_IF_ERROR(fields.Bool("add_special_tokens", add_special_tokens));
    Result<std::vector<int32_t>> encoded =
        tokenizer.Encode(prompt->get<std::string>(), add_special_tokens);
    if (!encoded.ok()) return fields.Error("prompt", "'prompt': " + encoded.status().message());
    tokens = std::move(encoded).value();
  }
  nlohmann::json token_strs = nullptr;
  if (return_token_strs) {
    token_strs = nlohmann::json::array();
    for (const int32_t id : tokens) token_strs.push_back(TokenText(tokenizer, id));
  }
  return nlohmann::json{{"count", tokens.size()},
                        {"max_model_len", limits.max_model_len},
                        {"tokens", tokens},
                        {"token_strs", std::move(token_strs)}};
}

Result<nlohmann::json> DetokenizeResponse(const nlohmann::json& body, const RequestLimits& limits,
                                          std::string* param) {
  SIEVE_RETURN_IF_ERROR(RequireObject(body));
  if (limits.tokenizer == nullptr) return NoTokenizer();
  const FieldReader fields(body, param);
  if (!fields.Has("tokens")) return fields.Error("tokens", "'tokens' is required");
  std::vector<int32_t> tokens;
  SIEVE_RETURN_IF_ERROR(fields.IntArray("tokens", 0, limits.vocab_size - 1, tokens));
  // As vLLM's (Hugging Face's decode): special tokens spelled out.
  return nlohmann::json{
      {"prompt", limits.tokenizer->Decode(tokens, /*skip_special_tokens=*/false)}};
}

Result<nlohmann::json> TokenizerInfoResponse(const RequestLimits& limits) {
  if (limits.tokenizer == nullptr) return NoTokenizer();
  const Tokenizer& tokenizer = *limits.tokenizer;
  const auto token_or_null = [&](std::optional<int32_t> id) {
    return id ? nlohmann::json(TokenText(tokenizer, *id)) : nlohmann::json(nullptr);
  };
  const std::vector<int32_t>& eos = tokenizer.eos_ids();
  return nlohmann::json{
      {"tokenizer_class", std::string(tokenizer.kind())},
      {"bos_token", token_or_null(tokenizer.bos_id())},
      {"eos_token", token_or_null(eos.empty() ? std::nullopt : std::optional<int32_t>(eos[0]))},
      {"pad_token", nullptr},
      {"add_bos_token", tokenizer.add_bos()},
      {"model_max_length", limits.max_model_len},
      {"vocab_size", tokenizer.vocab_size()}};
}

}  // namespace sieve
