#include "tokenizer/chat_template.h"

#include <gtest/gtest.h>

#include <vector>

namespace sieve {
namespace {

constexpr std::string_view kLlama3Jinja =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | "
    "trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% "
    "endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";
constexpr std::string_view kLlama2Jinja =
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set "
    "system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set "
    "system_message = false %}{% endif %}{% for message in loop_messages %}{% if (message['role'] "
    "== 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must "
    "alternate user/assistant/user/assistant/...') }}{% endif %}{% if loop.index0 == 0 and "
    "system_message != false %}{% set content = '<<SYS>>\\n' + system_message + "
    "'\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content = message['content'] "
    "%}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + "
    "' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + "
    "eos_token }}{% endif %}{% endfor %}";
constexpr std::string_view kMistralJinja =
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != "
    "(loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate "
    "user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ "
    "'[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ "
    "message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant roles "
    "are supported!') }}{% endif %}{% endfor %}";

const std::vector<ChatMessage> kConversation = {
    {"system", "You are helpful."},
    {"user", " Hi!\n"},
    {"assistant", "Hello."},
    {"user", "How are you?"},
};

std::string ApplyOk(const ChatTemplate& chat_template, std::span<const ChatMessage> messages,
                    bool add_generation_prompt) {
  Result<std::string> text = chat_template.Apply(messages, add_generation_prompt);
  EXPECT_TRUE(text.ok()) << text.status().ToString();
  return text.ok() ? *text : std::string();
}

TEST(ChatTemplateTest, Llama3MatchesItsJinja) {
  const ChatTemplate chat_template(ChatTemplate::Kind::kLlama3);
  EXPECT_EQ(ApplyOk(chat_template, kConversation, true),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are "
            "helpful.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|><|start_"
            "header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|><|start_header_id|>user<|"
            "end_header_id|>\n\nHow are you?<|eot_id|><|start_header_id|>assistant<|end_header_"
            "id|>\n\n");
  const std::vector<ChatMessage> single = {{"user", "Hi"}};
  EXPECT_EQ(ApplyOk(chat_template, single, false),
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>");
}

TEST(ChatTemplateTest, Llama2MatchesItsJinja) {
  const ChatTemplate chat_template(ChatTemplate::Kind::kLlama2);
  const std::string expected =
      "<s>[INST] <<SYS>>\nYou are helpful.\n<</SYS>>\n\n Hi! [/INST] Hello. </s><s>[INST] How "
      "are you? [/INST]";
  EXPECT_EQ(ApplyOk(chat_template, kConversation, true), expected);
  EXPECT_EQ(ApplyOk(chat_template, kConversation, false), expected);
  const std::vector<ChatMessage> no_system = {{"user", " Hi "}, {"assistant", "Yo"}};
  EXPECT_EQ(ApplyOk(chat_template, no_system, true), "<s>[INST] Hi [/INST] Yo </s>");
}

TEST(ChatTemplateTest, MistralMatchesItsJinja) {
  const ChatTemplate chat_template(ChatTemplate::Kind::kMistral);
  EXPECT_EQ(ApplyOk(chat_template, kConversation, true),
            "<s>[INST] You are helpful.\n\n Hi!\n [/INST]Hello.</s>[INST] How are you? [/INST]");
  const std::vector<ChatMessage> single = {{"user", "Hi"}};
  EXPECT_EQ(ApplyOk(chat_template, single, true), "<s>[INST] Hi [/INST]");
}

TEST(ChatTemplateTest, RejectsBadRolesAndOrder) {
  const std::vector<ChatMessage> tool = {{"user", "Hi"}, {"tool", "42"}};
  const std::vector<ChatMessage> two_users = {{"user", "Hi"}, {"user", "Again"}};
  const std::vector<ChatMessage> assistant_first = {{"assistant", "Hi"}};
  const std::vector<ChatMessage> late_system = {{"user", "Hi"}, {"system", "Be nice"}};
  const std::vector<ChatMessage> only_system = {{"system", "Be nice"}};
  for (const ChatTemplate::Kind kind :
       {ChatTemplate::Kind::kLlama3, ChatTemplate::Kind::kLlama2, ChatTemplate::Kind::kMistral}) {
    const ChatTemplate chat_template(kind);
    Result<std::string> text = chat_template.Apply(tool, true);
    ASSERT_FALSE(text.ok());
    EXPECT_EQ(text.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(text.status().message().find("'tool'"), std::string::npos);
    EXPECT_FALSE(chat_template.Apply({}, true).ok());
    const bool alternates = kind != ChatTemplate::Kind::kLlama3;
    for (const auto* messages : {&two_users, &assistant_first, &late_system, &only_system}) {
      EXPECT_EQ(chat_template.Apply(*messages, true).ok(), !alternates)
          << chat_template.name() << " " << messages->front().content;
    }
  }
}

TEST(ChatTemplateTest, DetectsKindsFromJinjaAndNames) {
  const auto kind_of = [](std::string_view jinja) {
    Result<ChatTemplate> chat_template = ChatTemplate::FromJinja(jinja);
    EXPECT_TRUE(chat_template.ok()) << chat_template.status().ToString();
    return chat_template.ok() ? chat_template->kind() : ChatTemplate::Kind::kLlama3;
  };
  EXPECT_EQ(kind_of(kLlama3Jinja), ChatTemplate::Kind::kLlama3);
  EXPECT_EQ(kind_of(kLlama2Jinja), ChatTemplate::Kind::kLlama2);
  EXPECT_EQ(kind_of(kMistralJinja), ChatTemplate::Kind::kMistral);
  for (const std::string_view name : {"llama3", "llama2", "mistral"}) {
    Result<ChatTemplate> chat_template = ChatTemplate::FromName(name);
    ASSERT_TRUE(chat_template.ok());
    EXPECT_EQ(chat_template->name(), name);
  }
  Result<ChatTemplate> unknown_name = ChatTemplate::FromName("chatml");
  ASSERT_FALSE(unknown_name.ok());
  EXPECT_EQ(unknown_name.status().code(), StatusCode::kInvalidArgument);
}

TEST(ChatTemplateTest, UnknownTemplatesAreUnimplementedAndQuoted) {
  const std::string chatml =
      "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
      "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ "
      "'<|im_start|>assistant\n' }}{% endif %}";
  Result<ChatTemplate> chat_template = ChatTemplate::FromJinja(chatml);
  ASSERT_FALSE(chat_template.ok());
  EXPECT_EQ(chat_template.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(chat_template.status().message().find("{% for message in messages %}{{'<|im_start|>'"),
            std::string::npos)
      << chat_template.status().message();
  EXPECT_EQ(chat_template.status().message().find("add_generation_prompt"), std::string::npos);

  const std::string llama31 = std::string(kLlama3Jinja) +
                              "{{- \"Cutting Knowledge Date: December 2023\\n\" }}{% if tools %}";
  Result<ChatTemplate> newer = ChatTemplate::FromJinja(llama31);
  ASSERT_FALSE(newer.ok());
  EXPECT_EQ(newer.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(newer.status().message().find("3.1"), std::string::npos);
}

}  // namespace
}  // namespace sieve
