#include "tokenizer/streaming_decoder.h"

#include "core/utf8.h"

namespace sieve {

std::string StreamingDecoder::Push(int32_t id) {
  if (skip_special_tokens_ && tokenizer_->IsSpecial(id)) return {};
  std::string_view piece = tokenizer_->TokenView(id);
  if (piece.empty()) return {};
  // The same first-piece rule as Tokenizer::Decode.
  if (at_start_ && tokenizer_->strips_leading_space() && piece.front() == ' ') {
    piece.remove_prefix(1);
  }
  at_start_ = false;
  pending_ += piece;
  const size_t held = IncompleteUtf8Suffix(pending_);
  std::string text = ToValidUtf8(std::string_view(pending_).substr(0, pending_.size() - held));
  pending_.erase(0, pending_.size() - held);
  return text;
}

std::string StreamingDecoder::Flush() {
  std::string text = ToValidUtf8(pending_);
  pending_.clear();
  at_start_ = true;
  return text;
}

}  // namespace sieve
