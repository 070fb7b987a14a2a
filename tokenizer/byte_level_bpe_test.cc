#include "tokenizer/byte_level_bpe.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>

#include "core/testing.h"
#include "tokenizer/hf_tokenizer_json.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/regex.h"
#include "tokenizer/tokenizer_loader.h"
#include "tokenizer/tokenizer_test_fixtures.h"

namespace sieve {
namespace {

using ::sieve::testing::EncodeOk;
using ::sieve::testing::FixtureTokenizer;
using ::sieve::testing::ReadTokenizerFixtures;
using ::testing::ElementsAre;

constexpr std::string_view kSpecialString =
    "<|begin_of_text|> special tokens as plain text <|eot_id|>";

// Both Llama 3 files must give tiktoken's ids; the test runs once per file.
class Llama3Test : public ::testing::TestWithParam<const char*> {};

TEST_P(Llama3Test, MatchesTiktokenOnEveryFixtureString) {
  const std::string fixtures = TestDataDir();  // testdata/tokenizers, committed
  const Tokenizer* tokenizer = FixtureTokenizer(fixtures, GetParam());
  ASSERT_NE(tokenizer, nullptr);
  const testing::TokenizerFixtures expected = ReadTokenizerFixtures(fixtures);
  ASSERT_EQ(expected.strings.size(), expected.llama3_ids.size());
  for (size_t index = 0; index < expected.strings.size(); ++index) {
    const std::string& text = expected.strings[index];
    // tiktoken's reference treats special-token text as plain text: EncodeOrdinary's contract.
    Result<std::vector<int32_t>> ordinary = tokenizer->EncodeOrdinary(text, false);
    ASSERT_TRUE(ordinary.ok()) << ordinary.status().ToString();
    EXPECT_EQ(*ordinary, expected.llama3_ids[index]) << "string " << index << ": " << text;
    if (text.find("<|") == std::string::npos) {
      EXPECT_EQ(EncodeOk(*tokenizer, text), expected.llama3_ids[index]) << "string " << index;
    }
  }
}

TEST_P(Llama3Test, DecodeRoundTripsEveryFixtureString) {
  const std::string fixtures = TestDataDir();  // testdata/tokenizers, committed
  const Tokenizer* tokenizer = FixtureTokenizer(fixtures, GetParam());
  ASSERT_NE(tokenizer, nullptr);
  for (const std::string& text : ReadTokenizerFixtures(fixtures).strings) {
    const std::vector<int32_t> ids = EncodeOk(*tokenizer, text, /*add_bos=*/true);
    EXPECT_EQ(tokenizer->Decode(ids, /*skip_special_tokens=*/false), "<|begin_of_text|>" + text);
    if (text == kSpecialString) {
      EXPECT_EQ(tokenizer->Decode(ids, true), " special tokens as plain text ");
    } else {
      EXPECT_EQ(tokenizer->Decode(ids, /*skip_special_tokens=*/true), text);
    }
  }
}

TEST_P(Llama3Test, KnownSentenceBosAndSpecials) {
  const std::string fixtures = TestDataDir();  // testdata/tokenizers, committed
  const Tokenizer* tokenizer = FixtureTokenizer(fixtures, GetParam());
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_THAT(EncodeOk(*tokenizer, "This is a test sentence."),
              ElementsAre(2028, 374, 264, 1296, 11914, 13));
  EXPECT_THAT(EncodeOk(*tokenizer, "This is a test sentence.", /*add_bos=*/true),
              ElementsAre(128000, 2028, 374, 264, 1296, 11914, 13));
  EXPECT_TRUE(EncodeOk(*tokenizer, "", /*add_bos=*/false).empty());
  EXPECT_THAT(EncodeOk(*tokenizer, "", /*add_bos=*/true), ElementsAre(128000));

  EXPECT_EQ(tokenizer->vocab_size(), 128256);
  EXPECT_EQ(tokenizer->bos_id(), 128000);
  EXPECT_TRUE(tokenizer->add_bos());
  EXPECT_TRUE(tokenizer->IsEos(128001));
  EXPECT_EQ(tokenizer->TokenToId("<|start_header_id|>"), 128006);
  EXPECT_EQ(tokenizer->TokenToId("<|end_header_id|>"), 128007);
  EXPECT_EQ(tokenizer->TokenToId("<|eot_id|>"), 128009);
  EXPECT_EQ(tokenizer->TokenToId("<|reserved_special_token_250|>"), 128255);
  EXPECT_EQ(tokenizer->TokenToId("Ġworld"), 1917);
  EXPECT_EQ(tokenizer->TokenToId("no such token"), std::nullopt);
  EXPECT_EQ(tokenizer->TokenBytes(1917), " world");
  EXPECT_EQ(tokenizer->TokenBytes(128009), "<|eot_id|>");
  EXPECT_EQ(tokenizer->TokenBytes(-1), "");
  EXPECT_EQ(tokenizer->TokenBytes(1 << 20), "");
  EXPECT_TRUE(tokenizer->IsSpecial(128000));
  EXPECT_TRUE(tokenizer->IsSpecial(128255));
  EXPECT_FALSE(tokenizer->IsSpecial(1917));
  EXPECT_FALSE(tokenizer->strips_leading_space());

  // Special-token text in the input is those tokens; EncodeOrdinary keeps it as text.
  const std::vector<int32_t> ids = EncodeOk(*tokenizer, kSpecialString);
  ASSERT_GE(ids.size(), 3u);
  EXPECT_EQ(ids.front(), 128000);
  EXPECT_EQ(ids.back(), 128009);
  Result<std::vector<int32_t>> middle =
      tokenizer->EncodeOrdinary(" special tokens as plain text ", false);
  ASSERT_TRUE(middle.ok());
  EXPECT_EQ(std::vector<int32_t>(ids.begin() + 1, ids.end() - 1), *middle);
  EXPECT_EQ(tokenizer->Decode(ids, false), kSpecialString);
  EXPECT_EQ(tokenizer->Decode(ids, true), " special tokens as plain text ");
  EXPECT_THAT(EncodeOk(*tokenizer, "<|start_header_id|>user<|end_header_id|>"),
              ElementsAre(128006, 882, 128007));
}

TEST_P(Llama3Test, RejectsInvalidUtf8NamingTheOffset) {
  const std::string fixtures = TestDataDir();  // testdata/tokenizers, committed
  const Tokenizer* tokenizer = FixtureTokenizer(fixtures, GetParam());
  ASSERT_NE(tokenizer, nullptr);
  for (const std::string_view bad : {std::string_view("abc\xff"), std::string_view("abc\xc3"),
                                     std::string_view("abc\xed\xa0\x80")}) {
    Result<std::vector<int32_t>> ids = tokenizer->Encode(bad, false);
    ASSERT_FALSE(ids.ok());
    EXPECT_EQ(ids.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(ids.status().message().find("offset 3"), std::string::npos) << ids.status().message();
  }
}

INSTANTIATE_TEST_SUITE_P(Files, Llama3Test,
                         ::testing::Values("llama3/tokenizer.model", "llama3/tokenizer.json"),
                         [](const auto& info) {
                           return std::string(info.param).ends_with(".json") ? "Json" : "Tiktoken";
                         });

TEST(ByteLevelBpeTest, TiktokenAndTokenizerJsonAgreeOnLongText) {
  const std::string fixtures = TestDataDir();  // testdata/tokenizers, committed
  const Tokenizer* tiktoken = FixtureTokenizer(fixtures, "llama3/tokenizer.model");
  const Tokenizer* json = FixtureTokenizer(fixtures, "llama3/tokenizer.json");
  ASSERT_NE(tiktoken, nullptr);
  ASSERT_NE(json, nullptr);
  EXPECT_EQ(tiktoken->kind(), "tiktoken");
  EXPECT_EQ(json->kind(), "bpe");
  std::string text =
      testing::ReadWholeFile(fixtures + "/text/tinyshakespeare.txt").substr(0, 100000);
  text += testing::ReadWholeFile(fixtures + "/haystack/apple.txt");
  const auto start = std::chrono::steady_clock::now();
  const std::vector<int32_t> from_tiktoken = EncodeOk(*tiktoken, text);
  const auto middle = std::chrono::steady_clock::now();
  const std::vector<int32_t> from_json = EncodeOk(*json, text);
  const auto end = std::chrono::steady_clock::now();
  EXPECT_EQ(from_tiktoken, from_json);
  EXPECT_EQ(tiktoken->Decode(from_tiktoken, false), text);
  const auto ms = [](auto duration) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(duration).count();
  };
  std::cout << text.size() << " bytes -> " << from_tiktoken.size() << " tokens; tiktoken "
            << ms(middle - start) << " ms, tokenizer.json " << ms(end - middle) << " ms\n";
}

TEST(ByteLevelBpeTest, ByteToUnicodeIsGpt2sMapping) {
  EXPECT_EQ(BytesToUnicode(" "), "Ġ");
  EXPECT_EQ(BytesToUnicode("\n"), "Ċ");
  EXPECT_EQ(BytesToUnicode("a!~"), "a!~");
  EXPECT_EQ(BytesToUnicode("\xad"), "Ń");  // 0xad is not printable: the 68th extra, U+0143
  std::string all_bytes;
  for (int byte = 0; byte < 256; ++byte) all_bytes += static_cast<char>(byte);
  EXPECT_EQ(UnicodeToBytes(BytesToUnicode(all_bytes)), all_bytes);
  EXPECT_EQ(UnicodeToBytes("a b"), std::nullopt);  // a raw space is not in the alphabet
}

TEST(RegexTest, WhitespaceClassesFollowUnicodeWhiteSpace) {
  Result<Regex> regex = Regex::Compile(R"(\s+|[^\s]+)");
  ASSERT_TRUE(regex.ok()) << regex.status().ToString();
  std::vector<std::pair<size_t, size_t>> matches;
  // U+0085 (NEL) and U+3000 are White_Space; U+180E and U+200B are not.
  const std::string text =
      "a\xc2\x85\xe3\x80\x80"
      "b\xe1\xa0\x8e\xe2\x80\x8b";
  ASSERT_TRUE(regex->FindAll(text, matches).ok());
  ASSERT_EQ(matches.size(), 3u);
  EXPECT_EQ(matches[1], std::make_pair(size_t{1}, size_t{6}));
  EXPECT_EQ(matches[2], std::make_pair(size_t{6}, text.size()));
  EXPECT_EQ(RewriteWhitespaceClasses(R"(\\s)"), R"(\\s)");  // an escaped backslash, then 's'
  EXPECT_EQ(RewriteWhitespaceClasses(R"([\]\s])").find("\\s"), std::string::npos);
  EXPECT_TRUE(RewriteWhitespaceClasses(R"([\]\s])").starts_with(R"([\]\x{09})"));
  EXPECT_FALSE(Regex::Compile("(unclosed").ok());
}

TEST(PreTokenizerTest, Gpt2ByteLevelSplitAndBehaviors) {
  PreTokenizer gpt2;
  ASSERT_TRUE(gpt2.AddByteLevel(/*add_prefix_space=*/false, /*use_regex=*/true).ok());
  std::vector<std::string> pieces;
  ASSERT_TRUE(gpt2.Split("Hello world's  3.14!", pieces).ok());
  EXPECT_THAT(pieces, ElementsAre("Hello", " world", "'s", " ", " 3", ".", "14", "!"));

  PreTokenizer prefixed;
  ASSERT_TRUE(prefixed.AddByteLevel(/*add_prefix_space=*/true, /*use_regex=*/false).ok());
  pieces.clear();
  ASSERT_TRUE(prefixed.Split("Hi", pieces).ok());
  EXPECT_THAT(pieces, ElementsAre(" Hi"));

  const auto split = [](SplitBehavior behavior, bool invert) {
    PreTokenizer pre_tokenizer;
    EXPECT_TRUE(pre_tokenizer.AddSplit("-", /*literal=*/true, behavior, invert).ok());
    std::vector<std::string> out;
    EXPECT_TRUE(pre_tokenizer.Split("a-b--c", out).ok());
    return out;
  };
  EXPECT_THAT(split(SplitBehavior::kIsolated, false), ElementsAre("a", "-", "b", "-", "-", "c"));
  EXPECT_THAT(split(SplitBehavior::kRemoved, false), ElementsAre("a", "b", "c"));
  EXPECT_THAT(split(SplitBehavior::kMergedWithPrevious, false), ElementsAre("a-", "b-", "-", "c"));
  EXPECT_THAT(split(SplitBehavior::kMergedWithNext, false), ElementsAre("a", "-b", "-", "-c"));
  EXPECT_THAT(split(SplitBehavior::kContiguous, false), ElementsAre("a", "-", "b", "--", "c"));
  EXPECT_THAT(split(SplitBehavior::kRemoved, true), ElementsAre("-", "-", "-"));
}

std::string Replaced(std::string text, std::string_view from, std::string_view to) {
  const size_t position = text.find(from);
  EXPECT_NE(position, std::string::npos) << from;
  if (position != std::string::npos) text.replace(position, from.size(), to);
  return text;
}

// A small tokenizer.json whose merge order differs from token-rank order: HF's merge list rules.
std::string SmallTokenizerJson(std::string_view extra_model_fields = "",
                               std::string_view merges = R"(["b c", ["a", "b"]])") {
  return std::string(R"({
    "version": "1.0",
    "added_tokens": [
      {"id": 7, "content": "<eos>", "special": true, "lstrip": false, "rstrip": false},
      {"id": 8, "content": "[sep]", "special": false, "lstrip": true, "rstrip": true}
    ],
    "normalizer": null,
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true},
    "post_processor": {"type": "ByteLevel"},
    "decoder": {"type": "ByteLevel"},
    "model": {"type": "BPE", )") +
         std::string(extra_model_fields) + R"(
      "vocab": {"a": 0, "b": 1, "c": 2, "ab": 3, "bc": 4, "abc": 5, "Ġ": 6},
      "merges": )" +
         std::string(merges) + R"(}})";
}

TEST(HfTokenizerJsonTest, MergesFollowTheMergeListNotTokenRanks) {
  Result<std::unique_ptr<Tokenizer>> tokenizer = ParseHfTokenizerJson(SmallTokenizerJson());
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().ToString();
  // "b c" outranks "a b", and "a bc" is no merge: a + bc.
  EXPECT_THAT(EncodeOk(**tokenizer, "abc"), ElementsAre(0, 4));
  EXPECT_THAT(EncodeOk(**tokenizer, "ab"), ElementsAre(3));
  EXPECT_THAT(EncodeOk(**tokenizer, "abc<eos>"), ElementsAre(0, 4, 7));
  EXPECT_THAT(EncodeOk(**tokenizer, "ab [sep] c"), ElementsAre(3, 8, 2));  // lstrip + rstrip
  EXPECT_FALSE((*tokenizer)->IsSpecial(8));
  EXPECT_EQ((*tokenizer)->Decode(std::vector<int32_t>{0, 4, 7, 8}, true), "abc[sep]");
  EXPECT_EQ((*tokenizer)->bos_id(), std::nullopt);
  EXPECT_TRUE(EncodeOk(**tokenizer, "ab", /*add_bos=*/true) == std::vector<int32_t>{3});
}

TEST(HfTokenizerJsonTest, IgnoreMergesTakesWholeWords) {
  Result<std::unique_ptr<Tokenizer>> tokenizer =
      ParseHfTokenizerJson(SmallTokenizerJson(R"("ignore_merges": true,)"));
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().ToString();
  EXPECT_THAT(EncodeOk(**tokenizer, "abc"), ElementsAre(5));
}

TEST(HfTokenizerJsonTest, UnsupportedAndCorruptFilesAreErrors) {
  const auto expect_error = [](const std::string& json, StatusCode code, std::string_view name) {
    Result<std::unique_ptr<Tokenizer>> tokenizer = ParseHfTokenizerJson(json);
    ASSERT_FALSE(tokenizer.ok());
    EXPECT_EQ(tokenizer.status().code(), code) << tokenizer.status().ToString();
    EXPECT_NE(tokenizer.status().message().find(name), std::string::npos)
        << tokenizer.status().ToString();
  };
  std::string json = SmallTokenizerJson();
  expect_error(R"({"model": {"type": "WordPiece", "vocab": {}}})", StatusCode::kUnimplemented,
               "WordPiece");
  expect_error(R"({"model": {"type": "Unigram", "vocab": []}})", StatusCode::kUnimplemented,
               "Unigram");
  expect_error(Replaced(json, R"("type": "ByteLevel", "add_prefix_space")",
                        R"("type": "Whitespace", "add_prefix_space")"),
               StatusCode::kUnimplemented, "Whitespace");
  expect_error(Replaced(json, R"("normalizer": null)", R"("normalizer": {"type": "NFC"})"),
               StatusCode::kUnimplemented, "NFC");
  expect_error(json.substr(0, json.size() / 2), StatusCode::kDataLoss, "malformed");
  expect_error(SmallTokenizerJson("", R"(["b x"])"), StatusCode::kDataLoss, "'x'");
  expect_error(SmallTokenizerJson("", R"(["c a"])"), StatusCode::kDataLoss, "not in the vocab");
  expect_error(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
                  "pre_tokenizer": {"type": "Metaspace"}})",
               StatusCode::kUnimplemented, "Metaspace");
  expect_error(R"([1, 2])", StatusCode::kDataLoss, "model");
}

