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
      lengths_(static_cast<size_t>(options.num_layers) * options.max_seqs, 0) {
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
  seq.pages_held = 0;
  seq.pages.assign(options_.num_layers, {});
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
  for (int layer = 0; layer < options_.num_layers; ++layer) SetLengthOf(seq, layer, 0);
  free_slots_.push_back(seq.slot);
  seq.slot = -1;
  seq.id = -1;
  slot_of_.erase(id);
}

int KvCacheManager::Slot(SeqId id) const { return Get(id).slot; }

int KvCacheManager::Length(SeqId id, int layer) const {
  return lengths_[static_cast<int64_t>(layer) * options_.max_seqs + Get(id).slot];
}

bool KvCacheManager::AppendNeedsPage(const Sequence& seq, int layer) const {
  const int length = lengths_[static_cast<int64_t>(layer) * options_.max_seqs + seq.slot];
  return PagesFor(length + 1) > static_cast<int>(seq.pages[layer].size());
}

int KvCacheManager::PagesToAppend(SeqId id, std::vector<int>& lengths) const {
  const Sequence& seq = Get(id);
  lengths.resize(options_.num_layers);
  int needed = 0;
  for (int layer = 0; layer < options_.num_layers; ++layer) {
    lengths[layer] = lengths_[static_cast<int64_t>(layer) * options_.max_seqs + seq.slot];
    needed += AppendNeedsPage(seq, layer) ? 1 : 0;
  }
  return needed;
}

int KvCacheManager::Capacity(SeqId id, int layer) const {
  return static_cast<int>(Get(id).pages[layer].size()) * options_.page_size;
}

const std::vector<int32_t>& KvCacheManager::Pages(SeqId id, int layer) const {
  return Get(id).pages[layer];
}

int KvCacheManager::PagesToGrow(SeqId id, std::span<const int> capacities) const {
  SIEVE_CHECK(static_cast<int>(capacities.size()) == options_.num_layers);
  const auto it = slot_of_.find(id);
  const Sequence* seq = it == slot_of_.end() ? nullptr : &by_slot_[it->second];
  int needed = 0;
  for (int layer = 0; layer < options_.num_layers; ++layer) {
    const int held = seq == nullptr ? 0 : static_cast<int>(seq->pages[layer].size());
    needed += std::max(0, PagesFor(capacities[layer]) - held);
  }
  return needed;
}

bool KvCacheManager::Grow(SeqId id, std::span<const int> capacities) {
  SIEVE_CHECK(static_cast<int>(capacities.size()) == options_.num_layers);
  Sequence& seq = Get(id);
  int needed = 0;
  for (int layer = 0; layer < options_.num_layers; ++layer) {
    const int wanted = PagesFor(capacities[layer]);
    if (wanted > options_.max_pages_per_seq) return false;
    needed += std::max(0, wanted - static_cast<int>(seq.pages[layer].size()));
  }
  if (needed > pool_.num_free()) return false;
  if (needed == 0) return true;
  for (int layer = 0; layer < options_.num_layers; ++layer) {
    std::vector<int32_t>& pages = seq.pages[layer];
    const int before = static_cast<int>(pages.size());
    const int wanted = PagesFor(capacities[layer]);
    if (wanted <= before) continue;
    const bool ok = pool_.Allocate(wanted - before, pages);
    SIEVE_CHECK(ok) << "pool ran out after counting enough free pages";
    seq.pages_held += wanted - before;
    for (int index = before; index < wanted; ++index)
      WriteTable(layer, seq.slot, index, pages[index]);
  }
  return true;
}

bool KvCacheManager::GrowForAppend(SeqId id) {
  Sequence& seq = Get(id);
  int needed = 0;
  for (int layer = 0; layer < options_.num_layers; ++layer) {
    needed += AppendNeedsPage(seq, layer) ? 1 : 0;
  }
  if (needed == 0) return true;
  if (needed > pool_.num_free()) return false;
  for (int layer = 0; layer < options_.num_layers; ++layer) {
    if (!AppendNeedsPage(seq, layer)) continue;
    std::vector<int32_t>& pages = seq.pages[layer];
    if (static_cast<int>(pages.size()) + 1 > options_.max_pages_per_seq) return false;
    const bool ok = pool_.Allocate(1, pages);
    SIEVE_CHECK(ok) << "pool ran out after counting enough free pages";
    ++seq.pages_held;
    WriteTable(layer, seq.slot, static_cast<int>(pages.size()) - 1, pages.back());
  }
  return true;
}

