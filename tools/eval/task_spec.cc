#include "tools/eval/task_spec.h"

#include "core/check.h"

namespace sieve::eval {

namespace {

// The fields tasks.py and the generator read: (section, field, is_text).
struct Field {
  const char* section;
  const char* name;
  bool text;
};
constexpr Field kFields[] = {
    {"passkey", "prefix", true},
    {"passkey", "needle", true},
    {"passkey", "question", true},
    {"passkey", "value_digits", false},
    {"passkey", "max_tokens", false},
    {"niah", "prefix", true},
    {"niah", "needle", true},
    {"niah", "question", true},
    {"niah", "question_all", true},
    {"niah", "value_digits", false},
    {"niah", "max_tokens", false},
    {"niah", "max_tokens_all", false},
    {"niah", "needles_multi", false},
    {"kv_retrieval", "prefix", true},
    {"kv_retrieval", "pair", true},
    {"kv_retrieval", "separator", true},
    {"kv_retrieval", "suffix", true},
    {"kv_retrieval", "question", true},
    {"kv_retrieval", "key_hex_digits", false},
    {"kv_retrieval", "max_tokens", false},
    {"variable_tracking", "prefix", true},
    {"variable_tracking", "first", true},
    {"variable_tracking", "next", true},
    {"variable_tracking", "question", true},
    {"variable_tracking", "name_letters", false},
    {"variable_tracking", "value_digits", false},
    {"variable_tracking", "hops", false},
    {"variable_tracking", "max_tokens", false},
    {"common_words", "prefix", true},
    {"common_words", "item", true},
    {"common_words", "question", true},
    {"common_words", "common", false},
    {"common_words", "max_tokens", false},
    {"common_words", "common_share", false},
    {"common_words", "rare_repeats_max", false},
};

Result<std::vector<std::string>> WordList(const nlohmann::json& json, const char* name,
                                          size_t at_least) {
  const auto it = json.find(name);
  if (it == json.end() || !it->is_array()) {
    return InvalidArgumentError(std::string("tasks.json: '") + name + "' must be a list");
  }
  std::vector<std::string> words;
  for (const auto& word : *it) {
    if (!word.is_string() || word.get<std::string>().empty()) {
      return InvalidArgumentError(std::string("tasks.json: '") + name +
                                  "' must hold non-empty strings");
    }
    words.push_back(word.get<std::string>());
  }
  if (words.size() < at_least) {
    return InvalidArgumentError(std::string("tasks.json: '") + name + "' needs at least " +
                                std::to_string(at_least) + " words");
  }
  return words;
}

}  // namespace

Result<TaskSpec> TaskSpec::Parse(std::string_view text) {
  TaskSpec spec;
  spec.json_ = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!spec.json_.is_object()) return InvalidArgumentError("tasks.json is not a JSON object");
  for (const Field& field : kFields) {
    const auto section = spec.json_.find(field.section);
    const std::string where = std::string(field.section) + "." + field.name;
    if (section == spec.json_.end() || !section->is_object() || !section->contains(field.name)) {
      return InvalidArgumentError("tasks.json lacks " + where);
    }
    const auto& value = (*section)[field.name];
    if (field.text ? !value.is_string() : !value.is_number()) {
      return InvalidArgumentError("tasks.json: " + where + " must be a " +
                                  (field.text ? "string" : "number"));
    }
  }
  const auto noise = spec.json_.find("noise_sentence");
  if (noise == spec.json_.end() || !noise->is_string() || noise->get<std::string>().empty()) {
    return InvalidArgumentError("tasks.json lacks noise_sentence");
  }
  spec.noise_sentence_ = noise->get<std::string>();
  SIEVE_ASSIGN_OR_RETURN(spec.key_adjectives_, WordList(spec.json_, "key_adjectives", 2));
  SIEVE_ASSIGN_OR_RETURN(spec.key_nouns_, WordList(spec.json_, "key_nouns", 2));
  const size_t common = static_cast<size_t>(spec.Int("common_words", "common"));
  SIEVE_ASSIGN_OR_RETURN(spec.list_words_, WordList(spec.json_, "list_words", common + 1));
  return spec;
}

const TaskSpec& TaskSpec::Embedded() {
  static const TaskSpec spec = [] {
    auto parsed = Parse(EmbeddedTasksJson());
    SIEVE_CHECK(parsed.ok()) << "the compiled-in tasks.json: " << parsed.status().ToString();
    return std::move(parsed).value();
  }();
  return spec;
}

const std::string& TaskSpec::Text(std::string_view section, std::string_view field) const {
  return json_.at(std::string(section)).at(std::string(field)).get_ref<const std::string&>();
}

int TaskSpec::Int(std::string_view section, std::string_view field) const {
  return json_.at(std::string(section)).at(std::string(field)).get<int>();
}

double TaskSpec::Number(std::string_view section, std::string_view field) const {
  return json_.at(std::string(section)).at(std::string(field)).get<double>();
}

std::string Fill(std::string_view text,
                 std::initializer_list<std::pair<std::string_view, std::string_view>> values) {
  std::string out(text);
  for (const auto& [key, value] : values) {
    std::string placeholder(1, '{');
    placeholder.append(key);
    placeholder.push_back('}');
    for (size_t at = out.find(placeholder); at != std::string::npos;
         at = out.find(placeholder, at + value.size())) {
      out.replace(at, placeholder.size(), value);
    }
  }
  return out;
}

}  // namespace sieve::eval
