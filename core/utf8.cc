#include "core/utf8.h"

namespace sieve {

int Utf8SequenceLength(std::string_view text) {
  if (text.empty()) return 0;
  const auto byte = [&](size_t index) { return static_cast<uint8_t>(text[index]); };
  const uint8_t lead = byte(0);
  if (lead < 0x80) return 1;
  int length;
  uint32_t min_code;
  if ((lead & 0xe0) == 0xc0) {
    length = 2;
    min_code = 0x80;
  } else if ((lead & 0xf0) == 0xe0) {
    length = 3;
    min_code = 0x800;
  } else if ((lead & 0xf8) == 0xf0) {
    length = 4;
    min_code = 0x10000;
  } else {
    return 0;
  }
  if (text.size() < static_cast<size_t>(length)) return 0;
  uint32_t code = lead & (0x7f >> length);
  for (int index = 1; index < length; ++index) {
    if ((byte(index) & 0xc0) != 0x80) return 0;
    code = (code << 6) | (byte(index) & 0x3f);
  }
  if (code < min_code || code > 0x10ffff || (code >= 0xd800 && code <= 0xdfff)) return 0;
  return length;
}

size_t FirstInvalidUtf8Offset(std::string_view text) {
  size_t offset = 0;
  while (offset < text.size()) {
    const int length = Utf8SequenceLength(text.substr(offset));
    if (length == 0) return offset;
    offset += length;
  }
  return text.size();
}

bool IsValidUtf8(std::string_view text) { return FirstInvalidUtf8Offset(text) == text.size(); }

uint32_t DecodeUtf8(std::string_view text, size_t& offset) {
  const int length = Utf8SequenceLength(text.substr(offset));
  if (length == 0) {
    ++offset;
    return 0xfffd;
  }
  const auto lead = static_cast<uint8_t>(text[offset]);
  uint32_t code = length == 1 ? lead : (lead & (0x7f >> length));
  for (int index = 1; index < length; ++index) {
    code = (code << 6) | (static_cast<uint8_t>(text[offset + index]) & 0x3f);
  }
  offset += length;
  return code;
}

void AppendUtf8(uint32_t code, std::string& out) {
  if (code < 0x80) {
    out += static_cast<char>(code);
  } else if (code < 0x800) {
    out += static_cast<char>(0xc0 | (code >> 6));
    out += static_cast<char>(0x80 | (code & 0x3f));
  } else if (code < 0x10000) {
    out += static_cast<char>(0xe0 | (code >> 12));
    out += static_cast<char>(0x80 | ((code >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (code & 0x3f));
  } else {
    out += static_cast<char>(0xf0 | (code >> 18));
    out += static_cast<char>(0x80 | ((code >> 12) & 0x3f));
    out += static_cast<char>(0x80 | ((code >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (code & 0x3f));
  }
}

size_t IncompleteUtf8Suffix(std::string_view text) {
  // Look back at most 3 bytes for a lead byte whose sequence runs past the end.
  for (size_t back = 1; back <= 3 && back <= text.size(); ++back) {
    const auto byte = static_cast<uint8_t>(text[text.size() - back]);
    if ((byte & 0xc0) == 0x80) continue;  // continuation: keep looking for the lead
    size_t needed = 0;
    if ((byte & 0xe0) == 0xc0)
      needed = 2;
    else if ((byte & 0xf0) == 0xe0)
      needed = 3;
    else if ((byte & 0xf8) == 0xf0)
      needed = 4;
    return needed > back ? back : 0;
  }
  return 0;
}

}  // namespace sieve
