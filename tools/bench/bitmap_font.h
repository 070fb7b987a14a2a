// A 5x8 bitmap font for the plot labels: printable ASCII, drawn for this project (no font file or
// library needed on the machine that draws the plot).
#pragma once

#include <array>
#include <cstdint>

namespace sieve::bench {

inline constexpr int kGlyphWidth = 5;
inline constexpr int kGlyphHeight = 8;  // rows 0-6 hold capitals and digits, row 7 descenders

// The rows of `c`'s glyph, top first; bit 4 is the leftmost column. A character without a glyph
// (outside printable ASCII) is drawn as '?'.
std::array<uint8_t, kGlyphHeight> GlyphRows(char c);

}  // namespace sieve::bench