// UBSan on ids that are not 32-bit integers: nlohmann's get<int32_t> converted 1e300 with
// undefined behaviour (fuzz/corpus/tokenizer_files_fuzzer/regression_float_token_id).
TEST(HfTokenizerJsonTest, TokenIdsMustBe32BitIntegers) {
  const std::string json = SmallTokenizerJson();
  for (const std::string id : {"1e300", "7.5", "4294967303", "\"7\""}) {
    Result<std::unique_ptr<Tokenizer>> tokenizer = ParseHfTokenizerJson(Replaced(
        json, R"({"id": 7, "content": "<eos>")", R"({"id": )" + id + R"(, "content": "<eos>")"));
    ASSERT_FALSE(tokenizer.ok()) << id;
    EXPECT_EQ(tokenizer.status().code(), StatusCode::kDataLoss) << tokenizer.status().ToString();
    EXPECT_NE(tokenizer.status().message().find("added token id"), std::string::npos)
        << tokenizer.status().ToString();
  }
  Result<std::unique_ptr<Tokenizer>> tokenizer =
      ParseHfTokenizerJson(Replaced(json, R"("post_processor": {"type": "ByteLevel"})",
                                    R"("post_processor": {"type": "TemplateProcessing",
                   "single": [{"SpecialToken": {"id": "<bos>"}}, {"Sequence": {"id": "A"}}],
                   "special_tokens": {"<bos>": {"id": "<bos>", "ids": [-1e300], "tokens": ["<bos>"]}}})"));
  ASSERT_FALSE(tokenizer.ok());
  EXPECT_EQ(tokenizer.status().code(), StatusCode::kDataLoss) << tokenizer.status().ToString();
}

