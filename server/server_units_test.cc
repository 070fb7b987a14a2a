// The server's parts without sockets: request parsing (types, ranges, prompts, lengths), the
// Prometheus registry's text format, and the response builder's OpenAI shapes.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "server/api_error.h"
#include "server/completion_request.h"
#include "server/metrics.h"
#include "server/response_builder.h"
#include "server/tokenizer_endpoints.h"
#include "tokenizer/tokenizer_loader.h"

#include <random>

namespace sieve {
namespace {

using json = nlohmann::json;

class RequestParsingTest : public ::testing::Test {
 protected:
  RequestParsingTest() : tokenizer_(MakeEmbeddedByteTokenizer()) {
    limits_.tokenizer = tokenizer_.get();
    limits_.max_model_len = 64;
    limits_.vocab_size = 261;
  }

  Result<CompletionRequest> Parse(const json& body, ApiKind kind = ApiKind::kCompletion) {
    param_.clear();
    return ParseCompletionRequest(body, kind, limits_, &param_);
  }

  std::unique_ptr<Tokenizer> tokenizer_;
  RequestLimits limits_;
  std::string param_;
};

TEST_F(RequestParsingTest, DefaultsAndNullsLikeOpenAi) {
  auto parsed = Parse({{"prompt", "abc"}, {"temperature", nullptr}, {"whatever", {1, 2}}});
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->prompts.size(), 1u);
  EXPECT_EQ(parsed->prompts[0], (std::vector<int32_t>{256, 'a', 'b', 'c'}));
  EXPECT_FLOAT_EQ(parsed->sampling.temperature, 1.0f);
  EXPECT_FALSE(parsed->max_tokens.has_value());
  EXPECT_EQ(parsed->n, 1);
  EXPECT_FALSE(parsed->stream);
  EXPECT_EQ(parsed->logprobs, -1);
  // max_tokens defaults to the rest of the context, as vLLM.
  const std::vector<Request> requests = EngineRequests(*parsed, limits_.max_model_len);
  ASSERT_EQ(requests.size(), 1u);
  EXPECT_EQ(requests[0].sampling.max_tokens, 64 - 4);
}

TEST_F(RequestParsingTest, WrongTypesNameTheField) {
  const std::vector<std::pair<json, std::string>> cases = {
      {{{"prompt", "a"}, {"max_tokens", "ten"}}, "max_tokens"},
      {{{"prompt", "a"}, {"max_tokens", 2.5}}, "max_tokens"},
      {{{"prompt", "a"}, {"max_tokens", 0}}, "max_tokens"},
      {{{"prompt", "a"}, {"temperature", "hot"}}, "temperature"},
      {{{"prompt", "a"}, {"temperature", -1}}, "temperature"},
      {{{"prompt", "a"}, {"n", true}}, "n"},
      {{{"prompt", "a"}, {"stream", "yes"}}, "stream"},
      {{{"prompt", "a"}, {"stop", {"x", 3}}}, "stop"},
      {{{"prompt", "a"}, {"stop", ""}}, "stop"},
      {{{"prompt", "a"}, {"seed", "s"}}, "seed"},
      {{{"prompt", "a"}, {"logprobs", 21}}, "logprobs"},
      {{{"prompt", "a"}, {"presence_penalty", 3}}, "presence_penalty"},
      {{{"prompt", "a"}, {"stream_options", {{"include_usage", true}}}}, "stream_options"},
      {{{"prompt", "a"}, {"echo", "yes"}}, "echo"},
      {{{"prompt", "a"}, {"echo", true}, {"max_tokens", -1}}, "max_tokens"},
      {{{"prompt", ""}}, "prompt"},
      {{{"prompt", {"a", ""}}}, "prompt"},
      {{{"prompt", {{1, 2}, json::array()}}}, "prompt"},
      {{{"prompt", {{1, 2}, {2, 261}}}}, "prompt"},
      {{{"prompt", {1, -1}}}, "prompt"},
      {{{"prompt", "a"}, {"logit_bias", {{"5", 1}}}}, "logit_bias"},
      {{{"prompt", {1, "a"}}}, "prompt"},
      {{{"prompt", json::array()}}, "prompt"},
      {{{"prompt", {300}}}, "prompt"},
      {{{"model", 3}, {"prompt", "a"}}, "model"},
      {{{"max_tokens", 3}}, "prompt"},
      {{{"prompt", std::string(64, 'x')}}, "prompt"},
      {{{"prompt", "abc"}, {"max_tokens", 61}}, "max_tokens"},
  };
  for (const auto& [body, field] : cases) {
    auto parsed = Parse(body);
    ASSERT_FALSE(parsed.ok()) << body.dump();
    EXPECT_TRUE(parsed.status().code() == StatusCode::kInvalidArgument ||
                parsed.status().code() == StatusCode::kOutOfRange)
        << body.dump();
    EXPECT_EQ(param_, field) << body.dump() << ": " << parsed.status().message();
    EXPECT_EQ(HttpStatusFor(parsed.status().code()), 400);
  }
  EXPECT_FALSE(Parse(json::array({1})).ok());
  // Exactly filling the context is fine.
  EXPECT_TRUE(Parse({{"prompt", "abc"}, {"max_tokens", 60}}).ok());
}

// UBSan, through fuzz/completion_request_fuzzer: prompt length + max_tokens overflowed int, so
// max_tokens near INT_MAX wrapped to a negative total and passed the context check.
TEST_F(RequestParsingTest, HugeMaxTokensIsOutOfRange) {
  for (const ApiKind kind : {ApiKind::kCompletion, ApiKind::kChat}) {
    const json body = kind == ApiKind::kChat
                          ? json{{"messages", {{{"role", "user"}, {"content", "abc"}}}},
                                 {"max_completion_tokens", 2147483647}}
                          : json{{"prompt", "abc"}, {"max_tokens", 2147483647}};
    auto parsed = Parse(body, kind);
    ASSERT_FALSE(parsed.ok()) << body.dump();
    EXPECT_EQ(parsed.status().code(), StatusCode::kOutOfRange);
    EXPECT_EQ(param_, "max_tokens");
    EXPECT_NE(parsed.status().message().find("you requested 21474836"), std::string::npos)
        << parsed.status().message();
  }
}

TEST_F(RequestParsingTest, ChatFieldsAndMessages) {
  auto parsed =
      Parse({{"messages",
              {{{"role", "developer"}, {"content", "Be nice."}},
               {{"role", "user"},
                {"content",
                 {{{"type", "text"}, {"text", "Hi "}}, {{"type", "text"}, {"text", "you"}}}}}}},
             {"max_completion_tokens", 7},
             {"logprobs", true},
             {"top_logprobs", 3}},
            ApiKind::kChat);
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->max_tokens, 7);
  EXPECT_EQ(parsed->logprobs, 3);
  const std::vector<ChatMessage> messages = {{"system", "Be nice."}, {"user", "Hi you"}};
  auto rendered = tokenizer_->chat_template()->Apply(messages, true);
  ASSERT_TRUE(rendered.ok());
  EXPECT_EQ(parsed->prompts.at(0), *tokenizer_->Encode(*rendered, false));

