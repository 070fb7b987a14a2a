#include "tools/eval/text_source.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace sieve::eval {

namespace {

Result<std::string> ReadFile(const std::filesystem::path& path, std::string_view flag) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return NotFoundError(std::string(flag) + ": cannot read " + path.string());
  std::ostringstream bytes;
  bytes << file.rdbuf();
  return bytes.str();
}

}  // namespace

Result<std::string> ReadTextSource(const std::string& path, std::string_view flag) {
  std::error_code error;
  const std::filesystem::path root(path);
  if (!std::filesystem::exists(root, error)) {
    return NotFoundError(std::string(flag) + ": " + path + " does not exist");
  }
  std::string text;
  if (std::filesystem::is_directory(root, error)) {
    std::vector<std::filesystem::path> files;
    for (const auto& entry : std::filesystem::directory_iterator(root, error)) {
      if (entry.is_regular_file() && entry.path().extension() == ".txt") {
        files.push_back(entry.path());
      }
    }
    if (error) return NotFoundError(std::string(flag) + ": cannot list " + path);
    std::sort(files.begin(), files.end());
    if (files.empty()) {
      return InvalidArgumentError(std::string(flag) + ": " + path + " has no .txt files");
    }
    for (const auto& file : files) {
      SIEVE_ASSIGN_OR_RETURN(std::string part, ReadFile(file, flag));
      if (!text.empty()) text += "\n";
      text += part;
    }
  } else {
    SIEVE_ASSIGN_OR_RETURN(text, ReadFile(root, flag));
  }
  if (text.find_first_not_of(" \t\r\n") == std::string::npos) {
    return InvalidArgumentError(std::string(flag) + ": " + path + " holds no text");
  }
  return text;
}

std::vector<std::string> SplitSentences(std::string_view text) {
  std::string flat(text);
  std::replace(flat.begin(), flat.end(), '\n', ' ');
  const auto is_space = [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; };
  std::vector<std::string> sentences;
  const auto keep = [&](size_t begin, size_t end) {
    const size_t length = end - begin;
    if (length >= 20 && length <= 400) sentences.push_back(flat.substr(begin, length) + " ");
  };
  size_t begin = 0;
  for (size_t at = 1; at < flat.size(); ++at) {
    const char previous = flat[at - 1];
    if (!is_space(flat[at]) || (previous != '.' && previous != '!' && previous != '?')) continue;
    size_t end_of_space = at;
    while (end_of_space < flat.size() && is_space(flat[end_of_space])) ++end_of_space;
    keep(begin, at);
    begin = end_of_space;
    at = end_of_space;
  }
  if (begin < flat.size()) keep(begin, flat.size());
  return sentences;
}

}  // namespace sieve::eval
