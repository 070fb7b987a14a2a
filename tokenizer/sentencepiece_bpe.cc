#include "tokenizer/sentencepiece_bpe.h"

#include <algorithm>
#include <queue>

#include "core/utf8.h"

namespace sieve {
namespace {

using PieceType = SentencePieceModel::PieceType;

constexpr std::string_view kSpaceSymbol = "\xe2\x96\x81";  // U+2581 '▁'

// "<0x41>" -> 0x41.
std::optional<uint8_t> ParseBytePiece(std::string_view piece) {
  if (piece.size() != 6 || !piece.starts_with("<0x") || piece.back() != '>') return std::nullopt;
  int value = 0;
  for (const char c : piece.substr(3, 2)) {
    int digit;
    if (c >= '0' && c <= '9') {
      digit = c - '0';
    } else if (c >= 'A' && c <= 'F') {
      digit = c - 'A' + 10;
    } else if (c >= 'a' && c <= 'f') {
      digit = c - 'a' + 10;
    } else {
      return std::nullopt;
    }
    value = value * 16 + digit;
  }
  return static_cast<uint8_t>(value);
}

std::string ReplaceAll(std::string_view text, std::string_view from, std::string_view to) {
  std::string out;
  out.reserve(text.size());
  size_t position = 0;
  while (true) {
    const size_t found = text.find(from, position);
    if (found == std::string_view::npos) break;
    out.append(text.substr(position, found - position));
    out.append(to);
    position = found + from.size();
  }
  out.append(text.substr(position));
  return out;
}

}  // namespace

Result<std::unique_ptr<SentencePieceBpe>> SentencePieceBpe::Create(
    const SentencePieceModel& model) {
  if (model.model_type != SentencePieceModel::ModelType::kBpe) {
    return UnimplementedError("SentencePiece model type " +
                              std::string(ModelTypeName(model.model_type)) +
                              " is not supported (Sieve reads SentencePiece BPE)");
  }
  if (model.has_precompiled_charsmap) {
    return UnimplementedError("SentencePiece normalizer '" + model.normalizer_name +
                              "' (a precompiled character map) is not supported; only identity");
  }
  if (model.treat_whitespace_as_suffix) {
    return UnimplementedError("SentencePiece treat_whitespace_as_suffix is not supported");
  }
  const auto vocab_size = static_cast<int32_t>(model.pieces.size());
  for (const auto& [name, id] :
       {std::pair{"unk_id", model.unk_id}, {"bos_id", model.bos_id}, {"eos_id", model.eos_id}}) {
    if (id < -1 || id >= vocab_size) {
      return DataLossError(std::string("SentencePiece ") + name + " " + std::to_string(id) +
                           " is outside the " + std::to_string(vocab_size) + " pieces");
    }
  }
  if (model.unk_id < 0) return DataLossError("SentencePiece model has no unknown piece");

  std::unique_ptr<SentencePieceBpe> bpe(new SentencePieceBpe());
  bpe->byte_fallback_ = model.byte_fallback;
  bpe->unk_id_ = model.unk_id;
  bpe->add_dummy_prefix_ = model.add_dummy_prefix;
  bpe->remove_extra_whitespaces_ = model.remove_extra_whitespaces;
  bpe->escape_whitespaces_ = model.escape_whitespaces;
  bpe->byte_ids_.fill(-1);
  bpe->pieces_.reserve(model.pieces.size());
  bpe->bytes_.reserve(model.pieces.size());
  for (int32_t id = 0; id < vocab_size; ++id) {
    const SentencePieceModel::Piece& piece = model.pieces[static_cast<size_t>(id)];
    if (piece.text.empty()) {
      return DataLossError("SentencePiece piece " + std::to_string(id) + " is empty");
    }
    bpe->pieces_.push_back(piece.text);
    bpe->scores_.push_back(piece.score);
    bpe->types_.push_back(piece.type);
    std::string bytes;
    if (piece.type == PieceType::kByte) {
      const std::optional<uint8_t> byte = ParseBytePiece(piece.text);
      if (!byte) {
        return DataLossError("SentencePiece byte piece " + std::to_string(id) + " '" + piece.text +
                             "' is not <0xXX>");
      }
      bytes = std::string(1, static_cast<char>(*byte));
      if (bpe->byte_ids_[*byte] < 0) bpe->byte_ids_[*byte] = id;
    } else if (piece.type == PieceType::kControl || piece.type == PieceType::kUnknown) {
      bytes = piece.text;
    } else {
      bytes = model.escape_whitespaces ? ReplaceAll(piece.text, kSpaceSymbol, " ") : piece.text;
    }
    bpe->bytes_.push_back(std::move(bytes));
  }
  for (int32_t id = 0; id < vocab_size; ++id) {
    const std::string_view text = bpe->pieces_[static_cast<size_t>(id)];
    bpe->id_of_piece_.emplace(text, id);
    const PieceType type = bpe->types_[static_cast<size_t>(id)];
    if (type == PieceType::kNormal || type == PieceType::kUserDefined ||
        type == PieceType::kUnused) {
      bpe->mergeable_.emplace(text, id);
    }
    if (type == PieceType::kUserDefined) bpe->user_defined_.push_back(text);
  }
  std::sort(bpe->user_defined_.begin(), bpe->user_defined_.end(),
            [](std::string_view a, std::string_view b) { return a.size() > b.size(); });

  // Control pieces and the unknown piece are specials: matched in text, skipped when asked.
  for (int32_t id = 0; id < vocab_size; ++id) {
    const PieceType type = bpe->types_[static_cast<size_t>(id)];
    if (type == PieceType::kControl || type == PieceType::kUnknown) {
      SIEVE_RETURN_IF_ERROR(bpe->AddAddedToken(
          AddedToken{.content = bpe->pieces_[static_cast<size_t>(id)], .id = id}));
    }
  }
  bpe->set_strip_leading_space(model.add_dummy_prefix);
  if (model.bos_id >= 0) bpe->SetBos(model.bos_id, /*add_bos=*/true);
  if (model.eos_id >= 0) bpe->SetEosIds({model.eos_id});
  return bpe;
}

std::string_view SentencePieceBpe::ModelTokenBytes(int32_t id) const {
  return bytes_[static_cast<size_t>(id)];
}

std::optional<int32_t> SentencePieceBpe::ModelPieceToId(std::string_view piece) const {
  const auto it = id_of_piece_.find(piece);
  if (it == id_of_piece_.end()) return std::nullopt;
  return it->second;
}

std::string SentencePieceBpe::Normalize(std::string_view text) const {
  std::string cleaned;
  if (remove_extra_whitespaces_) {
    // Leading and trailing spaces go, inner runs become one.
    bool previous_space = true;
    for (const char c : text) {
      if (c == ' ') {
        if (!previous_space) cleaned += c;
        previous_space = true;
      } else {
        cleaned += c;
        previous_space = false;
      }
    }
    while (!cleaned.empty() && cleaned.back() == ' ') cleaned.pop_back();
  } else {
    cleaned = std::string(text);
  }
  if (cleaned.empty()) return cleaned;
  if (add_dummy_prefix_) cleaned.insert(cleaned.begin(), ' ');
  return escape_whitespaces_ ? ReplaceAll(cleaned, " ", kSpaceSymbol) : cleaned;
}

Status SentencePieceBpe::EncodeText(std::string_view text, std::vector<int32_t>& ids) const {
  const std::string normalized = Normalize(text);
  if (normalized.empty()) return Status::Ok();
  const std::string_view word = normalized;

  // Characters (and whole user-defined pieces, which never merge) in a linked list.
  struct Symbol {
    int32_t prev;
    int32_t next;
    uint32_t begin;
    uint32_t length;  // 0 once merged into its left neighbour
    bool frozen;
  };
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  for (size_t offset = 0; offset < word.size();) {
    size_t length = 0;
    bool frozen = false;
    for (const std::string_view piece : user_defined_) {
      if (word.substr(offset).starts_with(piece)) {
        length = piece.size();
        frozen = true;
        break;
      }
    }
    if (length == 0) {
      const int sequence = Utf8SequenceLength(word.substr(offset));
      length = sequence > 0 ? static_cast<size_t>(sequence) : 1;
    }
    const auto index = static_cast<int32_t>(symbols.size());
    symbols.push_back(Symbol{.prev = index - 1,
                             .next = -1,
                             .begin = static_cast<uint32_t>(offset),
                             .length = static_cast<uint32_t>(length),
                             .frozen = frozen});
    if (index > 0) symbols[static_cast<size_t>(index) - 1].next = index;
    offset += length;
  }

  struct Candidate {
    float score;
    int32_t left;
    int32_t right;
    uint32_t length;  // bytes of left + right when made
  };
  // Highest score first; on equal scores the leftmost pair.
  const auto later = [](const Candidate& a, const Candidate& b) {
    return a.score != b.score ? a.score < b.score : a.left > b.left;
  };
  std::priority_queue<Candidate, std::vector<Candidate>, decltype(later)> queue(later);
  // Merged pieces that are "unused" get split back at the end, as sentencepiece does.
  std::unordered_map<std::string_view, std::pair<std::string_view, std::string_view>> rev_merge;
  const auto piece_of = [&](int32_t index) {
    return word.substr(symbols[static_cast<size_t>(index)].begin,
                       symbols[static_cast<size_t>(index)].length);
  };
  const auto consider = [&](int32_t left) {
    if (left < 0) return;
    const int32_t right = symbols[static_cast<size_t>(left)].next;
    if (right < 0) return;
    if (symbols[static_cast<size_t>(left)].frozen || symbols[static_cast<size_t>(right)].frozen) {
      return;
    }
    const uint32_t length =
        symbols[static_cast<size_t>(left)].length + symbols[static_cast<size_t>(right)].length;
    const std::string_view merged = word.substr(symbols[static_cast<size_t>(left)].begin, length);
    const auto it = mergeable_.find(merged);
    if (it == mergeable_.end()) return;
    queue.push({scores_[static_cast<size_t>(it->second)], left, right, length});
    if (types_[static_cast<size_t>(it->second)] == PieceType::kUnused) {
      rev_merge[merged] = {piece_of(left), piece_of(right)};
    }
  };
  for (int32_t index = 0; index + 1 < static_cast<int32_t>(symbols.size()); ++index) {
    consider(index);
  }
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[static_cast<size_t>(top.left)];
    if (left.length == 0 || left.next != top.right ||
        left.length + symbols[static_cast<size_t>(top.right)].length != top.length) {
      continue;
    }
    Symbol& right = symbols[static_cast<size_t>(top.right)];
    left.length = top.length;
    left.next = right.next;
    if (right.next >= 0) symbols[static_cast<size_t>(right.next)].prev = top.left;
    right.length = 0;
    consider(left.prev);
    consider(top.left);
  }

