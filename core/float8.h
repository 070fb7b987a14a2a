// FP8 e4m3 (the "e4m3fn" of PyTorch and OCP FP8: 1 sign, 4 exponent bits of bias 7, 3 mantissa
// bits, no infinities, NaN = S.1111.111, largest finite 448) and the scaled quantization of rows
// that FP8 weights and activations use. This is the CPU twin of the device's conversion
// (cvt.rn.satfinite.e4m3x2.f32, cuda_fp8.h's __NV_SATFINITE): round to nearest even, magnitudes
// past 448 (infinities too) saturate to 448, NaN stays NaN.
#pragma once

#include <array>
#include <cstdint>

namespace sieve {

inline constexpr float kE4m3Max = 448.0f;

uint8_t FloatToE4m3(float value);

// Every code's value, NaN for 0x7f and 0xff.
const std::array<float, 256>& E4m3Values();
inline float E4m3ToFloat(uint8_t bits) { return E4m3Values()[bits]; }

// A row's scale: the value one e4m3 unit of the row stands for, amax / 448 with amax the row's
// largest magnitude (at least kE4m3MinAmax, so that an all-zero row has a finite reciprocal). The
// row is stored as e4m3(x * (448 / amax)) and read back as e4m3 value * scale. Weights take one
// scale per output channel (a row of W[N][K]); activations one per token (a row of x[T][K]),
// computed when the activation is made (dynamic). Both the CPU and the CUDA backend compute these
// two numbers with exactly these float operations, so they agree bit for bit.
inline constexpr float kE4m3MinAmax = 1e-12f;
struct E4m3RowScale {
  float scale;    // amax / 448: what the GEMM multiplies by
  float inverse;  // 448 / amax: what the row is multiplied by before rounding
};
E4m3RowScale E4m3ScaleForAmax(float amax);

// Quantizes `count` values with their row's scale; returns the row's scale.
float QuantizeRowE4m3(const float* row, int64_t count, uint8_t* out);

}  // namespace sieve
