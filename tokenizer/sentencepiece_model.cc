#include "tokenizer/sentencepiece_model.h"

#include <cstring>
#include <optional>

namespace sieve {
namespace {

enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

// One field of a protobuf message: its number, wire type and payload.
struct Field {
  uint32_t number = 0;
  uint32_t wire_type = 0;
  uint64_t varint = 0;     // kVarint, kFixed64, kFixed32
  std::string_view bytes;  // kLengthDelimited
};

// Reads the fields of one message in order.
class WireReader {
 public:
  explicit WireReader(std::string_view data) : data_(data) {}

  bool done() const { return offset_ >= data_.size(); }

  Result<Field> Next() {
    Field field;
    SIEVE_ASSIGN_OR_RETURN(const uint64_t tag, ReadVarint());
    field.number = static_cast<uint32_t>(tag >> 3);
    field.wire_type = static_cast<uint32_t>(tag & 7);
    if (field.number == 0) return Corrupt("field number 0");
    switch (field.wire_type) {
      case kVarint: {
        SIEVE_ASSIGN_OR_RETURN(field.varint, ReadVarint());
        break;
      }
      case kFixed64:
      case kFixed32: {
        const size_t size = field.wire_type == kFixed64 ? 8 : 4;
        if (data_.size() - offset_ < size) return Corrupt("truncated fixed-width field");
        uint64_t value = 0;
        std::memcpy(&value, data_.data() + offset_, size);  // little-endian host
        field.varint = value;
        offset_ += size;
        break;
      }
      case kLengthDelimited: {
        SIEVE_ASSIGN_OR_RETURN(const uint64_t length, ReadVarint());
        if (length > data_.size() - offset_) return Corrupt("truncated length-delimited field");
        field.bytes = data_.substr(offset_, static_cast<size_t>(length));
        offset_ += static_cast<size_t>(length);
        break;
      }
      default:
        return Corrupt("unsupported wire type " + std::to_string(field.wire_type));
    }
    return field;
  }

 private:
  Result<uint64_t> ReadVarint() {
    uint64_t value = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (offset_ >= data_.size()) return Corrupt("truncated varint");
      const auto byte = static_cast<uint8_t>(data_[offset_++]);
      value |= static_cast<uint64_t>(byte & 0x7f) << shift;
      if ((byte & 0x80) == 0) return value;
    }
    return Corrupt("varint longer than 10 bytes");
  }

  Status Corrupt(const std::string& what) const {
    return DataLossError("SentencePiece tokenizer.model is corrupt: " + what + " at byte " +
                         std::to_string(offset_));
  }

  std::string_view data_;
  size_t offset_ = 0;
};

float AsFloat(uint64_t bits) {
  const auto narrow = static_cast<uint32_t>(bits);
  float value;
  std::memcpy(&value, &narrow, sizeof(value));
  return value;
}

// int32 fields hold negative numbers as 64-bit two's complement varints.
int32_t AsInt32(uint64_t varint) { return static_cast<int32_t>(static_cast<int64_t>(varint)); }

Status ExpectWireType(const Field& field, uint32_t wire_type, std::string_view name) {
  if (field.wire_type == wire_type) return Status::Ok();
  return DataLossError("SentencePiece tokenizer.model is corrupt: field " + std::string(name) +
                       " has wire type " + std::to_string(field.wire_type));
}

Result<SentencePieceModel::Piece> ParsePiece(std::string_view bytes) {
  SentencePieceModel::Piece piece;
  WireReader reader(bytes);
  while (!reader.done()) {
    SIEVE_ASSIGN_OR_RETURN(const Field field, reader.Next());
    if (field.number == 1) {
      SIEVE_RETURN_IF_ERROR(ExpectWireType(field, kLengthDelimited, "piece"));
      piece.text = std::string(field.bytes);
    } else if (field.number == 2) {
      SIEVE_RETURN_IF_ERROR(ExpectWireType(field, kFixed32, "score"));
      piece.score = AsFloat(field.varint);
    } else if (field.number == 3) {
      SIEVE_RETURN_IF_ERROR(ExpectWireType(field, kVarint, "type"));
      const int32_t type = AsInt32(field.varint);
      if (type < 1 || type > 6) {
        return DataLossError("SentencePiece piece has unknown type " + std::to_string(type));
      }
      piece.type = static_cast<SentencePieceModel::PieceType>(type);
    }
  }
  return piece;
}

Status ParseTrainerSpec(std::string_view bytes, SentencePieceModel& model) {
  WireReader reader(bytes);
  while (!reader.done()) {
    SIEVE_ASSIGN_OR_RETURN(const Field field, reader.Next());
    if (field.wire_type != kVarint) continue;
    const int32_t value = AsInt32(field.varint);
    switch (field.number) {
      case 3:
        model.model_type = static_cast<SentencePieceModel::ModelType>(value);
        break;
      case 24:
        model.treat_whitespace_as_suffix = value != 0;
        break;
      case 35:
        model.byte_fallback = value != 0;
        break;
      case 40:
        model.unk_id = value;
        break;
      case 41:
        model.bos_id = value;
        break;
      case 42:
        model.eos_id = value;
        break;
      case 43:
        model.pad_id = value;
        break;
      default:
        break;
    }
  }
  return Status::Ok();
}

Status ParseNormalizerSpec(std::string_view bytes, SentencePieceModel& model) {
  WireReader reader(bytes);
  while (!reader.done()) {
    SIEVE_ASSIGN_OR_RETURN(const Field field, reader.Next());
    if (field.number == 1 && field.wire_type == kLengthDelimited) {
      model.normalizer_name = std::string(field.bytes);
    } else if (field.number == 2 && field.wire_type == kLengthDelimited) {
      model.has_precompiled_charsmap = !field.bytes.empty();
    } else if (field.wire_type == kVarint) {
      if (field.number == 3) model.add_dummy_prefix = field.varint != 0;
      if (field.number == 4) model.remove_extra_whitespaces = field.varint != 0;
      if (field.number == 5) model.escape_whitespaces = field.varint != 0;
    }
  }
  return Status::Ok();
}

}  // namespace

std::string_view ModelTypeName(SentencePieceModel::ModelType type) {
  switch (type) {
    case SentencePieceModel::ModelType::kUnigram:
      return "UNIGRAM";
    case SentencePieceModel::ModelType::kBpe:
      return "BPE";
    case SentencePieceModel::ModelType::kWord:
      return "WORD";
    case SentencePieceModel::ModelType::kChar:
      return "CHAR";
  }
  return "UNKNOWN";
}

Result<SentencePieceModel> ParseSentencePieceModel(std::string_view bytes) {
  SentencePieceModel model;
  WireReader reader(bytes);
  while (!reader.done()) {
    SIEVE_ASSIGN_OR_RETURN(const Field field, reader.Next());
    if (field.wire_type != kLengthDelimited) continue;
    if (field.number == 1) {
      SIEVE_ASSIGN_OR_RETURN(SentencePieceModel::Piece piece, ParsePiece(field.bytes));
      model.pieces.push_back(std::move(piece));
    } else if (field.number == 2) {
      SIEVE_RETURN_IF_ERROR(ParseTrainerSpec(field.bytes, model));
    } else if (field.number == 3) {
      SIEVE_RETURN_IF_ERROR(ParseNormalizerSpec(field.bytes, model));
    }
  }
  if (model.pieces.empty()) return DataLossError("SentencePiece tokenizer.model has no pieces");
  return model;
}

}  // namespace sieve
