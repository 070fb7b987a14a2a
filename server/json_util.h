// JSON helpers of the server: dumping that never throws, and typed reads of request fields that
// fail with a 400-worthy Status naming the field.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace sieve {

// Compact JSON; invalid UTF-8 (which should never reach here) becomes U+FFFD instead of throwing.
std::string DumpJson(const nlohmann::json& value);

// Typed reads of `object[name]`. An absent or null field leaves `out` unchanged and is ok (OpenAI
// clients send null for "unset"); a field of the wrong type or out of range is InvalidArgument
// with a message that names it, and `*param` (if given) is set to `name`.
class FieldReader {
 public:
  FieldReader(const nlohmann::json& object, std::string* param) : object_(object), param_(param) {}

  // Present and not null.
  bool Has(std::string_view name) const;
  const nlohmann::json* Find(std::string_view name) const;

  Status Bool(std::string_view name, bool& out) const;
  // Integers (a float with an integral value, such as 10.0, is accepted) in [min, max].
  Status Int(std::string_view name, int64_t min, int64_t max, int64_t& out) const;
  Status Int(std::string_view name, int min, int max, int& out) const;
  // Numbers in [min, max].
  Status Float(std::string_view name, double min, double max, float& out) const;
  Status String(std::string_view name, std::string& out) const;
  // A string or an array of strings.
  Status Strings(std::string_view name, std::vector<std::string>& out) const;
  Status IntArray(std::string_view name, int64_t min, int64_t max, std::vector<int32_t>& out) const;

  // An InvalidArgument error about field `name`, recording it as the param.
  Status Error(std::string_view name, const std::string& message) const;

 private:
  const nlohmann::json& object_;
  std::string* param_;
};

// JSON's name for the type of `value` ("string", "number", ...), for error messages.
std::string JsonTypeName(const nlohmann::json& value);

}  // namespace sieve
