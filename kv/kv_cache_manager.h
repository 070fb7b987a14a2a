// KvCacheManager: every (sequence, layer) has its own page list and length, all drawing pages
// from one BlockPool. This is what lets a sparse layer hold 400 entries while a full layer of the
// same sequence holds 4000 — vLLM's one-block-table-per-sequence cannot.
//
// It also keeps the host mirror of the device page tables: [L][max_seqs][max_pages_per_seq]
// page ids (row = the sequence's slot; -1 past its pages) and [L][max_seqs] lengths, plus the log
// of page-table writes since the last TakePageTablePatches(), so the runner uploads only changes.
// The mirror is the only copy of the page lists: a (sequence, layer)'s list is the first
// `pages held` entries of its row, so growing one writes the table and nothing else.
//
// Ownership: the engine thread. Planning queries are const; Grow/SetLength/Remove commit.
// Invariants (CheckInvariants): a used page's ref count is the number of (sequence, layer) lists
// that hold it (more than one only for a cached prefix's pages); a list holds
// ceil(capacity / page_size) pages and length <= capacity; a row is -1 past its list.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/status.h"
#include "kv/block_pool.h"

namespace sieve {

using SeqId = int64_t;

class KvCacheManager {
 public:
  struct Options {
    int num_pages = 0;
    int page_size = 16;
    int num_layers = 0;
    int max_seqs = 0;           // sequence slots (rows of the page tables)
    int max_pages_per_seq = 0;  // pages one (sequence, layer) may hold
  };

  explicit KvCacheManager(const Options& options);

  const Options& options() const { return options_; }
  int page_size() const { return options_.page_size; }
  int num_layers() const { return options_.num_layers; }
  int PagesFor(int entries) const {
    const int rounded_up = entries + options_.page_size - 1;
    return page_shift_ >= 0 ? rounded_up >> page_shift_ : rounded_up / options_.page_size;
  }

  // ---- sequences ----
  // Gives the sequence a slot and empty lists; ResourceExhausted when all slots are taken.
  Result<int> AddSequence(SeqId id);
  // Takes one slot for good and gives it one page and one entry in every layer: the row that
  // padding sequences of a fixed-size (CUDA graph) decode batch point to, so they read and write
  // only memory nobody else uses. Returns the slot; call once, before any sequence is added.
  int ReservePaddingSlot();
  int padding_slot() const { return padding_slot_; }
  // Frees every page of every layer of the sequence and its slot.
  void RemoveSequence(SeqId id);
  bool HasSequence(SeqId id) const { return slot_of_.count(id) != 0; }
  int Slot(SeqId id) const;
  int num_sequences() const { return static_cast<int>(slot_of_.size()); }
  int num_free_slots() const { return static_cast<int>(free_slots_.size()); }

  // ---- per (sequence, layer) ----
  int Length(SeqId id, int layer) const;
  // The decode fast path: every layer's length into `lengths` ([L]) and the pages that appending
  // one entry to every layer would take (a layer needs one when its pages are full).
  int PagesToAppend(SeqId id, std::span<int> lengths) const;
  int Capacity(SeqId id, int layer) const;  // pages held * page_size
  // The layer's page list (a view of its page-table row, valid until the next commit).
  std::span<const int32_t> Pages(SeqId id, int layer) const;

  // Pages that Grow(id, capacities) would take from the pool (0 for an unknown sequence: a new
  // one is counted by passing its target capacities to PagesFor).
  int PagesToGrow(SeqId id, std::span<const int> capacities) const;
  // Makes each layer l hold at least capacities[l] entries. All or nothing: false (and no change)
  // when the pool has too few free pages or a list would pass max_pages_per_seq.
  [[nodiscard]] bool Grow(SeqId id, std::span<const int> capacities);
  // The decode fast path of Grow: one more page for every layer whose pages are full. False (and
  // no change) when the pool has fewer free pages than that or such a list is at
  // max_pages_per_seq.
  [[nodiscard]] bool GrowForAppend(SeqId id);
  // Sets the layer's length and frees the pages past it.
  void SetLength(SeqId id, int layer, int length);
  // SetLength for every layer ([L] lengths).
  void SetLengths(SeqId id, std::span<const int> lengths);

