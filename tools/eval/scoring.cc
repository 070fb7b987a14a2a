#include "tools/eval/scoring.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <sstream>

namespace sieve::eval {

namespace {

bool IsDigit(char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; }
bool IsAlnum(char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0; }

std::vector<std::string> SplitWords(std::string_view text) {
  std::vector<std::string> words;
  std::istringstream in{std::string(text)};
  for (std::string word; in >> word;) words.push_back(word);
  return words;
}

}  // namespace

bool ContainsWhole(std::string_view text, std::string_view value) {
  if (value.empty()) return false;
  const bool number = std::all_of(value.begin(), value.end(), IsDigit);
  const auto same_kind = [&](char c) { return number ? IsDigit(c) : IsAlnum(c); };
  for (size_t at = text.find(value); at != std::string_view::npos; at = text.find(value, at + 1)) {
    const bool left_ok = at == 0 || !same_kind(text[at - 1]);
    const size_t end = at + value.size();
    const bool right_ok = end == text.size() || !same_kind(text[end]);
    if (left_ok && right_ok) return true;
  }
  return false;
}

double FractionFound(std::string_view text, const std::vector<std::string>& expected) {
  if (expected.empty()) return 0.0;
  int found = 0;
  for (const std::string& value : expected) found += ContainsWhole(text, value) ? 1 : 0;
  return static_cast<double>(found) / static_cast<double>(expected.size());
}

std::string NormalizeAnswer(std::string_view text) {
  std::string lowered;
  for (const char c : text) {
    if (std::ispunct(static_cast<unsigned char>(c))) continue;  // string.punctuation: ASCII
    lowered += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  std::string out;
  for (const std::string& word : SplitWords(lowered)) {
    if (word == "a" || word == "an" || word == "the") continue;
    if (!out.empty()) out += ' ';
    out += word;
  }
  return out;
}

double TokenF1(std::string_view prediction, std::string_view truth) {
  const std::vector<std::string> predicted = SplitWords(NormalizeAnswer(prediction));
  const std::vector<std::string> expected = SplitWords(NormalizeAnswer(truth));
  if (predicted.empty() || expected.empty()) return predicted == expected ? 1.0 : 0.0;
  std::map<std::string, int> counts;
  for (const std::string& word : expected) ++counts[word];
  int common = 0;
  for (const std::string& word : predicted) {
    auto it = counts.find(word);
    if (it != counts.end() && it->second > 0) {
      --it->second;
      ++common;
    }
  }
  if (common == 0) return 0.0;
  const double precision = static_cast<double>(common) / static_cast<double>(predicted.size());
  const double recall = static_cast<double>(common) / static_cast<double>(expected.size());
  return 2 * precision * recall / (precision + recall);
}

double ScoreOutput(const EvalSample& sample, std::string_view output) {
  if (sample.metric == Metric::kContains) return FractionFound(output, sample.expected);
  double best = 0.0;
  const std::string normalized_output = NormalizeAnswer(output);
  for (const std::string& answer : sample.expected) {
    double score = 0.0;
    switch (sample.metric) {
      case Metric::kExact:
        score = NormalizeAnswer(answer) == normalized_output ? 1.0 : 0.0;
        break;
      case Metric::kSubstring: {
        const std::string normalized = NormalizeAnswer(answer);
        score = !normalized.empty() && normalized_output.find(normalized) != std::string::npos
                    ? 1.0
                    : 0.0;
        break;
      }
      case Metric::kF1:
        score = TokenF1(output, answer);
        break;
      case Metric::kContains:
      case Metric::kPerplexity:
        break;
    }
    best = std::max(best, score);
  }
  return best;
}

const char* MetricName(Metric metric) {
  switch (metric) {
    case Metric::kContains:
      return "contains";
    case Metric::kExact:
      return "exact";
    case Metric::kSubstring:
      return "substring";
    case Metric::kF1:
      return "f1";
    case Metric::kPerplexity:
      return "perplexity";
  }
  return "contains";
}

}  // namespace sieve::eval
