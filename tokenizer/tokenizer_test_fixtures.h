// Test-only helpers shared by the tokenizer tests: the fixture strings and their expected ids
// (<fixtures>/tokenizers/{strings,expected}.json), and tokenizers loaded once per test binary.
#pragma once

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_loader.h"

namespace sieve::testing {

struct TokenizerFixtures {
  std::vector<std::string> strings;
  std::vector<std::vector<int32_t>> llama3_ids;  // tiktoken, no BOS
  std::vector<std::vector<int32_t>> llama2_ids;  // sentencepiece, no BOS
};

inline std::string ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

inline TokenizerFixtures ReadTokenizerFixtures(const std::string& fixtures_dir) {
  TokenizerFixtures fixtures;
  const auto strings =
      nlohmann::json::parse(ReadWholeFile(fixtures_dir + "/tokenizers/strings.json"));
  const auto expected =
      nlohmann::json::parse(ReadWholeFile(fixtures_dir + "/tokenizers/expected.json"));
  fixtures.strings = strings.at("strings").get<std::vector<std::string>>();
  fixtures.llama3_ids = expected.at("llama3_tiktoken").get<std::vector<std::vector<int32_t>>>();
  fixtures.llama2_ids =
      expected.at("llama2_sentencepiece").get<std::vector<std::vector<int32_t>>>();
  return fixtures;
}

// Loads `<fixtures>/tokenizers/<relative>` once per binary; fails the test when it cannot.
inline const Tokenizer* FixtureTokenizer(const std::string& fixtures_dir,
                                         const std::string& relative) {
  static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
  const std::string path = fixtures_dir + "/tokenizers/" + relative;
  auto it = cache.find(path);
  if (it == cache.end()) {
    Result<std::unique_ptr<Tokenizer>> loaded = LoadTokenizer(path);
    EXPECT_TRUE(loaded.ok()) << path << ": " << loaded.status().ToString();
    if (!loaded.ok()) return nullptr;
    it = cache.emplace(path, std::move(loaded).value()).first;
  }
  return it->second.get();
}

inline std::vector<int32_t> EncodeOk(const Tokenizer& tokenizer, std::string_view text,
                                     bool add_bos = false) {
  Result<std::vector<int32_t>> ids = tokenizer.Encode(text, add_bos);
  EXPECT_TRUE(ids.ok()) << ids.status().ToString();
  return ids.ok() ? *ids : std::vector<int32_t>{};
}

}  // namespace sieve::testing
