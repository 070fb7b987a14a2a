#include "tools/bench/rgb_image.h"

#include <cstdlib>

#include "tools/bench/bitmap_font.h"

namespace sieve::bench {

namespace {
constexpr int kGlyphAdvance = kGlyphWidth + 1;  // one blank column between characters
}

RgbImage::RgbImage(int width, int height, Rgb background)
    : width_(width), height_(height), pixels_(static_cast<size_t>(width) * height * 3) {
  for (size_t index = 0; index < pixels_.size(); index += 3) {
    pixels_[index] = background.r;
    pixels_[index + 1] = background.g;
    pixels_[index + 2] = background.b;
  }
}

Rgb RgbImage::Get(int x, int y) const {
  if (x < 0 || y < 0 || x >= width_ || y >= height_) return Rgb{};
  const size_t offset = (static_cast<size_t>(y) * width_ + x) * 3;
  return Rgb{pixels_[offset], pixels_[offset + 1], pixels_[offset + 2]};
}

void RgbImage::Set(int x, int y, Rgb color) {
  if (x < 0 || y < 0 || x >= width_ || y >= height_) return;
  const size_t offset = (static_cast<size_t>(y) * width_ + x) * 3;
  pixels_[offset] = color.r;
  pixels_[offset + 1] = color.g;
  pixels_[offset + 2] = color.b;
}

void RgbImage::FillRect(int x, int y, int width, int height, Rgb color) {
  for (int row = y; row < y + height; ++row) {
    for (int column = x; column < x + width; ++column) Set(column, row, color);
  }
}

void RgbImage::DrawLine(int x0, int y0, int x1, int y1, Rgb color, int thickness, int dash) {
  const int dx = std::abs(x1 - x0);
  const int dy = -std::abs(y1 - y0);
  const int step_x = x0 < x1 ? 1 : -1;
  const int step_y = y0 < y1 ? 1 : -1;
  const int pen_offset = (thickness - 1) / 2;
  int error = dx + dy;
  for (int step = 0;; ++step) {
    if (dash <= 0 || (step / dash) % 2 == 0) {
      FillRect(x0 - pen_offset, y0 - pen_offset, thickness, thickness, color);
    }
    if (x0 == x1 && y0 == y1) break;
    const int twice_error = 2 * error;
    if (twice_error >= dy) {
      error += dy;
      x0 += step_x;
    }
    if (twice_error <= dx) {
      error += dx;
      y0 += step_y;
    }
  }
}

void RgbImage::DrawText(int x, int y, std::string_view text, Rgb color, int scale) {
  for (const char c : text) {
    const auto rows = GlyphRows(c);
    for (int row = 0; row < kGlyphHeight; ++row) {
      for (int column = 0; column < kGlyphWidth; ++column) {
        if (rows[static_cast<size_t>(row)] & (1u << (kGlyphWidth - 1 - column))) {
          FillRect(x + column * scale, y + row * scale, scale, scale, color);
        }
      }
    }
    x += kGlyphAdvance * scale;
  }
}

int RgbImage::TextWidth(std::string_view text, int scale) {
  if (text.empty()) return 0;
  return (static_cast<int>(text.size()) * kGlyphAdvance - 1) * scale;
}

int RgbImage::TextHeight(int scale) { return kGlyphHeight * scale; }

}  // namespace sieve::bench
