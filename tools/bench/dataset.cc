#include "tools/bench/dataset.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "core/utf8.h"

namespace sieve::bench {

namespace {

// Rounds of cut-back / extend before taking the length the text has.
constexpr int kMaxLengthRounds = 10;
// Draws of a shared prefix before taking one that a suffix cannot follow intact.
constexpr int kMaxPrefixDraws = 10;

// Whether `id` decodes, on its own, to text that comes back through JSON and a tokenizer intact.
bool IsPlainToken(const Tokenizer& tokenizer, int32_t id) {
  if (tokenizer.IsSpecial(id)) return false;
  const std::string bytes = tokenizer.TokenBytes(id);
  if (bytes.empty() || !IsValidUtf8(bytes)) return false;
  for (unsigned char byte : bytes) {
    const bool control = byte < 0x20 || byte == 0x7F;
    if (control && byte != '\n' && byte != '\t') return false;
  }
  return true;
}

// [len * (1 - ratio), len * (1 + ratio)], at least 1.
std::uniform_int_distribution<int> LengthRange(int length, double ratio) {
  const int low = std::max(1, static_cast<int>(std::floor(length * (1.0 - ratio))));
  const int high = std::max(low, static_cast<int>(std::ceil(length * (1.0 + ratio))));
  return std::uniform_int_distribution<int>(low, high);
}

Result<int> CountTokens(const Tokenizer& tokenizer, const std::string& text) {
  SIEVE_ASSIGN_OR_RETURN(std::vector<int32_t> ids, tokenizer.Encode(text, /*add_bos=*/false));
  return static_cast<int>(ids.size());
}

// The ordinary tokens random text is drawn from (IsPlainToken), and the draw.
class PlainTokens {
 public:
  static Result<PlainTokens> Of(const Tokenizer& tokenizer) {
    PlainTokens tokens;
    for (int32_t id = 0; id < tokenizer.vocab_size(); ++id) {
      if (IsPlainToken(tokenizer, id)) tokens.ids_.push_back(id);
    }
    if (tokens.ids_.empty()) {
      return InvalidArgumentError("the tokenizer has no ordinary token to build prompts from");
    }
    tokens.pick_ = std::uniform_int_distribution<size_t>(0, tokens.ids_.size() - 1);
    return tokens;
  }

  int32_t Draw(std::mt19937_64& rng) { return ids_[pick_(rng)]; }

