// Regex: a compiled PCRE2 pattern for the pre-tokenizers' splits.
//
// Hugging Face tokenizers matches its split patterns with Oniguruma and tiktoken with
// fancy-regex; both read `\p{L}`, `\s` and friends over Unicode. PCRE2 in UTF + UCP mode reads the
// same patterns the same way, with one difference we remove: PCRE2's `\s` also takes U+180E, so
// `\s`/`\S` are rewritten to Unicode's White_Space set before compiling. Matching uses the JIT when
// the platform has it. A Regex is immutable after Compile and safe to use from many threads.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"

struct pcre2_real_code_8;

namespace sieve {

class Regex {
 public:
  // `literal`: match `pattern` as plain text (HF's `{"String": ...}` split patterns).
  static Result<Regex> Compile(std::string_view pattern, bool literal = false);

  Regex(Regex&& other) noexcept;
  Regex& operator=(Regex&& other) noexcept;
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  ~Regex();

  // Appends the [begin, end) byte ranges of the successive non-overlapping, non-empty matches in
  // `text` (valid UTF-8: the caller checked it), left to right, as find_iter does.
  Status FindAll(std::string_view text, std::vector<std::pair<size_t, size_t>>& matches) const;

  const std::string& pattern() const { return pattern_; }

 private:
  Regex(pcre2_real_code_8* code, std::string pattern) : code_(code), pattern_(std::move(pattern)) {}

  pcre2_real_code_8* code_ = nullptr;
  std::string pattern_;  // as given, before the White_Space rewrite
};

// `pattern` with every `\s` and `\S` replaced by Unicode White_Space classes (exposed for tests).
std::string RewriteWhitespaceClasses(std::string_view pattern);

}  // namespace sieve
