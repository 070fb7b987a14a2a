// Fuzzes `tokenizer_config.json` (ApplyTokenizerConfig): added_tokens_decoder, bos_token,
// eos_token, add_bos_token and chat_template applied to the tokenizer of Sieve's embedded default
// model, which is then used (tokenizer_checks.h). A malformed config is a DataLoss Status.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

#include "core/check.h"
#include "fuzz/tokenizer_checks.h"
#include "tokenizer/tokenizer_loader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  // A fresh tokenizer per input: a config changes the one it is applied to.
  const std::unique_ptr<sieve::Tokenizer> tokenizer = sieve::MakeEmbeddedByteTokenizer();
  const sieve::Status status = sieve::ApplyTokenizerConfig(text, *tokenizer);
  if (!status.ok()) {
    SIEVE_CHECK(!status.message().empty());
    return 0;
  }
  if (tokenizer->bos_id()) SIEVE_CHECK(*tokenizer->bos_id() >= 0);
  sieve::fuzz::Exercise(*tokenizer, text.substr(0, 256));
  return 0;
}
