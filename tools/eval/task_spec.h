// TaskSpec: the wording of `sieve eval`'s long-context tasks, from tools/eval/tasks.json.
//
// The file is compiled into the binary (tools/eval/CMakeLists.txt writes it into a raw string
// literal), so an installed sieve needs no data files; scripts/train/tasks.py reads the same file
// to build training examples, so a model is evaluated on the prompts it was trained on.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace sieve::eval {

// tasks.json as it was at build time.
std::string_view EmbeddedTasksJson();

class TaskSpec {
 public:
  // Checks every field the generator reads, so a bad file fails here, naming the field, and
  // not halfway through a run.
  static Result<TaskSpec> Parse(std::string_view text);
  // The compiled-in spec (parsed once; the build's own file is known to be good).
  static const TaskSpec& Embedded();

  // section.field, e.g. Text("passkey", "needle"). Parse guaranteed they exist.
  const std::string& Text(std::string_view section, std::string_view field) const;
  int Int(std::string_view section, std::string_view field) const;
  double Number(std::string_view section, std::string_view field) const;
  const std::string& noise_sentence() const { return noise_sentence_; }
  const std::vector<std::string>& key_adjectives() const { return key_adjectives_; }
  const std::vector<std::string>& key_nouns() const { return key_nouns_; }
  const std::vector<std::string>& list_words() const { return list_words_; }

 private:
  nlohmann::json json_;
  std::string noise_sentence_;
  std::vector<std::string> key_adjectives_;
  std::vector<std::string> key_nouns_;
  std::vector<std::string> list_words_;
};

// "{key}" -> value for each pair, as tasks.py's fill().
std::string Fill(std::string_view text,
                 std::initializer_list<std::pair<std::string_view, std::string_view>> values);

}  // namespace sieve::eval
