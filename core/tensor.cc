#include "core/tensor.h"

#include <algorithm>

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <sstream>

namespace sieve {

namespace {

std::vector<int64_t> ContiguousStrides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> strides(shape.size());
  int64_t running = 1;
  for (int index = static_cast<int>(shape.size()) - 1; index >= 0; --index) {
    strides[index] = running;
    running *= shape[index];
  }
  return strides;
}

}  // namespace

std::string_view DeviceName(Device device) { return device == Device::kCpu ? "cpu" : "cuda"; }

Tensor Tensor::Empty(std::vector<int64_t> shape, DType dtype) {
  int64_t count = 1;
  for (int64_t extent : shape) {
    SIEVE_CHECK(extent >= 0) << "negative extent";
    count *= extent;
  }
  const size_t bytes = static_cast<size_t>(count) * DTypeSize(dtype);
  const size_t rounded = std::max<size_t>(64, ((bytes + 63) / 64) * 64);
  std::shared_ptr<void> owner;
  void* memory;
  if (rounded >= (size_t{1} << 20)) {
    // Large buffers (KV pools, weights) come zeroed from the kernel, page by page as touched,
    // instead of being written once here.
    memory = mmap(nullptr, rounded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    SIEVE_CHECK(memory != MAP_FAILED) << "host allocation of " << bytes << " bytes failed";
    owner = std::shared_ptr<void>(memory, [rounded](void* p) { munmap(p, rounded); });
  } else {
    memory = std::aligned_alloc(64, rounded);
    SIEVE_CHECK(memory != nullptr) << "host allocation of " << bytes << " bytes failed";
    std::memset(memory, 0, rounded);
    owner = std::shared_ptr<void>(memory, [](void* p) { std::free(p); });
  }
  return Wrap(memory, std::move(shape), dtype, Device::kCpu, std::move(owner));
}

Tensor Tensor::Wrap(void* data, std::vector<int64_t> shape, DType dtype, Device device,
                    std::shared_ptr<void> owner) {
  Tensor tensor;
  tensor.data_ = data;
  tensor.strides_ = ContiguousStrides(shape);
  tensor.shape_ = std::move(shape);
  tensor.dtype_ = dtype;
  tensor.device_ = device;
  tensor.owner_ = std::move(owner);
  return tensor;
}

int64_t Tensor::dim(int index) const {
  if (index < 0) index += rank();
  SIEVE_CHECK(index >= 0 && index < rank()) << "dim " << index << " of " << ShapeString();
  return shape_[index];
}

int64_t Tensor::stride(int index) const {
  if (index < 0) index += rank();
  SIEVE_CHECK(index >= 0 && index < rank()) << "stride " << index << " of " << ShapeString();
  return strides_[index];
}

int64_t Tensor::numel() const {
  int64_t count = 1;
  for (int64_t extent : shape_) count *= extent;
  return count;
}

bool Tensor::is_contiguous() const { return strides_ == ContiguousStrides(shape_); }

size_t Tensor::nbytes() const {
  SIEVE_CHECK(is_contiguous()) << "nbytes of a strided view " << ShapeString();
  return static_cast<size_t>(numel()) * element_size();
}

Tensor Tensor::Rows(int64_t begin, int64_t end) const {
  SIEVE_CHECK(rank() >= 1 && begin >= 0 && begin <= end && end <= shape_[0])
      << "Rows(" << begin << ", " << end << ") of " << ShapeString();
  Tensor view = *this;
  view.data_ = static_cast<char*>(data_) + begin * strides_[0] * element_size();
  view.shape_[0] = end - begin;
  if (row_scales_ != nullptr) {
    view.row_scales_ = std::make_shared<const Tensor>(row_scales_->Rows(begin, end));
  }
  return view;
}

Tensor Tensor::Columns(int64_t begin, int64_t end) const {
  SIEVE_CHECK(rank() == 2 && begin >= 0 && begin <= end && end <= shape_[1] && strides_[1] == 1)
      << "Columns(" << begin << ", " << end << ") of " << ShapeString();
  SIEVE_CHECK(row_scales_ == nullptr)
      << "Columns() of a matrix quantized by rows " << ShapeString();
  Tensor view = *this;
  view.data_ = static_cast<char*>(data_) + begin * element_size();
  view.shape_[1] = end - begin;
  return view;
}

Tensor Tensor::Reshape(std::vector<int64_t> shape) const {
  SIEVE_CHECK(is_contiguous()) << "Reshape of a strided view " << ShapeString();
  SIEVE_CHECK(row_scales_ == nullptr) << "Reshape of a matrix quantized by rows " << ShapeString();
  int64_t count = 1;
  for (int64_t extent : shape) count *= extent;
  SIEVE_CHECK(count == numel()) << "Reshape to a different element count " << ShapeString();
  Tensor view = *this;
  view.strides_ = ContiguousStrides(shape);
  view.shape_ = std::move(shape);
  return view;
}

const Tensor& Tensor::row_scales() const {
  SIEVE_CHECK(row_scales_ != nullptr) << ShapeString() << " carries no row scales";
  return *row_scales_;
}

Tensor Tensor::WithRowScales(Tensor scales) const {
  SIEVE_CHECK(dtype_ == DType::kF8E4M3 && rank() >= 1 && scales.dtype() == DType::kF32 &&
              scales.rank() == 1 && scales.dim(0) == shape_[0] && scales.device() == device_ &&
              scales.is_contiguous())
      << "row scales " << scales.ShapeString() << " for " << ShapeString();
  Tensor view = *this;
  view.row_scales_ = std::make_shared<const Tensor>(std::move(scales));
  return view;
}

std::string Tensor::ShapeString() const {
  std::ostringstream out;
  out << "[";
  for (size_t index = 0; index < shape_.size(); ++index) {
    if (index) out << ", ";
    out << shape_[index];
  }
  out << "] " << DTypeName(dtype_) << " " << DeviceName(device_);
  return out.str();
}

}  // namespace sieve
