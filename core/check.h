// SIEVE_CHECK: invariants of the program itself. A failed check is a bug in Sieve, so it prints
// where and why and aborts. Never use it for input from outside (files, requests, flags): those
// return a Status.
#pragma once

#include <sstream>
#include <string_view>

namespace sieve::internal {

class CheckFailure {
 public:
  CheckFailure(const char* file, int line, const char* condition);
  [[noreturn]] ~CheckFailure();
  template <typename T>
  CheckFailure& operator<<(const T& value) {
    stream_ << value;
    return *this;
  }

 private:
  std::ostringstream stream_;
};

// Lets `SIEVE_CHECK(c) << x` compile to nothing when c holds.
struct Voidify {
  void operator&(const CheckFailure&) {}
};

}  // namespace sieve::internal

#define SIEVE_CHECK(condition)                 \
  (condition) ? (void)0                        \
              : ::sieve::internal::Voidify() & \
                    ::sieve::internal::CheckFailure(__FILE__, __LINE__, #condition)

#define SIEVE_CHECK_EQ(a, b) SIEVE_CHECK((a) == (b)) << (a) << " vs " << (b) << " "
#define SIEVE_CHECK_LE(a, b) SIEVE_CHECK((a) <= (b)) << (a) << " vs " << (b) << " "
#define SIEVE_CHECK_LT(a, b) SIEVE_CHECK((a) < (b)) << (a) << " vs " << (b) << " "
#define SIEVE_CHECK_GE(a, b) SIEVE_CHECK((a) >= (b)) << (a) << " vs " << (b) << " "
