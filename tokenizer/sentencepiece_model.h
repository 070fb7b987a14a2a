// SentencePieceModel: the fields of a SentencePiece `tokenizer.model` (a protobuf ModelProto) that
// encoding and decoding need, read straight from the protobuf wire format so that Sieve does not
// depend on protobuf. Unknown fields are skipped, as protobuf does.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace sieve {

struct SentencePieceModel {
  // ModelProto.SentencePiece.Type.
  enum class PieceType : int32_t {
    kNormal = 1,
    kUnknown = 2,
    kControl = 3,
    kUserDefined = 4,
    kUnused = 5,
    kByte = 6,
  };
  // TrainerSpec.ModelType.
  enum class ModelType : int32_t { kUnigram = 1, kBpe = 2, kWord = 3, kChar = 4 };

  struct Piece {
    std::string text;
    float score = 0.0f;
    PieceType type = PieceType::kNormal;
  };

  std::vector<Piece> pieces;  // [vocab_size], index = id

  // TrainerSpec (defaults as in sentencepiece_model.proto).
  ModelType model_type = ModelType::kUnigram;
  bool byte_fallback = false;
  bool treat_whitespace_as_suffix = false;
  int32_t unk_id = 0;
  int32_t bos_id = 1;  // -1: none
  int32_t eos_id = 2;  // -1: none
  int32_t pad_id = -1;

  // NormalizerSpec.
  std::string normalizer_name;
  bool has_precompiled_charsmap = false;
  bool add_dummy_prefix = true;
  bool remove_extra_whitespaces = true;
  bool escape_whitespaces = true;
};

std::string_view ModelTypeName(SentencePieceModel::ModelType type);

// DataLoss for a truncated or malformed message.
Result<SentencePieceModel> ParseSentencePieceModel(std::string_view bytes);

}  // namespace sieve
