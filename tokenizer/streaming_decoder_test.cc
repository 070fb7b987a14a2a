#include "tokenizer/streaming_decoder.h"

#include <gtest/gtest.h>

#include <random>

#include "core/testing.h"
#include "core/utf8.h"
#include "tokenizer/byte_level_bpe.h"
#include "tokenizer/tokenizer_loader.h"
#include "tokenizer/tokenizer_test_fixtures.h"

namespace sieve {
namespace {

using ::sieve::testing::EncodeOk;
using ::sieve::testing::FixtureTokenizer;

// Streams `ids` and checks each piece is valid UTF-8 and that the whole equals Decode.
void ExpectStreamMatchesDecode(const Tokenizer& tokenizer, const std::vector<int32_t>& ids) {
  for (const bool skip_special : {false, true}) {
    StreamingDecoder decoder(tokenizer, skip_special);
    std::string streamed;
    for (const int32_t id : ids) {
      const std::string piece = decoder.Push(id);
      ASSERT_TRUE(IsValidUtf8(piece));
      streamed += piece;
    }
    streamed += decoder.Flush();
    ASSERT_EQ(streamed, tokenizer.Decode(ids, skip_special))
        << tokenizer.kind() << " skip=" << skip_special << " seed=" << testing::LastSeed();
  }
}

// Random sequences of three sorts: any id (specials and out-of-range ones included), ids of
// single bytes (which split and break UTF-8 sequences), and slices of real encodings.
void CheckRandomSequences(const Tokenizer& tokenizer, const std::vector<int32_t>& byte_ids,
                          std::mt19937_64& rng) {
  std::uniform_int_distribution<int32_t> any_id(-2, tokenizer.vocab_size() + 1);
  std::uniform_int_distribution<size_t> length(1, 40);
  std::uniform_int_distribution<size_t> byte_index(0, byte_ids.size() - 1);
  const std::vector<int32_t> text_ids =
      EncodeOk(tokenizer,
               "Ünïcödé 🦙🚀👍🏽 family: 👨‍👩‍👧‍👦 "
               "中文测试：你好 <|eot_id|></s> ok\n  end");
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<int32_t> ids(length(rng));
    for (int32_t& id : ids) {
      switch (rng() % 3) {
        case 0:
          id = any_id(rng);
          break;
        case 1:
          id = byte_ids[byte_index(rng)];
          break;
        default:
          id = text_ids[rng() % text_ids.size()];
          break;
      }
    }
    ExpectStreamMatchesDecode(tokenizer, ids);
    const size_t begin = rng() % text_ids.size();
    ExpectStreamMatchesDecode(
        tokenizer, std::vector<int32_t>(text_ids.begin() + static_cast<std::ptrdiff_t>(begin),
                                        text_ids.end()));
  }
}

std::vector<int32_t> ByteLevelByteIds(const Tokenizer& tokenizer) {
  std::vector<int32_t> ids;
  for (int byte = 0; byte < 256; ++byte) {
    const std::optional<int32_t> id =
        tokenizer.TokenToId(BytesToUnicode(std::string(1, static_cast<char>(byte))));
    if (id) ids.push_back(*id);
  }
  return ids;
}

TEST(StreamingDecoderTest, HoldsBackIncompleteCharacters) {
  const std::unique_ptr<Tokenizer> tokenizer = MakeEmbeddedByteTokenizer();
  StreamingDecoder decoder(*tokenizer, /*skip_special_tokens=*/true);
  EXPECT_EQ(decoder.Push('a'), "a");
  EXPECT_EQ(decoder.Push(0xf0), "");
  EXPECT_EQ(decoder.Push(0x9f), "");
  EXPECT_EQ(decoder.Push(0xa6), "");
  EXPECT_EQ(decoder.Push(0x99), "🦙");
  EXPECT_EQ(decoder.Push(0xe2), "");
  EXPECT_EQ(decoder.Push(260), "");         // <|eot_id|> skipped: the held byte stays held
  EXPECT_EQ(decoder.Push('A'), "\uFFFDA");  // the held lead byte turned out invalid
  EXPECT_EQ(decoder.Push(0xc3), "");
  EXPECT_EQ(decoder.Flush(), "\uFFFD");
  EXPECT_EQ(decoder.Push(0xff), "\uFFFD");
}

TEST(StreamingDecoderTest, EmbeddedTokenizerRandomSequencesEqualDecode) {
  const std::unique_ptr<Tokenizer> tokenizer = MakeEmbeddedByteTokenizer();
  auto rng = testing::MakeRng();
  CheckRandomSequences(*tokenizer, ByteLevelByteIds(*tokenizer), rng);
}

TEST(StreamingDecoderTest, Llama3RandomSequencesEqualDecode) {
  const std::string fixtures = TestDataDir();  // testdata/tokenizers, committed
  const Tokenizer* tokenizer = FixtureTokenizer(fixtures, "llama3/tokenizer.model");
  ASSERT_NE(tokenizer, nullptr);
  const std::vector<int32_t> byte_ids = ByteLevelByteIds(*tokenizer);
  ASSERT_EQ(byte_ids.size(), 256u);
  auto rng = testing::MakeRng();
  CheckRandomSequences(*tokenizer, byte_ids, rng);
}

TEST(StreamingDecoderTest, Llama2RandomSequencesEqualDecodeWithLeadingSpaceRule) {
  const std::string fixtures = TestDataDir();  // testdata/tokenizers, committed
  const Tokenizer* tokenizer = FixtureTokenizer(fixtures, "llama2/tokenizer.model");
  ASSERT_NE(tokenizer, nullptr);
  std::vector<int32_t> byte_ids;
  for (int32_t id = 3; id < 3 + 256; ++id) byte_ids.push_back(id);  // <0x00>..<0xFF>
  auto rng = testing::MakeRng();
  CheckRandomSequences(*tokenizer, byte_ids, rng);

  StreamingDecoder decoder(*tokenizer, /*skip_special_tokens=*/true);
  EXPECT_EQ(decoder.Push(1), "");           // <s>, skipped
  EXPECT_EQ(decoder.Push(15043), "Hello");  // "▁Hello": the dummy-prefix space is dropped
  EXPECT_EQ(decoder.Push(3186), " world");  // later pieces keep theirs
  EXPECT_EQ(decoder.Flush(), "");
}

}  // namespace
}  // namespace sieve
