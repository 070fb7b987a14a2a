#include "core/utf8.h"

#include <gtest/gtest.h>

namespace sieve {
namespace {

TEST(Utf8Test, Validation) {
  EXPECT_TRUE(IsValidUtf8("héllo 世界 🎉"));
  EXPECT_FALSE(IsValidUtf8("\xc3"));              // truncated
  EXPECT_FALSE(IsValidUtf8("\xc0\xaf"));          // overlong '/'
  EXPECT_FALSE(IsValidUtf8("\xed\xa0\x80"));      // surrogate
  EXPECT_FALSE(IsValidUtf8("\xf4\x90\x80\x80"));  // above U+10FFFF
  EXPECT_EQ(FirstInvalidUtf8Offset("ab\xff"), 2u);
}

TEST(Utf8Test, EncodeDecodeRoundTrip) {
  for (uint32_t code : {0x24u, 0xa3u, 0x20acu, 0x10348u, 0x10ffffu}) {
    std::string encoded;
    AppendUtf8(code, encoded);
    size_t offset = 0;
    EXPECT_EQ(DecodeUtf8(encoded, offset), code);
    EXPECT_EQ(offset, encoded.size());
  }
}

TEST(Utf8Test, IncompleteSuffix) {
  EXPECT_EQ(IncompleteUtf8Suffix("a\xe2"), 1u);
  EXPECT_EQ(IncompleteUtf8Suffix("a\xe2\x82"), 2u);
  EXPECT_EQ(IncompleteUtf8Suffix("a\xe2\x82\xac"), 0u);
  EXPECT_EQ(IncompleteUtf8Suffix("abc"), 0u);
}

}  // namespace
}  // namespace sieve
