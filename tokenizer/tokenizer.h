// Tokenizer: text <-> token ids for the models Sieve serves.
//
// One interface over three vocabulary formats: byte-level BPE from a Hugging Face
// `tokenizer.json` (kind "bpe"), Meta's tiktoken `tokenizer.model` (kind "tiktoken") and
// SentencePiece BPE `tokenizer.model` (kind "sentencepiece"); `LoadTokenizer`
// (tokenizer_loader.h) picks one. Encoding runs in two stages, as Hugging Face tokenizers does:
// added tokens (specials such as `<|eot_id|>` or `<s>`) are cut out of the text first, leftmost and
// longest first, then each remaining stretch goes through the model's own algorithm.
//
// Decoding works on bytes: every id stands for a byte string (`TokenBytes`) that may be an
// incomplete UTF-8 sequence; `Decode` joins them and only then replaces invalid UTF-8 with U+FFFD,
// one per invalid byte. `StreamingDecoder` gives the same text token by token.
//
// A Tokenizer is configured by its loader (and the model loader, which adds generation_config's
// EOS ids) and then only read: every const method is safe to call from many threads.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "tokenizer/chat_template.h"

namespace sieve {

// A string recognised as one token wherever it appears in the text, before the model's algorithm
// runs: Hugging Face's "added tokens" (BOS/EOS, chat markers, SentencePiece control pieces).
struct AddedToken {
  std::string content;
  int32_t id = 0;
  bool special = true;  // skipped by Decode(skip_special_tokens) and by EncodeOrdinary
  bool lstrip = false;  // the match also takes the whitespace before it
  bool rstrip = false;  // the match also takes the whitespace after it
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Encodes `text` (valid UTF-8, else InvalidArgument naming the byte offset). Special-token text
  // in it becomes those tokens. `add_bos`: prepend BOS when this tokenizer's configuration says the
  // model expects one (HF post-processor / add_bos_token); false never adds it. Chat prompts from
  // ChatTemplate already hold BOS text: encode them with add_bos=false.
  Result<std::vector<int32_t>> Encode(std::string_view text, bool add_bos) const;
  // As Encode, but special-token text is encoded as plain text (tiktoken's encode_ordinary): for
  // untrusted content that must not smuggle in control tokens. Non-special added tokens still
  // match.
  Result<std::vector<int32_t>> EncodeOrdinary(std::string_view text, bool add_bos) const;

  // The bytes token `id` stands for ("" for an id outside the vocabulary). May be incomplete UTF-8.
  std::string TokenBytes(int32_t id) const { return std::string(TokenView(id)); }
  // Joins the tokens' bytes, drops the leading space SentencePiece's dummy prefix put before the
  // first non-empty piece, and replaces invalid UTF-8 with U+FFFD. Ids outside the vocabulary are
  // skipped.
  std::string Decode(std::span<const int32_t> ids, bool skip_special_tokens) const;

  // One more than the largest id (model vocabulary and added tokens).
  int32_t vocab_size() const;
  std::optional<int32_t> bos_id() const { return bos_id_; }
  // Whether Encode(text, true) prepends bos_id().
  bool add_bos() const { return add_bos_ && bos_id_.has_value(); }
  // The tokenizer's own end tokens (its eos_token; Llama 3 chat also <|eot_id|>). The model loader
  // adds generation_config.json's ids with AddEosId.
  const std::vector<int32_t>& eos_ids() const { return eos_ids_; }
  bool IsEos(int32_t id) const;
  // True for added tokens marked special (BOS, EOS, chat markers, control pieces, unk).
  bool IsSpecial(int32_t id) const;
  // The id of a token given as written in its vocabulary: special/added token text, a byte-level
  // BPE piece in GPT-2's byte-to-unicode form ("Ġworld"), or a SentencePiece piece ("▁world").
  std::optional<int32_t> TokenToId(std::string_view token) const;
  // "bpe" (HF tokenizer.json), "tiktoken" or "sentencepiece".
  virtual std::string_view kind() const = 0;
  // Whether Decode drops the first piece's leading space (SentencePiece add_dummy_prefix).
  bool strips_leading_space() const { return strip_leading_space_; }

  // The model's chat format, or null; chat_template_status() then says why (NotFound when the
  // tokenizer has none, Unimplemented for one Sieve does not recognise).
  const ChatTemplate* chat_template() const {
    return chat_template_.has_value() ? &*chat_template_ : nullptr;
  }
  const Status& chat_template_status() const { return chat_template_status_; }
  const std::vector<AddedToken>& added_tokens() const { return added_tokens_; }

  // Configuration, used by the loaders before the tokenizer is shared (not thread-safe).
  //
  // Registers an added token. InvalidArgument for empty content or a negative id; a token whose
  // content or id is already registered is ignored (the vocabulary file wins over later config).
  Status AddAddedToken(AddedToken token);
  void SetBos(std::optional<int32_t> bos_id, bool add_bos);
  void SetEosIds(std::vector<int32_t> eos_ids);
  void AddEosId(int32_t id);
  // A template, or the error that explains why there is none.
  void SetChatTemplate(Result<ChatTemplate> chat_template);

 protected:
  Tokenizer() = default;

  // Appends the ids of `text`: valid UTF-8, free of added tokens, possibly empty.
  virtual Status EncodeText(std::string_view text, std::vector<int32_t>& ids) const = 0;
  // The bytes of a model-vocabulary token ("" when `id` has none). Added tokens are looked up
  // before this is called.
  virtual std::string_view ModelTokenBytes(int32_t id) const = 0;
  virtual int32_t model_vocab_size() const = 0;
  // The model-vocabulary id of `piece` as written in the vocabulary (see TokenToId).
  virtual std::optional<int32_t> ModelPieceToId(std::string_view piece) const = 0;

  void set_strip_leading_space(bool strip) { strip_leading_space_ = strip; }

 private:
  friend class StreamingDecoder;

  Result<std::vector<int32_t>> EncodeImpl(std::string_view text, bool add_bos,
                                          bool match_special) const;
  std::string_view TokenView(int32_t id) const;

  std::vector<AddedToken> added_tokens_;
  std::unordered_map<int32_t, size_t> added_token_by_id_;  // id -> index in added_tokens_
  std::unordered_map<std::string, size_t> added_token_by_content_;
  // Indexes of added tokens by their first byte, longest content first: the leftmost-longest scan.
  std::array<std::vector<size_t>, 256> added_tokens_by_first_byte_;
  int32_t max_added_id_ = -1;

  std::optional<int32_t> bos_id_;
  bool add_bos_ = false;
  std::vector<int32_t> eos_ids_;
  bool strip_leading_space_ = false;
  std::optional<ChatTemplate> chat_template_;
  Status chat_template_status_ = NotFoundError("the tokenizer has no chat template");
};

// `bytes` with every byte that does not start or continue a valid UTF-8 sequence replaced by
// U+FFFD: the one conversion Decode and StreamingDecoder share.
std::string ToValidUtf8(std::string_view bytes);

}  // namespace sieve
