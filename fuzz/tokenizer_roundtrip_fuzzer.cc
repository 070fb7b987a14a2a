// Fuzzes the tokenizers on arbitrary bytes: Encode never crashes and fails exactly on invalid
// UTF-8; byte-level BPE round-trips, Decode(Encode(x)) == x, for every valid UTF-8 x; and the
// input read as token ids decodes (Decode == StreamingDecoder, valid UTF-8) whatever the ids.
// Four tokenizers: the default model's (models/sieve-tiny-10m/tokenizer.json, byte-level BPE with
// merges), the embedded byte tokenizer, and a tiktoken and a SentencePiece model built here.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/check.h"
#include "core/fixtures.h"
#include "core/utf8.h"
#include "fuzz/tokenizer_checks.h"
#include "tokenizer/sentencepiece_bpe.h"
#include "tokenizer/sentencepiece_model.h"
#include "tokenizer/tiktoken_model.h"
#include "tokenizer/tokenizer_loader.h"

namespace {

using sieve::Tokenizer;

// Tokens beyond the 256 single bytes, for the built tiktoken and SentencePiece vocabularies.
constexpr const char* kWords[] = {"he",  "ll",          "llo",  "hello", " w",  "or",
                                  "ld",  " world",      "  ",   "\n\n",  "in",  "ing",
                                  "th",  "the",         " the", "12",    "123", "\xc3\xa9",
                                  "caf", "caf\xc3\xa9", "<s",   "s>",    "<|",  "|>"};

std::string Base64(std::string_view bytes) {
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  size_t index = 0;
  for (; index + 2 < bytes.size(); index += 3) {
    const uint32_t group = (static_cast<uint8_t>(bytes[index]) << 16) |
                           (static_cast<uint8_t>(bytes[index + 1]) << 8) |
                           static_cast<uint8_t>(bytes[index + 2]);
    for (const int shift : {18, 12, 6, 0}) out += kAlphabet[(group >> shift) & 63];
  }
  const size_t rest = bytes.size() - index;
  if (rest > 0) {
    uint32_t group = static_cast<uint8_t>(bytes[index]) << 16;
    if (rest == 2) group |= static_cast<uint8_t>(bytes[index + 1]) << 8;
    out += kAlphabet[(group >> 18) & 63];
    out += kAlphabet[(group >> 12) & 63];
    out += rest == 2 ? kAlphabet[(group >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

std::unique_ptr<Tokenizer> MakeTiktoken() {
  std::string contents;
  int rank = 0;
  for (int byte = 0; byte < 256; ++byte) {
    contents +=
        Base64(std::string(1, static_cast<char>(byte))) + " " + std::to_string(rank++) + "\n";
  }
  for (const char* word : kWords) contents += Base64(word) + " " + std::to_string(rank++) + "\n";
  sieve::Result<std::unique_ptr<Tokenizer>> tokenizer = sieve::ParseTiktokenModel(contents);
  SIEVE_CHECK(tokenizer.ok()) << tokenizer.status().ToString();
  return std::move(tokenizer).value();
}

// Protobuf wire format, just what a SentencePiece ModelProto needs.
void Varint(uint64_t value, std::string& out) {
  while (value >= 0x80) {
    out += static_cast<char>((value & 0x7f) | 0x80);
    value >>= 7;
  }
  out += static_cast<char>(value);
}
void VarintField(uint32_t number, uint64_t value, std::string& out) {
  Varint(number << 3, out);
  Varint(value, out);
}
void BytesField(uint32_t number, std::string_view bytes, std::string& out) {
  Varint((number << 3) | 2, out);
  Varint(bytes.size(), out);
  out += bytes;
}
std::string Piece(std::string_view text, float score, int type) {
  std::string piece;
  BytesField(1, text, piece);
  Varint((2 << 3) | 5, piece);
  char bits[4];
  std::memcpy(bits, &score, sizeof(bits));
  piece.append(bits, sizeof(bits));
  VarintField(3, static_cast<uint64_t>(type), piece);
  return piece;
}

// BPE with byte fallback, no whitespace normalisation (so that only U+2581 and the control
// pieces' texts keep a text from round-tripping).
std::unique_ptr<Tokenizer> MakeSentencePiece() {
  std::string model;
  BytesField(1, Piece("<unk>", 0.0f, 2), model);
  BytesField(1, Piece("<s>", 0.0f, 3), model);
  BytesField(1, Piece("</s>", 0.0f, 3), model);
  for (int byte = 0; byte < 256; ++byte) {
    char text[7];
    std::snprintf(text, sizeof(text), "<0x%02X>", byte);
    BytesField(1, Piece(text, 0.0f, 6), model);
  }
  float score = -1.0f;
  for (const char* single :
       {"\xe2\x96\x81", "h", "e", "l", "o", "w", "r", "d", "t", "i", "n", "g"}) {
    BytesField(1, Piece(single, score, 1), model);
  }
  for (std::string word : kWords) {
    std::string piece;
    for (const char c : word) piece += c == ' ' ? std::string("\xe2\x96\x81") : std::string(1, c);
    if (word == "he" || word == "ll" || word == "llo" || word == "hello" || word == "or" ||
        word == "ld" || word == "in" || word == "ing" || word == "th" || word == "the") {
      BytesField(1, Piece(piece, score -= 0.5f, 1), model);
    }
  }
  BytesField(1, Piece("\xe2\x96\x81h", score -= 0.5f, 1), model);
  BytesField(1, Piece("\xe2\x96\x81hello", score -= 0.5f, 1), model);
  std::string trainer;
  VarintField(3, 2, trainer);   // model_type BPE
  VarintField(35, 1, trainer);  // byte_fallback
  VarintField(40, 0, trainer);  // unk_id
  VarintField(41, 1, trainer);  // bos_id
  VarintField(42, 2, trainer);  // eos_id
  BytesField(2, trainer, model);
  std::string normalizer;
  BytesField(1, "identity", normalizer);
  VarintField(3, 1, normalizer);  // add_dummy_prefix
  VarintField(4, 0, normalizer);  // remove_extra_whitespaces
  VarintField(5, 1, normalizer);  // escape_whitespaces
  BytesField(3, normalizer, model);
  const sieve::Result<sieve::SentencePieceModel> parsed = sieve::ParseSentencePieceModel(model);
  SIEVE_CHECK(parsed.ok()) << parsed.status().ToString();
  sieve::Result<std::unique_ptr<sieve::SentencePieceBpe>> bpe =
      sieve::SentencePieceBpe::Create(*parsed);
  SIEVE_CHECK(bpe.ok()) << bpe.status().ToString();
  return std::move(bpe).value();
}

struct Tokenizers {
  std::unique_ptr<Tokenizer> default_model;
  std::unique_ptr<Tokenizer> embedded = sieve::MakeEmbeddedByteTokenizer();
  std::unique_ptr<Tokenizer> tiktoken = MakeTiktoken();
  std::unique_ptr<Tokenizer> sentencepiece = MakeSentencePiece();

  Tokenizers() {
    const std::string dir = sieve::ProjectSourceDir() + "/models/sieve-tiny-10m";
    sieve::Result<std::unique_ptr<Tokenizer>> loaded = sieve::LoadTokenizer(dir);
    SIEVE_CHECK(loaded.ok()) << loaded.status().ToString();
    default_model = std::move(loaded).value();
  }
};

const Tokenizers& All() {
  static const Tokenizers tokenizers;
  return tokenizers;
}

void CheckRoundTrip(const Tokenizer& tokenizer, std::string_view text, bool exact) {
  for (const bool ordinary : {false, true}) {
    const std::optional<std::vector<int32_t>> ids =
        sieve::fuzz::CheckEncode(tokenizer, text, /*add_bos=*/false, ordinary);
    if (!ids) return;
    sieve::fuzz::CheckDecode(tokenizer, *ids);
    if (exact) {
      const std::string decoded = tokenizer.Decode(*ids, /*skip_special_tokens=*/false);
      SIEVE_CHECK(decoded == text) << tokenizer.kind() << " decoded '" << decoded << "'";
    }
  }
}

bool Contains(std::string_view text, std::string_view needle) {
  return text.find(needle) != std::string_view::npos;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  (void)All();  // loads before the first input: its time is not an input's
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const Tokenizers& tokenizers = All();
  CheckRoundTrip(*tokenizers.default_model, text, /*exact=*/true);
  CheckRoundTrip(*tokenizers.embedded, text, /*exact=*/true);
  CheckRoundTrip(*tokenizers.tiktoken, text, /*exact=*/true);
  // SentencePiece decodes U+2581 as a space and its control pieces' texts as pieces with a space
  // after them (as sentencepiece does); other text round-trips.
  const bool sentencepiece_exact = !Contains(text, "\xe2\x96\x81") && !Contains(text, "<unk>") &&
                                   !Contains(text, "<s>") && !Contains(text, "</s>");
  CheckRoundTrip(*tokenizers.sentencepiece, text, sentencepiece_exact);

  // The same bytes as token ids: some raw (negative, huge), most folded into the vocabulary.
  std::vector<int32_t> ids(size / 4);
  if (!ids.empty()) std::memcpy(ids.data(), data, ids.size() * 4);
  for (const Tokenizer* tokenizer : {tokenizers.default_model.get(), tokenizers.embedded.get(),
                                     tokenizers.tiktoken.get(), tokenizers.sentencepiece.get()}) {
    std::vector<int32_t> folded = ids;
    for (size_t index = 0; index < folded.size(); ++index) {
      if (index % 4 != 3) {
        folded[index] = static_cast<int32_t>(static_cast<uint32_t>(folded[index]) %
                                             static_cast<uint32_t>(tokenizer->vocab_size() + 2));
      }
    }
    sieve::fuzz::CheckDecode(*tokenizer, folded);
  }
  return 0;
}