  EXPECT_FALSE(Parse({{"messages", 5}}, ApiKind::kChat).ok());
  EXPECT_EQ(param_, "messages");
  EXPECT_FALSE(Parse({{"messages", {{{"role", "user"}, {"content", "x"}}}}, {"top_logprobs", 2}},
                     ApiKind::kChat)
                   .ok());
  EXPECT_EQ(param_, "top_logprobs");
  EXPECT_FALSE(Parse({{"messages",
                       {{{"role", "user"}, {"content", {{{"type", "image_url"}, {"url", "x"}}}}}}}},
                     ApiKind::kChat)
                   .ok());
  EXPECT_EQ(param_, "messages");
}

TEST_F(RequestParsingTest, ChoicesAndSeeds) {
  auto parsed = Parse({{"prompt", {"a", "b"}}, {"n", 2}, {"seed", 10}, {"max_tokens", 3}});
  ASSERT_TRUE(parsed.ok());
  const std::vector<Request> requests = EngineRequests(*parsed, limits_.max_model_len);
  ASSERT_EQ(requests.size(), 4u);
  for (size_t choice = 0; choice < 4; ++choice) {
    EXPECT_EQ(requests[choice].sampling.seed, 10 + choice);
    EXPECT_EQ(requests[choice].sampling.max_tokens, 3);
    EXPECT_EQ(requests[choice].prompt.back(), choice < 2 ? 'a' : 'b');
  }
}

