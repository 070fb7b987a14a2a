// SentencePieceBpe: the BPE algorithm of SentencePiece models (Llama 2, Mistral), as the
// sentencepiece library (and llama.cpp's llm_tokenizer_spm) run it.
//
// Each stretch of text is normalised (optional whitespace cleanup, a dummy-prefix space, spaces
// written as "▁"), split into characters (user-defined pieces stay whole), and then the adjacent
// pair whose concatenation is a piece with the highest score merges, leftmost first on ties,
// until none can. A character with no piece becomes its UTF-8 bytes as `<0xXX>` pieces (byte
// fallback) or the unknown piece. Control pieces (`<s>`, `</s>`) and the unknown piece are special
// added tokens, so their text in a prompt maps to their ids. Unigram models are not supported.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "tokenizer/sentencepiece_model.h"
#include "tokenizer/tokenizer.h"

namespace sieve {

class SentencePieceBpe final : public Tokenizer {
 public:
  // UnimplementedError for a non-BPE model type or a normalizer Sieve cannot apply; DataLoss for
  // inconsistent special ids.
  static Result<std::unique_ptr<SentencePieceBpe>> Create(const SentencePieceModel& model);

  std::string_view kind() const override { return "sentencepiece"; }

 protected:
  Status EncodeText(std::string_view text, std::vector<int32_t>& ids) const override;
  std::string_view ModelTokenBytes(int32_t id) const override;
  int32_t model_vocab_size() const override { return static_cast<int32_t>(types_.size()); }
  std::optional<int32_t> ModelPieceToId(std::string_view piece) const override;

 private:
  SentencePieceBpe() = default;
  std::string Normalize(std::string_view text) const;
  void Resegment(std::string_view piece,
                 const std::unordered_map<std::string_view,
                                          std::pair<std::string_view, std::string_view>>& rev_merge,
                 std::vector<int32_t>& ids) const;
  void EmitUnknown(std::string_view piece, std::vector<int32_t>& ids) const;

  std::vector<std::string> pieces_;                   // [vocab_size] piece text as in the model
  std::vector<std::string> bytes_;                    // [vocab_size] what each id decodes to
  std::vector<float> scores_;                         // [vocab_size]
  std::vector<SentencePieceModel::PieceType> types_;  // [vocab_size]
  std::unordered_map<std::string_view, int32_t> id_of_piece_;  // every piece (views into pieces_)
  // Normal, user-defined and unused pieces: the ones merges may form (sentencepiece's pieces_).
  std::unordered_map<std::string_view, int32_t> mergeable_;
  std::vector<std::string_view> user_defined_;  // matched whole, longest first
  std::array<int32_t, 256> byte_ids_{};         // <0xXX> piece ids; -1 where missing
  bool byte_fallback_ = false;
  int32_t unk_id_ = 0;
  bool add_dummy_prefix_ = true;
  bool remove_extra_whitespaces_ = true;
  bool escape_whitespaces_ = true;
};

}  // namespace sieve
