// Fuzzes the chat templates (tokenizer/chat_template.h). Sieve runs no Jinja: FromJinja
// recognises a `chat_template` by its signature, and Apply renders the recognised format in C++.
// Each input is split (FuzzedDataProvider) into a template text and a conversation of up to 8
// messages with arbitrary roles and contents; the conversation is rendered with the recognised
// template (if any) and with each named one. Checked: no crash; valid UTF-8 contents render to
// valid UTF-8 that starts with the format's BOS text and that the tokenizer encodes.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/utf8.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer_loader.h"

namespace {

const sieve::Tokenizer& EmbeddedTokenizer() {
  static const std::unique_ptr<sieve::Tokenizer> tokenizer = sieve::MakeEmbeddedByteTokenizer();
  return *tokenizer;
}

void Render(const sieve::ChatTemplate& chat_template,
            const std::vector<sieve::ChatMessage>& messages, bool add_generation_prompt,
            bool valid_utf8) {
  const sieve::Result<std::string> text = chat_template.Apply(messages, add_generation_prompt);
  if (!text.ok()) {
    SIEVE_CHECK(text.status().code() == sieve::StatusCode::kInvalidArgument)
        << text.status().ToString();
    return;
  }
  const std::string_view bos =
      chat_template.kind() == sieve::ChatTemplate::Kind::kLlama3 ? "<|begin_of_text|>" : "<s>";
  SIEVE_CHECK(std::string_view(*text).starts_with(bos)) << *text;
  if (!valid_utf8) return;
  SIEVE_CHECK(sieve::IsValidUtf8(*text)) << "valid contents rendered to invalid UTF-8";
  SIEVE_CHECK(EmbeddedTokenizer().Encode(*text, /*add_bos=*/false).ok());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider provider(data, size);
  const std::string jinja = provider.ConsumeRandomLengthString(4096);
  const bool add_generation_prompt = provider.ConsumeBool();
  std::vector<sieve::ChatMessage> messages;
  bool valid_utf8 = true;
  const size_t num_messages = provider.ConsumeIntegralInRange<size_t>(0, 8);
  for (size_t index = 0; index < num_messages && provider.remaining_bytes() > 0; ++index) {
    static const char* const kRoles[] = {"system", "user", "assistant", "user", "assistant"};
    std::string role = provider.ConsumeBool()
                           ? std::string(kRoles[provider.ConsumeIntegralInRange<size_t>(0, 4)])
                           : provider.ConsumeRandomLengthString(16);
    std::string content = provider.ConsumeRandomLengthString(1024);
    valid_utf8 = valid_utf8 && sieve::IsValidUtf8(content);
    messages.push_back(sieve::ChatMessage{std::move(role), std::move(content)});
  }
  const sieve::Result<sieve::ChatTemplate> recognised = sieve::ChatTemplate::FromJinja(jinja);
  if (recognised.ok()) {
    Render(*recognised, messages, add_generation_prompt, valid_utf8);
  } else {
    SIEVE_CHECK(recognised.status().code() == sieve::StatusCode::kUnimplemented);
  }
  for (const char* name : {"llama3", "llama2", "mistral"}) {
    Render(*sieve::ChatTemplate::FromName(name), messages, add_generation_prompt, valid_utf8);
  }
  return 0;
}
