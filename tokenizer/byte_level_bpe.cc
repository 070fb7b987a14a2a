#include "tokenizer/byte_level_bpe.h"

#include <queue>

#include "core/utf8.h"

namespace sieve {
namespace {

// byte -> code point, and code point (< 324) -> byte, as GPT-2's bytes_to_unicode() builds them:
// printable Latin-1 bytes map to themselves, the other 68 to U+0100 onwards in byte order.
struct ByteUnicodeTables {
  std::array<uint32_t, 256> code_of_byte{};
  std::array<int16_t, 324> byte_of_code{};

  ByteUnicodeTables() {
    byte_of_code.fill(-1);
    uint32_t next_extra = 256;
    for (uint32_t byte = 0; byte < 256; ++byte) {
      const bool printable = (byte >= '!' && byte <= '~') || (byte >= 0xa1 && byte <= 0xac) ||
                             (byte >= 0xae && byte <= 0xff);
      const uint32_t code = printable ? byte : next_extra++;
      code_of_byte[byte] = code;
      byte_of_code[code] = static_cast<int16_t>(byte);
    }
  }
};

const ByteUnicodeTables& Tables() {
  static const ByteUnicodeTables tables;
  return tables;
}

uint64_t PairKey(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

}  // namespace

std::string BytesToUnicode(std::string_view bytes) {
  std::string text;
  text.reserve(bytes.size() * 2);
  for (const char byte : bytes) AppendUtf8(Tables().code_of_byte[static_cast<uint8_t>(byte)], text);
  return text;
}

std::optional<std::string> UnicodeToBytes(std::string_view text) {
  std::string bytes;
  bytes.reserve(text.size());
  size_t offset = 0;
  while (offset < text.size()) {
    if (Utf8SequenceLength(text.substr(offset)) == 0) return std::nullopt;
    const uint32_t code = DecodeUtf8(text, offset);
    if (code >= Tables().byte_of_code.size() || Tables().byte_of_code[code] < 0) {
      return std::nullopt;
    }
    bytes += static_cast<char>(Tables().byte_of_code[code]);
  }
  return bytes;
}

Result<std::unique_ptr<ByteLevelBpe>> ByteLevelBpe::Create(Vocabulary vocabulary,
                                                           PreTokenizer pre_tokenizer,
                                                           std::string kind) {
  std::unique_ptr<ByteLevelBpe> bpe(new ByteLevelBpe());
  bpe->kind_ = std::move(kind);
  bpe->pre_tokenizer_ = std::move(pre_tokenizer);
  bpe->merge_rule_ = vocabulary.merge_rule;
  bpe->whole_word_lookup_ =
      vocabulary.ignore_merges || vocabulary.merge_rule == MergeRule::kTokenRank;
  bpe->unk_id_ = vocabulary.unk_id;

  size_t total_bytes = 0;
  for (const std::string& token : vocabulary.tokens) total_bytes += token.size();
  bpe->arena_.reserve(total_bytes);
  bpe->offsets_.reserve(vocabulary.tokens.size() + 1);
  for (const std::string& token : vocabulary.tokens) {
    bpe->offsets_.push_back(static_cast<uint32_t>(bpe->arena_.size()));
    bpe->arena_ += token;
  }
  bpe->offsets_.push_back(static_cast<uint32_t>(bpe->arena_.size()));
  vocabulary.tokens = {};

  const int32_t vocab_size = bpe->model_vocab_size();
  bpe->id_by_bytes_.Reserve(static_cast<size_t>(vocab_size));
  bpe->byte_ids_.fill(-1);
  for (int32_t id = 0; id < vocab_size; ++id) {
    const std::string_view bytes = bpe->ModelTokenBytes(id);
    if (bytes.empty()) continue;
    bpe->id_by_bytes_.Insert(bytes, id);  // keeps the first (lowest) id of duplicates
    if (bytes.size() == 1 && bpe->byte_ids_[static_cast<uint8_t>(bytes[0])] < 0) {
      bpe->byte_ids_[static_cast<uint8_t>(bytes[0])] = id;
    }
  }

  bpe->merges_.Reserve(vocabulary.merges.size());
  for (size_t rank = 0; rank < vocabulary.merges.size(); ++rank) {
    const auto [left, right] = vocabulary.merges[rank];
    if (left < 0 || right < 0 || left >= vocab_size || right >= vocab_size) {
      return DataLossError("merge " + std::to_string(rank) +
                           " refers to an id outside the vocabulary");
    }
    std::string merged(bpe->ModelTokenBytes(left));
    merged += bpe->ModelTokenBytes(right);
    const std::optional<int32_t> merged_id = bpe->IdOfBytes(merged);
    if (!merged_id) {
      return DataLossError("merge " + std::to_string(rank) + " ('" +
                           BytesToUnicode(bpe->ModelTokenBytes(left)) + "' + '" +
                           BytesToUnicode(bpe->ModelTokenBytes(right)) +
                           "') makes a token that is not in the vocabulary");
    }
    bpe->merges_.Insert(PairKey(left, right),
                        Merge{.rank = static_cast<int32_t>(rank), .merged_id = *merged_id});
  }
  return bpe;
}

std::string_view ByteLevelBpe::ModelTokenBytes(int32_t id) const {
  return std::string_view(arena_).substr(
      offsets_[static_cast<size_t>(id)],
      offsets_[static_cast<size_t>(id) + 1] - offsets_[static_cast<size_t>(id)]);
}

std::optional<int32_t> ByteLevelBpe::IdOfBytes(std::string_view bytes) const {
  const int32_t* id = id_by_bytes_.Find(bytes);
  if (id == nullptr) return std::nullopt;
  return *id;
}

std::optional<int32_t> ByteLevelBpe::ModelPieceToId(std::string_view piece) const {
  const std::optional<std::string> bytes = UnicodeToBytes(piece);
  if (!bytes) return std::nullopt;
  return IdOfBytes(*bytes);
}

Status ByteLevelBpe::EncodeText(std::string_view text, std::vector<int32_t>& ids) const {
  std::vector<std::string> words;
  SIEVE_RETURN_IF_ERROR(pre_tokenizer_.Split(text, words));
  for (const std::string& word : words) EncodeWord(word, ids);
  return Status::Ok();
}

std::optional<ByteLevelBpe::Merge> ByteLevelBpe::FindMerge(std::string_view word, size_t begin,
                                                           size_t length, int32_t left_id,
                                                           int32_t right_id) const {
  if (left_id < 0 || right_id < 0) return std::nullopt;
  if (merge_rule_ == MergeRule::kTokenRank) {
    const std::optional<int32_t> id = IdOfBytes(word.substr(begin, length));
    if (!id) return std::nullopt;
    return Merge{.rank = *id, .merged_id = *id};
  }
  const Merge* merge = merges_.Find(PairKey(left_id, right_id));
  if (merge == nullptr) return std::nullopt;
  return *merge;
}

void ByteLevelBpe::EncodeWord(std::string_view word, std::vector<int32_t>& ids) const {
  if (word.empty()) return;
  if (whole_word_lookup_) {
    if (const std::optional<int32_t> id = IdOfBytes(word)) {
      ids.push_back(*id);
      return;
    }
  }
  // One symbol per byte, linked in a list; merged-away symbols keep length 0.
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
    uint32_t begin;
    uint32_t length;
  };
  const auto num_bytes = static_cast<int32_t>(word.size());
  std::vector<Symbol> symbols(word.size());
  for (int32_t index = 0; index < num_bytes; ++index) {
    symbols[index] = Symbol{.id = byte_ids_[static_cast<uint8_t>(word[index])],
                            .prev = index - 1,
                            .next = index + 1 < num_bytes ? index + 1 : -1,
                            .begin = static_cast<uint32_t>(index),
                            .length = 1};
  }