// lm-evaluation-harness's loglikelihood request (openai_completions.py): echo, logprobs 1, max
// tokens 0 or 1, prompts as token-id arrays in a batch.
TEST_F(RequestParsingTest, EchoAsTheHarnessSendsIt) {
  for (const int max_tokens : {0, 1}) {
    auto parsed = Parse({{"prompt", {{256, 'a', 'b'}, {256, 'c'}}},
                         {"echo", true},
                         {"max_tokens", max_tokens},
                         {"logprobs", 1},
                         {"temperature", 0},
                         {"seed", 1234}});
    ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
    EXPECT_TRUE(parsed->echo);
    EXPECT_EQ(parsed->prompts.size(), 2u);
    // Token prompts echo as their decoded text, special tokens spelled out.
    ASSERT_EQ(parsed->prompt_texts.size(), 2u);
    EXPECT_EQ(parsed->prompt_texts[0], tokenizer_->Decode(parsed->prompts[0], false));
    const std::vector<Request> requests = EngineRequests(*parsed, limits_.max_model_len);
    ASSERT_EQ(requests.size(), 2u);
    for (const Request& request : requests) {
      EXPECT_EQ(request.sampling.max_tokens, max_tokens);
      EXPECT_EQ(request.sampling.prompt_logprobs, 1);
      EXPECT_TRUE(request.sampling.Validate().ok());
    }
  }
  // A text prompt echoes as sent.
  auto text = Parse({{"prompt", "hello"}, {"echo", true}, {"max_tokens", 2}});
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(text->prompt_texts, std::vector<std::string>{"hello"});
  // Without logprobs only max_tokens 0 needs the prompt run for logprobs (the engine's way to
  // end a request that generates nothing); with max_tokens > 0 none are asked for.
  EXPECT_EQ(EngineRequests(*text, limits_.max_model_len)[0].sampling.prompt_logprobs, -1);
  auto nothing = Parse({{"prompt", "hello"}, {"echo", true}, {"max_tokens", 0}});
  ASSERT_TRUE(nothing.ok());
  EXPECT_EQ(EngineRequests(*nothing, limits_.max_model_len)[0].sampling.prompt_logprobs, 0);
  // max_tokens 0 needs echo; echo is streamed too, as vLLM's.
  EXPECT_FALSE(Parse({{"prompt", "hello"}, {"max_tokens", 0}}).ok());
  EXPECT_EQ(param_, "max_tokens");
  EXPECT_TRUE(Parse({{"prompt", "hello"}, {"echo", true}, {"stream", true}, {"logprobs", 2}}).ok());
}

