// LoadTokenizer: finds and reads a model's tokenizer; MakeEmbeddedByteTokenizer: the tokenizer of
// Sieve's embedded default model.
//
// A path may be a model directory (tokenizer.json preferred, else tokenizer.model; when the
// tokenizer.json is a kind Sieve does not read, e.g. a SentencePiece-style one, a tokenizer.model
// beside it is used instead), a `*.json` tokenizer file, or a `tokenizer.model` file (tiktoken or
// SentencePiece, told apart by content). A `tokenizer_config.json` beside the file adds what the
// vocabulary file does not say: `chat_template`, `add_bos_token`, `bos_token`, `eos_token` and
// `added_tokens_decoder`. EOS gets `<|eot_id|>` too when the chat template is Llama 3's.
//
// Errors: NotFound (nothing there, with what was looked for), DataLoss (a corrupt file),
// Unimplemented (a tokenizer kind Sieve does not support, named).
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "core/status.h"
#include "tokenizer/tokenizer.h"

namespace sieve {

Result<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& path);

// Applies the text of a `tokenizer_config.json` to a tokenizer its loader is configuring (the
// fields above; LoadTokenizer calls it for the file beside the vocabulary). DataLoss for malformed
// JSON, a field of the wrong shape, or a token that is not in the tokenizer.
Status ApplyTokenizerConfig(std::string_view json_text, Tokenizer& tokenizer);

// Byte-level BPE without merges: id b (0..255) is byte b (written in GPT-2's byte-to-unicode
// alphabet), then <|begin_of_text|> 256 (BOS, added by Encode(text, true)), <|end_of_text|> 257,
// <|start_header_id|> 258, <|end_header_id|> 259, <|eot_id|> 260. EOS {257, 260}, the Llama 3
// split regex and chat template.
std::unique_ptr<Tokenizer> MakeEmbeddedByteTokenizer();

}  // namespace sieve
