#include "tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <memory>

namespace sieve {
namespace {

// Unicode White_Space, written with escapes only so that `(?x)` in a pattern cannot eat it.
constexpr std::string_view kWhiteSpaceItems =
    "\\x{09}-\\x{0D}\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}"
    "\\x{202F}\\x{205F}\\x{3000}";

std::string Pcre2ErrorMessage(int error_code) {
  PCRE2_UCHAR buffer[256];
  const int length = pcre2_get_error_message(error_code, buffer, sizeof(buffer));
  if (length < 0) return "PCRE2 error " + std::to_string(error_code);
  return std::string(reinterpret_cast<const char*>(buffer), static_cast<size_t>(length));
}

struct MatchDataDeleter {
  void operator()(pcre2_match_data* data) const { pcre2_match_data_free(data); }
};

}  // namespace

std::string RewriteWhitespaceClasses(std::string_view pattern) {
  std::string out;
  out.reserve(pattern.size() + 64);
  bool in_class = false;
  size_t index = 0;
  while (index < pattern.size()) {
    const char c = pattern[index];
    if (c == '\\' && index + 1 < pattern.size()) {
      const char next = pattern[index + 1];
      if (next == 's') {
        if (in_class) {
          out += kWhiteSpaceItems;
        } else {
          out += '[';
          out += kWhiteSpaceItems;
          out += ']';
        }
      } else if (next == 'S' && !in_class) {
        out += "[^";
        out += kWhiteSpaceItems;
        out += ']';
      } else if (next == 'Q') {
        // \Q...\E quotes everything up to \E verbatim.
        const size_t end = pattern.find("\\E", index + 2);
        const size_t stop = end == std::string_view::npos ? pattern.size() : end + 2;
        out.append(pattern.substr(index, stop - index));
        index = stop;
        continue;
      } else {
        out += c;
        out += next;
      }
      index += 2;
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      ++index;
      // A ']' right after '[' or '[^' is a literal member, not the end of the class.
      if (index < pattern.size() && pattern[index] == '^') out += pattern[index++];
      if (index < pattern.size() && pattern[index] == ']') out += pattern[index++];
      continue;
    }
    if (in_class && c == '[' && index + 1 < pattern.size() && pattern[index + 1] == ':') {
      const size_t end = pattern.find(":]", index + 2);
      if (end != std::string_view::npos) {
        out.append(pattern.substr(index, end + 2 - index));
        index = end + 2;
        continue;
      }
    }
    if (in_class && c == ']') in_class = false;
    out += c;
    ++index;
  }
  return out;
}

Result<Regex> Regex::Compile(std::string_view pattern, bool literal) {
  const std::string compiled = literal ? std::string(pattern) : RewriteWhitespaceClasses(pattern);
  // PCRE2_LITERAL refuses PCRE2_UCP, which a literal does not need.
  const uint32_t options = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(compiled.data()), compiled.size(),
                                   options, &error_code, &error_offset, nullptr);
  if (code == nullptr) {
    return InvalidArgumentError("cannot compile split regex '" + std::string(pattern) +
                                "': " + Pcre2ErrorMessage(error_code) + " (at offset " +
                                std::to_string(error_offset) + " of the rewritten pattern)");
  }
  // Without JIT support PCRE2 falls back to its interpreter, which gives the same matches.
  (void)pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  return Regex(code, std::string(pattern));
}

Regex::Regex(Regex&& other) noexcept
    : code_(std::exchange(other.code_, nullptr)), pattern_(std::move(other.pattern_)) {}

Regex& Regex::operator=(Regex&& other) noexcept {
  if (this != &other) {
    if (code_ != nullptr) pcre2_code_free(code_);
    code_ = std::exchange(other.code_, nullptr);
    pattern_ = std::move(other.pattern_);
  }
  return *this;
}

Regex::~Regex() {
  if (code_ != nullptr) pcre2_code_free(code_);
}

Status Regex::FindAll(std::string_view text,
                      std::vector<std::pair<size_t, size_t>>& matches) const {
  // Match data is per call so that one Regex serves concurrent encodes.
  std::unique_ptr<pcre2_match_data, MatchDataDeleter> match_data(
      pcre2_match_data_create_from_pattern(code_, nullptr));
  if (match_data == nullptr) return InternalError("out of memory for regex match data");
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t offset = 0;
  while (offset < text.size()) {
    const int rc = pcre2_match(code_, subject, text.size(), offset, PCRE2_NO_UTF_CHECK,
                               match_data.get(), nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      return InternalError("split regex failed at byte " + std::to_string(offset) + ": " +
                           Pcre2ErrorMessage(rc));
    }
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match_data.get());
    const size_t begin = ovector[0];
    const size_t end = ovector[1];
    if (end > begin) {
      matches.emplace_back(begin, end);
      offset = end;
      continue;
    }
    // An empty match splits nothing: step over one character and search again.
    offset = begin + 1;
    while (offset < text.size() && (static_cast<uint8_t>(text[offset]) & 0xc0) == 0x80) ++offset;
  }
  return Status::Ok();
}

}  // namespace sieve
