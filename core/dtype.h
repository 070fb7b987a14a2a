// Element types of tensors, and the conversions between the 16-bit floats and float.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

#include "core/status.h"

namespace sieve {

// kF8E4M3: FP8 e4m3 (core/float8.h), the storage of FP8 weights; such a tensor carries its
// per-row dequantization scales (Tensor::row_scales).
enum class DType : uint8_t { kF32, kBF16, kF16, kI32, kI64, kU8, kF8E4M3 };

size_t DTypeSize(DType dtype);
std::string_view DTypeName(DType dtype);  // "f32", "bf16", ...
// Parses Sieve's names and the safetensors / Hugging Face spellings ("F32", "bfloat16", ...).
Result<DType> ParseDType(std::string_view name);

inline float Bf16ToFloat(uint16_t bits) {
  uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// Round to nearest even, as PyTorch and CUDA's __float2bfloat16 do; NaN stays NaN.
inline uint16_t FloatToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

float F16ToFloat(uint16_t bits);
uint16_t FloatToF16(float f);

// Converts `count` elements of `src` (of type `src_dtype`) into floats.
void ConvertToFloat(const void* src, DType src_dtype, size_t count, float* dst);
// Converts floats into `dst_dtype` (f32, bf16 or f16).
void ConvertFromFloat(const float* src, size_t count, DType dst_dtype, void* dst);

}  // namespace sieve
