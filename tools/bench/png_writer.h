// A PNG encoder with no zlib: 8-bit RGB, every row unfiltered, the zlib stream made of "stored"
// (uncompressed) deflate blocks. Files are larger than a compressing encoder's (width x height x 3
// bytes, about 2 MB for a 1200 x 560 chart) but it runs on any machine, libpng or not.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "core/status.h"
#include "tools/bench/rgb_image.h"

namespace sieve::bench {

// CRC-32 as PNG chunks use it (ISO 3309, reflected polynomial 0xEDB88320), continuing from `crc`
// (0 to start).
uint32_t Crc32(std::string_view bytes, uint32_t crc = 0);
// Adler-32 as the zlib stream ends with it.
uint32_t Adler32(std::string_view bytes);

// The whole file: signature, IHDR, one IDAT, IEND.
std::string EncodePng(const RgbImage& image);
Status WritePng(const std::string& path, const RgbImage& image);

}  // namespace sieve::bench