TEST(ResponseBuilderTest, EchoOpensWithThePromptAndItsLogprobs) {
  const std::unique_ptr<Tokenizer> tokenizer = MakeEmbeddedByteTokenizer();
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> letter('a', 'z');
  std::uniform_real_distribution<float> logprob(-12.0f, -0.01f);
  const int prompt_len = std::uniform_int_distribution<int>(1, 30)(rng);
  std::vector<int32_t> prompt = {256};
  while (static_cast<int>(prompt.size()) < prompt_len) prompt.push_back(letter(rng));
  for (const bool stream : {false, true}) {
    for (const int max_tokens : {0, 1}) {
      CompletionRequest request;
      request.prompts = {prompt};
      request.prompt_texts = {tokenizer->Decode(prompt, false)};
      request.echo = true;
      request.logprobs = 1;
      request.stream = stream;
      ResponseBuilder builder(request, "m", tokenizer.get());
      RequestOutput output;
      for (size_t position = 1; position < prompt.size(); ++position) {
        SampleResult entry;
        entry.token = prompt[position];
        entry.logprob = logprob(rng);
        entry.top_logprobs = {{letter(rng), logprob(rng)}};
        output.prompt_logprobs.push_back(entry);
      }
      if (max_tokens == 1) {
        output.new_tokens = {'z'};
        output.new_text = "z";
        output.new_logprobs = {SampleResult{'z', -0.5f, {{'z', -0.5f}}}};
        output.num_generated_tokens = 1;
      }
      output.finished = true;
      output.finish_reason = FinishReason::kLength;
      json choice;
      if (stream) {
        const std::string event = builder.Event(0, output);
        ASSERT_EQ(event.rfind("data: ", 0), 0u);
        choice = json::parse(event.substr(6))["choices"][0];
      } else {
        builder.Add(0, output);
        const json body = json::parse(builder.Body());
        choice = body["choices"][0];
        EXPECT_EQ(body["usage"]["completion_tokens"], max_tokens);
        EXPECT_EQ(body["usage"]["prompt_tokens"], prompt.size());
      }
      EXPECT_EQ(choice["text"], request.prompt_texts[0] + output.new_text);
      const json& logprobs = choice["logprobs"];
      const size_t total = prompt.size() + static_cast<size_t>(max_tokens);
      ASSERT_EQ(logprobs["tokens"].size(), total) << logprobs.dump();
      ASSERT_EQ(logprobs["token_logprobs"].size(), total);
      ASSERT_EQ(logprobs["top_logprobs"].size(), total);
      ASSERT_EQ(logprobs["text_offset"].size(), total);
      EXPECT_TRUE(logprobs["token_logprobs"][0].is_null());
      EXPECT_TRUE(logprobs["top_logprobs"][0].is_null());
      int offset = 0;
      for (size_t position = 0; position < total; ++position) {
        EXPECT_EQ(logprobs["text_offset"][position], offset);
        offset += static_cast<int>(logprobs["tokens"][position].get<std::string>().size());
        if (position == 0 || position >= prompt.size()) continue;
        const SampleResult& entry = output.prompt_logprobs[position - 1];
        EXPECT_EQ(logprobs["tokens"][position], std::string(1, static_cast<char>(entry.token)));
        EXPECT_FLOAT_EQ(logprobs["token_logprobs"][position].get<float>(), entry.logprob);
        // The top 1 and the prompt's own token, as vLLM.
        const json& top = logprobs["top_logprobs"][position];
        EXPECT_FLOAT_EQ(top[std::string(1, static_cast<char>(entry.token))].get<float>(),
                        entry.top_logprobs[0].token == entry.token ? entry.top_logprobs[0].logprob
                                                                   : entry.logprob);
        EXPECT_FLOAT_EQ(
            top[std::string(1, static_cast<char>(entry.top_logprobs[0].token))].get<float>(),
            entry.top_logprobs[0].logprob);
      }
      if (max_tokens == 1) {
        EXPECT_FLOAT_EQ(logprobs["token_logprobs"][total - 1].get<float>(), -0.5f);
      }
    }
  }
}

class TokenizerEndpointsTest : public RequestParsingTest {};

