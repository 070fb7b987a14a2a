#include "sparsity/kv_policy_json.h"

#include <limits>
#include <string>

namespace sieve {

namespace {

const char* PoolWord(PoolKind pool) {
  switch (pool) {
    case PoolKind::kMax:
      return "max";
    case PoolKind::kAvg:
      return "avg";
    case PoolKind::kNone:
      return "none";
  }
  return "none";
}

}  // namespace

nlohmann::json KvPolicyOptionsToJson(const KvPolicyOptions& options) {
  return {{"budget", options.budget},
          {"window", options.window},
          {"pool", PoolWord(options.pool)},
          {"kernel", options.kernel},
          {"group_reduce", options.reduce == GroupReduce::kMean ? "mean" : "max"},
          {"pyramid_beta", options.beta},
          {"sinks", options.sinks},
          {"recent", options.recent},
          {"heavy", options.heavy},
          {"decode_cap", options.decode_cap},
          {"decode_cap_by", options.decode_cap_by_score ? "score" : "oldest"}};
}

Result<KvPolicyOptions> KvPolicyOptionsFromJson(const nlohmann::json& json) {
  if (!json.is_object()) return InvalidArgumentError("KV policy options must be a JSON object");
  KvPolicyOptions options;
  const auto integer = [](const std::string& key, const nlohmann::json& value, int& out) -> Status {
    if (!value.is_number_integer() || value.get<int64_t>() < 0 ||
        value.get<int64_t>() > std::numeric_limits<int>::max()) {
      return InvalidArgumentError("KV policy option '" + key +
                                  "' must be a non-negative integer, not " + value.dump());
    }
    out = static_cast<int>(value.get<int64_t>());
    return Status::Ok();
  };
  const auto word = [](const std::string& key, const nlohmann::json& value,
                       std::initializer_list<const char*> words) -> Result<std::string> {
    if (value.is_string()) {
      for (const char* allowed : words) {
        if (value.get<std::string>() == allowed) return value.get<std::string>();
      }
    }
    std::string list;
    for (const char* allowed : words) list += std::string(list.empty() ? "" : ", ") + allowed;
    return InvalidArgumentError("KV policy option '" + key + "' must be one of " + list + ", not " +
                                value.dump());
  };
  for (const auto& [key, value] : json.items()) {
    if (key == "budget") {
      SIEVE_RETURN_IF_ERROR(integer(key, value, options.budget));
    } else if (key == "window") {
      SIEVE_RETURN_IF_ERROR(integer(key, value, options.window));
    } else if (key == "kernel") {
      SIEVE_RETURN_IF_ERROR(integer(key, value, options.kernel));
    } else if (key == "pyramid_beta") {
      SIEVE_RETURN_IF_ERROR(integer(key, value, options.beta));
    } else if (key == "sinks") {
      SIEVE_RETURN_IF_ERROR(integer(key, value, options.sinks));
    } else if (key == "recent") {
      SIEVE_RETURN_IF_ERROR(integer(key, value, options.recent));
    } else if (key == "heavy") {
      SIEVE_RETURN_IF_ERROR(integer(key, value, options.heavy));
    } else if (key == "decode_cap") {
      SIEVE_RETURN_IF_ERROR(integer(key, value, options.decode_cap));
    } else if (key == "pool") {
      SIEVE_ASSIGN_OR_RETURN(const std::string pool, word(key, value, {"max", "avg", "none"}));
      options.pool = pool == "max"   ? PoolKind::kMax
                     : pool == "avg" ? PoolKind::kAvg
                                     : PoolKind::kNone;
    } else if (key == "group_reduce") {
      SIEVE_ASSIGN_OR_RETURN(const std::string reduce, word(key, value, {"mean", "max"}));
      options.reduce = reduce == "mean" ? GroupReduce::kMean : GroupReduce::kMax;
    } else if (key == "decode_cap_by") {
      SIEVE_ASSIGN_OR_RETURN(const std::string by, word(key, value, {"score", "oldest"}));
      options.decode_cap_by_score = by == "score";
    } else {
      return InvalidArgumentError("unknown KV policy option '" + key + "'");
    }
  }
  return options;
}

}  // namespace sieve
