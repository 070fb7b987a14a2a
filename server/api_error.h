// ApiError: an error as the OpenAI API reports it, with the HTTP status that goes with it.
//
// Body: {"error": {"message": ..., "type": ..., "param": ..., "code": ...}}. Statuses come from
// the Status code of what failed: InvalidArgument / OutOfRange 400, Unauthenticated 401,
// NotFound 404, ResourceExhausted 429, Unavailable 503, anything else 500; the HTTP layer adds
// 405 (method), 413 (body too large).
#pragma once

#include <string>

#include "core/status.h"

namespace sieve {

struct ApiError {
  int http_status = 500;
  std::string message;
  std::string type;   // OpenAI's: invalid_request_error, authentication_error, ...
  std::string param;  // the request field at fault; "" : null
  std::string code;   // a machine-readable reason; "" : null
};

int HttpStatusFor(StatusCode code);
// An ApiError for `status` (which must not be ok); `param` names the field at fault, if known.
ApiError ApiErrorFromStatus(const Status& status, std::string param = "");
ApiError MakeApiError(int http_status, std::string message, std::string param = "",
                      std::string code = "");
// The JSON body of `error`.
std::string ApiErrorBody(const ApiError& error);

}  // namespace sieve
