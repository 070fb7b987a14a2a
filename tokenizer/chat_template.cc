#include "tokenizer/chat_template.h"

#include "core/utf8.h"

namespace sieve {
namespace {

constexpr std::string_view kLlama3Bos = "<|begin_of_text|>";
constexpr std::string_view kInstBos = "<s>";
constexpr std::string_view kInstEos = "</s>";
constexpr std::string_view kAlternationError =
    "conversation roles must alternate user/assistant/user/assistant/... after an optional "
    "leading system message";

// Python's str.isspace() set: what Jinja's `trim` and `.strip()` remove.
bool IsPythonSpace(uint32_t code) {
  return (code >= 0x09 && code <= 0x0d) || (code >= 0x1c && code <= 0x20) || code == 0x85 ||
         code == 0xa0 || code == 0x1680 || (code >= 0x2000 && code <= 0x200a) || code == 0x2028 ||
         code == 0x2029 || code == 0x202f || code == 0x205f || code == 0x3000;
}

std::string_view PythonStrip(std::string_view text) {
  size_t begin = 0;
  while (begin < text.size()) {
    size_t next = begin;
    if (!IsPythonSpace(DecodeUtf8(text, next))) break;
    begin = next;
  }
  size_t end = text.size();
  while (end > begin) {
    // Step back to the start of the last character.
    size_t start = end - 1;
    while (start > begin && (static_cast<uint8_t>(text[start]) & 0xc0) == 0x80) --start;
    size_t next = start;
    if (!IsPythonSpace(DecodeUtf8(text, next))) break;
    end = start;
  }
  return text.substr(begin, end - begin);
}

Status CheckRoles(std::span<const ChatMessage> messages) {
  for (size_t index = 0; index < messages.size(); ++index) {
    const std::string& role = messages[index].role;
    if (role != "system" && role != "user" && role != "assistant") {
      return InvalidArgumentError("message " + std::to_string(index) + " has role '" + role +
                                  "'; roles must be system, user or assistant");
    }
  }
  return Status::Ok();
}

bool Contains(std::string_view text, std::string_view needle) {
  return text.find(needle) != std::string_view::npos;
}

// Either quoting style of a Jinja string literal.
bool ContainsLiteral(std::string_view text, std::string_view literal) {
  for (const char quote : {'\'', '"'}) {
    std::string quoted;
    quoted.reserve(literal.size() + 2);
    quoted += quote;
    quoted += literal;
    quoted += quote;
    if (Contains(text, quoted)) return true;
  }
  return false;
}

std::string QuoteStart(std::string_view jinja) {
  size_t length = 0;
  while (length < jinja.size() && length < 80) {
    const int step = Utf8SequenceLength(jinja.substr(length));
    length += step > 0 ? static_cast<size_t>(step) : 1;
  }
  std::string quoted;
  for (const char c : jinja.substr(0, length)) {
    if (c == '\n') {
      quoted += "\\n";
    } else {
      quoted += c;
    }
  }
  if (length < jinja.size()) quoted += "...";
  return quoted;
}

}  // namespace

Result<ChatTemplate> ChatTemplate::FromName(std::string_view name) {
  if (name == "llama3") return ChatTemplate(Kind::kLlama3);
  if (name == "llama2") return ChatTemplate(Kind::kLlama2);
  if (name == "mistral") return ChatTemplate(Kind::kMistral);
  return InvalidArgumentError("unknown chat template '" + std::string(name) +
                              "': expected llama3, llama2 or mistral");
}

Result<ChatTemplate> ChatTemplate::FromJinja(std::string_view jinja) {
  if (Contains(jinja, "<|start_header_id|>") && Contains(jinja, "<|end_header_id|>") &&
      Contains(jinja, "<|eot_id|>")) {
    // Llama 3.1 and later inject a dated system prompt and tool definitions: a different text.
    if (Contains(jinja, "Cutting Knowledge Date") || Contains(jinja, "ipython") ||
        Contains(jinja, "tools")) {
      return UnimplementedError(
          "the Llama 3.1+ chat template (dated system prompt, tools) is not supported; "
          "override with the 'llama3' template if plain Llama 3 turns are acceptable: \"" +
          QuoteStart(jinja) + "\"");
    }
    return ChatTemplate(Kind::kLlama3);
  }
  if (Contains(jinja, "[INST]") && Contains(jinja, "[/INST]")) {
    if (Contains(jinja, "<<SYS>>")) return ChatTemplate(Kind::kLlama2);
    // Only the original Mistral Instruct template renders '[INST] u [/INST]a</s>'; later ones put
    // spaces and tool blocks in other places.
    const bool original_mistral =
        ContainsLiteral(jinja, "[INST] ") && ContainsLiteral(jinja, " [/INST]") &&
        !ContainsLiteral(jinja, " [INST] ") && !Contains(jinja, "[AVAILABLE_TOOLS]");
    if (original_mistral) return ChatTemplate(Kind::kMistral);
  }
  return UnimplementedError("unrecognised chat template (supported: llama3, llama2, mistral): \"" +
                            QuoteStart(jinja) + "\"");
}

std::string_view ChatTemplate::name() const {
  switch (kind_) {
    case Kind::kLlama3:
      return "llama3";
    case Kind::kLlama2:
      return "llama2";
    case Kind::kMistral:
      return "mistral";
  }
  return "unknown";
}

Result<std::string> ChatTemplate::Apply(std::span<const ChatMessage> messages,
                                        bool add_generation_prompt) const {
  if (messages.empty()) return InvalidArgumentError("a conversation needs at least one message");
  SIEVE_RETURN_IF_ERROR(CheckRoles(messages));
  if (kind_ == Kind::kLlama3) return ApplyLlama3(messages, add_generation_prompt);
  return ApplyInst(messages);
}

Result<std::string> ChatTemplate::ApplyLlama3(std::span<const ChatMessage> messages,
                                              bool add_generation_prompt) const {
  std::string text(kLlama3Bos);
  for (const ChatMessage& message : messages) {
    text += "<|start_header_id|>";
    text += message.role;
    text += "<|end_header_id|>\n\n";
    text += PythonStrip(message.content);
    text += "<|eot_id|>";
  }
  if (add_generation_prompt) text += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  return text;
}

Result<std::string> ChatTemplate::ApplyInst(std::span<const ChatMessage> messages) const {
  const ChatMessage* system = nullptr;
  std::span<const ChatMessage> turns = messages;
  if (turns.front().role == "system") {
    system = &turns.front();
    turns = turns.subspan(1);
  }
  if (turns.empty()) {
    return InvalidArgumentError("a conversation needs a user message, not only a system message");
  }
  const bool llama2 = kind_ == Kind::kLlama2;
  std::string text;
  if (!llama2) text += kInstBos;
  for (size_t index = 0; index < turns.size(); ++index) {
    const ChatMessage& message = turns[index];
    const bool expect_user = index % 2 == 0;
    if (message.role == "system") {
      return InvalidArgumentError("only the first message may be a system message (message " +
                                  std::to_string(index + (system ? 1 : 0)) + " is one)");
    }
    if ((message.role == "user") != expect_user)
      return InvalidArgumentError(std::string(kAlternationError));
    std::string content = message.content;
    if (index == 0 && system != nullptr) {
      content = llama2 ? "<<SYS>>\n" + system->content + "\n<</SYS>>\n\n" + message.content
                       : system->content + "\n\n" + message.content;
    }
    if (llama2) {
      if (expect_user) {
        text += kInstBos;
        text += "[INST] ";
        text += PythonStrip(content);
        text += " [/INST]";
      } else {
        text += ' ';
        text += PythonStrip(content);
        text += ' ';
        text += kInstEos;
      }
    } else if (expect_user) {
      text += "[INST] ";
      text += content;
      text += " [/INST]";
    } else {
      text += content;
      text += kInstEos;
    }
  }
  return text;
}

}  // namespace sieve