void KvCacheManager::SetLength(SeqId id, int layer, int length) {
  SetLengthOf(Get(id), layer, length);
}

void KvCacheManager::SetLengths(SeqId id, std::span<const int> lengths) {
  SIEVE_CHECK(static_cast<int>(lengths.size()) == options_.num_layers);
  Sequence& seq = Get(id);
  for (int layer = 0; layer < options_.num_layers; ++layer) SetLengthOf(seq, layer, lengths[layer]);
}

void KvCacheManager::SetLengthOf(Sequence& seq, int layer, int length) {
  std::vector<int32_t>& pages = seq.pages[layer];
  SIEVE_CHECK(length >= 0 && length <= static_cast<int>(pages.size()) * options_.page_size)
      << "length " << length << " past the capacity of layer " << layer;
  lengths_[static_cast<int64_t>(layer) * options_.max_seqs + seq.slot] = length;
  const int keep = PagesFor(length);
  if (keep < static_cast<int>(pages.size())) {
    pool_.Release(std::span<const int32_t>(pages).subspan(keep));
    for (int index = keep; index < static_cast<int>(pages.size()); ++index) {
      WriteTable(layer, seq.slot, index, -1);
    }
    seq.pages_held -= static_cast<int>(pages.size()) - keep;
    pages.resize(keep);
  }
}

int KvCacheManager::PagesUsedByLayer(int layer) const {
  int total = 0;
  for (const auto& [id, slot] : slot_of_) {
    total += static_cast<int>(by_slot_[slot].pages[layer].size());
  }
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

Status KvCacheManager::CheckInvariants() const {
  std::vector<int> owners(pool_.num_pages(), 0);
  std::vector<bool> slot_used(options_.max_seqs, false);
  for (const auto& [id, slot] : slot_of_) {
    const Sequence& seq = by_slot_[slot];
    int pages_held = 0;
    for (const auto& pages : seq.pages) pages_held += static_cast<int>(pages.size());
    if (pages_held != seq.pages_held) return InternalError("pages_held out of step");
    if (seq.slot != slot || seq.id != id || slot_used[seq.slot]) {
      return InternalError("sequence " + std::to_string(id) + " has a bad or shared slot");
    }
    slot_used[seq.slot] = true;
    for (int layer = 0; layer < options_.num_layers; ++layer) {
      const auto& pages = seq.pages[layer];
      const int length = lengths_[static_cast<int64_t>(layer) * options_.max_seqs + seq.slot];
      if (length > static_cast<int>(pages.size()) * options_.page_size) {
        return InternalError("sequence " + std::to_string(id) + " layer " + std::to_string(layer) +
                             ": length past capacity");
      }
      for (int index = 0; index < options_.max_pages_per_seq; ++index) {
        const int32_t expected = index < static_cast<int>(pages.size()) ? pages[index] : -1;
        if (page_table_[TableIndex(layer, seq.slot, index)] != expected) {
          return InternalError("page-table mirror differs from the lists for sequence " +
                               std::to_string(id) + " layer " + std::to_string(layer));
        }
      }
      for (const int32_t page : pages) {
        if (page < 0 || page >= pool_.num_pages()) return InternalError("bad page id");
        ++owners[page];
      }
    }
  }
  if (padding_slot_ >= 0) {
    const Sequence& padding = by_slot_[padding_slot_];
    slot_used[padding_slot_] = true;
    for (const auto& pages : padding.pages) {
      for (const int32_t page : pages) ++owners[page];
    }
  }
  int used = 0;
  for (int32_t page = 0; page < pool_.num_pages(); ++page) {
    if (owners[page] > 1) return InternalError("page " + std::to_string(page) + " in two lists");
    if (owners[page] != pool_.ref_count(page)) {
      return InternalError("page " + std::to_string(page) + " ref count " +
                           std::to_string(pool_.ref_count(page)) + " but " +
                           std::to_string(owners[page]) + " owners (leak or double free)");
    }
    used += owners[page];
  }
  if (used != pool_.num_used()) return InternalError("pool's used count disagrees with the lists");
  for (int slot = 0; slot < options_.max_seqs; ++slot) {
    if (slot_used[slot]) continue;
    for (int layer = 0; layer < options_.num_layers; ++layer) {
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
