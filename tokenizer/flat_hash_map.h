// FlatHashMap: an open-addressing hash map (linear probing, power-of-two capacity) for the
// vocabulary lookups on the load and encode paths. Loading a 128k-token vocabulary with 280k
// merges does about a million lookups; node-based std::unordered_map spends most of that time on
// cache misses and allocations, this layout does not. Insert-only: vocabularies never shrink.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

namespace sieve {

// SplitMix64's finaliser: integer keys such as (left id << 32 | right id) need their bits mixed
// before the low ones pick a slot.
struct MixHash {
  size_t operator()(uint64_t value) const {
    value ^= value >> 30;
    value *= 0xbf58476d1ce4e5b9ULL;
    value ^= value >> 27;
    value *= 0x94d049bb133111ebULL;
    value ^= value >> 31;
    return static_cast<size_t>(value);
  }
};

template <typename Key, typename Value, typename Hash = std::hash<Key>>
class FlatHashMap {
 public:
  // `empty_key` marks free slots and can never be stored.
  explicit FlatHashMap(Key empty_key = Key()) : empty_key_(empty_key) {}

  void Reserve(size_t count) {
    const size_t capacity = std::bit_ceil(std::max<size_t>(16, count * 2));
    if (capacity > slots_.size()) Rehash(capacity);
  }

  // Inserts unless `key` is present (then the first value stays). False if it was present.
  bool Insert(const Key& key, const Value& value) {
    if (key == empty_key_) return false;
    if ((size_ + 1) * 2 > slots_.size()) Rehash(std::max<size_t>(16, slots_.size() * 2));
    for (size_t index = hash_(key) & mask_;; index = (index + 1) & mask_) {
      Slot& slot = slots_[index];
      if (slot.key == empty_key_) {
        slot.key = key;
        slot.value = value;
        ++size_;
        return true;
      }
      if (slot.key == key) return false;
    }
  }

  const Value* Find(const Key& key) const {
    if (slots_.empty() || key == empty_key_) return nullptr;
    for (size_t index = hash_(key) & mask_;; index = (index + 1) & mask_) {
      const Slot& slot = slots_[index];
      if (slot.key == key) return &slot.value;
      if (slot.key == empty_key_) return nullptr;
    }
  }

  size_t size() const { return size_; }

 private:
  struct Slot {
    Key key;
    Value value;
  };

  void Rehash(size_t capacity) {
    std::vector<Slot> old = std::move(slots_);
    slots_.assign(capacity, Slot{empty_key_, Value()});
    mask_ = capacity - 1;
    size_ = 0;
    for (const Slot& slot : old) {
      if (slot.key != empty_key_) Insert(slot.key, slot.value);
    }
  }

  std::vector<Slot> slots_;  // [capacity]
  size_t mask_ = 0;
  size_t size_ = 0;
  Key empty_key_;
  Hash hash_;
};

}  // namespace sieve
