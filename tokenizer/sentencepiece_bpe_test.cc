#include "tokenizer/sentencepiece_bpe.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <tuple>

#include "core/testing.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/sentencepiece_model.h"
#include "tokenizer/tokenizer_test_fixtures.h"

namespace sieve {
namespace {

using ::sieve::testing::EncodeOk;
using ::sieve::testing::FixtureTokenizer;
using ::sieve::testing::ReadTokenizerFixtures;
using ::testing::ElementsAre;
using PieceType = SentencePieceModel::PieceType;

// Writes protobuf wire format: enough to build small ModelProto files in tests.
class ProtoWriter {
 public:
  ProtoWriter& Varint(uint32_t field, int64_t value) {
    Tag(field, 0);
    Raw(static_cast<uint64_t>(value));
    return *this;
  }
  ProtoWriter& Float(uint32_t field, float value) {
    Tag(field, 5);
    char bytes[4];
    std::memcpy(bytes, &value, 4);
    out_.append(bytes, 4);
    return *this;
  }
  ProtoWriter& Bytes(uint32_t field, std::string_view value) {
    Tag(field, 2);
    Raw(value.size());
    out_ += value;
    return *this;
  }
  const std::string& str() const { return out_; }

 private:
  void Tag(uint32_t field, uint32_t wire_type) { Raw((field << 3) | wire_type); }
  void Raw(uint64_t value) {
    while (value >= 0x80) {
      out_ += static_cast<char>((value & 0x7f) | 0x80);
      value >>= 7;
    }
    out_ += static_cast<char>(value);
  }
  std::string out_;
};

struct ModelOptions {
  int model_type = 2;  // BPE
  bool byte_fallback = false;
  bool remove_extra_whitespaces = true;
  bool with_bytes = false;
};

// A tiny model: specials, "▁", a, b, ab (-0.5), ▁ab (-0.1), ba (-0.5), a user-defined <sep>.
std::string SmallModel(const ModelOptions& options) {
  std::vector<std::tuple<std::string, float, PieceType>> pieces = {
      {"<unk>", 0, PieceType::kUnknown},
      {"<s>", 0, PieceType::kControl},
      {"</s>", 0, PieceType::kControl},
      {"\xe2\x96\x81", -1, PieceType::kNormal},
      {"a", -2, PieceType::kNormal},
      {"b", -3, PieceType::kNormal},
      {"ab", -0.5, PieceType::kNormal},
      {"\xe2\x96\x81"
       "ab",
       -0.1f, PieceType::kNormal},
      {"ba", -0.5, PieceType::kNormal},
      {"<sep>", 0, PieceType::kUserDefined},
  };
  if (options.with_bytes) {
    static const char kHex[] = "0123456789ABCDEF";
    for (int byte = 0; byte < 256; ++byte) {
      pieces.emplace_back(std::string("<0x") + kHex[byte >> 4] + kHex[byte & 15] + ">", 0,
                          PieceType::kByte);
    }
  }
  ProtoWriter model;
  for (const auto& [text, score, type] : pieces) {
    ProtoWriter piece;
    piece.Bytes(1, text).Float(2, score).Varint(3, static_cast<int>(type));
    model.Bytes(1, piece.str());
  }
  ProtoWriter trainer;
  trainer.Varint(3, options.model_type)
      .Varint(35, options.byte_fallback)
      .Varint(40, 0)
      .Varint(41, 1)
      .Varint(42, 2)
      .Varint(43, -1);
  model.Bytes(2, trainer.str());
  ProtoWriter normalizer;
  normalizer.Bytes(1, "identity").Varint(3, 1).Varint(4, options.remove_extra_whitespaces);
  model.Bytes(3, normalizer.str());
  return model.str();
}

std::unique_ptr<Tokenizer> MakeSmall(const ModelOptions& options) {
  Result<SentencePieceModel> model = ParseSentencePieceModel(SmallModel(options));
  EXPECT_TRUE(model.ok()) << model.status().ToString();
  if (!model.ok()) return nullptr;
  Result<std::unique_ptr<SentencePieceBpe>> tokenizer = SentencePieceBpe::Create(*model);
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status().ToString();
  if (!tokenizer.ok()) return nullptr;
  return std::move(tokenizer).value();
}

TEST(SentencePieceBpeTest, MergesByScoreLeftmostFirst) {
  const std::unique_ptr<Tokenizer> tokenizer = MakeSmall({});
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_EQ(tokenizer->kind(), "sentencepiece");
  EXPECT_THAT(EncodeOk(*tokenizer, "ab"), ElementsAre(7));
  // "ba" and "ab" tie at -0.5: the leftmost pair merges first.
  EXPECT_THAT(EncodeOk(*tokenizer, "bab"), ElementsAre(3, 8, 5));
  EXPECT_THAT(EncodeOk(*tokenizer, "  ab   ab "), ElementsAre(7, 7));  // extra spaces removed
  EXPECT_TRUE(EncodeOk(*tokenizer, "   ").empty());
  // Without byte fallback a run of unknown characters is one <unk>.
  EXPECT_THAT(EncodeOk(*tokenizer, "xyz"), ElementsAre(3, 0));
  EXPECT_THAT(EncodeOk(*tokenizer, "x<sep>ab"),
              ElementsAre(3, 0, 9, 6));  // user-defined stays whole
  EXPECT_THAT(EncodeOk(*tokenizer, "ab", /*add_bos=*/true), ElementsAre(1, 7));
  EXPECT_THAT(EncodeOk(*tokenizer, "<s>ab</s>"), ElementsAre(1, 7, 2));
  EXPECT_EQ(tokenizer->Decode(std::vector<int32_t>{7, 7}, true), "ab ab");
  EXPECT_EQ(tokenizer->Decode(std::vector<int32_t>{1, 7, 2}, false), "<s> ab</s>");
  EXPECT_EQ(tokenizer->Decode(std::vector<int32_t>{1, 7, 2}, true), "ab");
  EXPECT_TRUE(tokenizer->IsSpecial(0));
  EXPECT_FALSE(tokenizer->IsSpecial(9));
  EXPECT_EQ(tokenizer->TokenToId("\xe2\x96\x81"
                                 "ab"),
            7);
}

TEST(SentencePieceBpeTest, KeepsWhitespaceWhenAskedAndFallsBackToBytes) {
  const std::unique_ptr<Tokenizer> tokenizer =
      MakeSmall({.byte_fallback = true, .remove_extra_whitespaces = false, .with_bytes = true});
  ASSERT_NE(tokenizer, nullptr);
  const int32_t first_byte = 10;  // <0x00>
  EXPECT_THAT(EncodeOk(*tokenizer, " ab"), ElementsAre(3, 7));
  EXPECT_THAT(EncodeOk(*tokenizer, "x"), ElementsAre(3, first_byte + 'x'));
  EXPECT_THAT(EncodeOk(*tokenizer, "é"), ElementsAre(3, first_byte + 0xc3, first_byte + 0xa9));
  EXPECT_EQ(tokenizer->TokenBytes(first_byte + 0xc3), "\xc3");
  EXPECT_EQ(tokenizer->Decode(EncodeOk(*tokenizer, " ab é x"), true), " ab é x");
}

TEST(SentencePieceBpeTest, UnsupportedAndCorruptModelsAreErrors) {
  Result<SentencePieceModel> unigram = ParseSentencePieceModel(SmallModel({.model_type = 1}));
  ASSERT_TRUE(unigram.ok());
  Result<std::unique_ptr<SentencePieceBpe>> tokenizer = SentencePieceBpe::Create(*unigram);
  ASSERT_FALSE(tokenizer.ok());
  EXPECT_EQ(tokenizer.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(tokenizer.status().message().find("UNIGRAM"), std::string::npos);

  const std::string bytes = SmallModel({});
  for (const size_t cut : {bytes.size() - 1, bytes.size() / 2, size_t{3}}) {
    Result<SentencePieceModel> truncated = ParseSentencePieceModel(bytes.substr(0, cut));
    ASSERT_FALSE(truncated.ok()) << cut;
    EXPECT_EQ(truncated.status().code(), StatusCode::kDataLoss);
  }
  EXPECT_FALSE(ParseSentencePieceModel("").ok());
}

TEST(SentencePieceBpeTest, Llama2MatchesSentencepieceOnEveryFixtureString) {
  const std::string fixtures = TestDataDir();  // testdata/tokenizers, committed
  const Tokenizer* tokenizer = FixtureTokenizer(fixtures, "llama2/tokenizer.model");
  ASSERT_NE(tokenizer, nullptr);
  const testing::TokenizerFixtures expected = ReadTokenizerFixtures(fixtures);
  ASSERT_EQ(expected.strings.size(), expected.llama2_ids.size());
  for (size_t index = 0; index < expected.strings.size(); ++index) {
    const std::string& text = expected.strings[index];
    EXPECT_EQ(EncodeOk(*tokenizer, text), expected.llama2_ids[index])
        << "string " << index << ": " << text;
    const std::vector<int32_t> with_bos = EncodeOk(*tokenizer, text, /*add_bos=*/true);
    ASSERT_FALSE(with_bos.empty());
    EXPECT_EQ(with_bos.front(), 1);
    EXPECT_EQ(tokenizer->Decode(with_bos, /*skip_special_tokens=*/true), text)
        << "string " << index;
  }
}

TEST(SentencePieceBpeTest, Llama2SpecialsBosAndChatPrompt) {
  const std::string fixtures = TestDataDir();  // testdata/tokenizers, committed
  const Tokenizer* tokenizer = FixtureTokenizer(fixtures, "llama2/tokenizer.model");
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_EQ(tokenizer->vocab_size(), 32000);
  EXPECT_EQ(tokenizer->bos_id(), 1);
  EXPECT_THAT(tokenizer->eos_ids(), ElementsAre(2));
  EXPECT_TRUE(tokenizer->strips_leading_space());
  EXPECT_EQ(tokenizer->chat_template(), nullptr);
  EXPECT_EQ(tokenizer->chat_template_status().code(), StatusCode::kNotFound);
  EXPECT_THAT(EncodeOk(*tokenizer, "Hello world", true), ElementsAre(1, 15043, 3186));
  EXPECT_THAT(EncodeOk(*tokenizer, "\n"), ElementsAre(29871, 13));
  EXPECT_EQ(tokenizer->TokenBytes(13), "\n");  // <0x0A>
  EXPECT_EQ(tokenizer->TokenBytes(29871), " ");
  EXPECT_EQ(tokenizer->TokenBytes(1), "<s>");
  EXPECT_EQ(tokenizer->TokenToId("\xe2\x96\x81Hello"), 15043);
  EXPECT_EQ(tokenizer->Decode(std::vector<int32_t>{1, 15043, 3186, 2}, false),
            "<s> Hello world</s>");
  EXPECT_EQ(tokenizer->Decode(std::vector<int32_t>{1, 15043, 3186, 2}, true), "Hello world");

  // The chat prompt's "<s>" text is BOS; after it "[INST]" gets its dummy prefix, as in HF.
  const std::vector<ChatMessage> messages = {{"user", "Hi"}};
  Result<std::string> prompt =
      ChatTemplate(ChatTemplate::Kind::kLlama2).Apply(messages, /*add_generation_prompt=*/true);
  ASSERT_TRUE(prompt.ok());
  const std::vector<int32_t> ids = EncodeOk(*tokenizer, *prompt, /*add_bos=*/false);
  ASSERT_GE(ids.size(), 4u);
  EXPECT_THAT(std::vector<int32_t>(ids.begin(), ids.begin() + 4),
              ElementsAre(1, 518, 25580, 29962));
}

}  // namespace
}  // namespace sieve
