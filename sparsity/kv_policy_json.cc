#include "sparsity/kv_policy_json.h"

#include <cstdint>
#include <limits>
#include <string>

namespace sieve {

namespace {

// The integer knobs by key.
constexpr std::pair<const char*, int KvPolicyOptions::*> kIntegerKnobs[] = {
    {"budget", &KvPolicyOptions::budget}, {"window", &KvPolicyOptions::window},
    {"kernel", &KvPolicyOptions::kernel}, {"pyramid_beta", &KvPolicyOptions::beta},
    {"sinks", &KvPolicyOptions::sinks},   {"recent", &KvPolicyOptions::recent},
    {"heavy", &KvPolicyOptions::heavy},   {"decode_cap", &KvPolicyOptions::decode_cap},
};

// The enumerated knobs: their words, in the order of the values they stand for.
constexpr const char* kPoolWords[] = {"none", "max", "avg"};  // PoolKind 0, 1, 2
constexpr const char* kReduceWords[] = {"mean", "max"};       // GroupReduce 0, 1
constexpr const char* kCapByWords[] = {"oldest", "score"};    // decode_cap_by_score false, true

template <size_t N>
Result<int> WordIndex(const std::string& key, const nlohmann::json& value,
                      const char* const (&words)[N]) {
  for (size_t index = 0; index < N; ++index) {
    if (value.is_string() && value.get<std::string>() == words[index]) {
      return static_cast<int>(index);
    }
  }
  std::string list;
  for (const char* word : words) list += std::string(list.empty() ? "" : ", ") + word;
  return InvalidArgumentError("KV policy option '" + key + "' must be one of " + list + ", not " +
                              value.dump());
}

}  // namespace

nlohmann::json KvPolicyOptionsToJson(const KvPolicyOptions& options) {
  nlohmann::json json = nlohmann::json::object();
  for (const auto& [key, member] : kIntegerKnobs) json[key] = options.*member;
  json["pool"] = kPoolWords[static_cast<int>(options.pool)];
  json["group_reduce"] = kReduceWords[static_cast<int>(options.reduce)];
  json["decode_cap_by"] = kCapByWords[options.decode_cap_by_score ? 1 : 0];
  return json;
}

Result<KvPolicyOptions> KvPolicyOptionsFromJson(const nlohmann::json& json) {
  if (!json.is_object()) return InvalidArgumentError("KV policy options must be a JSON object");
  KvPolicyOptions options;
  for (const auto& [key, value] : json.items()) {
    bool known = false;
    for (const auto& [name, member] : kIntegerKnobs) {
      if (key != name) continue;
      known = true;
      if (!value.is_number_integer() || value.get<int64_t>() < 0 ||
          value.get<int64_t>() > std::numeric_limits<int>::max()) {
        return InvalidArgumentError("KV policy option '" + key +
                                    "' must be a non-negative integer, not " + value.dump());
      }
      options.*member = static_cast<int>(value.get<int64_t>());
    }
    if (known) continue;
    if (key == "pool") {
      SIEVE_ASSIGN_OR_RETURN(const int index, WordIndex(key, value, kPoolWords));
      options.pool = static_cast<PoolKind>(index);
    } else if (key == "group_reduce") {
      SIEVE_ASSIGN_OR_RETURN(const int index, WordIndex(key, value, kReduceWords));
      options.reduce = static_cast<GroupReduce>(index);
    } else if (key == "decode_cap_by") {
      SIEVE_ASSIGN_OR_RETURN(const int index, WordIndex(key, value, kCapByWords));
      options.decode_cap_by_score = index == 1;
    } else {
      return InvalidArgumentError("unknown KV policy option '" + key + "'");
    }
  }
  return options;
}

}  // namespace sieve
