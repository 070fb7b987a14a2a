// The integer arithmetic behind decode attention's e4m3 fragments (kv_fp8.cuh, E4m3WarpRows):
// plain functions of a word, compiled for the host too so that a CPU test checks every byte.
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define SIEVE_HOST_DEVICE __host__ __device__
#else
#define SIEVE_HOST_DEVICE
#endif

namespace sieve::cuda {

// What an element read through E4m3EvenBytesToHalf2 / E4m3OddBytesToHalf2 must be multiplied by.
inline constexpr float kE4m3HalfBitsScale = 256.0f;

// Bytes 1 and 3 of `word` (e4m3) as an f16 pair (byte 1 in the low half), each the value / 256:
// s.eeee.mmm becomes s << 15 | eeee.mmm << 7, an f16 of exponent field eeee and mantissa
// mmm0000000 (subnormal where eeee is 0, as in e4m3).
SIEVE_HOST_DEVICE constexpr uint32_t E4m3OddBytesToHalf2(uint32_t word) {
  return (word & 0x80008000u) | ((word & 0x7f007f00u) >> 1);
}
// Bytes 0 and 2 of `word` (e4m3) as an f16 pair (byte 0 in the low half), each the value / 256.
SIEVE_HOST_DEVICE constexpr uint32_t E4m3EvenBytesToHalf2(uint32_t word) {
  return E4m3OddBytesToHalf2(word << 8);
}

// The dimension (within the head) of column 2t + e of output accumulator tile n: tiles 4j..4j + 3
// cover dimensions 32j..32j + 31 as even 0-15, odd 0-15, even 16-31, odd 16-31 (the even bytes of
// a V fragment fill one tile, the odd bytes the next).
SIEVE_HOST_DEVICE constexpr int E4m3OutputColumn(int n, int t, int e) {
  return 32 * (n / 4) + 16 * ((n % 4) / 2) + 4 * t + 2 * e + (n % 2);
}

}  // namespace sieve::cuda
