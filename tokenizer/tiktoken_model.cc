#include "tokenizer/tiktoken_model.h"

#include <charconv>

#include "tokenizer/byte_level_bpe.h"

namespace sieve {
namespace {

// A vocabulary larger than this is not a tokenizer file but damage.
constexpr int64_t kMaxRank = 1 << 24;

int Base64Value(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

std::optional<std::string> DecodeBase64(std::string_view text) {
  while (!text.empty() && text.back() == '=') text.remove_suffix(1);
  std::string bytes;
  bytes.reserve(text.size() * 3 / 4);
  uint32_t buffer = 0;
  int bits = 0;
  for (const char c : text) {
    const int value = Base64Value(c);
    if (value < 0) return std::nullopt;
    buffer = (buffer << 6) | static_cast<uint32_t>(value);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      bytes += static_cast<char>((buffer >> bits) & 0xff);
    }
  }
  if (bits >= 6) return std::nullopt;  // a dangling sextet is not valid base64
  return bytes;
}

struct RankLine {
  std::string_view base64;
  int64_t rank = -1;
};

std::optional<RankLine> SplitRankLine(std::string_view line) {
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  const size_t space = line.find(' ');
  if (space == std::string_view::npos || space == 0) return std::nullopt;
  RankLine parsed{.base64 = line.substr(0, space)};
  const std::string_view digits = line.substr(space + 1);
  const auto [end, error] =
      std::from_chars(digits.data(), digits.data() + digits.size(), parsed.rank);
  if (error != std::errc() || end != digits.data() + digits.size() || digits.empty()) {
    return std::nullopt;
  }
  for (const char c : parsed.base64) {
    if (Base64Value(c) < 0 && c != '=') return std::nullopt;
  }
  return parsed;
}

}  // namespace

bool LooksLikeTiktokenModel(std::string_view contents) {
  const std::string_view first_line = contents.substr(0, contents.find('\n'));
  return SplitRankLine(first_line).has_value();
}

std::vector<std::string> MetaLlama3SpecialTokens() {
  std::vector<std::string> names = {
      "<|begin_of_text|>",
      "<|end_of_text|>",
      "<|reserved_special_token_0|>",
      "<|reserved_special_token_1|>",
      "<|reserved_special_token_2|>",
      "<|reserved_special_token_3|>",
      "<|start_header_id|>",
      "<|end_header_id|>",
      "<|reserved_special_token_4|>",
      "<|eot_id|>",
  };
  for (int index = 5; index <= 250; ++index) {
    names.push_back("<|reserved_special_token_" + std::to_string(index) + "|>");
  }
  return names;
}

Result<std::unique_ptr<Tokenizer>> ParseTiktokenModel(std::string_view contents) {
  ByteLevelBpe::Vocabulary vocabulary;
  vocabulary.merge_rule = ByteLevelBpe::MergeRule::kTokenRank;
  vocabulary.ignore_merges = true;
  size_t line_number = 0;
  size_t num_ranks = 0;
  while (!contents.empty()) {
    ++line_number;
    const size_t newline = contents.find('\n');
    const std::string_view line = contents.substr(0, newline);
    contents.remove_prefix(newline == std::string_view::npos ? contents.size() : newline + 1);
    if (line.empty() || line == "\r") continue;
    const std::optional<RankLine> parsed = SplitRankLine(line);
    std::optional<std::string> bytes;
    if (parsed) bytes = DecodeBase64(parsed->base64);
    if (!parsed || !bytes || bytes->empty() || parsed->rank < 0 || parsed->rank >= kMaxRank) {
      return DataLossError("tiktoken tokenizer.model line " + std::to_string(line_number) +
                           " is not '<base64 token> <rank>'");
    }
    const auto rank = static_cast<size_t>(parsed->rank);
    if (rank >= vocabulary.tokens.size()) vocabulary.tokens.resize(rank + 1);
    if (!vocabulary.tokens[rank].empty()) {
      return DataLossError("tiktoken tokenizer.model line " + std::to_string(line_number) +
                           " repeats rank " + std::to_string(rank));
    }
    vocabulary.tokens[rank] = std::move(*bytes);
    ++num_ranks;
  }
  if (num_ranks == 0) return DataLossError("tiktoken tokenizer.model has no tokens");

  PreTokenizer pre_tokenizer;
  SIEVE_RETURN_IF_ERROR(
      pre_tokenizer.AddSplit(kLlama3SplitPattern, false, SplitBehavior::kIsolated, false));
  const auto first_special = static_cast<int32_t>(vocabulary.tokens.size());
  SIEVE_ASSIGN_OR_RETURN(
      std::unique_ptr<ByteLevelBpe> tokenizer,
      ByteLevelBpe::Create(std::move(vocabulary), std::move(pre_tokenizer), "tiktoken"));
  const std::vector<std::string> specials = MetaLlama3SpecialTokens();
  for (size_t index = 0; index < specials.size(); ++index) {
    SIEVE_RETURN_IF_ERROR(tokenizer->AddAddedToken(
        AddedToken{.content = specials[index], .id = first_special + static_cast<int32_t>(index)}));
  }
  tokenizer->SetBos(first_special, /*add_bos=*/true);
  tokenizer->SetEosIds({first_special + 1});
  tokenizer->SetChatTemplate(ChatTemplate(ChatTemplate::Kind::kLlama3));
  return std::unique_ptr<Tokenizer>(std::move(tokenizer));
}

}  // namespace sieve
