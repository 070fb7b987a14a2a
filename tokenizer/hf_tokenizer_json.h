// Hugging Face `tokenizer.json` files with a byte-level BPE model (GPT-2, Llama 3, Qwen-style
// vocabularies without a normalizer).
//
// Read: model BPE (vocab, merges as "a b" strings or [a, b] arrays, ignore_merges, unk_token),
// added_tokens, pre_tokenizer Split / ByteLevel / Sequence of them, decoder ByteLevel, and
// post_processor TemplateProcessing / ByteLevel / Sequence for BOS. Anything else (WordPiece or
// Unigram models, normalizers, SentencePiece-style Metaspace files, unknown pre-tokenizers) is an
// UnimplementedError that names what was found; malformed JSON is DataLoss.
//
// A file that carries Meta's Llama 3 vocabulary (128,000 ranks, BOS `<|begin_of_text|>` = 128000)
// but lists no added tokens is completed with Meta's 256 special tokens and EOS `<|end_of_text|>`,
// so that it behaves as the tiktoken `tokenizer.model` it was converted from.
#pragma once

#include <memory>
#include <string_view>

#include "core/status.h"
#include "tokenizer/tokenizer.h"

namespace sieve {

Result<std::unique_ptr<Tokenizer>> ParseHfTokenizerJson(std::string_view json_text);

}  // namespace sieve
