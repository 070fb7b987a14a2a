// ChatTemplate: turns a conversation into the prompt text a chat model was trained on.
//
// Sieve does not run Jinja. It recognises the chat templates of the model families it serves by
// their signature in `tokenizer_config.json` and renders each in C++ to exactly the text the
// Hugging Face Jinja template produces for the same messages (including its trims and its
// errors). An unrecognised template is an UnimplementedError, never a guess; `FromName` lets a
// user override detection (`--chat-template llama3`).
//
// The rendered text begins with the BOS token's text (`<|begin_of_text|>`, `<s>`), so encode it
// with `Tokenizer::Encode(text, /*add_bos=*/false)`: the tokenizer recognises special-token text,
// including SentencePiece's `<s>`/`</s>` control pieces, and maps it to the BOS/EOS ids.
#pragma once

#include <span>
#include <string>
#include <string_view>

#include "core/status.h"

namespace sieve {

struct ChatMessage {
  std::string role;  // "system", "user" or "assistant"
  std::string content;
};

class ChatTemplate {
 public:
  enum class Kind {
    kLlama3,   // <|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|>
    kLlama2,   // <s>[INST] <<SYS>>\n...\n<</SYS>>\n\nuser [/INST] assistant </s>
    kMistral,  // <s>[INST] user [/INST]assistant</s>
  };

  // "llama3", "llama2" or "mistral"; anything else is InvalidArgument listing those.
  static Result<ChatTemplate> FromName(std::string_view name);
  // Recognises a Jinja `chat_template` by its signature; UnimplementedError quoting its start when
  // it is none of the supported kinds (e.g. Llama 3.1's tool-calling template).
  static Result<ChatTemplate> FromJinja(std::string_view jinja);

  explicit ChatTemplate(Kind kind) : kind_(kind) {}

  Kind kind() const { return kind_; }
  std::string_view name() const;

  // Renders `messages`. Roles must be system, user or assistant. Llama 2 and Mistral take an
  // optional leading system message, then strictly alternating user/assistant turns (their
  // templates raise otherwise). `add_generation_prompt` opens an assistant turn where the format
  // has one (Llama 3); Llama 2 and Mistral prompts already end ready for the answer.
  Result<std::string> Apply(std::span<const ChatMessage> messages,
                            bool add_generation_prompt) const;

 private:
  Result<std::string> ApplyLlama3(std::span<const ChatMessage> messages,
                                  bool add_generation_prompt) const;
  Result<std::string> ApplyInst(std::span<const ChatMessage> messages) const;

  Kind kind_;
};

}  // namespace sieve
