#include "core/tensor.h"

#include <gtest/gtest.h>

namespace sieve {
namespace {

TEST(TensorTest, ViewsShareMemoryAndKeepStrides) {
  Tensor tensor = Tensor::Empty({4, 6}, DType::kF32);
  for (int index = 0; index < 24; ++index) tensor.data_as<float>()[index] = index;
  const Tensor rows = tensor.Rows(1, 3);
  EXPECT_EQ(rows.dim(0), 2);
  EXPECT_EQ(rows.data_as<float>()[0], 6.0f);
  const Tensor columns = tensor.Columns(2, 5);
  EXPECT_EQ(columns.dim(1), 3);
  EXPECT_EQ(columns.stride(0), 6);
  EXPECT_FALSE(columns.is_contiguous());
  EXPECT_EQ(columns.data_as<float>()[columns.stride(0) * 1 + 0], 8.0f);
  EXPECT_EQ(tensor.Reshape({2, 12}).dim(1), 12);
  EXPECT_EQ(tensor.ShapeString(), "[4, 6] f32 cpu");
}

TEST(TensorDeathTest, BadViewsAreBugs) {
  Tensor tensor = Tensor::Empty({4, 6}, DType::kF32);
  EXPECT_DEATH((void)tensor.Rows(3, 5), "Rows");
  EXPECT_DEATH((void)tensor.Reshape({5, 5}), "Reshape");
}

}  // namespace
}  // namespace sieve