  // ---- prefix cache (BlockPool's keyed pages; kv/README.md "Prefix caching") ----
  // How many of `keys` (a layer's full-page keys of a prompt, chained) have a page, from the
  // first: the layer's cached prefix, in pages.
  // `idle`, when given, gets how many of those pages no list holds (cached: counted free until
  // attached).
  int CachedPrefixPages(std::span<const PageKey> keys, int* idle = nullptr) const;
  // Puts the pages of `keys` (each must have one: CachedPrefixPages) at the head of the layer's
  // empty list, one reference each, and sets its length to keys.size() * page_size.
  void AttachCachedPages(SeqId id, int layer, std::span<const PageKey> keys);
  // Keys the layer's pages [first_page, first_page + keys.size()), which must be full and whose
  // entries must not change while keyed. Returns how many took their key (a page keyed already,
  // or a key another page holds, is left as it is).
  int RegisterPages(SeqId id, int layer, int first_page, std::span<const PageKey> keys);
  // The end of a prefix-caching sequence's compression in one layer: the list's first
  // `prompt_pages` pages hold the prompt's entries as computed, the pages after them the kept
  // entries (CompressionJob::kept_offset). Keys the prompt's pages [first_key_page,
  // first_key_page + keys.size()) (full pages), drops the prompt's pages (one reference each: keyed
  // ones stay cached), moves the kept pages to the head and sets the length to `kept_length`.
  void ReleasePromptPages(SeqId id, int layer, int prompt_pages, int first_key_page,
                          std::span<const PageKey> keys, int kept_length);
  int num_cached_pages() const { return pool_.num_cached(); }
  int64_t num_evicted_pages() const { return pool_.num_evicted(); }

  // ---- accounting ----
  // Pages for sequences (the padding slot's are set apart and not counted). Free pages include
  // cached ones, which Grow evicts when it needs them.
  int num_pages() const { return pool_.num_pages() - padding_pages_; }
  int num_free_pages() const { return pool_.num_free(); }
  int num_used_pages() const { return pool_.num_used() - padding_pages_; }
  int PagesUsedByLayer(int layer) const;
  int PagesUsedBySequence(SeqId id) const;
  // Pages RemoveSequence(id) would return to the free count: those no other list holds (a shared
  // cached-prefix page stays used).
  int PagesFreedByRemoval(SeqId id) const;
  int64_t EntriesHeldByLayer(int layer) const;

  // ---- device mirror ----
  const std::vector<int32_t>& page_table() const { return page_table_; }  // [L][S][P]
  const std::vector<int32_t>& lengths() const { return lengths_; }        // [L][S]
  // (index into page_table(), new value) for every entry written since the last call, each entry
  // once with its latest value (so the patches can be applied in any order).
  std::vector<std::pair<int32_t, int32_t>> TakePageTablePatches();

  // OK when every invariant above holds; used by the property tests.
  Status CheckInvariants() const;

 private:
  struct Sequence {
    SeqId id = -1;
    int slot = -1;
    int pages_held = 0;  // over all layers
  };
  const Sequence& Get(SeqId id) const;
  Sequence& Get(SeqId id);
  int64_t TableIndex(int layer, int slot, int page_index) const;
  // Pages the slot's layers hold ([L], contiguous: the per-layer loops of a step read them).
  int* PagesHeld(int slot) { return &pages_held_[static_cast<size_t>(slot) * options_.num_layers]; }
  const int* PagesHeld(int slot) const {
    return &pages_held_[static_cast<size_t>(slot) * options_.num_layers];
  }
  void WriteTable(int layer, int slot, int page_index, int32_t page);
  // SetLength for layers [first_layer, first_layer + lengths.size()).
  void SetLengthsFrom(Sequence& seq, int first_layer, std::span<const int> lengths);
  // Frees the layer's pages past `length` entries (none when it needs them all).
  void FreePagesPast(Sequence& seq, int layer, int length);
  // Whether appending one entry to a layer of `length` entries in `pages_held` pages needs one
  // more page. No division: it runs for every (sequence, layer) of every decode step.
  bool AppendNeedsPage(int length, int pages_held) const;

  Options options_;
  int page_shift_ = -1;  // log2(page_size) when a power of two: PagesFor without a division
  BlockPool pool_;
  std::vector<Sequence> by_slot_;  // [max_seqs]; slot -1 when free
  std::unordered_map<SeqId, int> slot_of_;
  std::vector<int> free_slots_;
  std::vector<int32_t> page_table_;  // [L][max_seqs][max_pages_per_seq]
  std::vector<int32_t> lengths_;     // [L][max_seqs]
  std::vector<int> pages_held_;      // [max_seqs][L]: the length of each page list
  std::vector<std::pair<int32_t, int32_t>> patches_;
  bool patches_may_repeat_ = false;  // an entry was cleared since the last take
  int padding_slot_ = -1;
  int padding_pages_ = 0;
  // Scratch of Grow and GrowForAppend (kept so that a decode step allocates no memory).
  std::vector<int> append_layers_;  // layers that need a page
  std::vector<int32_t> new_pages_;  // pages taken from the pool, handed out in layer order
};

}  // namespace sieve
