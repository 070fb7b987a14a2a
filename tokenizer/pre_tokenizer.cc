#include "tokenizer/pre_tokenizer.h"

#include <algorithm>
#include <utility>

namespace sieve {

Result<SplitBehavior> ParseSplitBehavior(std::string_view name) {
  if (name == "Isolated") return SplitBehavior::kIsolated;
  if (name == "Removed") return SplitBehavior::kRemoved;
  if (name == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (name == "Contiguous") return SplitBehavior::kContiguous;
  return UnimplementedError("Split pre-tokenizer behavior '" + std::string(name) +
                            "' is not supported");
}

Status PreTokenizer::AddSplit(std::string_view pattern, bool literal, SplitBehavior behavior,
                              bool invert) {
  SIEVE_ASSIGN_OR_RETURN(Regex regex, Regex::Compile(pattern, literal));
  steps_.push_back(Step{.regex = std::move(regex), .behavior = behavior, .invert = invert});
  return Status::Ok();
}

Status PreTokenizer::AddByteLevel(bool add_prefix_space, bool use_regex) {
  if (!add_prefix_space && !use_regex) return Status::Ok();  // nothing to do on raw bytes
  // A regex is always compiled so that Step stays a plain aggregate; unused when !use_regex.
  SIEVE_ASSIGN_OR_RETURN(Regex regex, Regex::Compile(kGpt2SplitPattern));
  steps_.push_back(Step{.regex = std::move(regex),
                        .behavior = SplitBehavior::kIsolated,
                        .invert = false,
                        .add_prefix_space = add_prefix_space,
                        .has_regex = use_regex});
  return Status::Ok();
}

Status PreTokenizer::Split(std::string_view text, std::vector<std::string>& pieces) const {
  if (text.empty()) return Status::Ok();
  std::vector<std::string> current{std::string(text)};
  std::vector<std::string> next;
  for (const Step& step : steps_) {
    next.clear();
    for (const std::string& piece : current) SIEVE_RETURN_IF_ERROR(ApplyStep(step, piece, next));
    std::swap(current, next);
  }
  for (std::string& piece : current) {
    if (!piece.empty()) pieces.push_back(std::move(piece));
  }
  return Status::Ok();
}

Status PreTokenizer::ApplyStep(const Step& step, std::string_view piece,
                               std::vector<std::string>& out) const {
  std::string prefixed;
  if (step.add_prefix_space && !piece.starts_with(' ')) {
    prefixed = " ";
    prefixed += piece;
    piece = prefixed;
  }
  if (!step.has_regex) {
    out.emplace_back(piece);
    return Status::Ok();
  }
  std::vector<std::pair<size_t, size_t>> matches;
  SIEVE_RETURN_IF_ERROR(step.regex.FindAll(piece, matches));

  // The piece as alternating spans, each flagged as a delimiter (match) or not, as HF builds it.
  struct Span {
    size_t begin, end;
    bool is_match;
  };
  std::vector<Span> spans;
  size_t previous_end = 0;
  for (const auto& [begin, end] : matches) {
    if (begin > previous_end) spans.push_back({previous_end, begin, false});
    spans.push_back({begin, end, true});
    previous_end = end;
  }
  if (previous_end < piece.size()) spans.push_back({previous_end, piece.size(), false});
  if (step.invert) {
    for (Span& span : spans) span.is_match = !span.is_match;
  }

  std::vector<std::pair<size_t, size_t>> kept;
  switch (step.behavior) {
    case SplitBehavior::kIsolated:
      for (const Span& span : spans) kept.emplace_back(span.begin, span.end);
      break;
    case SplitBehavior::kRemoved:
      for (const Span& span : spans) {
        if (!span.is_match) kept.emplace_back(span.begin, span.end);
      }
      break;
    case SplitBehavior::kMergedWithPrevious: {
      bool previous_match = false;
      for (const Span& span : spans) {
        if (span.is_match && !previous_match && !kept.empty()) {
          kept.back().second = span.end;
        } else {
          kept.emplace_back(span.begin, span.end);
        }
        previous_match = span.is_match;
      }
      break;
    }
    case SplitBehavior::kMergedWithNext: {
      bool previous_match = false;
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->is_match && !previous_match && !kept.empty()) {
          kept.back().first = it->begin;
        } else {
          kept.emplace_back(it->begin, it->end);
        }
        previous_match = it->is_match;
      }
      std::reverse(kept.begin(), kept.end());
      break;
    }
    case SplitBehavior::kContiguous: {
      bool previous_match = false;
      for (const Span& span : spans) {
        if (span.is_match && previous_match && !kept.empty()) {
          kept.back().second = span.end;
        } else {
          kept.emplace_back(span.begin, span.end);
        }
        previous_match = span.is_match;
      }
      break;
    }
  }
  for (const auto& [begin, end] : kept) {
    if (end > begin) out.emplace_back(piece.substr(begin, end - begin));
  }
  return Status::Ok();
}

}  // namespace sieve
