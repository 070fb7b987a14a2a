// Tensor: a typed, shaped view of memory on one device, optionally sharing ownership of it.
//
// Shapes are row-major; `strides` are in elements. Most ops require the innermost dimension to be
// contiguous; views made by Rows() and Columns() keep that and carry the outer stride (how the
// model takes q, k and v out of one fused qkv buffer without copying). Copying a Tensor copies the
// view, not the data.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/dtype.h"

namespace sieve {

enum class Device : uint8_t { kCpu, kCuda };

std::string_view DeviceName(Device device);

class Tensor {
 public:
  Tensor() = default;

  // Allocates zero-initialised host memory (64-byte aligned).
  static Tensor Empty(std::vector<int64_t> shape, DType dtype);
  // A view of memory someone else owns. `owner` keeps it alive if given.
  static Tensor Wrap(void* data, std::vector<int64_t> shape, DType dtype, Device device,
                     std::shared_ptr<void> owner = nullptr);

  bool defined() const { return data_ != nullptr; }
  void* data() const { return data_; }
  template <typename T>
  T* data_as() const {
    return static_cast<T*>(data_);
  }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  const std::vector<int64_t>& strides() const { return strides_; }
  int rank() const { return static_cast<int>(shape_.size()); }
  int64_t dim(int index) const;
  int64_t stride(int index) const;
  int64_t numel() const;
  size_t element_size() const { return DTypeSize(dtype_); }
  // Bytes spanned when contiguous; CHECKs contiguity.
  size_t nbytes() const;
  bool is_contiguous() const;

  // Rows [begin, end) of dimension 0.
  Tensor Rows(int64_t begin, int64_t end) const;
  // Columns [begin, end) of the last dimension of a 2-D tensor; keeps the row stride.
  Tensor Columns(int64_t begin, int64_t end) const;
  // Same memory, new shape; the tensor must be contiguous.
  Tensor Reshape(std::vector<int64_t> shape) const;

  std::string ShapeString() const;  // "[4, 64] bf16 cpu"

  // A quantized matrix's dequantization scales, one per row: element [r][c] stands for
  // value(r, c) * row_scales()[r]. [dim(0)] f32 on the same device. Only kF8E4M3 tensors carry
  // them (FP8 weights, per output channel); Rows() views take their rows' scales along, and
  // Columns() and Reshape() of such a tensor are refused (a row's scale covers the whole row).
  const Tensor& row_scales() const;
  bool has_row_scales() const { return row_scales_ != nullptr; }
  // This view with `scales` ([dim(0)] f32, same device) attached.
  Tensor WithRowScales(Tensor scales) const;

 private:
  void* data_ = nullptr;
  std::vector<int64_t> shape_;
  std::vector<int64_t> strides_;
  DType dtype_ = DType::kF32;
  Device device_ = Device::kCpu;
  std::shared_ptr<void> owner_;
  std::shared_ptr<const Tensor> row_scales_;  // null unless quantized
};

}  // namespace sieve
