#include "core/status.h"

#include <gtest/gtest.h>

namespace sieve {
namespace {

Result<int> Half(int value) {
  if (value % 2) return InvalidArgumentError("odd value " + std::to_string(value));
  return value / 2;
}

Result<int> Quarter(int value) {
  SIEVE_ASSIGN_OR_RETURN(int half, Half(value));
  SIEVE_ASSIGN_OR_RETURN(int quarter, Half(half));
  return quarter;
}

TEST(StatusTest, ResultCarriesValueOrError) {
  EXPECT_EQ(*Quarter(8), 2);
  const auto failed = Quarter(6);
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(failed.status().ToString(), "INVALID_ARGUMENT: odd value 3");
}

TEST(StatusTest, ContextIsPrepended) {
  const Status status = NotFoundError("no file").WithContext("loading model");
  EXPECT_EQ(status.message(), "loading model: no file");
  EXPECT_TRUE(Status::Ok().WithContext("x").ok());
}

}  // namespace
}  // namespace sieve
