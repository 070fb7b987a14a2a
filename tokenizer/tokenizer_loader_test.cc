#include "tokenizer/tokenizer_loader.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/testing.h"
#include "tokenizer/tokenizer_test_fixtures.h"

namespace sieve {
namespace {

using ::sieve::testing::EncodeOk;
using ::testing::ElementsAre;

using testing::TempDir;

constexpr std::string_view kLlama3InstructConfig = R"({
  "add_bos_token": true,
  "bos_token": "<|begin_of_text|>",
  "eos_token": "<|eot_id|>",
  "chat_template": "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}",
  "added_tokens_decoder": {
    "128000": {"content": "<|begin_of_text|>", "lstrip": false, "normalized": false, "rstrip": false, "single_word": false, "special": true}
  }
})";

TEST(TokenizerLoaderTest, FindsEachFormat) {
  const std::string fixtures = TestDataDir();  // testdata/tokenizers, committed
  const std::string tokenizers = fixtures + "/tokenizers";
  const auto kind_of = [](const std::string& path) {
    Result<std::unique_ptr<Tokenizer>> tokenizer = LoadTokenizer(path);
    EXPECT_TRUE(tokenizer.ok()) << path << ": " << tokenizer.status().ToString();
    return tokenizer.ok() ? std::string((*tokenizer)->kind()) : std::string();
  };
  EXPECT_EQ(kind_of(tokenizers + "/llama3"), "bpe");  // tokenizer.json preferred
  EXPECT_EQ(kind_of(tokenizers + "/llama3/tokenizer.json"), "bpe");
  EXPECT_EQ(kind_of(tokenizers + "/llama3/tokenizer.model"), "tiktoken");
  EXPECT_EQ(kind_of(tokenizers + "/llama2"), "sentencepiece");
  EXPECT_EQ(kind_of(tokenizers + "/llama2/tokenizer.model"), "sentencepiece");
}

TEST(TokenizerLoaderTest, TiktokenDefaultsAreMetasLlama3) {
  const std::string fixtures = TestDataDir();  // testdata/tokenizers, committed
  const Tokenizer* tokenizer = testing::FixtureTokenizer(fixtures, "llama3/tokenizer.model");
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_THAT(tokenizer->eos_ids(), ElementsAre(128001, 128009));
  ASSERT_NE(tokenizer->chat_template(), nullptr);
  EXPECT_EQ(tokenizer->chat_template()->kind(), ChatTemplate::Kind::kLlama3);
  // The chat prompt already holds BOS text: encoded without add_bos it starts with one BOS.
  const std::vector<ChatMessage> messages = {{"user", "Hi"}};
  Result<std::string> prompt = tokenizer->chat_template()->Apply(messages, true);
  ASSERT_TRUE(prompt.ok());
  EXPECT_THAT(
      EncodeOk(*tokenizer, *prompt, /*add_bos=*/false),
      ElementsAre(128000, 128006, 882, 128007, 271, 13347, 128009, 128006, 78191, 128007, 271));
}

TEST(TokenizerLoaderTest, MissingPathsAreNotFound) {
  TempDir dir;
  Result<std::unique_ptr<Tokenizer>> empty = LoadTokenizer(dir.path());
  ASSERT_FALSE(empty.ok());
  EXPECT_EQ(empty.status().code(), StatusCode::kNotFound);
  EXPECT_NE(empty.status().message().find("tokenizer.json"), std::string::npos);
  EXPECT_NE(empty.status().message().find("tokenizer.model"), std::string::npos);

  Result<std::unique_ptr<Tokenizer>> missing = LoadTokenizer(dir.File("nope"));
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("nope"), std::string::npos);

  const std::string config = dir.Write("tokenizer_config.json", "{}");
  Result<std::unique_ptr<Tokenizer>> only_config = LoadTokenizer(config);
  ASSERT_FALSE(only_config.ok());
  EXPECT_EQ(only_config.status().code(), StatusCode::kInvalidArgument);
}

TEST(TokenizerLoaderTest, CorruptFilesAreDataLoss) {
  TempDir dir;
  const auto expect_data_loss = [](const std::string& path) {
    Result<std::unique_ptr<Tokenizer>> tokenizer = LoadTokenizer(path);
    ASSERT_FALSE(tokenizer.ok()) << path;
    EXPECT_EQ(tokenizer.status().code(), StatusCode::kDataLoss) << tokenizer.status().ToString();
    EXPECT_NE(tokenizer.status().message().find(path), std::string::npos)
        << tokenizer.status().ToString();
  };
  expect_data_loss(dir.Write("garbage.model", "\x01\x02 not a tokenizer"));
  expect_data_loss(dir.Write("truncated.model", std::string("\x0a\x20\x0a\x05hello", 8)));
  expect_data_loss(dir.Write("bad_rank.model", "SGVsbG8= 0\nV29ybGQ= x\n"));
  expect_data_loss(dir.Write("dup_rank.model", "SGVsbG8= 0\nV29ybGQ= 0\n"));
  expect_data_loss(dir.Write("broken.json", R"({"model": {"type": "BPE", "vocab": {)"));
  expect_data_loss(dir.Write("empty.model", ""));
}

