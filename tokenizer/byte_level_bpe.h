// ByteLevelBpe: byte-level byte-pair encoding, the tokenizer of GPT-2, Llama 3 and their kin.
//
// Text is cut into words by a PreTokenizer; each word starts as one symbol per byte and adjacent
// symbols merge by rank, lowest first, leftmost first on ties, until no pair can merge. Two rank
// rules cover the two file formats:
//   - kMergeList (Hugging Face tokenizer.json): a pair may merge only if it is in the merges list;
//     its rank is its position there.
//   - kTokenRank (tiktoken): any pair whose concatenated bytes are a token may merge; its rank is
//     that token's rank, which is its id.
// Tokens are stored as raw bytes; GPT-2's byte-to-unicode alphabet ("Ġ" for a space) is only how
// tokenizer.json writes them (BytesToUnicode / UnicodeToBytes convert).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"
#include "tokenizer/flat_hash_map.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/tokenizer.h"

namespace sieve {

class ByteLevelBpe final : public Tokenizer {
 public:
  enum class MergeRule { kMergeList, kTokenRank };

  struct Vocabulary {
    std::vector<std::string> tokens;  // [model_vocab_size] raw bytes per id; "" where none
    // [num_merges] (left id, right id) in rank order; used by kMergeList only.
    std::vector<std::pair<int32_t, int32_t>> merges;
    MergeRule merge_rule = MergeRule::kMergeList;
    // A word that is itself a token is emitted whole, without merging (HF ignore_merges; tiktoken
    // always does this).
    bool ignore_merges = false;
    std::optional<int32_t>
        unk_id;  // for bytes the vocabulary lacks; such bytes are dropped if unset
  };

  // DataLoss when a merge's concatenation is not a token.
  static Result<std::unique_ptr<ByteLevelBpe>> Create(Vocabulary vocabulary,
                                                      PreTokenizer pre_tokenizer, std::string kind);

  std::string_view kind() const override { return kind_; }

 protected:
  Status EncodeText(std::string_view text, std::vector<int32_t>& ids) const override;
  std::string_view ModelTokenBytes(int32_t id) const override;
  int32_t model_vocab_size() const override { return static_cast<int32_t>(offsets_.size()) - 1; }
  std::optional<int32_t> ModelPieceToId(std::string_view piece) const override;

 private:
  struct Merge {
    int32_t rank = 0;
    int32_t merged_id = 0;
  };

  ByteLevelBpe() = default;
  void EncodeWord(std::string_view word, std::vector<int32_t>& ids) const;
  std::optional<Merge> FindMerge(std::string_view word, size_t begin, size_t length,
                                 int32_t left_id, int32_t right_id) const;
  std::optional<int32_t> IdOfBytes(std::string_view bytes) const;

  std::string kind_;
  PreTokenizer pre_tokenizer_;
  MergeRule merge_rule_ = MergeRule::kMergeList;
  bool whole_word_lookup_ = false;
  std::optional<int32_t> unk_id_;
  std::string arena_;              // every token's bytes, back to back
  std::vector<uint32_t> offsets_;  // [model_vocab_size + 1] token id -> start in arena_
  FlatHashMap<std::string_view, int32_t> id_by_bytes_;  // views into arena_; lowest id wins
  std::array<int32_t, 256> byte_ids_{};                 // -1 where a byte has no token
  // (left id << 32 | right id) -> merge; all ones marks a free slot (ids are never negative).
  FlatHashMap<uint64_t, Merge, MixHash> merges_{~uint64_t{0}};
};

// GPT-2's reversible mapping of bytes to printable code points, as tokenizer.json writes tokens.
std::string BytesToUnicode(std::string_view bytes);
// The inverse; nullopt when `text` has a character outside the 256 that bytes map to.
std::optional<std::string> UnicodeToBytes(std::string_view text);

}  // namespace sieve