 private:
  std::vector<int32_t> ids_;
  std::uniform_int_distribution<size_t> pick_;
};

bool StartsWith(const std::vector<int32_t>& ids, const std::vector<int32_t>& head) {
  return ids.size() >= head.size() && std::equal(head.begin(), head.end(), ids.begin());
}

// Random text to follow a head, and whether head + text re-tokenises to the head's own tokens
// followed by the text's.
struct TextAfter {
  std::string text;
  bool head_kept = true;
};

// Random text of `target` tokens to follow `head` (text that re-tokenises to `head_ids`; both
// empty for a text of its own): random plain ids are decoded, then head + text is re-tokenised;
// when the text's tokens differ in number from the target (BPE merges across the random tokens)
// it is cut back or extended with more random tokens, and when the head's last tokens merged with
// the text's first (so head + text no longer begins with head_ids) the text's first token is
// drawn again, a few rounds at most. The caller counts the final length.
Result<TextAfter> RandomTextAfter(const Tokenizer& tokenizer, PlainTokens& plain,
                                  std::mt19937_64& rng, size_t target, const std::string& head,
                                  const std::vector<int32_t>& head_ids) {
  std::vector<int32_t> ids(target);
  for (int32_t& id : ids) id = plain.Draw(rng);
  TextAfter result;
  for (int round = 0; round < kMaxLengthRounds; ++round) {
    result.text = tokenizer.Decode(ids, /*skip_special_tokens=*/true);
    SIEVE_ASSIGN_OR_RETURN(std::vector<int32_t> all,
                           tokenizer.Encode(head + result.text, /*add_bos=*/false));
    result.head_kept = StartsWith(all, head_ids);
    if (!result.head_kept) {
      ids[0] = plain.Draw(rng);
      continue;
    }
    ids.assign(all.begin() + static_cast<std::ptrdiff_t>(head_ids.size()), all.end());
    if (ids.size() == target) break;
    if (ids.size() > target) {
      ids.resize(target);
    } else {
      while (ids.size() < target) ids.push_back(plain.Draw(rng));
    }
  }
  return result;
}

}  // namespace

Result<std::vector<BenchPrompt>> MakeRandomDataset(const Tokenizer& tokenizer,
                                                   const RandomDatasetOptions& options) {
  if (options.num_prompts <= 0) return InvalidArgumentError("--num-prompts must be positive");
  if (options.input_len <= 0 || options.output_len <= 0) {
    return InvalidArgumentError("--input-len and --output-len must be positive");
  }
  if (options.range_ratio < 0 || options.range_ratio >= 1) {
    return InvalidArgumentError("--range-ratio must be in [0, 1)");
  }
  SIEVE_ASSIGN_OR_RETURN(PlainTokens plain, PlainTokens::Of(tokenizer));
  std::mt19937_64 rng(options.seed);
  auto input_len = LengthRange(options.input_len, options.range_ratio);
  auto output_len = LengthRange(options.output_len, options.range_ratio);
  std::vector<BenchPrompt> prompts;
  prompts.reserve(static_cast<size_t>(options.num_prompts));
  for (int index = 0; index < options.num_prompts; ++index) {
    BenchPrompt prompt;
    const size_t target = static_cast<size_t>(input_len(rng));
    prompt.output_len = output_len(rng);
    SIEVE_ASSIGN_OR_RETURN(TextAfter text,
                           RandomTextAfter(tokenizer, plain, rng, target, std::string(), {}));
    prompt.prompt = std::move(text.text);
    SIEVE_ASSIGN_OR_RETURN(prompt.prompt_len, CountTokens(tokenizer, prompt.prompt));
    prompts.push_back(std::move(prompt));
  }
  return prompts;
}

Result<std::vector<BenchPrompt>> MakePrefixRepetitionDataset(
    const Tokenizer& tokenizer, const PrefixRepetitionOptions& options) {
  if (options.num_prompts <= 0) return InvalidArgumentError("--num-prompts must be positive");
  if (options.prefix_len <= 0) {
    return InvalidArgumentError("--prefix-repetition-prefix-len must be positive");
  }
  if (options.suffix_len <= 0) {
    return InvalidArgumentError("--prefix-repetition-suffix-len must be positive");
  }
  if (options.output_len <= 0) {
    return InvalidArgumentError("--prefix-repetition-output-len must be positive");
  }
  if (options.num_prefixes < 1) {
    return InvalidArgumentError("--prefix-repetition-num-prefixes must be at least 1");
  }
  if (options.num_prefixes > options.num_prompts) {
    return InvalidArgumentError(
        "--prefix-repetition-num-prefixes (" + std::to_string(options.num_prefixes) +
        ") must not exceed the number of prompts (" + std::to_string(options.num_prompts) +
        "): every prefix needs a prompt");
  }
  SIEVE_ASSIGN_OR_RETURN(PlainTokens plain, PlainTokens::Of(tokenizer));
  std::mt19937_64 rng(options.seed);
  std::vector<BenchPrompt> prompts;
  prompts.reserve(static_cast<size_t>(options.num_prompts));
  const int per_prefix = options.num_prompts / options.num_prefixes;
  const int with_one_more = options.num_prompts % options.num_prefixes;
  for (int group = 0; group < options.num_prefixes; ++group) {
    const int count = per_prefix + (group < with_one_more ? 1 : 0);
    std::vector<BenchPrompt> members;
    // A prefix that a suffix cannot follow intact however it starts (one that ends in spaces,
    // which join the next word) is drawn again, a few times at most.
    for (int draw = 0; draw < kMaxPrefixDraws; ++draw) {
      const bool last_draw = draw + 1 == kMaxPrefixDraws;
      members.clear();
      SIEVE_ASSIGN_OR_RETURN(
          TextAfter prefix,
          RandomTextAfter(tokenizer, plain, rng, static_cast<size_t>(options.prefix_len),
                          std::string(), {}));
      SIEVE_ASSIGN_OR_RETURN(const std::vector<int32_t> prefix_ids,
                             tokenizer.Encode(prefix.text, /*add_bos=*/false));
      for (int index = 0; index < count; ++index) {
        SIEVE_ASSIGN_OR_RETURN(
            TextAfter suffix,
            RandomTextAfter(tokenizer, plain, rng, static_cast<size_t>(options.suffix_len),
                            prefix.text, prefix_ids));
        if (!suffix.head_kept && !last_draw) break;
        BenchPrompt prompt;
        prompt.prompt = prefix.text + suffix.text;
        prompt.output_len = options.output_len;
        prompt.prefix_group = group;
        prompt.prefix_bytes = static_cast<int>(prefix.text.size());
        SIEVE_ASSIGN_OR_RETURN(prompt.prompt_len, CountTokens(tokenizer, prompt.prompt));
        members.push_back(std::move(prompt));
      }
      if (static_cast<int>(members.size()) == count) break;
    }
    for (BenchPrompt& prompt : members) prompts.push_back(std::move(prompt));
  }
  std::shuffle(prompts.begin(), prompts.end(), rng);
  return prompts;
}

Result<std::vector<BenchConversation>> MakeMultiTurnDataset(const Tokenizer& tokenizer,
                                                            const MultiTurnOptions& options) {
  if (options.num_conversations <= 0) {
    return InvalidArgumentError("--num-prompts (conversations) must be positive");
  }
  if (options.num_turns <= 0)
    return InvalidArgumentError("--multi-turn-num-turns must be positive");
  if (options.first_len <= 0)
    return InvalidArgumentError("--multi-turn-first-len must be positive");
  if (options.message_len <= 0) {
    return InvalidArgumentError("--multi-turn-message-len must be positive");
  }
  if (options.output_len <= 0) {
    return InvalidArgumentError("--multi-turn-output-len must be positive");
  }
  SIEVE_ASSIGN_OR_RETURN(PlainTokens plain, PlainTokens::Of(tokenizer));
  std::mt19937_64 rng(options.seed);
  std::vector<BenchConversation> conversations(static_cast<size_t>(options.num_conversations));
  for (BenchConversation& conversation : conversations) {
    conversation.output_len = options.output_len;
    for (int turn = 0; turn < options.num_turns; ++turn) {
      const size_t target =
          static_cast<size_t>(turn == 0 ? options.first_len : options.message_len);
      SIEVE_ASSIGN_OR_RETURN(TextAfter text,
                             RandomTextAfter(tokenizer, plain, rng, target, std::string(), {}));
      SIEVE_ASSIGN_OR_RETURN(const int length, CountTokens(tokenizer, text.text));
      conversation.messages.push_back(std::move(text.text));
      conversation.message_lens.push_back(length);
    }
  }
  return conversations;
}

Result<std::vector<BenchPrompt>> LoadJsonlDataset(const std::string& path,
                                                  const Tokenizer& tokenizer,
                                                  int default_output_len, int num_prompts) {
  std::ifstream file(path);
  if (!file) return NotFoundError("cannot read dataset '" + path + "'");
  std::vector<BenchPrompt> lines;
  int line_number = 0;
  for (std::string line; std::getline(file, line);) {
    ++line_number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(line_number);
    nlohmann::json json = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!json.is_object()) return InvalidArgumentError(where + ": not a JSON object");
    const auto prompt = json.find("prompt");
    if (prompt == json.end() || !prompt->is_string()) {
      return InvalidArgumentError(where + ": needs a string \"prompt\"");
    }
    BenchPrompt entry;
    entry.prompt = prompt->get<std::string>();
    entry.output_len = default_output_len;
    if (const auto output_len = json.find("output_len"); output_len != json.end()) {
      if (!output_len->is_number_integer() || output_len->get<int64_t>() <= 0) {
        return InvalidArgumentError(where + ": \"output_len\" must be a positive integer");
      }
      entry.output_len = output_len->get<int>();
    }
    auto tokens = CountTokens(tokenizer, entry.prompt);
    if (!tokens.ok()) return tokens.status().WithContext(where);
    entry.prompt_len = *tokens;
    lines.push_back(std::move(entry));
  }
  if (lines.empty()) return InvalidArgumentError("dataset '" + path + "' has no prompts");
  if (num_prompts <= 0) return lines;
  std::vector<BenchPrompt> prompts;
  prompts.reserve(static_cast<size_t>(num_prompts));
  for (int index = 0; index < num_prompts; ++index) {
    prompts.push_back(lines[static_cast<size_t>(index) % lines.size()]);
  }
  return prompts;
}

}  // namespace sieve::bench
