// StreamingDecoder: turns generated ids into text as they arrive.
//
// A token may end inside a multi-byte UTF-8 character (byte-level BPE splits emoji and CJK
// across tokens; SentencePiece byte fallback emits them byte by byte), so Push returns only the
// complete characters so far and holds back an incomplete tail. A held tail that turns out to be
// invalid comes out as U+FFFD, one per byte, exactly as Decode would render it: for any ids,
// the concatenation of every Push and the final Flush equals Decode(ids) with the same
// skip_special_tokens. One decoder per sequence; it references the tokenizer, which must outlive
// it.
#pragma once

#include <cstdint>
#include <string>

#include "tokenizer/tokenizer.h"

namespace sieve {

class StreamingDecoder {
 public:
  // `continuation`: the ids continue a text that came before them (a generated reply after its
  // prompt), so SentencePiece's leading space of the first piece is a real space and is kept.
  StreamingDecoder(const Tokenizer& tokenizer, bool skip_special_tokens, bool continuation = false)
      : tokenizer_(&tokenizer),
        skip_special_tokens_(skip_special_tokens),
        at_start_(!continuation) {}

  // The text that `id` completes; "" while a character is still incomplete.
  std::string Push(int32_t id);
  // Whatever is held back (as U+FFFD) and a reset, so the decoder can start a new sequence.
  std::string Flush();

 private:
  const Tokenizer* tokenizer_;
  bool skip_special_tokens_;
  bool at_start_ = true;  // no non-empty piece yet: SentencePiece's leading space is still due
  std::string pending_;   // bytes of an incomplete trailing UTF-8 sequence (at most 3)
};

}  // namespace sieve