// tokenizer_files_fuzzer (corpus regression_bos_id_outside_vocabulary): TemplateProcessing gave
// BOS an id that added_tokens gives another token, or none; Encode then prepended an id outside
// the vocabulary. That is DataLoss now; an id that agrees is fine.
TEST(HfTokenizerJsonTest, TemplateProcessingIdsMustAgreeWithTheTokens) {
  const auto with_bos = [](std::string_view token, int id) {
    return Replaced(SmallTokenizerJson(), R"("post_processor": {"type": "ByteLevel"})",
                    R"("post_processor": {"type": "TemplateProcessing",
                        "single": [{"SpecialToken": {"id": "B"}}, {"Sequence": {"id": "A"}}],
                        "special_tokens": {"B": {"id": "B", "ids": [)" +
                        std::to_string(id) + R"(], "tokens": [")" + std::string(token) +
                        R"("]}}})");
  };
  for (const auto& [token, id] :
       std::vector<std::pair<std::string, int>>{{"<eos>", 512}, {"<eos>", 8}, {"<new>", 7}}) {
    Result<std::unique_ptr<Tokenizer>> tokenizer = ParseHfTokenizerJson(with_bos(token, id));
    ASSERT_FALSE(tokenizer.ok()) << token << " " << id;
    EXPECT_EQ(tokenizer.status().code(), StatusCode::kDataLoss) << tokenizer.status().ToString();
    EXPECT_NE(tokenizer.status().message().find("TemplateProcessing"), std::string::npos)
        << tokenizer.status().ToString();
  }
  Result<std::unique_ptr<Tokenizer>> tokenizer = ParseHfTokenizerJson(with_bos("<eos>", 7));
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().ToString();
  EXPECT_EQ((*tokenizer)->bos_id(), 7);
}

