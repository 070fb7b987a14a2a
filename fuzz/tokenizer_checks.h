// The invariants of tokenizer.h, checked by every fuzz target that ends up with a Tokenizer: any
// ids decode to valid UTF-8, a StreamingDecoder gives exactly Decode's text, and Encode fails
// exactly on invalid UTF-8 and otherwise returns ids of the vocabulary. A broken invariant is a
// SIEVE_CHECK failure, which libFuzzer reports as a crash with the input that broke it.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/check.h"
#include "core/utf8.h"
#include "tokenizer/streaming_decoder.h"
#include "tokenizer/tokenizer.h"

namespace sieve::fuzz {

inline void CheckDecode(const Tokenizer& tokenizer, std::span<const int32_t> ids) {
  for (const bool skip_special_tokens : {false, true}) {
    const std::string text = tokenizer.Decode(ids, skip_special_tokens);
    SIEVE_CHECK(IsValidUtf8(text)) << "Decode gave invalid UTF-8";
    StreamingDecoder decoder(tokenizer, skip_special_tokens);
    std::string streamed;
    for (const int32_t id : ids) streamed += decoder.Push(id);
    streamed += decoder.Flush();
    SIEVE_CHECK(streamed == text) << "StreamingDecoder gave '" << streamed << "', Decode '" << text
                                  << "'";
  }
}

// The ids of `text`, or nullopt when it is not valid UTF-8 (and Encode said so).
inline std::optional<std::vector<int32_t>> CheckEncode(const Tokenizer& tokenizer,
                                                       std::string_view text, bool add_bos,
                                                       bool ordinary) {
  const Result<std::vector<int32_t>> ids =
      ordinary ? tokenizer.EncodeOrdinary(text, add_bos) : tokenizer.Encode(text, add_bos);
  if (!IsValidUtf8(text)) {
    SIEVE_CHECK(!ids.ok() && ids.status().code() == StatusCode::kInvalidArgument)
        << "invalid UTF-8 was encoded";
    return std::nullopt;
  }
  SIEVE_CHECK(ids.ok()) << ids.status().ToString();
  const int32_t vocab_size = tokenizer.vocab_size();
  for (const int32_t id : *ids) SIEVE_CHECK(id >= 0 && id < vocab_size) << "id " << id;
  if (add_bos && tokenizer.add_bos()) {
    SIEVE_CHECK(!ids->empty() && ids->front() == *tokenizer.bos_id());
  }
  return *ids;
}

// Runs a freshly loaded tokenizer over a fixed text with special tokens, and over `text`.
inline void Exercise(const Tokenizer& tokenizer, std::string_view text) {
  constexpr std::string_view kSample =
      "<|begin_of_text|>Hello, world! <s>[INST] 12345 caf\xc3\xa9 \xe2\x96\x81\xf0\x9f\x98\x80 "
      "</s>  \n\n<|eot_id|>";
  for (const std::string_view input : {kSample, text}) {
    for (const bool ordinary : {false, true}) {
      const std::optional<std::vector<int32_t>> ids =
          CheckEncode(tokenizer, input, /*add_bos=*/true, ordinary);
      if (ids) CheckDecode(tokenizer, *ids);
    }
  }
  for (const int32_t id : {-1, 0, 1, tokenizer.vocab_size() - 1, tokenizer.vocab_size()}) {
    (void)tokenizer.TokenBytes(id);
    (void)tokenizer.IsSpecial(id);
  }
  (void)tokenizer.TokenToId(text);
  if (const ChatTemplate* chat_template = tokenizer.chat_template()) {
    const ChatMessage messages[] = {{"system", "Be brief."}, {"user", std::string(text)}};
    (void)chat_template->Apply(messages, /*add_generation_prompt=*/true);
  }
}

}  // namespace sieve::fuzz
