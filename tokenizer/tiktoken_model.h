// Meta's tiktoken `tokenizer.model` (Llama 3): one "<base64 token bytes> <rank>" line per token.
//
// The file holds only the mergeable ranks. Like Meta's llama3 `tokenizer.py`, the tokenizer adds
// the Llama 3 split regex and 256 special tokens right after the ranks (`<|begin_of_text|>` first),
// with BOS `<|begin_of_text|>`, EOS `<|end_of_text|>` and the Llama 3 chat format (whose
// `<|eot_id|>` the loader adds as a second EOS).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "tokenizer/tokenizer.h"

namespace sieve {

// True when the first line has the "<base64> <rank>" shape (the SentencePiece protobuf never does).
bool LooksLikeTiktokenModel(std::string_view contents);

// DataLoss for a malformed line (naming its number), a duplicate rank or an empty file.
Result<std::unique_ptr<Tokenizer>> ParseTiktokenModel(std::string_view contents);

// The 256 special tokens Meta's llama3 tokenizer.py places after the ranks, in id order.
std::vector<std::string> MetaLlama3SpecialTokens();

}  // namespace sieve
