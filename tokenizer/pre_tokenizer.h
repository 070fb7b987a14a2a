// PreTokenizer: cuts text into the words that byte-level BPE merges within.
//
// It mirrors the Hugging Face pre-tokenizers that byte-level vocabularies use: `Split` (a regex or
// literal pattern with one of HF's delimiter behaviours) and `ByteLevel` (an optional prefix space
// and the optional GPT-2 regex; its byte-to-unicode mapping is the model's job here, since Sieve's
// byte-level BPE works on raw bytes). Steps run in order, each on every piece the previous step
// produced, as HF's `Sequence` does. Immutable after construction; thread-safe.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "tokenizer/regex.h"

namespace sieve {

// What a Split step does with the delimiters it finds (HF's SplitDelimiterBehavior).
enum class SplitBehavior {
  kIsolated,            // matches and the text between them are separate pieces
  kRemoved,             // matches are dropped
  kMergedWithPrevious,  // a match joins the piece before it
  kMergedWithNext,      // a match joins the piece after it
  kContiguous,          // runs of adjacent matches become one piece
};

// The GPT-2 split pattern that ByteLevel(use_regex=true) applies.
inline constexpr std::string_view kGpt2SplitPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// The Llama 3 (tiktoken cl100k-style) split pattern.
inline constexpr std::string_view kLlama3SplitPattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

class PreTokenizer {
 public:
  PreTokenizer() = default;
  PreTokenizer(PreTokenizer&&) = default;
  PreTokenizer& operator=(PreTokenizer&&) = default;

  // Appends a Split step. `invert`: the pattern describes the pieces, not the delimiters.
  Status AddSplit(std::string_view pattern, bool literal, SplitBehavior behavior, bool invert);
  // Appends a ByteLevel step.
  Status AddByteLevel(bool add_prefix_space, bool use_regex);

  // Splits `text` (valid UTF-8) into non-empty pieces, appended to `pieces`. With no steps the
  // whole text is one piece.
  Status Split(std::string_view text, std::vector<std::string>& pieces) const;

 private:
  struct Step {
    Regex regex;
    SplitBehavior behavior = SplitBehavior::kIsolated;
    bool invert = false;
    bool add_prefix_space = false;  // ByteLevel: prepend ' ' to a piece that lacks one
    bool has_regex = true;          // false for ByteLevel(use_regex=false)
  };

  Status ApplyStep(const Step& step, std::string_view piece, std::vector<std::string>& out) const;

  std::vector<Step> steps_;
};

// Parses HF's behaviour names ("Isolated", "Removed", "MergedWithPrevious", ...).
Result<SplitBehavior> ParseSplitBehavior(std::string_view name);

}  // namespace sieve