TEST_F(TokenizerEndpointsTest, TokenizeDetokenizeRoundTrip) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  std::string text;
  const int length = std::uniform_int_distribution<int>(1, 40)(rng);
  for (int index = 0; index < length; ++index) {
    text += static_cast<char>(std::uniform_int_distribution<int>(' ', '~')(rng));
  }
  for (const bool special : {true, false}) {
    auto tokenized = TokenizeResponse(
        {{"prompt", text}, {"add_special_tokens", special}, {"return_token_strs", true}}, limits_,
        &param_);
    ASSERT_TRUE(tokenized.ok()) << tokenized.status().ToString();
    const std::vector<int32_t> tokens = (*tokenized)["tokens"].get<std::vector<int32_t>>();
    EXPECT_EQ(tokens, *tokenizer_->Encode(text, special));
    EXPECT_EQ((*tokenized)["count"], tokens.size());
    EXPECT_EQ((*tokenized)["max_model_len"], limits_.max_model_len);
    EXPECT_EQ((*tokenized)["token_strs"].size(), tokens.size());
    auto detokenized = DetokenizeResponse({{"tokens", tokens}}, limits_, &param_);
    ASSERT_TRUE(detokenized.ok()) << detokenized.status().ToString();
    // Special tokens are spelled out, as vLLM's detokenize.
    EXPECT_EQ((*detokenized)["prompt"], (special ? tokenizer_->TokenBytes(256) : "") + text);
  }
  // Chat form: what /v1/chat/completions would run.
  auto chat =
      TokenizeResponse({{"messages", {{{"role", "user"}, {"content", "hi"}}}}}, limits_, &param_);
  ASSERT_TRUE(chat.ok()) << chat.status().ToString();
  EXPECT_FALSE((*chat)["tokens"].empty());
  EXPECT_TRUE((*chat)["token_strs"].is_null());

  auto info = TokenizerInfoResponse(limits_);
  ASSERT_TRUE(info.ok());
  EXPECT_TRUE(info->contains("eos_token"));  // what lm-eval's remote tokenizer checks
  EXPECT_TRUE(info->contains("tokenizer_class"));
}

TEST_F(TokenizerEndpointsTest, BadInputNamesTheField) {
  const std::vector<std::tuple<json, bool, std::string>> cases = {
      {{{"prompt", 5}}, true, "prompt"},
      {json::object(), true, "prompt"},
      {{{"prompt", "x"}, {"add_special_tokens", "no"}}, true, "add_special_tokens"},
      {{{"tokens", {1, 261}}}, false, "tokens"},
      {{{"tokens", {-1}}}, false, "tokens"},
      {{{"tokens", "abc"}}, false, "tokens"},
      {json::object(), false, "tokens"},
  };
  for (const auto& [body, tokenize, field] : cases) {
    auto response = tokenize ? TokenizeResponse(body, limits_, &param_)
                             : DetokenizeResponse(body, limits_, &param_);
    ASSERT_FALSE(response.ok()) << body.dump();
    EXPECT_EQ(HttpStatusFor(response.status().code()), 400) << body.dump();
    EXPECT_EQ(param_, field) << body.dump() << ": " << response.status().message();
  }
  EXPECT_FALSE(TokenizeResponse(json::array(), limits_, &param_).ok());
  RequestLimits no_tokenizer = limits_;
  no_tokenizer.tokenizer = nullptr;
  EXPECT_FALSE(TokenizerInfoResponse(no_tokenizer).ok());
}

