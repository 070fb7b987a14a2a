#include "kv/page_key.h"

#include <cstring>
#include <functional>
#include <string>

#include "core/check.h"

namespace sieve {
namespace {

// std::hash over the bytes: the standard library's string hash, for spreading keys only (lookups
// compare whole keys).
uint64_t HashBytes(const void* data, size_t size) {
  return std::hash<std::string_view>{}(std::string_view(static_cast<const char*>(data), size));
}

}  // namespace

PageKey MakePageKey(uint64_t parent, uint64_t extra, std::span<const int32_t> tokens) {
  PageKey key{parent, extra, std::vector<int32_t>(tokens.begin(), tokens.end()), 0};
  std::string bytes(2 * sizeof(uint64_t) + tokens.size_bytes(), '\0');
  std::memcpy(bytes.data(), &parent, sizeof(parent));
  std::memcpy(bytes.data() + sizeof(parent), &extra, sizeof(extra));
  if (!tokens.empty()) {
    std::memcpy(bytes.data() + 2 * sizeof(uint64_t), tokens.data(), tokens.size_bytes());
  }
  key.hash = HashBytes(bytes.data(), bytes.size());
  // 0 is the first page's parent: a page's own hash never takes it.
  if (key.hash == 0) key.hash = 1;
  return key;
}

std::vector<PageKey> FullPageKeys(std::span<const int32_t> tokens, int page_size, uint64_t extra) {
  SIEVE_CHECK(page_size > 0) << "page size " << page_size;
  std::vector<PageKey> keys;
  keys.reserve(tokens.size() / page_size);
  uint64_t parent = 0;
  for (size_t start = 0; start + page_size <= tokens.size(); start += page_size) {
    keys.push_back(MakePageKey(parent, extra, tokens.subspan(start, page_size)));
    parent = keys.back().hash;
  }
  return keys;
}

uint64_t MixExtraKey(uint64_t extra, uint64_t value) {
  const uint64_t pair[2] = {extra, value};
  return HashBytes(pair, sizeof(pair));
}

uint64_t MixExtraKey(uint64_t extra, std::string_view text) {
  return MixExtraKey(extra, HashBytes(text.data(), text.size()));
}

}  // namespace sieve
