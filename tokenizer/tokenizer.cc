#include "tokenizer/tokenizer.h"

#include <algorithm>

#include "core/utf8.h"

namespace sieve {
namespace {

bool IsAsciiSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

}  // namespace

std::string ToValidUtf8(std::string_view bytes) {
  if (IsValidUtf8(bytes)) return std::string(bytes);
  std::string out;
  out.reserve(bytes.size() + 8);
  size_t offset = 0;
  while (offset < bytes.size()) {
    const int length = Utf8SequenceLength(bytes.substr(offset));
    if (length == 0) {
      AppendUtf8(0xfffd, out);
      ++offset;
    } else {
      out.append(bytes.substr(offset, static_cast<size_t>(length)));
      offset += static_cast<size_t>(length);
    }
  }
  return out;
}

Result<std::vector<int32_t>> Tokenizer::Encode(std::string_view text, bool add_bos) const {
  return EncodeImpl(text, add_bos, /*match_special=*/true);
}

Result<std::vector<int32_t>> Tokenizer::EncodeOrdinary(std::string_view text, bool add_bos) const {
  return EncodeImpl(text, add_bos, /*match_special=*/false);
}

Result<std::vector<int32_t>> Tokenizer::EncodeImpl(std::string_view text, bool add_bos,
                                                   bool match_special) const {
  const size_t invalid_offset = FirstInvalidUtf8Offset(text);
  if (invalid_offset != text.size()) {
    return InvalidArgumentError("text is not valid UTF-8 at byte offset " +
                                std::to_string(invalid_offset));
  }
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 2);
  if (add_bos && this->add_bos()) ids.push_back(*bos_id_);

  // Leftmost-longest scan for added tokens; the text between them goes to the model. Contents are
  // valid UTF-8, so a match can only start on a character boundary.
  size_t segment_begin = 0;
  size_t position = 0;
  while (position < text.size()) {
    const AddedToken* found = nullptr;
    for (const size_t index : added_tokens_by_first_byte_[static_cast<uint8_t>(text[position])]) {
      const AddedToken& token = added_tokens_[index];
      if (token.special && !match_special) continue;
      if (text.substr(position).starts_with(token.content)) {
        found = &token;
        break;
      }
    }
    if (found == nullptr) {
      ++position;
      continue;
    }
    size_t match_begin = position;
    size_t match_end = position + found->content.size();
    if (found->lstrip) {
      while (match_begin > segment_begin && IsAsciiSpace(text[match_begin - 1])) --match_begin;
    }
    if (found->rstrip) {
      while (match_end < text.size() && IsAsciiSpace(text[match_end])) ++match_end;
    }
    if (match_begin > segment_begin) {
      SIEVE_RETURN_IF_ERROR(
          EncodeText(text.substr(segment_begin, match_begin - segment_begin), ids));
    }
    ids.push_back(found->id);
    segment_begin = position = match_end;
  }
  if (segment_begin < text.size())
    SIEVE_RETURN_IF_ERROR(EncodeText(text.substr(segment_begin), ids));
  return ids;
}

std::string_view Tokenizer::TokenView(int32_t id) const {
  if (const auto it = added_token_by_id_.find(id); it != added_token_by_id_.end()) {
    return added_tokens_[it->second].content;
  }
  if (id < 0 || id >= model_vocab_size()) return {};
  return ModelTokenBytes(id);
}

std::string Tokenizer::Decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  std::string bytes;
  bool at_start = true;
  for (const int32_t id : ids) {
    if (skip_special_tokens && IsSpecial(id)) continue;
    std::string_view piece = TokenView(id);
    if (piece.empty()) continue;
    if (at_start && strip_leading_space_ && piece.front() == ' ') piece.remove_prefix(1);
    at_start = false;
    bytes += piece;
  }
  return ToValidUtf8(bytes);
}

int32_t Tokenizer::vocab_size() const { return std::max(model_vocab_size(), max_added_id_ + 1); }

bool Tokenizer::IsEos(int32_t id) const {
  return std::find(eos_ids_.begin(), eos_ids_.end(), id) != eos_ids_.end();
}

bool Tokenizer::IsSpecial(int32_t id) const {
  const auto it = added_token_by_id_.find(id);
  return it != added_token_by_id_.end() && added_tokens_[it->second].special;
}

std::optional<int32_t> Tokenizer::TokenToId(std::string_view token) const {
  if (const auto it = added_token_by_content_.find(std::string(token));
      it != added_token_by_content_.end()) {
    return added_tokens_[it->second].id;
  }
  return ModelPieceToId(token);
}

Status Tokenizer::AddAddedToken(AddedToken token) {
  if (token.content.empty()) {
    return InvalidArgumentError("added token " + std::to_string(token.id) + " has empty content");
  }
  if (token.id < 0) {
    return InvalidArgumentError("added token '" + token.content + "' has negative id " +
                                std::to_string(token.id));
  }
  if (!IsValidUtf8(token.content)) {
    return InvalidArgumentError("added token " + std::to_string(token.id) + " is not valid UTF-8");
  }
  if (added_token_by_id_.contains(token.id) || added_token_by_content_.contains(token.content)) {
    return Status::Ok();
  }
  const size_t index = added_tokens_.size();
  added_token_by_id_[token.id] = index;
  added_token_by_content_[token.content] = index;
  max_added_id_ = std::max(max_added_id_, token.id);
  auto& bucket = added_tokens_by_first_byte_[static_cast<uint8_t>(token.content.front())];
  added_tokens_.push_back(std::move(token));
  bucket.push_back(index);
  std::stable_sort(bucket.begin(), bucket.end(), [this](size_t left, size_t right) {
    return added_tokens_[left].content.size() > added_tokens_[right].content.size();
  });
  return Status::Ok();
}

void Tokenizer::SetBos(std::optional<int32_t> bos_id, bool add_bos) {
  bos_id_ = bos_id;
  add_bos_ = add_bos;
}

void Tokenizer::SetEosIds(std::vector<int32_t> eos_ids) {
  eos_ids_.clear();
  for (const int32_t id : eos_ids) AddEosId(id);
}

void Tokenizer::AddEosId(int32_t id) {
  if (!IsEos(id)) eos_ids_.push_back(id);
}

void Tokenizer::SetChatTemplate(Result<ChatTemplate> chat_template) {
  if (chat_template.ok()) {
    chat_template_ = *chat_template;
    chat_template_status_ = Status::Ok();
  } else {
    chat_template_.reset();
    chat_template_status_ = chat_template.status();
  }
}

}  // namespace sieve