TEST(TokenizerLoaderTest, TinyTiktokenFileWorks) {
  TempDir dir;
  // Ranks: 'a' 0, 'b' 1, 'ab' 2 (base64 of the bytes).
  Result<std::unique_ptr<Tokenizer>> tokenizer =
      LoadTokenizer(dir.Write("tokenizer.model", "YQ== 0\nYg== 1\nYWI= 2\n"));
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().ToString();
  EXPECT_EQ((*tokenizer)->vocab_size(), 3 + 256);
  EXPECT_EQ((*tokenizer)->TokenToId("<|begin_of_text|>"), 3);
  EXPECT_THAT(EncodeOk(**tokenizer, "abba", true), ElementsAre(3, 2, 1, 0));
}

TEST(TokenizerLoaderTest, UnsupportedTokenizerJsonFallsBackToTokenizerModel) {
  const std::string fixtures = TestDataDir();  // testdata/tokenizers, committed
  TempDir dir;
  dir.Write("tokenizer.json",
            R"({"model": {"type": "BPE", "vocab": {}, "merges": [], "byte_fallback": true},
                "normalizer": {"type": "Sequence", "normalizers": []},
                "pre_tokenizer": null})");
  Result<std::unique_ptr<Tokenizer>> json_only = LoadTokenizer(dir.path());
  ASSERT_FALSE(json_only.ok());
  EXPECT_EQ(json_only.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(json_only.status().message().find("Sequence"), std::string::npos);

  dir.Link("tokenizer.model", fixtures + "/tokenizers/llama2/tokenizer.model");
  Result<std::unique_ptr<Tokenizer>> tokenizer = LoadTokenizer(dir.path());
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().ToString();
  EXPECT_EQ((*tokenizer)->kind(), "sentencepiece");
}

TEST(TokenizerLoaderTest, TokenizerConfigSetsTemplateEosAndBos) {
  const std::string fixtures = TestDataDir();  // testdata/tokenizers, committed
  TempDir dir;
  dir.Link("tokenizer.json", fixtures + "/tokenizers/llama3/tokenizer.json");
  dir.Write("tokenizer_config.json", kLlama3InstructConfig);
  Result<std::unique_ptr<Tokenizer>> tokenizer = LoadTokenizer(dir.path());
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().ToString();
  ASSERT_NE((*tokenizer)->chat_template(), nullptr);
  EXPECT_EQ((*tokenizer)->chat_template()->kind(), ChatTemplate::Kind::kLlama3);
  EXPECT_THAT((*tokenizer)->eos_ids(), ElementsAre(128009));
  EXPECT_EQ((*tokenizer)->bos_id(), 128000);
  EXPECT_THAT(EncodeOk(**tokenizer, "Hi", true), ElementsAre(128000, 13347));

  // add_bos_token false turns BOS off; an unknown template leaves the tokenizer usable.
  TempDir other;
  other.Link("tokenizer.model", fixtures + "/tokenizers/llama2/tokenizer.model");
  other.Write("tokenizer_config.json", R"({"add_bos_token": false, "eos_token": {"content": "</s>"},
      "chat_template": "{% for m in messages %}<|im_start|>{{ m['content'] }}{% endfor %}"})");
  Result<std::unique_ptr<Tokenizer>> spm = LoadTokenizer(other.path());
  ASSERT_TRUE(spm.ok()) << spm.status().ToString();
  EXPECT_FALSE((*spm)->add_bos());
  EXPECT_THAT(EncodeOk(**spm, "Hello", true), ElementsAre(15043));
  EXPECT_EQ((*spm)->chat_template(), nullptr);
  EXPECT_EQ((*spm)->chat_template_status().code(), StatusCode::kUnimplemented);
  EXPECT_NE((*spm)->chat_template_status().message().find("<|im_start|>"), std::string::npos);

  TempDir bad;
  bad.Link("tokenizer.model", fixtures + "/tokenizers/llama2/tokenizer.model");
  bad.Write("tokenizer_config.json", R"({"eos_token": "<|not a token|>"})");
  Result<std::unique_ptr<Tokenizer>> bad_config = LoadTokenizer(bad.path());
  ASSERT_FALSE(bad_config.ok());
  EXPECT_EQ(bad_config.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(bad_config.status().message().find("<|not a token|>"), std::string::npos);
}

}  // namespace
}  // namespace sieve
