// Text from outside for the haystack (--haystack) and for perplexity (--text): one file, or a
// directory of .txt files read in sorted name order.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace sieve::eval {

// The file's bytes, or the directory's .txt files joined by "\n" (so the last sentence of one
// file never runs into the first of the next). NotFound / InvalidArgument name `flag` and the
// path: missing, unreadable, no .txt files, empty.
Result<std::string> ReadTextSource(const std::string& path, std::string_view flag);

// Sentences as scripts/train/train.py's Corpus cuts its haystack: newlines become spaces, the
// text splits at whitespace that follows '.', '!' or '?', and sentences of 20..400 characters
// are kept, each followed by one space.
std::vector<std::string> SplitSentences(std::string_view text);

}  // namespace sieve::eval