TEST(HfTokenizerJsonTest, TemplateProcessingGivesBos) {
  const std::string json =
      Replaced(SmallTokenizerJson(), R"("post_processor": {"type": "ByteLevel"})",
               R"("post_processor": {"type": "Sequence", "processors": [
                   {"type": "ByteLevel"},
                   {"type": "TemplateProcessing",
                    "single": [{"SpecialToken": {"id": "<bos>", "type_id": 0}},
                               {"Sequence": {"id": "A", "type_id": 0}}],
                    "pair": [],
                    "special_tokens": {"<bos>": {"id": "<bos>", "ids": [9], "tokens": ["<bos>"]}}}]})");
  Result<std::unique_ptr<Tokenizer>> tokenizer = ParseHfTokenizerJson(json);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().ToString();
  EXPECT_EQ((*tokenizer)->bos_id(), 9);
  EXPECT_EQ((*tokenizer)->vocab_size(), 10);
  EXPECT_THAT(EncodeOk(**tokenizer, "ab", true), ElementsAre(9, 3));
  EXPECT_THAT(EncodeOk(**tokenizer, "ab", false), ElementsAre(3));
  EXPECT_THAT(EncodeOk(**tokenizer, "<bos>ab", false), ElementsAre(9, 3));
}

TEST(EmbeddedByteTokenizerTest, BytesThenLlama3Specials) {
  const std::unique_ptr<Tokenizer> tokenizer = MakeEmbeddedByteTokenizer();
  EXPECT_EQ(tokenizer->vocab_size(), 261);
  EXPECT_EQ(tokenizer->kind(), "bpe");
  EXPECT_EQ(tokenizer->bos_id(), 256);
  EXPECT_THAT(tokenizer->eos_ids(), ElementsAre(257, 260));
  ASSERT_NE(tokenizer->chat_template(), nullptr);
  EXPECT_EQ(tokenizer->chat_template()->kind(), ChatTemplate::Kind::kLlama3);
  EXPECT_THAT(EncodeOk(*tokenizer, "Hi é", true), ElementsAre(256, 'H', 'i', ' ', 0xc3, 0xa9));
  EXPECT_THAT(EncodeOk(*tokenizer, "<|start_header_id|>a<|end_header_id|>b<|eot_id|>"),
              ElementsAre(258, 'a', 259, 'b', 260));
  EXPECT_EQ(tokenizer->TokenToId("Ġ"), 32);
  EXPECT_EQ(tokenizer->TokenToId("<|end_of_text|>"), 257);
  EXPECT_EQ(tokenizer->TokenBytes(0xc3), "\xc3");
  EXPECT_EQ(tokenizer->Decode(std::vector<int32_t>{256, 'o', 'k', 0xff, 260}, true), "ok\uFFFD");
  auto rng = testing::MakeRng();
  std::uniform_int_distribution<int> byte(0, 255);
  for (int trial = 0; trial < 20; ++trial) {
    std::string text;
    for (int index = 0; index < 64; ++index) text += static_cast<char>(byte(rng) & 0x7f);
    EXPECT_EQ(tokenizer->Decode(EncodeOk(*tokenizer, text), false), text);
  }
}

}  // namespace
}  // namespace sieve
