// Fuzzes the three vocabulary formats tokenizer/ reads: a Hugging Face `tokenizer.json`
// (ParseHfTokenizerJson), Meta's tiktoken `tokenizer.model` (ParseTiktokenModel) and a
// SentencePiece `tokenizer.model` protobuf (ParseSentencePieceModel + SentencePieceBpe::Create).
// Every input goes to all three, as LoadTokenizer may hand any file to any of them; a tokenizer
// that loads is then used (tokenizer_checks.h), with the input's first bytes as the text.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

#include "core/check.h"
#include "fuzz/tokenizer_checks.h"
#include "tokenizer/hf_tokenizer_json.h"
#include "tokenizer/sentencepiece_bpe.h"
#include "tokenizer/sentencepiece_model.h"
#include "tokenizer/tiktoken_model.h"

namespace {

void Use(const sieve::Result<std::unique_ptr<sieve::Tokenizer>>& tokenizer, std::string_view text) {
  if (!tokenizer.ok()) {
    SIEVE_CHECK(!tokenizer.status().message().empty());
    return;
  }
  sieve::fuzz::Exercise(**tokenizer, text.substr(0, 256));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view contents(reinterpret_cast<const char*>(data), size);
  Use(sieve::ParseHfTokenizerJson(contents), contents);
  (void)sieve::LooksLikeTiktokenModel(contents);
  Use(sieve::ParseTiktokenModel(contents), contents);
  const sieve::Result<sieve::SentencePieceModel> model = sieve::ParseSentencePieceModel(contents);
  if (model.ok()) {
    sieve::Result<std::unique_ptr<sieve::SentencePieceBpe>> bpe =
        sieve::SentencePieceBpe::Create(*model);
    if (bpe.ok()) {
      Use(std::unique_ptr<sieve::Tokenizer>(std::move(bpe).value()), contents);
    } else {
      SIEVE_CHECK(!bpe.status().message().empty());
    }
  }
  return 0;
}
