#include "server/json_util.h"

#include <cmath>

#include <fmt/format.h>

namespace sieve {

std::string DumpJson(const nlohmann::json& value) {
  return value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string JsonTypeName(const nlohmann::json& value) {
  if (value.is_boolean()) return "boolean";
  if (value.is_number_integer()) return "integer";
  if (value.is_number()) return "number";
  if (value.is_string()) return "string";
  if (value.is_array()) return "array";
  if (value.is_object()) return "object";
  return "null";
}

namespace {

// The integer `value` holds, if it is one (10 and 10.0 are; 10.5 and "10" are not).
std::optional<int64_t> AsInteger(const nlohmann::json& value) {
  if (value.is_number_integer()) {
    if (value.is_number_unsigned() && value.get<uint64_t>() > uint64_t{INT64_MAX}) {
      return std::nullopt;
    }
    return value.get<int64_t>();
  }
  if (value.is_number_float()) {
    const double number = value.get<double>();
    if (std::isfinite(number) && std::floor(number) == number && std::fabs(number) < 9.0e18) {
      return static_cast<int64_t>(number);
    }
  }
  return std::nullopt;
}

}  // namespace

const nlohmann::json* FieldReader::Find(std::string_view name) const {
  const auto it = object_.find(name);
  if (it == object_.end() || it->is_null()) return nullptr;
  return &*it;
}

bool FieldReader::Has(std::string_view name) const { return Find(name) != nullptr; }

Status FieldReader::Error(std::string_view name, const std::string& message) const {
  if (param_ != nullptr) *param_ = std::string(name);
  return InvalidArgumentError(message);
}

Status FieldReader::Bool(std::string_view name, bool& out) const {
  const nlohmann::json* value = Find(name);
  if (value == nullptr) return Status::Ok();
  if (!value->is_boolean()) {
    return Error(name, fmt::format("'{}' must be a boolean, not {}", name, JsonTypeName(*value)));
  }
  out = value->get<bool>();
  return Status::Ok();
}

Status FieldReader::Int(std::string_view name, int64_t min, int64_t max, int64_t& out) const {
  const nlohmann::json* value = Find(name);
  if (value == nullptr) return Status::Ok();
  const std::optional<int64_t> integer = AsInteger(*value);
  if (!integer) {
    return Error(name, fmt::format("'{}' must be an integer, not {}", name,
                                   value->is_number() ? "a fraction" : JsonTypeName(*value)));
  }
  if (*integer < min || *integer > max) {
    return Error(name, fmt::format("'{}' must be in [{}, {}], not {}", name, min, max, *integer));
  }
  out = *integer;
  return Status::Ok();
}

Status FieldReader::Int(std::string_view name, int min, int max, int& out) const {
  int64_t wide = out;
  SIEVE_RETURN_IF_ERROR(Int(name, int64_t{min}, int64_t{max}, wide));
  out = static_cast<int>(wide);
  return Status::Ok();
}

Status FieldReader::Float(std::string_view name, double min, double max, float& out) const {
  const nlohmann::json* value = Find(name);
  if (value == nullptr) return Status::Ok();
  if (!value->is_number()) {
    return Error(name, fmt::format("'{}' must be a number, not {}", name, JsonTypeName(*value)));
  }
  const double number = value->get<double>();
  if (!(number >= min && number <= max)) {
    return Error(name,
                 fmt::format("'{}' must be in [{}, {}], not {}", name, min, max, value->dump()));
  }
  out = static_cast<float>(number);
  return Status::Ok();
}

Status FieldReader::String(std::string_view name, std::string& out) const {
  const nlohmann::json* value = Find(name);
  if (value == nullptr) return Status::Ok();
  if (!value->is_string()) {
    return Error(name, fmt::format("'{}' must be a string, not {}", name, JsonTypeName(*value)));
  }
  out = value->get<std::string>();
  return Status::Ok();
}

Status FieldReader::Strings(std::string_view name, std::vector<std::string>& out) const {
  const nlohmann::json* value = Find(name);
  if (value == nullptr) return Status::Ok();
  out.clear();
  if (value->is_string()) {
    out.push_back(value->get<std::string>());
    return Status::Ok();
  }
  if (!value->is_array()) {
    return Error(name, fmt::format("'{}' must be a string or an array of strings, not {}", name,
                                   JsonTypeName(*value)));
  }
  for (const nlohmann::json& item : *value) {
    if (!item.is_string()) {
      return Error(name,
                   fmt::format("'{}' must hold strings only, not {}", name, JsonTypeName(item)));
    }
    out.push_back(item.get<std::string>());
  }
  return Status::Ok();
}

Status FieldReader::IntArray(std::string_view name, int64_t min, int64_t max,
                             std::vector<int32_t>& out) const {
  const nlohmann::json* value = Find(name);
  if (value == nullptr) return Status::Ok();
  if (!value->is_array()) {
    return Error(
        name, fmt::format("'{}' must be an array of integers, not {}", name, JsonTypeName(*value)));
  }
  out.clear();
  for (const nlohmann::json& item : *value) {
    const std::optional<int64_t> integer = AsInteger(item);
    if (!integer) {
      return Error(name,
                   fmt::format("'{}' must hold integers only, not {}", name, JsonTypeName(item)));
    }
    if (*integer < min || *integer > max) {
      return Error(name, fmt::format("'{}' holds {}, outside [{}, {}]", name, *integer, min, max));
    }
    out.push_back(static_cast<int32_t>(*integer));
  }
  return Status::Ok();
}

}  // namespace sieve
