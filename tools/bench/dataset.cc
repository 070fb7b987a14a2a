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
  std::vector<int32_t> plain_ids;
  for (int32_t id = 0; id < tokenizer.vocab_size(); ++id) {
    if (IsPlainToken(tokenizer, id)) plain_ids.push_back(id);
  }
  if (plain_ids.empty()) {
    return InvalidArgumentError("the tokenizer has no ordinary token to build prompts from");
  }
  std::mt19937_64 rng(options.seed);
  std::uniform_int_distribution<size_t> pick(0, plain_ids.size() - 1);
  auto input_len = LengthRange(options.input_len, options.range_ratio);
  auto output_len = LengthRange(options.output_len, options.range_ratio);
  std::vector<BenchPrompt> prompts;
  prompts.reserve(static_cast<size_t>(options.num_prompts));
  for (int index = 0; index < options.num_prompts; ++index) {
    BenchPrompt prompt;
    const size_t target = static_cast<size_t>(input_len(rng));
    prompt.output_len = output_len(rng);
    std::vector<int32_t> ids(target);
    for (int32_t& id : ids) id = plain_ids[pick(rng)];
    for (int round = 0; round < kMaxLengthRounds; ++round) {
      prompt.prompt = tokenizer.Decode(ids, /*skip_special_tokens=*/true);
      SIEVE_ASSIGN_OR_RETURN(ids, tokenizer.Encode(prompt.prompt, /*add_bos=*/false));
      if (ids.size() == target) break;
      if (ids.size() > target) {
        ids.resize(target);
      } else {
        while (ids.size() < target) ids.push_back(plain_ids[pick(rng)]);
      }
    }
    SIEVE_ASSIGN_OR_RETURN(prompt.prompt_len, CountTokens(tokenizer, prompt.prompt));
    prompts.push_back(std::move(prompt));
  }
  return prompts;
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
