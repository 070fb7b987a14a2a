// PageKey: what a full KV page's contents depend on, for the prefix cache (BlockPool::Register,
// KvCacheManager's cached-prefix calls). A page of layer l holding tokens [i, i + page_size) of a
// prompt holds K/V that depend on every token before it, its own tokens, and what else shapes the
// layer's entries (the layer, the model, the KV dtype and scales, the layer's policy and knobs):
// the key chains a parent (the previous page's hash) with the page's token ids and an `extra` key
// for the rest, as vLLM's block hashes do. The hash only spreads keys over the map: a lookup
// compares the whole key, so two prompts share a page only when every token before and in it and
// the extra key are equal.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace sieve {

struct PageKey {
  uint64_t parent = 0;  // the previous page's hash; 0 for a prompt's first page
  uint64_t extra = 0;   // everything but the tokens (MixExtraKey)
  std::vector<int32_t> tokens;
  uint64_t hash = 0;  // of the three above

  // Equal keys name equal K/V (hash and the chained parent stand for the tokens before).
  bool operator==(const PageKey& other) const {
    return hash == other.hash && parent == other.parent && extra == other.extra &&
           tokens == other.tokens;
  }
};

PageKey MakePageKey(uint64_t parent, uint64_t extra, std::span<const int32_t> tokens);

// The keys of the full pages of `tokens` (floor(size / page_size) of them), chained from the first.
std::vector<PageKey> FullPageKeys(std::span<const int32_t> tokens, int page_size, uint64_t extra);

// Folds one more component (a layer index, a policy's name, a knob's value) into an extra key.
uint64_t MixExtraKey(uint64_t extra, uint64_t value);
uint64_t MixExtraKey(uint64_t extra, std::string_view text);

}  // namespace sieve
