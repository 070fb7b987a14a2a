#include "server/response_builder.h"

#include <algorithm>
#include <chrono>
#include <random>

#include "server/json_util.h"

namespace sieve {

namespace {

// JSON has no -inf; vLLM reports impossible tokens as -9999 too.
double FiniteLogprob(float logprob) { return std::max(static_cast<double>(logprob), -9999.0); }

std::string Sse(const nlohmann::json& chunk) { return "data: " + DumpJson(chunk) + "\n\n"; }

}  // namespace

std::string FinishReasonText(FinishReason reason) { return std::string(FinishReasonName(reason)); }

std::string RandomId(std::string_view prefix) {
  thread_local std::mt19937_64 rng(std::random_device{}());
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id(prefix);
  for (int digit = 0; digit < 24; ++digit) id += kHex[rng() % 16];
  return id;
}

ResponseBuilder::ResponseBuilder(const CompletionRequest& request, std::string model,
                                 const Tokenizer* tokenizer)
    : kind_(request.kind),
      include_usage_(request.include_usage),
      logprobs_(request.logprobs),
      echo_(request.echo),
      n_(request.n),
      prompts_(request.echo ? request.prompts : std::vector<std::vector<int32_t>>()),
      prompt_texts_(request.prompt_texts),
      model_(std::move(model)),
      tokenizer_(tokenizer),
      id_(RandomId(request.kind == ApiKind::kChat ? "chatcmpl-" : "cmpl-")),
      created_(std::chrono::duration_cast<std::chrono::seconds>(
                   std::chrono::system_clock::now().time_since_epoch())
                   .count()),
      choices_(static_cast<size_t>(request.num_choices())) {
  // OpenAI counts a prompt once however many choices it has.
  for (const std::vector<int32_t>& prompt : request.prompts) {
    prompt_tokens_ += static_cast<int>(prompt.size());
  }
}

int ResponseBuilder::completion_tokens() const {
  int total = 0;
  for (const Choice& choice : choices_) total += choice.num_generated;
  return total;
}

nlohmann::json ResponseBuilder::Usage() const {
  const int completion = completion_tokens();
  return {{"prompt_tokens", prompt_tokens_},
          {"completion_tokens", completion},
          {"total_tokens", prompt_tokens_ + completion}};
}

std::string ResponseBuilder::NewText(size_t index, Choice& choice, const RequestOutput& output) {
  if (!echo_ || choice.echoed) return output.new_text;
  choice.echoed = true;
  return prompt_texts_.at(index / static_cast<size_t>(n_)) + output.new_text;
}

nlohmann::json ResponseBuilder::Logprobs(size_t index, Choice& choice,
                                         const RequestOutput& output) {
  if (logprobs_ < 0) return nullptr;
  const auto token_text = [this](int32_t token) {
    return tokenizer_ ? ToValidUtf8(tokenizer_->TokenBytes(token)) : std::to_string(token);
  };
  const auto token_bytes = [this](int32_t token) {
    nlohmann::json bytes = nlohmann::json::array();
    if (tokenizer_) {
      for (const char byte : tokenizer_->TokenBytes(token)) {
        bytes.push_back(static_cast<int>(static_cast<uint8_t>(byte)));
      }
    }
    return bytes;
  };
  if (kind_ == ApiKind::kChat) {
    nlohmann::json content = nlohmann::json::array();
    for (const SampleResult& sample : output.new_logprobs) {
      nlohmann::json top = nlohmann::json::array();
      for (const TokenLogprob& entry : sample.top_logprobs) {
        top.push_back({{"token", token_text(entry.token)},
                       {"logprob", FiniteLogprob(entry.logprob)},
                       {"bytes", token_bytes(entry.token)}});
      }
      content.push_back({{"token", token_text(sample.token)},
                         {"logprob", FiniteLogprob(sample.logprob)},
                         {"bytes", token_bytes(sample.token)},
                         {"top_logprobs", std::move(top)}});
    }
    return {{"content", std::move(content)}};
  }
  nlohmann::json tokens = nlohmann::json::array();
  nlohmann::json token_logprobs = nlohmann::json::array();
  nlohmann::json top_logprobs = nlohmann::json::array();
  nlohmann::json text_offset = nlohmann::json::array();
  // `sample` null: a token with no logprob (the prompt's first, which nothing predicts).
  const auto add = [&](int32_t token, const SampleResult* sample) {
    const std::string text = token_text(token);
    tokens.push_back(text);
    if (sample == nullptr) {
      token_logprobs.push_back(nullptr);
      top_logprobs.push_back(nullptr);
    } else {
      token_logprobs.push_back(FiniteLogprob(sample->logprob));
      // As vLLM: the top N, plus the chosen token when it is not among them.
      nlohmann::json top = nlohmann::json::object();
      for (const TokenLogprob& entry : sample->top_logprobs) {
        top[token_text(entry.token)] = FiniteLogprob(entry.logprob);
      }
      if (!top.contains(text)) top[text] = FiniteLogprob(sample->logprob);
      top_logprobs.push_back(std::move(top));
    }
    text_offset.push_back(choice.text_offset);
    choice.text_offset += static_cast<int>(text.size());
  };
  if (echo_ && !choice.echoed) {
    // The prompt's tokens first, as vLLM's echo: token k > 0 with its logprob given the ones
    // before it (RequestOutput::prompt_logprobs), the first with none.
    const std::vector<int32_t>& prompt = prompts_.at(index / static_cast<size_t>(n_));
    for (size_t position = 0; position < prompt.size(); ++position) {
      const bool known = position > 0 && position - 1 < output.prompt_logprobs.size();
      add(prompt[position], known ? &output.prompt_logprobs[position - 1] : nullptr);
    }
  }
  for (const SampleResult& sample : output.new_logprobs) add(sample.token, &sample);
  return {{"tokens", std::move(tokens)},
          {"token_logprobs", std::move(token_logprobs)},
          {"top_logprobs", std::move(top_logprobs)},
          {"text_offset", std::move(text_offset)}};
}

void ResponseBuilder::Record(Choice& choice, const RequestOutput& output) {
  choice.num_generated = output.num_generated_tokens;
  if (output.finished) choice.finish_reason = FinishReasonText(output.finish_reason);
}

void ResponseBuilder::Add(size_t choice_index, const RequestOutput& output) {
  Choice& choice = choices_.at(choice_index);
  nlohmann::json logprobs = Logprobs(choice_index, choice, output);
  choice.text += NewText(choice_index, choice, output);
  if (!logprobs.is_null()) {
    if (choice.logprobs.is_null()) {
      choice.logprobs = std::move(logprobs);
    } else {
      for (auto& [key, values] : logprobs.items()) {
        for (nlohmann::json& value : values) choice.logprobs[key].push_back(std::move(value));
      }
    }
  }
  Record(choice, output);
}

std::string ResponseBuilder::Body() const {
  nlohmann::json choices = nlohmann::json::array();
  for (size_t index = 0; index < choices_.size(); ++index) {
    const Choice& choice = choices_[index];
    nlohmann::json logprobs = choice.logprobs;
    if (logprobs_ >= 0 && logprobs.is_null()) {
      // Requested, but no tokens came (an abort before the first one): empty, not missing.
      logprobs = kind_ == ApiKind::kChat
                     ? nlohmann::json{{"content", nlohmann::json::array()}}
                     : nlohmann::json{{"tokens", nlohmann::json::array()},
                                      {"token_logprobs", nlohmann::json::array()},
                                      {"top_logprobs", nlohmann::json::array()},
                                      {"text_offset", nlohmann::json::array()}};
    }
    nlohmann::json entry = {{"index", index}};
    if (kind_ == ApiKind::kChat) {
      entry["message"] = {{"role", "assistant"}, {"content", choice.text}};
    } else {
      entry["text"] = choice.text;
    }
    entry["logprobs"] = std::move(logprobs);
    entry["finish_reason"] = choice.finish_reason.empty() ? nlohmann::json(nullptr)
                                                          : nlohmann::json(choice.finish_reason);
    choices.push_back(std::move(entry));
  }
  nlohmann::json body = {
      {"id", id_},
      {"object", kind_ == ApiKind::kChat ? "chat.completion" : "text_completion"},
      {"created", created_},
      {"model", model_},
      {"choices", std::move(choices)},
      {"usage", Usage()}};
  return DumpJson(body);
}

nlohmann::json ResponseBuilder::ChunkBase() const {
  nlohmann::json chunk = {
      {"id", id_},
      {"object", kind_ == ApiKind::kChat ? "chat.completion.chunk" : "text_completion"},
      {"created", created_},
      {"model", model_}};
  // OpenAI: with include_usage every chunk carries "usage": null but the last.
  if (include_usage_) chunk["usage"] = nullptr;
  return chunk;
}

std::string ResponseBuilder::Start() const {
  if (kind_ != ApiKind::kChat) return "";
  std::string events;
  for (size_t index = 0; index < choices_.size(); ++index) {
    nlohmann::json chunk = ChunkBase();
    chunk["choices"] = nlohmann::json::array({{{"index", index},
                                               {"delta", {{"role", "assistant"}, {"content", ""}}},
                                               {"logprobs", nullptr},
                                               {"finish_reason", nullptr}}});
    events += Sse(chunk);
  }
  return events;
}

std::string ResponseBuilder::Event(size_t choice_index, const RequestOutput& output) {
  Choice& choice = choices_.at(choice_index);
  nlohmann::json logprobs = Logprobs(choice_index, choice, output);
  const std::string text = NewText(choice_index, choice, output);
  Record(choice, output);
  if (text.empty() && logprobs.is_null() && !output.finished) return "";
  nlohmann::json entry = {{"index", choice_index}};
  if (kind_ == ApiKind::kChat) {
    entry["delta"] = text.empty() && output.finished ? nlohmann::json::object()
                                                     : nlohmann::json{{"content", text}};
  } else {
    entry["text"] = text;
  }
  entry["logprobs"] = std::move(logprobs);
  entry["finish_reason"] =
      output.finished ? nlohmann::json(choice.finish_reason) : nlohmann::json(nullptr);
  nlohmann::json chunk = ChunkBase();
  chunk["choices"] = nlohmann::json::array({std::move(entry)});
  return Sse(chunk);
}

std::string ResponseBuilder::End() const {
  std::string events;
  if (include_usage_) {
    nlohmann::json chunk = ChunkBase();
    chunk["choices"] = nlohmann::json::array();
    chunk["usage"] = Usage();
    events += Sse(chunk);
  }
  return events + "data: [DONE]\n\n";
}

std::string ResponseBuilder::ErrorEvent(const ApiError& error) {
  return "data: " + ApiErrorBody(error) + "\n\n";
}

}  // namespace sieve
