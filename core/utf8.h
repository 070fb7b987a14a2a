// UTF-8 helpers shared by the tokenizers, the CLI and the server.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace sieve {

// True when `text` is well-formed UTF-8 (no overlongs, no surrogates, nothing above U+10FFFF).
bool IsValidUtf8(std::string_view text);
// Byte offset of the first invalid sequence, or text.size() when valid.
size_t FirstInvalidUtf8Offset(std::string_view text);
// Length of a complete, valid sequence starting at text[0] (1..4), or 0 if none starts there.
int Utf8SequenceLength(std::string_view text);
// Decodes the code point at `offset` and advances it; invalid bytes yield U+FFFD, one byte each.
uint32_t DecodeUtf8(std::string_view text, size_t& offset);
void AppendUtf8(uint32_t code_point, std::string& out);
// Number of bytes at the end of `text` that form an incomplete but so-far valid sequence (0..3):
// what a streaming decoder holds back until the next piece arrives.
size_t IncompleteUtf8Suffix(std::string_view text);

}  // namespace sieve
