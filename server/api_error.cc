#include "server/api_error.h"

#include <nlohmann/json.hpp>

#include "server/json_util.h"

namespace sieve {

namespace {

std::string TypeFor(int http_status) {
  switch (http_status) {
    case 401:
      return "authentication_error";
    case 404:
      return "not_found_error";
    case 429:
      return "rate_limit_error";
    case 503:
      return "service_unavailable_error";
    default:
      return http_status >= 500 ? "server_error" : "invalid_request_error";
  }
}

}  // namespace

int HttpStatusFor(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return 200;
    case StatusCode::kInvalidArgument:
    case StatusCode::kOutOfRange:
      return 400;
    case StatusCode::kUnauthenticated:
      return 401;
    case StatusCode::kNotFound:
      return 404;
    case StatusCode::kResourceExhausted:
      return 429;
    case StatusCode::kUnavailable:
      return 503;
    default:
      return 500;
  }
}

ApiError ApiErrorFromStatus(const Status& status, std::string param) {
  return MakeApiError(HttpStatusFor(status.code()), status.message(), std::move(param));
}

ApiError MakeApiError(int http_status, std::string message, std::string param, std::string code) {
  ApiError error;
  error.http_status = http_status;
  error.message = std::move(message);
  error.type = TypeFor(http_status);
  error.param = std::move(param);
  error.code = std::move(code);
  return error;
}

std::string ApiErrorBody(const ApiError& error) {
  const auto string_or_null = [](const std::string& text) {
    return text.empty() ? nlohmann::json(nullptr) : nlohmann::json(text);
  };
  nlohmann::json body;
  body["error"] = {{"message", error.message},
                   {"type", error.type},
                   {"param", string_or_null(error.param)},
                   {"code", string_or_null(error.code)}};
  return DumpJson(body);
}

}  // namespace sieve