  struct Candidate {
    int32_t rank;
    int32_t left;
    int32_t right;
    int32_t merged_id;
    uint32_t length;  // bytes of left + right when the candidate was made
  };
  // Lowest rank first; on equal ranks the leftmost pair.
  const auto later = [](const Candidate& a, const Candidate& b) {
    return a.rank != b.rank ? a.rank > b.rank : a.left > b.left;
  };
  std::priority_queue<Candidate, std::vector<Candidate>, decltype(later)> queue(later);
  const auto consider = [&](int32_t left) {
    if (left < 0) return;
    const int32_t right = symbols[left].next;
    if (right < 0) return;
    const uint32_t length = symbols[left].length + symbols[right].length;
    const std::optional<Merge> merge =
        FindMerge(word, symbols[left].begin, length, symbols[left].id, symbols[right].id);
    if (merge) queue.push({merge->rank, left, right, merge->merged_id, length});
  };
  for (int32_t index = 0; index + 1 < num_bytes; ++index) consider(index);

  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[top.left];
    // Stale when either side has changed since the candidate was made.
    if (left.length == 0 || left.next != top.right ||
        left.length + symbols[top.right].length != top.length) {
      continue;
    }
    Symbol& right = symbols[top.right];
    left.id = top.merged_id;
    left.length = top.length;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = top.left;
    right.length = 0;
    consider(left.prev);
    consider(top.left);
  }

  for (int32_t index = 0; index >= 0; index = symbols[index].next) {
    if (symbols[index].id >= 0) {
      ids.push_back(symbols[index].id);
    } else if (unk_id_) {
      ids.push_back(*unk_id_);
    }
  }
}

}  // namespace sieve
