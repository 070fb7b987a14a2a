#include "tools/bench/png_writer.h"

#include <algorithm>
#include <array>
#include <fstream>

namespace sieve::bench {

namespace {

constexpr size_t kMaxStoredBlock = 65535;  // a stored block's LEN field is 16 bits

std::array<uint32_t, 256> MakeCrcTable() {
  std::array<uint32_t, 256> table{};
  for (uint32_t n = 0; n < 256; ++n) {
    uint32_t c = n;
    for (int bit = 0; bit < 8; ++bit) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    table[n] = c;
  }
  return table;
}

void PutU32BigEndian(std::string& out, uint32_t value) {
  out += static_cast<char>(value >> 24);
  out += static_cast<char>(value >> 16);
  out += static_cast<char>(value >> 8);
  out += static_cast<char>(value);
}

void PutU16LittleEndian(std::string& out, uint16_t value) {
  out += static_cast<char>(value & 0xFF);
  out += static_cast<char>(value >> 8);
}

void PutChunk(std::string& out, std::string_view type, std::string_view data) {
  PutU32BigEndian(out, static_cast<uint32_t>(data.size()));
  const size_t type_start = out.size();
  out.append(type);
  out.append(data);
  // The CRC covers the type and the data, not the length.
  PutU32BigEndian(out, Crc32(std::string_view(out).substr(type_start)));
}

// A zlib stream (RFC 1950) of stored deflate blocks (RFC 1951, BTYPE 00).
std::string ZlibStored(std::string_view data) {
  std::string out;
  out += '\x78';  // CMF: deflate, 32 KiB window
  out += '\x01';  // FLG: no dictionary, fastest; (0x78 * 256 + 0x01) % 31 == 0 as required
  size_t offset = 0;
  do {
    const size_t length = std::min(kMaxStoredBlock, data.size() - offset);
    const bool final_block = offset + length == data.size();
    out += static_cast<char>(final_block ? 1 : 0);  // BFINAL, BTYPE 00, then byte-aligned
    PutU16LittleEndian(out, static_cast<uint16_t>(length));
    PutU16LittleEndian(out, static_cast<uint16_t>(~length));
    out.append(data.substr(offset, length));
    offset += length;
  } while (offset < data.size());
  PutU32BigEndian(out, Adler32(data));
  return out;
}

}  // namespace

uint32_t Crc32(std::string_view bytes, uint32_t crc) {
  static const std::array<uint32_t, 256> kTable = MakeCrcTable();
  uint32_t c = crc ^ 0xFFFFFFFFu;
  for (const char byte : bytes) c = kTable[(c ^ static_cast<uint8_t>(byte)) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

uint32_t Adler32(std::string_view bytes) {
  constexpr uint32_t kModulus = 65521;
  uint32_t a = 1;
  uint32_t b = 0;
  for (const char byte : bytes) {
    a = (a + static_cast<uint8_t>(byte)) % kModulus;
    b = (b + a) % kModulus;
  }
  return (b << 16) | a;
}

std::string EncodePng(const RgbImage& image) {
  const size_t row_bytes = static_cast<size_t>(image.width()) * 3;
  std::string raw;
  raw.reserve((row_bytes + 1) * static_cast<size_t>(image.height()));
  const auto* pixels = reinterpret_cast<const char*>(image.pixels().data());
  for (int row = 0; row < image.height(); ++row) {
    raw += '\0';  // filter type 0: the row as it is
    raw.append(pixels + static_cast<size_t>(row) * row_bytes, row_bytes);
  }
  std::string header;
  PutU32BigEndian(header, static_cast<uint32_t>(image.width()));
  PutU32BigEndian(header, static_cast<uint32_t>(image.height()));
  header += '\x08';  // bit depth
  header += '\x02';  // colour type: RGB
  header += '\0';    // compression: deflate
  header += '\0';    // filter method 0
  header += '\0';    // no interlace
  std::string png = "\x89PNG\r\n\x1a\n";
  PutChunk(png, "IHDR", header);
  PutChunk(png, "IDAT", ZlibStored(raw));
  PutChunk(png, "IEND", "");
  return png;
}

Status WritePng(const std::string& path, const RgbImage& image) {
  std::ofstream file(path, std::ios::binary);
  const std::string png = EncodePng(image);
  file.write(png.data(), static_cast<std::streamsize>(png.size()));
  file.close();
  if (!file) return InternalError("cannot write '" + path + "'");
  return Status::Ok();
}

}  // namespace sieve::bench
