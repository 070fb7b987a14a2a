#include "kv/kv_cache_manager.h"

#include <algorithm>
#include <string>
#include <utility>

#include "core/check.h"

namespace sieve {

KvCacheManager::KvCacheManager(const Options& options)
    : options_(options),
      pool_(options.num_pages),
      page_table_(
          static_cast<size_t>(options.num_layers) * options.max_seqs * options.max_pages_per_seq,
          -1),
      lengths_(static_cast<size_t>(options.num_layers) * options.max_seqs, 0),
      pages_held_(static_cast<size_t>(options.max_seqs) * options.num_layers, 0) {
  by_slot_.resize(options.max_seqs);
  if ((options.page_size & (options.page_size - 1)) == 0) {
    page_shift_ = 0;
    while ((1 << page_shift_) < options.page_size) ++page_shift_;
  }
  SIEVE_CHECK(options.page_size > 0 && options.num_layers > 0 && options.max_seqs > 0 &&
              options.max_pages_per_seq > 0);
  for (int slot = options.max_seqs - 1; slot >= 0; --slot) free_slots_.push_back(slot);
}

const KvCacheManager::Sequence& KvCacheManager::Get(SeqId id) const {
  const auto it = slot_of_.find(id);
  SIEVE_CHECK(it != slot_of_.end()) << "unknown sequence " << id;
  return by_slot_[it->second];
}

KvCacheManager::Sequence& KvCacheManager::Get(SeqId id) {
  const auto it = slot_of_.find(id);
  SIEVE_CHECK(it != slot_of_.end()) << "unknown sequence " << id;
  return by_slot_[it->second];
}

int64_t KvCacheManager::TableIndex(int layer, int slot, int page_index) const {
  return (static_cast<int64_t>(layer) * options_.max_seqs + slot) * options_.max_pages_per_seq +
         page_index;
}

void KvCacheManager::WriteTable(int layer, int slot, int page_index, int32_t page) {
  const int64_t index = TableIndex(layer, slot, page_index);
  page_table_[index] = page;
  patches_.emplace_back(static_cast<int32_t>(index), page);
  // Only an entry that was cleared can be written again before the next take (a page freed,
  // then its slot reused); growth alone never writes an entry twice.
  if (page < 0) patches_may_repeat_ = true;
}

void KvCacheManager::SetLengthsFrom(Sequence& seq, int first_layer, std::span<const int> lengths) {
  const int page_size = options_.page_size;
  const int* pages_held = PagesHeld(seq.slot);
  int32_t* length_of = &lengths_[seq.slot];  // layer l at [l * max_seqs]
  const int64_t stride = options_.max_seqs;
  for (int layer = first_layer; layer < first_layer + static_cast<int>(lengths.size()); ++layer) {
    const int length = lengths[layer - first_layer];
    const int held = pages_held[layer];
    SIEVE_CHECK(length >= 0 && length <= held * page_size)
        << "length " << length << " past the capacity of layer " << layer;
    length_of[layer * stride] = length;
    // PagesFor(length) < held, without a division: this runs for every (sequence, layer) of
    // every step, and pages are rarely freed (compression, eviction past a page, removal).
    if (length <= (held - 1) * page_size) FreePagesPast(seq, layer, length);
  }
}

void KvCacheManager::FreePagesPast(Sequence& seq, int layer, int length) {
  int& held = PagesHeld(seq.slot)[layer];
  const int keep = PagesFor(length);
  if (keep >= held) return;
  const int32_t* row = &page_table_[TableIndex(layer, seq.slot, 0)];
  pool_.Release(std::span<const int32_t>(row + keep, row + held));
  for (int index = keep; index < held; ++index) WriteTable(layer, seq.slot, index, -1);
  seq.pages_held -= held - keep;
  held = keep;
}

Result<int> KvCacheManager::AddSequence(SeqId id) {
  SIEVE_CHECK(!HasSequence(id)) << "sequence " << id << " added twice";
  if (free_slots_.empty()) {
    return ResourceExhaustedError("all " + std::to_string(options_.max_seqs) +
                                  " sequence slots are in use");
  }
  const int slot = free_slots_.back();
  free_slots_.pop_back();
  Sequence& seq = by_slot_[slot];
  seq.id = id;
  seq.slot = slot;
  seq.pages_held = 0;  // its lists are empty: a free slot holds no pages and its rows are -1
  slot_of_.emplace(id, slot);
  return slot;
}

int KvCacheManager::ReservePaddingSlot() {
  SIEVE_CHECK(padding_slot_ < 0 && slot_of_.empty()) << "reserve the padding slot first, once";
  constexpr SeqId kPaddingId = -2;
  auto slot = AddSequence(kPaddingId);
  SIEVE_CHECK(slot.ok()) << slot.status().ToString();
  const std::vector<int> one(options_.num_layers, 1);
  SIEVE_CHECK(Grow(kPaddingId, one)) << "no pages for the padding slot";
  SetLengths(kPaddingId, one);
  // It stays out of the sequence index (so accounting and slots count only real sequences) but
  // keeps its pages and its slot.
  slot_of_.erase(kPaddingId);
  padding_slot_ = *slot;
  padding_pages_ = options_.num_layers;
  return padding_slot_;
}

void KvCacheManager::RemoveSequence(SeqId id) {
  Sequence& seq = Get(id);
  for (int layer = 0; layer < options_.num_layers; ++layer) {
    lengths_[static_cast<int64_t>(layer) * options_.max_seqs + seq.slot] = 0;
    FreePagesPast(seq, layer, 0);
  }
  free_slots_.push_back(seq.slot);
  seq.slot = -1;
  seq.id = -1;
  slot_of_.erase(id);
}

int KvCacheManager::Slot(SeqId id) const { return Get(id).slot; }

int KvCacheManager::Length(SeqId id, int layer) const {
  return lengths_[static_cast<int64_t>(layer) * options_.max_seqs + Get(id).slot];
}

bool KvCacheManager::AppendNeedsPage(int length, int pages_held) const {
  // length + 1 > capacity, i.e. PagesFor(length + 1) > pages held, without a division.
  return length >= pages_held * options_.page_size;
}

int KvCacheManager::PagesToAppend(SeqId id, std::span<int> lengths) const {
  const int layers = options_.num_layers;
  SIEVE_CHECK(static_cast<int>(lengths.size()) == layers);
  const Sequence& seq = Get(id);
  const int* pages_held = PagesHeld(seq.slot);
  const int32_t* length_of = &lengths_[seq.slot];  // layer l at [l * max_seqs]
  const int64_t stride = options_.max_seqs;
  int needed = 0;
  for (int layer = 0; layer < layers; ++layer) {
    const int length = length_of[layer * stride];
    lengths[layer] = length;
    needed += AppendNeedsPage(length, pages_held[layer]) ? 1 : 0;
  }
  return needed;
}

int KvCacheManager::Capacity(SeqId id, int layer) const {
  return PagesHeld(Get(id).slot)[layer] * options_.page_size;
}

std::span<const int32_t> KvCacheManager::Pages(SeqId id, int layer) const {
  const int slot = Get(id).slot;
  return {&page_table_[TableIndex(layer, slot, 0)], static_cast<size_t>(PagesHeld(slot)[layer])};
}

int KvCacheManager::PagesToGrow(SeqId id, std::span<const int> capacities) const {
  SIEVE_CHECK(static_cast<int>(capacities.size()) == options_.num_layers);
  const auto it = slot_of_.find(id);
  const int* pages_held = it == slot_of_.end() ? nullptr : PagesHeld(it->second);
  int needed = 0;
  for (int layer = 0; layer < options_.num_layers; ++layer) {
    const int held = pages_held == nullptr ? 0 : pages_held[layer];
    needed += std::max(0, PagesFor(capacities[layer]) - held);
  }
  return needed;
}

bool KvCacheManager::Grow(SeqId id, std::span<const int> capacities) {
  SIEVE_CHECK(static_cast<int>(capacities.size()) == options_.num_layers);
  Sequence& seq = Get(id);
  int* pages_held = PagesHeld(seq.slot);
  int needed = 0;
  for (int layer = 0; layer < options_.num_layers; ++layer) {
    const int wanted = PagesFor(capacities[layer]);
    if (wanted > options_.max_pages_per_seq) return false;
    needed += std::max(0, wanted - pages_held[layer]);
  }
  if (needed == 0) return true;
  new_pages_.clear();
  if (!pool_.Allocate(needed, new_pages_)) return false;
  // Handed out in layer order: each layer gets the ids one Allocate per layer would give it.
  const int32_t* next_page = new_pages_.data();
  for (int layer = 0; layer < options_.num_layers; ++layer) {
    const int wanted = PagesFor(capacities[layer]);
    for (; pages_held[layer] < wanted; ++pages_held[layer]) {
      WriteTable(layer, seq.slot, pages_held[layer], *next_page++);
    }
  }
  seq.pages_held += needed;
  return true;
}

bool KvCacheManager::GrowForAppend(SeqId id) {
  Sequence& seq = Get(id);
  const int layers = options_.num_layers;
  int* pages_held = PagesHeld(seq.slot);
  const int32_t* length_of = &lengths_[seq.slot];  // layer l at [l * max_seqs]
  const int64_t stride = options_.max_seqs;
  // One pass over the layers finds those whose pages are full; the allocation and the table
  // writes then touch only those (a few per sequence and step).
  append_layers_.resize(layers);
  int needed = 0;
  for (int layer = 0; layer < layers; ++layer) {
    if (!AppendNeedsPage(length_of[layer * stride], pages_held[layer])) continue;
    if (pages_held[layer] + 1 > options_.max_pages_per_seq) return false;
    append_layers_[needed++] = layer;
  }
  if (needed == 0) return true;
  new_pages_.clear();
  if (!pool_.Allocate(needed, new_pages_)) return false;
  for (int index = 0; index < needed; ++index) {
    const int layer = append_layers_[index];
    WriteTable(layer, seq.slot, pages_held[layer]++, new_pages_[index]);
  }
  seq.pages_held += needed;
  return true;
}

void KvCacheManager::SetLength(SeqId id, int layer, int length) {
  SetLengthsFrom(Get(id), layer, {&length, 1});
}

void KvCacheManager::SetLengths(SeqId id, std::span<const int> lengths) {
  SIEVE_CHECK(static_cast<int>(lengths.size()) == options_.num_layers);
  SetLengthsFrom(Get(id), 0, lengths);
}

int KvCacheManager::PagesUsedByLayer(int layer) const {
  int total = 0;
  for (const auto& [id, slot] : slot_of_) total += PagesHeld(slot)[layer];
  return total;
}

int KvCacheManager::PagesUsedBySequence(SeqId id) const { return Get(id).pages_held; }

int64_t KvCacheManager::EntriesHeldByLayer(int layer) const {
  int64_t total = 0;
  for (const auto& [id, slot] : slot_of_) {
    total += lengths_[static_cast<int64_t>(layer) * options_.max_seqs + slot];
  }
  return total;
}

std::vector<std::pair<int32_t, int32_t>> KvCacheManager::TakePageTablePatches() {
  std::vector<std::pair<int32_t, int32_t>> out;
  out.swap(patches_);
  // The next step logs about as many: one allocation now instead of regrowing entry by entry.
  patches_.reserve(out.size());
  if (patches_may_repeat_) {
    // The device applies patches in parallel: each entry must appear once, with its last value.
    std::stable_sort(out.begin(), out.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    size_t kept = 0;
    for (const auto& patch : out) {
      if (kept > 0 && out[kept - 1].first == patch.first) {
        out[kept - 1] = patch;
      } else {
        out[kept++] = patch;
      }
    }
    out.resize(kept);
    patches_may_repeat_ = false;
  }
  return out;
}

int KvCacheManager::PagesFreedByRemoval(SeqId id) const {
  const Sequence& seq = Get(id);
  int freed = 0;
  for (int layer = 0; layer < options_.num_layers; ++layer) {
    const int32_t* row = &page_table_[TableIndex(layer, seq.slot, 0)];
    for (int index = 0; index < PagesHeld(seq.slot)[layer]; ++index) {
      freed += pool_.ref_count(row[index]) == 1;
    }
  }
  return freed;
}

int KvCacheManager::CachedPrefixPages(std::span<const PageKey> keys, int* idle) const {
  int pages = 0;
  if (idle != nullptr) *idle = 0;
  for (; pages < static_cast<int>(keys.size()); ++pages) {
    const int32_t page = pool_.Lookup(keys[pages]);
    if (page < 0) break;
    if (idle != nullptr && pool_.ref_count(page) == 0) ++*idle;
  }
  return pages;
}

void KvCacheManager::AttachCachedPages(SeqId id, int layer, std::span<const PageKey> keys) {
  Sequence& seq = Get(id);
  int& held = PagesHeld(seq.slot)[layer];
  SIEVE_CHECK(held == 0) << "a cached prefix goes into an empty list (layer " << layer << ")";
  SIEVE_CHECK(static_cast<int>(keys.size()) <= options_.max_pages_per_seq);
  for (const PageKey& key : keys) {
    const int32_t page = pool_.Lookup(key);
    SIEVE_CHECK(page >= 0) << "a cached prefix page is gone (layer " << layer << ")";
    pool_.Acquire(page);
    WriteTable(layer, seq.slot, held++, page);
  }
  seq.pages_held += static_cast<int>(keys.size());
  lengths_[static_cast<int64_t>(layer) * options_.max_seqs + seq.slot] =
      static_cast<int32_t>(keys.size()) * options_.page_size;
}

int KvCacheManager::RegisterPages(SeqId id, int layer, int first_page,
                                  std::span<const PageKey> keys) {
  const Sequence& seq = Get(id);
  const int end = first_page + static_cast<int>(keys.size());
  SIEVE_CHECK(first_page >= 0 && end <= PagesHeld(seq.slot)[layer] &&
              static_cast<int64_t>(end) * options_.page_size <= Length(id, layer))
      << "only full pages take a key (layer " << layer << ")";
  int registered = 0;
  for (int index = first_page; index < end; ++index) {
    registered +=
        pool_.Register(page_table_[TableIndex(layer, seq.slot, index)], keys[index - first_page]);
  }
  return registered;
}

void KvCacheManager::ReleasePromptPages(SeqId id, int layer, int prompt_pages, int first_key_page,
                                        std::span<const PageKey> keys, int kept_length) {
  Sequence& seq = Get(id);
  int& held = PagesHeld(seq.slot)[layer];
  const int key_end = first_key_page + static_cast<int>(keys.size());
  SIEVE_CHECK(first_key_page >= 0 && key_end <= prompt_pages && prompt_pages <= held)
      << "layer " << layer << ": keys past the prompt's " << prompt_pages << " pages";
  SIEVE_CHECK(kept_length >= 0 && kept_length <= (held - prompt_pages) * options_.page_size)
      << "layer " << layer << ": " << kept_length << " kept entries past their pages";
  int32_t* row = &page_table_[TableIndex(layer, seq.slot, 0)];
  for (int index = first_key_page; index < key_end; ++index) {
    pool_.Register(row[index], keys[index - first_key_page]);
  }
  pool_.Release(std::span<const int32_t>(row, row + prompt_pages));
  for (int index = prompt_pages; index < held; ++index) {
    WriteTable(layer, seq.slot, index - prompt_pages, row[index]);
  }
  for (int index = held - prompt_pages; index < held; ++index)
    WriteTable(layer, seq.slot, index, -1);
  held -= prompt_pages;
  seq.pages_held -= prompt_pages;
  lengths_[static_cast<int64_t>(layer) * options_.max_seqs + seq.slot] = kept_length;
  FreePagesPast(seq, layer, kept_length);
}

Status KvCacheManager::CheckInvariants() const {
  SIEVE_RETURN_IF_ERROR(pool_.CheckInvariants());
  std::vector<int> owners(pool_.num_pages(), 0);
  std::vector<bool> slot_used(options_.max_seqs, false);
  // A slot's lists: valid page ids in each row's first `held` entries, -1 past them.
  const auto check_rows = [&](int slot, const std::string& who) -> Status {
    for (int layer = 0; layer < options_.num_layers; ++layer) {
      const int held = PagesHeld(slot)[layer];
      if (held < 0 || held > options_.max_pages_per_seq) {
        return InternalError(who + " layer " + std::to_string(layer) + ": bad page count");
      }
      const int length = lengths_[static_cast<int64_t>(layer) * options_.max_seqs + slot];
      if (length > held * options_.page_size) {
        return InternalError(who + " layer " + std::to_string(layer) + ": length past capacity");
      }
      for (int index = 0; index < options_.max_pages_per_seq; ++index) {
        const int32_t page = page_table_[TableIndex(layer, slot, index)];
        if (index >= held) {
          if (page != -1) {
            return InternalError(who + " layer " + std::to_string(layer) +
                                 ": page-table row holds a page past its list");
          }
        } else if (page < 0 || page >= pool_.num_pages()) {
          return InternalError("bad page id");
        } else {
          ++owners[page];
        }
      }
    }
    return Status::Ok();
  };
  for (const auto& [id, slot] : slot_of_) {
    const Sequence& seq = by_slot_[slot];
    if (seq.slot != slot || seq.id != id || slot_used[seq.slot]) {
      return InternalError("sequence " + std::to_string(id) + " has a bad or shared slot");
    }
    slot_used[seq.slot] = true;
    int pages_held = 0;
    for (int layer = 0; layer < options_.num_layers; ++layer) pages_held += PagesHeld(slot)[layer];
    if (pages_held != seq.pages_held) return InternalError("pages_held out of step");
    SIEVE_RETURN_IF_ERROR(check_rows(slot, "sequence " + std::to_string(id)));
  }
  if (padding_slot_ >= 0) {
    slot_used[padding_slot_] = true;
    SIEVE_RETURN_IF_ERROR(check_rows(padding_slot_, "padding slot"));
  }
  int used = 0;
  for (int32_t page = 0; page < pool_.num_pages(); ++page) {
    if (owners[page] != pool_.ref_count(page)) {
      return InternalError("page " + std::to_string(page) + " ref count " +
                           std::to_string(pool_.ref_count(page)) + " but " +
                           std::to_string(owners[page]) + " owners (leak or double free)");
    }
    used += owners[page] > 0;
  }
  if (used != pool_.num_used()) return InternalError("pool's used count disagrees with the lists");
  for (int slot = 0; slot < options_.max_seqs; ++slot) {
    if (slot_used[slot]) continue;
    for (int layer = 0; layer < options_.num_layers; ++layer) {
      if (PagesHeld(slot)[layer] != 0) return InternalError("a free slot holds pages");
      for (int index = 0; index < options_.max_pages_per_seq; ++index) {
        if (page_table_[TableIndex(layer, slot, index)] != -1) {
          return InternalError("a free slot's page-table row holds pages");
        }
      }
    }
  }
  return Status::Ok();
}

}  // namespace sieve
