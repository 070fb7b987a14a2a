#include "tools/eval/jsonl_dataset.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

namespace sieve::eval {

Result<Metric> ParseJsonlMetric(std::string_view name) {
  if (name == "exact") return Metric::kExact;
  if (name == "substring") return Metric::kSubstring;
  if (name == "f1") return Metric::kF1;
  return InvalidArgumentError("unknown metric '" + std::string(name) +
                              "' (exact, substring or f1)");
}

Result<std::vector<JsonlRecord>> ParseJsonl(std::string_view text, const std::string& file_name) {
  std::vector<JsonlRecord> records;
  int line_number = 0;
  size_t begin = 0;
  while (begin <= text.size()) {
    size_t end = text.find('\n', begin);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view line = text.substr(begin, end - begin);
    begin = end + 1;
    ++line_number;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) {
      if (end == text.size()) break;
      continue;
    }
    const auto bad = [&](const std::string& what) {
      return InvalidArgumentError(file_name + ":" + std::to_string(line_number) + ": " + what);
    };
    const nlohmann::json json = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (json.is_discarded()) return bad("not valid JSON");
    if (!json.is_object()) return bad("not a JSON object");
    JsonlRecord record;
    record.line = line_number;
    for (const char* field : {"context", "input"}) {
      const auto it = json.find(field);
      if (it == json.end()) return bad(std::string("missing \"") + field + "\"");
      if (!it->is_string()) return bad(std::string("\"") + field + "\" must be a string");
      (field[0] == 'c' ? record.context : record.input) = it->get<std::string>();
    }
    const auto answers = json.find("answers");
    if (answers == json.end()) return bad("missing \"answers\"");
    if (!answers->is_array()) return bad("\"answers\" must be a list of strings");
    for (const auto& answer : *answers) {
      if (!answer.is_string()) return bad("\"answers\" must be a list of strings");
      record.answers.push_back(answer.get<std::string>());
    }
    if (record.answers.empty()) return bad("\"answers\" is empty");
    if (const auto length = json.find("length"); length != json.end() && !length->is_null()) {
      if (!length->is_number_integer() || length->get<int64_t>() < 0) {
        return bad("\"length\" must be a non-negative integer");
      }
      record.length = static_cast<int>(std::min<int64_t>(length->get<int64_t>(), 1 << 30));
    }
    if (const auto metric = json.find("metric"); metric != json.end() && !metric->is_null()) {
      if (!metric->is_string()) return bad("\"metric\" must be a string");
      auto parsed = ParseJsonlMetric(metric->get<std::string>());
      if (!parsed.ok()) return bad(parsed.status().message());
      record.metric = *parsed;
    }
    records.push_back(std::move(record));
    if (end == text.size()) break;
  }
  if (records.empty()) return InvalidArgumentError(file_name + ": no records");
  return records;
}

Result<std::vector<JsonlRecord>> ReadJsonl(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return NotFoundError("--data: cannot read " + path);
  std::ostringstream bytes;
  bytes << file.rdbuf();
  return ParseJsonl(bytes.str(), path);
}

std::string FillPromptTemplate(std::string_view prompt_template, std::string_view context,
                               std::string_view input) {
  std::string out;
  for (size_t at = 0; at < prompt_template.size();) {
    if (prompt_template.compare(at, 9, "{context}") == 0) {
      out += context;
      at += 9;
    } else if (prompt_template.compare(at, 7, "{input}") == 0) {
      out += input;
      at += 7;
    } else {
      out += prompt_template[at++];
    }
  }
  return out;
}

std::vector<int32_t> TruncateMiddle(const std::vector<int32_t>& ids, int max_tokens) {
  if (static_cast<int>(ids.size()) <= max_tokens) return ids;
  const size_t head = static_cast<size_t>(max_tokens / 2);
  const size_t tail = static_cast<size_t>(max_tokens) - head;
  std::vector<int32_t> out(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(head));
  out.insert(out.end(), ids.end() - static_cast<std::ptrdiff_t>(tail), ids.end());
  return out;
}

int LengthBucket(const std::vector<int>& buckets, int length) {
  for (const int bucket : buckets) {
    if (length <= bucket) return bucket;
  }
  return buckets.empty() ? length : buckets.back();
}

Result<EvalSample> MakeJsonlSample(const JsonlRecord& record, int index,
                                   const JsonlOptions& options, const Tokenizer& tokenizer) {
  EvalSample sample;
  sample.task = "jsonl";
  sample.index = index;
  sample.metric = record.metric.value_or(options.metric);
  sample.expected = record.answers;
  sample.max_tokens = options.max_tokens;
  sample.prompt = FillPromptTemplate(options.prompt_template, record.context, record.input);
  auto ids = tokenizer.Encode(sample.prompt, /*add_bos=*/true);
  if (!ids.ok()) {
    return InvalidArgumentError("--data line " + std::to_string(record.line) + ": " +
                                ids.status().message());
  }
  sample.length =
      LengthBucket(options.buckets, record.length.value_or(static_cast<int>(ids->size())));
  if (options.max_prompt_tokens > 0 && static_cast<int>(ids->size()) > options.max_prompt_tokens) {
    // The BOS stays first: cut the ids after it.
    const size_t bos = tokenizer.add_bos() ? 1 : 0;
    std::vector<int32_t> body(ids->begin() + static_cast<std::ptrdiff_t>(bos), ids->end());
    body = TruncateMiddle(body, options.max_prompt_tokens - static_cast<int>(bos));
    sample.prompt = tokenizer.Decode(body, /*skip_special_tokens=*/false);
    sample.prompt_ids.assign(ids->begin(), ids->begin() + static_cast<std::ptrdiff_t>(bos));
    sample.prompt_ids.insert(sample.prompt_ids.end(), body.begin(), body.end());
    sample.truncated = true;
  } else {
    sample.prompt_ids = std::move(ids).value();
  }
  return sample;
}

Result<std::string> FindHeldoutSet() {
  namespace fs = std::filesystem;
  constexpr char kFileName[] = "heldout_needles.jsonl";
  std::vector<fs::path> candidates;
  std::error_code error;
  const fs::path executable = fs::read_symlink("/proc/self/exe", error);
  if (!error) {
    candidates.push_back(executable.parent_path().parent_path() / "share" / "sieve" / "eval" /
                         kFileName);
  }
#ifdef SIEVE_SOURCE_TESTDATA_DIR
  candidates.push_back(fs::path(SIEVE_SOURCE_TESTDATA_DIR) / "eval" / kFileName);
#endif
  std::string looked;
  for (const fs::path& candidate : candidates) {
    if (fs::is_regular_file(candidate, error)) return candidate.string();
    looked += (looked.empty() ? "" : ", ") + candidate.string();
  }
  return NotFoundError("the held-out needle set was not found (looked in " + looked +
                       "); evaluate a copy with --task jsonl --data FILE");
}

}  // namespace sieve::eval