TEST(MetricsRegistryTest, RendersPrometheusText) {
  MetricsRegistry registry;
  registry.GetCounter("app:requests_total", "Requests.", {{"code", "200"}}).Increment(2);
  registry.GetCounter("app:requests_total", "Requests.", {{"code", "4\"0\"4"}}).Increment();
  registry.GetGauge("app:load", "Load.").Set(0.5);
  const double bounds[] = {0.1, 1.0};
  Histogram& histogram = registry.GetHistogram("app:latency_seconds", "Latency.", bounds);
  histogram.Observe(0.05);
  histogram.Observe(0.1);
  histogram.Observe(5.0);
  const std::string text = registry.Render();
  EXPECT_NE(text.find("# HELP app:requests_total Requests.\n# TYPE app:requests_total counter\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("app:requests_total{code=\"200\"} 2\n"), std::string::npos) << text;
  EXPECT_NE(text.find("app:requests_total{code=\"4\\\"0\\\"4\"} 1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("# TYPE app:load gauge\napp:load 0.5\n"), std::string::npos) << text;
  EXPECT_NE(text.find("app:latency_seconds_bucket{le=\"0.1\"} 2\n"), std::string::npos) << text;
  EXPECT_NE(text.find("app:latency_seconds_bucket{le=\"1\"} 2\n"), std::string::npos) << text;
  EXPECT_NE(text.find("app:latency_seconds_bucket{le=\"+Inf\"} 3\n"), std::string::npos) << text;
  EXPECT_NE(text.find("app:latency_seconds_sum 5.15\n"), std::string::npos) << text;
  EXPECT_NE(text.find("app:latency_seconds_count 3\n"), std::string::npos) << text;
}

TEST(ApiErrorTest, StatusCodesMapToHttp) {
  EXPECT_EQ(HttpStatusFor(StatusCode::kInvalidArgument), 400);
  EXPECT_EQ(HttpStatusFor(StatusCode::kOutOfRange), 400);
  EXPECT_EQ(HttpStatusFor(StatusCode::kUnauthenticated), 401);
  EXPECT_EQ(HttpStatusFor(StatusCode::kNotFound), 404);
  EXPECT_EQ(HttpStatusFor(StatusCode::kResourceExhausted), 429);
  EXPECT_EQ(HttpStatusFor(StatusCode::kUnavailable), 503);
  EXPECT_EQ(HttpStatusFor(StatusCode::kInternal), 500);
  const json body = json::parse(ApiErrorBody(MakeApiError(400, "bad", "n")));
  EXPECT_EQ(body["error"]["message"], "bad");
  EXPECT_EQ(body["error"]["type"], "invalid_request_error");
  EXPECT_EQ(body["error"]["param"], "n");
  EXPECT_TRUE(body["error"]["code"].is_null());
}

TEST(ResponseBuilderTest, ChatChunksAndUsage) {
  const std::unique_ptr<Tokenizer> tokenizer = MakeEmbeddedByteTokenizer();
  CompletionRequest request;
  request.kind = ApiKind::kChat;
  request.prompts = {{256, 'a'}};
  request.n = 2;
  request.stream = true;
  request.include_usage = true;
  ResponseBuilder builder(request, "m", tokenizer.get());
  // One opening chunk per choice, carrying the role.
  const std::string start = builder.Start();
  size_t roles = 0;
  for (size_t at = start.find("\"role\":\"assistant\""); at != std::string::npos;
       at = start.find("\"role\":\"assistant\"", at + 1)) {
    ++roles;
  }
  EXPECT_EQ(roles, 2u) << start;
  RequestOutput output;
  output.new_tokens = {'h', 'i'};
  output.new_text = "hi";
  output.finished = true;
  output.finish_reason = FinishReason::kStop;
  output.num_generated_tokens = 2;
  const std::string event = builder.Event(1, output);
  ASSERT_EQ(event.rfind("data: ", 0), 0u);
  const json chunk = json::parse(event.substr(6));
  EXPECT_EQ(chunk["object"], "chat.completion.chunk");
  EXPECT_EQ(chunk["choices"][0]["index"], 1);
  EXPECT_EQ(chunk["choices"][0]["delta"]["content"], "hi");
  EXPECT_EQ(chunk["choices"][0]["finish_reason"], "stop");
  EXPECT_TRUE(chunk["usage"].is_null());
  const std::string end = builder.End();
  EXPECT_EQ(end.substr(end.size() - 14), "data: [DONE]\n\n");
  const json usage = json::parse(end.substr(6, end.find("\n\n") - 6));
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["prompt_tokens"], 2);
  EXPECT_EQ(usage["usage"]["completion_tokens"], 2);
  EXPECT_EQ(usage["usage"]["total_tokens"], 4);
}

}  // namespace
}  // namespace sieve