  const size_t first_output = ids.size();
  for (int32_t index = 0; index >= 0; index = symbols[static_cast<size_t>(index)].next) {
    Resegment(piece_of(index), rev_merge, ids);
  }
  if (!byte_fallback_) {
    // sentencepiece emits a run of unknown characters as one unknown token.
    auto begin = ids.begin() + static_cast<std::ptrdiff_t>(first_output);
    ids.erase(std::unique(begin, ids.end(),
                          [this](int32_t a, int32_t b) { return a == unk_id_ && b == unk_id_; }),
              ids.end());
  }
  return Status::Ok();
}

void SentencePieceBpe::Resegment(
    std::string_view piece,
    const std::unordered_map<std::string_view, std::pair<std::string_view, std::string_view>>&
        rev_merge,
    std::vector<int32_t>& ids) const {
  const auto it = mergeable_.find(piece);
  if (it == mergeable_.end()) {
    EmitUnknown(piece, ids);
    return;
  }
  if (types_[static_cast<size_t>(it->second)] != PieceType::kUnused) {
    ids.push_back(it->second);
    return;
  }
  const auto split = rev_merge.find(piece);
  if (split == rev_merge.end()) {
    EmitUnknown(piece, ids);
    return;
  }
  Resegment(split->second.first, rev_merge, ids);
  Resegment(split->second.second, rev_merge, ids);
}

void SentencePieceBpe::EmitUnknown(std::string_view piece, std::vector<int32_t>& ids) const {
  if (!byte_fallback_) {
    ids.push_back(unk_id_);
    return;
  }
  for (const char byte : piece) {
    const int32_t id = byte_ids_[static_cast<uint8_t>(byte)];
    ids.push_back(id >= 0 ? id : unk_id_);
  }
}

}  // namespace sieve
