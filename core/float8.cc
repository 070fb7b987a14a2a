#include "core/float8.h"

#include <cmath>
#include <cstring>
#include <limits>

namespace sieve {

uint8_t FloatToE4m3(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80u);
  const uint32_t magnitude_bits = bits & 0x7fffffffu;
  if (magnitude_bits > 0x7f800000u) return 0x7f;  // NaN (the canonical one, as the device)
  float magnitude;
  std::memcpy(&magnitude, &magnitude_bits, sizeof(magnitude));
  if (magnitude >= kE4m3Max) return static_cast<uint8_t>(sign | 0x7e);  // saturate (inf too)
  if (magnitude < 0.015625f) {
    // Below the smallest normal 2^-6: multiples of 2^-9. magnitude * 512 is exact, and
    // nearbyint rounds half to even under the default rounding mode; 8 (the smallest normal)
    // encodes as 0x08 too.
    return static_cast<uint8_t>(sign | static_cast<uint8_t>(std::nearbyint(magnitude * 512.0f)));
  }
  // Normal: keep 3 of float's 23 mantissa bits, rounding the 20 dropped to nearest even; a carry
  // into the exponent is the right result. Past 448 after rounding (448 < x < 464 rounds up to
  // 480, not finite) saturates.
  const uint32_t rounded = magnitude_bits + 0x7ffffu + ((magnitude_bits >> 20) & 1u);
  const int exponent = static_cast<int>(rounded >> 23) - 127 + 7;
  const uint32_t mantissa = (rounded >> 20) & 7u;
  if (exponent > 15 || (exponent == 15 && mantissa == 7)) return static_cast<uint8_t>(sign | 0x7e);
  return static_cast<uint8_t>(sign | (exponent << 3) | mantissa);
}

const std::array<float, 256>& E4m3Values() {
  static const std::array<float, 256> values = [] {
    std::array<float, 256> table{};
    for (int code = 0; code < 256; ++code) {
      const int exponent = (code >> 3) & 15;
      const int mantissa = code & 7;
      float magnitude;
      if (exponent == 15 && mantissa == 7) {
        magnitude = std::numeric_limits<float>::quiet_NaN();
      } else if (exponent == 0) {
        magnitude = std::ldexp(static_cast<float>(mantissa), -9);
      } else {
        magnitude = std::ldexp(1.0f + static_cast<float>(mantissa) / 8.0f, exponent - 7);
      }
      table[static_cast<size_t>(code)] = (code & 0x80) != 0 ? -magnitude : magnitude;
    }
    return table;
  }();
  return values;
}

E4m3RowScale E4m3ScaleForAmax(float amax) {
  const float clamped = std::fmax(amax, kE4m3MinAmax);
  return E4m3RowScale{clamped / kE4m3Max, kE4m3Max / clamped};
}

float QuantizeRowE4m3(const float* row, int64_t count, uint8_t* out) {
  float amax = 0.0f;
  for (int64_t index = 0; index < count; ++index) amax = std::fmax(amax, std::fabs(row[index]));
  const E4m3RowScale scale = E4m3ScaleForAmax(amax);
  for (int64_t index = 0; index < count; ++index)
    out[index] = FloatToE4m3(row[index] * scale.inverse);
  return scale.scale;
}

}  // namespace sieve
