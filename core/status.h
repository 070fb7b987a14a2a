// Status and Result<T>: how errors cross module and thread boundaries in Sieve.
//
// Bad input from outside (a request, a file, a flag) becomes a Status with a message that names
// what was wrong; it never aborts the process. CHECK (core/check.h) is only for the program's own
// invariants. Exceptions never cross a module or thread boundary.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace sieve {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,    // bad value from the caller (flag, request field, prompt)
  kNotFound,           // a file, tensor, model or route that does not exist
  kOutOfRange,         // e.g. a prompt longer than the context
  kUnimplemented,      // e.g. an unsupported architecture or tokenizer type
  kDataLoss,           // a corrupt or truncated file
  kResourceExhausted,  // out of KV pages, queue full
  kUnavailable,        // shutting down, temporarily unable to serve
  kAborted,            // request aborted (client gone)
  kInternal,           // a bug or a failing system call
  kUnauthenticated,    // missing or wrong API key
};

std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "INVALID_ARGUMENT: message"
  std::string ToString() const;

  // Adds context in front of the message: "loading model: <old message>".
  Status WithContext(std::string_view context) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status InvalidArgumentError(std::string m) {
  return Status(StatusCode::kInvalidArgument, std::move(m));
}
inline Status NotFoundError(std::string m) { return Status(StatusCode::kNotFound, std::move(m)); }
inline Status OutOfRangeError(std::string m) {
  return Status(StatusCode::kOutOfRange, std::move(m));
}
inline Status UnimplementedError(std::string m) {
  return Status(StatusCode::kUnimplemented, std::move(m));
}
inline Status DataLossError(std::string m) { return Status(StatusCode::kDataLoss, std::move(m)); }
inline Status ResourceExhaustedError(std::string m) {
  return Status(StatusCode::kResourceExhausted, std::move(m));
}
inline Status UnavailableError(std::string m) {
  return Status(StatusCode::kUnavailable, std::move(m));
}
inline Status AbortedError(std::string m) { return Status(StatusCode::kAborted, std::move(m)); }
inline Status InternalError(std::string m) { return Status(StatusCode::kInternal, std::move(m)); }
inline Status UnauthenticatedError(std::string m) {
  return Status(StatusCode::kUnauthenticated, std::move(m));
}

// A value or the Status that explains why there is none.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : data_(std::move(value)) {}         // NOLINT: implicit by design
  Result(Status status) : data_(std::move(status)) {}  // NOLINT: implicit by design

  bool ok() const { return std::holds_alternative<T>(data_); }
  const Status& status() const {
    static const Status kOkStatus;
    return ok() ? kOkStatus : std::get<Status>(data_);
  }
  T& value() & { return std::get<T>(data_); }
  const T& value() const& { return std::get<T>(data_); }
  T&& value() && { return std::get<T>(std::move(data_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<T, Status> data_;
};

}  // namespace sieve

#define SIEVE_CONCAT_INNER_(a, b) a##b
#define SIEVE_CONCAT_(a, b) SIEVE_CONCAT_INNER_(a, b)

#define SIEVE_RETURN_IF_ERROR(expr)         \
  do {                                      \
    ::sieve::Status sieve_status_ = (expr); \
    if (!sieve_status_.ok()) {              \
      return sieve_status_;                 \
    }                                       \
  } while (0)

#define SIEVE_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) {                                   \
    return tmp.status();                             \
  }                                                  \
  lhs = std::move(tmp).value()

// SIEVE_ASSIGN_OR_RETURN(auto x, MakeX());
#define SIEVE_ASSIGN_OR_RETURN(lhs, expr) \
  SIEVE_ASSIGN_OR_RETURN_IMPL_(SIEVE_CONCAT_(sieve_result_, __LINE__), lhs, expr)
