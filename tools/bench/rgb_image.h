// RgbImage: an 8-bit RGB raster with the few drawing operations a line chart needs: rectangles,
// lines (solid or dashed, any thickness) and text in the built-in 5x8 font. Drawing outside the
// image is clipped, never an error.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace sieve::bench {

struct Rgb {
  uint8_t r = 0;
  uint8_t g = 0;
  uint8_t b = 0;
  bool operator==(const Rgb&) const = default;
};

class RgbImage {
 public:
  RgbImage(int width, int height, Rgb background);

  int width() const { return width_; }
  int height() const { return height_; }
  // [height][width][3] bytes, rows top to bottom: what the PNG encoder takes.
  const std::vector<uint8_t>& pixels() const { return pixels_; }

  Rgb Get(int x, int y) const;
  void Set(int x, int y, Rgb color);
  void FillRect(int x, int y, int width, int height, Rgb color);
  // Bresenham's line with a square pen of `thickness` pixels. `dash` > 0 draws `dash` pixels, then
  // skips `dash`, measured along the line.
  void DrawLine(int x0, int y0, int x1, int y1, Rgb color, int thickness = 1, int dash = 0);
  // Text with its top-left corner at (x, y), each font pixel drawn as scale x scale.
  void DrawText(int x, int y, std::string_view text, Rgb color, int scale = 1);
  static int TextWidth(std::string_view text, int scale);
  static int TextHeight(int scale);

 private:
  int width_;
  int height_;
  std::vector<uint8_t> pixels_;
};

}  // namespace sieve::bench
