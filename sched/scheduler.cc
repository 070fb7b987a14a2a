#include "sched/scheduler.h"

#include <algorithm>
#include <string>

#include "core/check.h"

namespace sieve {

Result<PreemptionMode> ParsePreemptionMode(std::string_view name) {
  if (name == "recompute") return PreemptionMode::kRecompute;
  if (name == "swap") return PreemptionMode::kSwap;
  return InvalidArgumentError("unknown preemption mode '" + std::string(name) +
                              "' (choose recompute or swap)");
}

std::string_view PreemptionModeName(PreemptionMode mode) {
  return mode == PreemptionMode::kSwap ? "swap" : "recompute";
}

Scheduler::Scheduler(const SchedulerOptions& options, KvCacheManager* kv)
    : options_(options), kv_(kv) {
  SIEVE_CHECK(options.max_num_seqs > 0 && options.max_num_batched_tokens > 0);
  SIEVE_CHECK(options.swap_slots >= 0);
  SIEVE_CHECK(options.batch_invariant_chunk >= 0 &&
              options.batch_invariant_chunk <= options.max_num_batched_tokens &&
              options.batch_invariant_chunk % kv->page_size() == 0)
      << "batch_invariant_chunk " << options.batch_invariant_chunk;
  if (options.preemption_mode == PreemptionMode::kSwap) {
    free_swap_slots_.resize(options.swap_slots);
    for (int slot = 0; slot < options.swap_slots; ++slot) {
      free_swap_slots_[slot] = options.swap_slots - 1 - slot;
    }
  }
}

Status Scheduler::CanEverSchedule(int prompt_len, int max_total_tokens,
                                  const KvPolicy& policy) const {
  if (prompt_len <= 0) return InvalidArgumentError("the prompt is empty");
  if (prompt_len >= options_.max_model_len) {
    return OutOfRangeError(
        "the prompt has " + std::to_string(prompt_len) + " tokens but the context holds " +
        std::to_string(options_.max_model_len) + " (prompt plus at least one generated token)");
  }
  const int final_rows = policy.FinalChunkRows(max_total_tokens - 1);
  const int must_fit = options_.enable_chunked_prefill ? final_rows : max_total_tokens - 1;
  if (must_fit > options_.max_num_batched_tokens) {
    return InvalidArgumentError("this request needs " + std::to_string(must_fit) +
                                " tokens in one step but --max-num-batched-tokens is " +
                                std::to_string(options_.max_num_batched_tokens) +
                                (options_.enable_chunked_prefill
                                     ? " (its policy scores every prompt row)"
                                     : " (chunked prefill is off)"));
  }
  // Its largest moment: the whole context in every layer that keeps it.
  std::vector<int> capacities(kv_->num_layers(), max_total_tokens + 1);
  const int worst = kv_->PagesToGrow(-1, capacities);
  if (worst > kv_->num_pages() && policy.IsDense()) {
    return ResourceExhaustedError("a sequence of " + std::to_string(max_total_tokens) +
                                  " tokens needs " + std::to_string(worst) +
                                  " KV pages but the pool has " + std::to_string(kv_->num_pages()));
  }
  if (kv_->PagesFor(max_total_tokens + 1) > kv_->options().max_pages_per_seq) {
    return OutOfRangeError("a sequence of " + std::to_string(max_total_tokens) +
                           " tokens does not fit the page tables");
  }
  return Status::Ok();
}

void Scheduler::Add(Sequence sequence) {
  sequence.state = SequenceState::kWaiting;
  sequence.num_computed = 0;
  sequence.prefill_target = static_cast<int>(sequence.tokens.size());
  sequence.final_chunk_rows = sequence.policy->FinalChunkRows(sequence.prefill_target);
  sequence.cache_extra = MixExtraKey(0, sequence.policy->ToString());
  ResetPrefixCache(sequence);
  const SeqId id = sequence.id;
  SIEVE_CHECK(seqs_.count(id) == 0) << "sequence " << id << " added twice";
  waiting_.push_back(id);
  seqs_.emplace(id, std::move(sequence));
}

void Scheduler::ResetPrefixCache(Sequence& seq) const {
  seq.pages_keyed = 0;
  seq.uses_prefix_cache = false;
  seq.compressed_layers.clear();
  // Prompt logprobs score every prompt row: nothing of the prompt can be skipped.
  if (!options_.enable_prefix_caching || seq.prompt_logprobs) return;
  if (seq.policy->IsDense()) {
    seq.uses_prefix_cache = true;
    return;
  }
  // A sparse policy (kv/README.md "Prefix caching"): the rows it scores are computed whatever
  // the cache holds, so a policy that scores every prompt row (H2O) could never hit.
  const int n = seq.prefill_target;
  if (n - std::max(1, seq.final_chunk_rows) < kv_->page_size()) return;
  const int layers = kv_->num_layers();
  const std::vector<LayerPlan> plans = seq.policy->PlanPrompt(n);
  std::vector<uint8_t> compressed(layers, 0);
  std::vector<int> largest(layers);  // each layer's entries at the end of the prompt
  for (int layer = 0; layer < layers; ++layer) {
    if (plans[layer].compress) {
      compressed[layer] = 1;
      largest[layer] = kv_->PagesFor(n) * kv_->page_size() + plans[layer].budget;
      // The prompt's pages and the kept ones after them must fit the layer's page-table row.
      if (kv_->PagesFor(largest[layer]) > kv_->options().max_pages_per_seq) return;
    } else if (seq.policy->DecodeLimitFor(layer).max_entries > 0) {
      return;  // its decode evicts in place, over pages that would be shared
    } else {
      largest[layer] = n;
    }
  }
  // The prompt's pages kept whole with the kept entries beside them must fit the pool at all.
  if (kv_->PagesToGrow(-1, largest) > kv_->num_pages()) return;
  seq.uses_prefix_cache = true;
  seq.compressed_layers = std::move(compressed);
}

bool Scheduler::Remove(SeqId id) {
  const auto it = seqs_.find(id);
  if (it == seqs_.end()) return false;
  if (it->second.state == SequenceState::kSwapped) {
    for (const int32_t slot : it->second.swap_slots) free_swap_slots_.push_back(slot);
    std::erase(swapped_, id);
    ++num_swapped_removed_;
  }
  if (kv_->HasSequence(id)) {
    // Its last page may have filled in a step whose input token the host read only after it (a
    // sample fed on the device): key what is computed now that the tokens are known.
    if (it->second.uses_prefix_cache) KeyComputedPages(it->second);
    kv_->RemoveSequence(id);
  }
  std::erase(running_, id);
  std::erase(waiting_, id);
  seqs_.erase(it);
  return true;
}

bool Scheduler::HasSchedulableWork() const {
  if (!waiting_.empty()) return true;
  for (const auto* list : {&running_, &swapped_}) {
    for (const SeqId id : *list) {
      if (!seqs_.at(id).finishing) return true;
    }
  }
  return false;
}

Sequence* Scheduler::Find(SeqId id) {
  const auto it = seqs_.find(id);
  return it == seqs_.end() ? nullptr : &it->second;
}

const Sequence* Scheduler::Find(SeqId id) const {
  const auto it = seqs_.find(id);
  return it == seqs_.end() ? nullptr : &it->second;
}

std::vector<PageKey> Scheduler::SequenceKeys(const Sequence& seq, int layer, int first, int end,
                                             uint64_t parent) const {
  const int page_size = kv_->page_size();
  const uint64_t extra = MixExtraKey(seq.cache_extra, static_cast<uint64_t>(layer));
  std::vector<PageKey> keys;
  keys.reserve(std::max(0, end - first));
  for (int page = first; page < end; ++page) {
    keys.push_back(MakePageKey(
        parent, extra, std::span<const int32_t>(seq.tokens).subspan(page * page_size, page_size)));
    parent = keys.back().hash;
  }
  return keys;
}

int Scheduler::PagesToLookUp(const Sequence& seq) const {
  // Whole pages of known tokens (a preempted dense sequence's generated ones too), leaving at
  // least one token to compute (its logits give the next token) and every row the policy scores
  // (their queries are computed in the final chunk).
  const int final_rows = std::max(1, seq.final_chunk_rows);
  return std::max(0, std::min(seq.num_known_tokens(), seq.prefill_target - final_rows)) /
         kv_->page_size();
}

uint64_t Scheduler::FirstPageKey(const Sequence& seq) const {
  return MakePageKey(0, MixExtraKey(seq.cache_extra, 0),
                     std::span<const int32_t>(seq.tokens).first(kv_->page_size()))
      .hash;
}

int Scheduler::CachedPrefixPages(const Sequence& seq, int* idle) const {
  *idle = 0;
  if (!seq.uses_prefix_cache || seq.num_computed != 0) return 0;
  int pages = PagesToLookUp(seq);
  // Each layer's chain, hashed page by page up to its first miss (a waiting sequence is planned
  // every step until admitted: a miss costs one hash, not the prompt's).
  const int page_size = kv_->page_size();
  std::vector<std::vector<PageKey>> keys(kv_->num_layers());
  for (int layer = 0; layer < kv_->num_layers() && pages > 0; ++layer) {
    const uint64_t extra = MixExtraKey(seq.cache_extra, static_cast<uint64_t>(layer));
    uint64_t parent = 0;
    for (int page = 0; page < pages; ++page) {
      PageKey key = MakePageKey(
          parent, extra, std::span<const int32_t>(seq.tokens).subspan(page * page_size, page_size));
      if (kv_->CachedPrefixPages(std::span(&key, 1)) == 0) break;
      parent = key.hash;
      keys[layer].push_back(std::move(key));
    }
    pages = static_cast<int>(keys[layer].size());
  }
  // Batch invariance: the prefill after the cached prefix must start where the prompt alone is
  // cut (InvariantChunk), so the prefix is used up to a chunk boundary only.
  if (options_.batch_invariant_chunk > 0) {
    const int unit = options_.batch_invariant_chunk;
    pages = pages * page_size / unit * unit / page_size;
  }
  if (pages == 0) return 0;
  for (const std::vector<PageKey>& layer_keys : keys) {
    int layer_idle = 0;
    kv_->CachedPrefixPages(std::span(layer_keys).first(pages), &layer_idle);
    *idle += layer_idle;
  }
  return pages;
}

void Scheduler::KeyComputedPages(Sequence& seq) {
  // Generated tokens' pages too (the next turn of a conversation extends this prompt and its
  // answer), once the host knows their tokens (Remove keys the last ones).
  const int full = std::min(seq.num_computed, seq.num_known_tokens()) / kv_->page_size();
  if (full <= seq.pages_keyed) return;
  const int layers = kv_->num_layers();
  seq.key_chain_tail.resize(layers, 0);
  // Past its prompt a compressed layer's pages hold kept entries, not positions: not keyed.
  const bool skip_compressed = !seq.compressed_layers.empty() && !seq.in_prefill();
  for (int layer = 0; layer < layers; ++layer) {
    if (skip_compressed && seq.compressed_layers[layer]) continue;
    const std::vector<PageKey> keys =
        SequenceKeys(seq, layer, seq.pages_keyed, full, seq.key_chain_tail[layer]);
    kv_->RegisterPages(seq.id, layer, seq.pages_keyed, keys);
    seq.key_chain_tail[layer] = keys.back().hash;
  }
  seq.pages_keyed = full;
}

int Scheduler::ChunkSize(const Sequence& seq, int token_budget, int start) const {
  const int remaining = seq.prefill_target - start;
  if (options_.batch_invariant_chunk > 0 && options_.enable_chunked_prefill) {
    // The chunk a prompt alone gets, or none: its end depends on the prompt only, never on what
    // else the step holds.
    const int chunk = InvariantChunk(seq, start);
    return chunk <= token_budget ? chunk : 0;
  }
  if (remaining <= token_budget) return remaining;
  if (!options_.enable_chunked_prefill) return 0;
  // The rows the policy scores must all be in the final chunk (their queries are not kept).
  const int final_rows = seq.final_chunk_rows;
  int chunk = token_budget;
  if (remaining - chunk < final_rows) chunk = remaining - final_rows;
  return std::max(chunk, 0);
}

int Scheduler::InvariantChunk(const Sequence& seq, int start) const {
  const int unit = options_.batch_invariant_chunk;
  const int target = seq.prefill_target;
  int end = std::min(target, (start / unit + 1) * unit);
  // The rows the policy scores must all be in the final chunk: this one ends before them (or,
  // when it cannot, is the final chunk itself).
  if (end < target && target - end < seq.final_chunk_rows) {
    end = target - seq.final_chunk_rows > start ? target - seq.final_chunk_rows : target;
  }
  return end - start;
}

ScheduledSequence Scheduler::PlanPrefill(const Sequence& seq, int chunk, int start, StepPlan& plan,
                                         bool keep_prompt_pages) const {
  const int layers = kv_->num_layers();
  ScheduledSequence out;
  out.id = seq.id;
  out.context_len = start;
  out.num_tokens = chunk;
  out.final_chunk = start + chunk == seq.prefill_target;
  // A request of max_tokens 0 (prompt logprobs only) samples nothing after its prompt.
  out.sample = out.final_chunk && seq.max_total_tokens > seq.num_prompt_tokens;
  out.layer_rows = plan.AddLayerRows();
  int* capacities = plan.capacities.data() + out.layer_rows;
  int* lengths_after = plan.lengths_after.data() + out.layer_rows;
  const int end = start + chunk;
  if (!out.final_chunk) {
    std::fill(capacities, capacities + layers, end);
    std::fill(lengths_after, lengths_after + layers, end);
    return out;
  }
  out.compress = seq.policy->PlanPrompt(seq.prefill_target);
  // Kept entries after the prompt's pages, which then hold every prompt entry (this chunk's too).
  const int kept_offset = keep_prompt_pages ? kv_->PagesFor(end) * kv_->page_size() : 0;
  for (int layer = 0; layer < layers; ++layer) {
    const LayerPlan& layer_plan = out.compress[layer];
    if (layer_plan.compress && kept_offset > 0) {
      capacities[layer] = kept_offset + layer_plan.budget;
      lengths_after[layer] = layer_plan.budget;
      out.kept_offset = kept_offset;
    } else if (layer_plan.compress) {
      // Earlier chunks' entries stay in the pages until gathered; the kept ones are then written
      // over the head of the same list.
      capacities[layer] = std::max(start, layer_plan.budget);
      lengths_after[layer] = layer_plan.budget;
    } else {
      capacities[layer] = end;
      lengths_after[layer] = end;
    }
  }
  return out;
}

void Scheduler::DecodeCaps::Load(const KvPolicy& from, int layers) {
  policy = &from;
  max_entries.resize(layers);
  any = false;
  for (int layer = 0; layer < layers; ++layer) {
    max_entries[layer] = from.DecodeLimitFor(layer).max_entries;
    any = any || max_entries[layer] > 0;
  }
}

ScheduledSequence Scheduler::PlanDecode(const Sequence& seq, const DecodeCaps& caps,
                                        StepPlan& plan) const {
  const int layers = kv_->num_layers();
  ScheduledSequence out;
  out.id = seq.id;
  out.context_len = seq.num_computed;
  out.num_tokens = 1;
  out.is_decode = true;
  out.sample = true;
  out.layer_rows = plan.AddLayerRows();
  int* capacities = plan.capacities.data() + out.layer_rows;
  int* lengths_after = plan.lengths_after.data() + out.layer_rows;
  uint8_t* evict = plan.evict.data() + out.layer_rows;
  // Each layer's length now, overwritten below with its length after the step.
  if (seq.state == SequenceState::kSwapped) {
    // Its lists come back holding PagesFor(length) pages each: full ones need a page.
    out.new_pages = 0;
    for (int layer = 0; layer < layers; ++layer) {
      lengths_after[layer] = seq.swapped_lengths[layer];
      out.new_pages += lengths_after[layer] % kv_->page_size() == 0;
    }
  } else {
    out.new_pages = kv_->PagesToAppend(seq.id, {lengths_after, static_cast<size_t>(layers)});
  }
  if (!caps.any) {  // no layer evicts (AddLayerRows zeroed evict)
    for (int layer = 0; layer < layers; ++layer) {
      capacities[layer] = ++lengths_after[layer];
    }
    return out;
  }
  for (int layer = 0; layer < layers; ++layer) {
    const int length = lengths_after[layer];
    const int max_entries = caps.max_entries[layer];
    capacities[layer] = length + 1;
    evict[layer] = max_entries > 0 && length + 1 > max_entries;
    lengths_after[layer] = evict[layer] ? length : length + 1;
    out.evicts = out.evicts || evict[layer];
  }
  return out;
}

int Scheduler::SwappedPagesToGrow(const Sequence& seq, std::span<const int> capacities) const {
  int needed = 0;
  for (int layer = 0; layer < kv_->num_layers(); ++layer) {
    needed +=
        std::max(0, kv_->PagesFor(capacities[layer]) - kv_->PagesFor(seq.swapped_lengths[layer]));
  }
  return needed;
}

int Scheduler::PagesAfterCompression(const Sequence& seq) const {
  if (seq.state == SequenceState::kSwapped && !seq.in_prefill()) {
    return static_cast<int>(seq.swap_slots.size());
  }
  if (seq.state == SequenceState::kRunning && !seq.in_prefill()) {
    return kv_->PagesUsedBySequence(seq.id);
  }
  // A sparse sequence back from a preemption also replays its generated tokens into the cache
  // (at most the layer's decode cap, where it evicts).
  const int replayed = static_cast<int>(seq.tokens.size()) - seq.prefill_target;
  const std::vector<int> after_prompt = seq.policy->EntriesAfterPrompt(seq.prefill_target);
  int pages = 0;
  for (int layer = 0; layer < static_cast<int>(after_prompt.size()); ++layer) {
    int entries = after_prompt[layer] + replayed + 1;  // + the first decode entry
    const int cap = seq.policy->DecodeLimitFor(layer).max_entries;
    if (cap > 0) entries = std::max(after_prompt[layer] + 1, std::min(entries, cap + 1));
    pages += kv_->PagesFor(entries);
  }
  return pages;
}

void Scheduler::Plan(StepPlan& plan) const {
  plan.Clear(kv_->num_layers());
  int free_pages = kv_->num_free_pages();
  int token_budget = options_.max_num_batched_tokens;
  int free_swap_slots = num_free_swap_slots();
  std::vector<SeqId> preempted;
  const auto is_preempted = [&](SeqId id) {
    return std::find(preempted.begin(), preempted.end(), id) != preempted.end();
  };
  const auto newest_running = [&]() -> SeqId {
    for (auto it = running_.rbegin(); it != running_.rend(); ++it) {
      if (!is_preempted(*it)) return *it;
    }
    return -1;
  };

  // Reloaded when a sequence's policy is not the previous one's (most share the engine's). Reset
  // first: a policy freed since the last step may share its address with a new one.
  thread_local DecodeCaps caps;
  caps.policy = nullptr;
  // Prefill rows of sequences that need prompt logprobs: each is a row of logits.
  int logprob_rows = options_.prompt_logprob_rows;
  const auto chunk_budget = [&](const Sequence& seq) {
    return seq.prompt_logprobs ? std::min(token_budget, logprob_rows) : token_budget;
  };
  for (const SeqId id : running_) {
    if (is_preempted(id)) continue;
    const Sequence& seq = seqs_.at(id);
    if (seq.finishing) continue;
    ScheduledSequence scheduled;
    if (seq.in_prefill()) {
      const int chunk = ChunkSize(seq, chunk_budget(seq), seq.num_computed);
      if (chunk == 0) continue;
      scheduled = PlanPrefill(seq, chunk, seq.num_computed, plan, !seq.compressed_layers.empty());
    } else {
      if (token_budget < 1) continue;
      if (seq.policy != caps.policy) caps.Load(*seq.policy, kv_->num_layers());
      scheduled = PlanDecode(seq, caps, plan);
    }
    const int needed = scheduled.is_decode ? scheduled.new_pages
                                           : kv_->PagesToGrow(id, plan.Capacities(scheduled));
    scheduled.new_pages = needed;
    bool self_preempted = false;
    while (needed > free_pages) {
      const SeqId victim = newest_running();
      preempted.push_back(victim);
      // Swapped when its pages (every one it references, shared or not) fit the free slots.
      const int held = kv_->PagesUsedBySequence(victim);
      const bool swap =
          options_.preemption_mode == PreemptionMode::kSwap && held <= free_swap_slots;
      if (swap) free_swap_slots -= held;
      plan.preempted_swap.push_back(swap);
      free_pages += kv_->PagesFreedByRemoval(victim);
      if (victim == id) {
        self_preempted = true;
        break;
      }
    }
    if (self_preempted) continue;
    free_pages -= needed;
    token_budget -= scheduled.num_tokens;
    if (!scheduled.is_decode && seq.prompt_logprobs) logprob_rows -= scheduled.num_tokens;
    plan.num_tokens += scheduled.num_tokens;
    (scheduled.is_decode ? plan.decodes : plan.prefills).push_back(std::move(scheduled));
  }
  // A sequence preempted now may have been scheduled before its victim was chosen: drop it.
  for (auto* list : {&plan.prefills, &plan.decodes}) {
    for (auto it = list->begin(); it != list->end();) {
      if (is_preempted(it->id)) {
        plan.num_tokens -= it->num_tokens;
        it = list->erase(it);
      } else {
        ++it;
      }
    }
  }
  plan.preempted = preempted;

  int running = static_cast<int>(running_.size());
  int free_slots = kv_->num_free_slots();
  // Swapped sequences come back first, oldest first, never skipping ahead, when their pages and
  // their step fit, and only when nothing had to be preempted (memory is tight otherwise). They
  // run in this step: a decode (or their prefill's next chunk) planned from their saved lengths.
  bool swapped_all_in = preempted.empty();
  for (const SeqId id : swapped_) {
    if (!preempted.empty()) break;
    const Sequence& seq = seqs_.at(id);
    if (seq.finishing) continue;  // its last token is in flight: it ends without running again
    if (running >= options_.max_num_seqs || free_slots == 0 || token_budget == 0) {
      swapped_all_in = false;
      break;
    }
    ScheduledSequence scheduled;
    int grow = 0;
    if (seq.in_prefill()) {
      const int chunk = ChunkSize(seq, chunk_budget(seq), seq.num_computed);
      if (chunk == 0) {
        swapped_all_in = false;
        break;
      }
      scheduled = PlanPrefill(seq, chunk, seq.num_computed, plan, !seq.compressed_layers.empty());
      grow = SwappedPagesToGrow(seq, plan.Capacities(scheduled));
    } else {
      if (seq.policy != caps.policy) caps.Load(*seq.policy, kv_->num_layers());
      scheduled = PlanDecode(seq, caps, plan);
      grow = scheduled.new_pages;
    }
    const int needed = static_cast<int>(seq.swap_slots.size()) + grow;
    if (needed > free_pages) {
      plan.DropLayerRows(scheduled.layer_rows);
      swapped_all_in = false;
      break;
    }
    scheduled.new_pages = grow;
    free_pages -= needed;
    token_budget -= scheduled.num_tokens;
    if (!scheduled.is_decode && seq.prompt_logprobs) logprob_rows -= scheduled.num_tokens;
    plan.num_tokens += scheduled.num_tokens;
    ++running;
    --free_slots;
    plan.swapped_in.push_back(id);
    (scheduled.is_decode ? plan.decodes : plan.prefills).push_back(std::move(scheduled));
  }

  // New sequences, FCFS, only when nothing had to be preempted and nothing waits swapped out.
  if (preempted.empty() && swapped_all_in && !waiting_.empty()) {
    int64_t pages_after = 0;  // what every running sequence holds once its prompt is compressed
    for (const SeqId id : running_) pages_after += PagesAfterCompression(seqs_.at(id));
    for (const SeqId id : plan.swapped_in) pages_after += PagesAfterCompression(seqs_.at(id));
    // First pages of the prompts whose prefill is under way and keys pages as it goes: a waiting
    // sequence with the same first page and nothing cached yet (n > 1 copies of one prompt,
    // requests sent together with one system prompt) waits for those pages instead of computing
    // them again beside them. Once the first chunk's pages are keyed, the rest all hit at once.
    std::vector<uint64_t> prefilling;
    for (const SeqId id : running_) {
      const Sequence& seq = seqs_.at(id);
      if (seq.uses_prefix_cache && seq.in_prefill() && CanHitPages(seq)) {
        prefilling.push_back(FirstPageKey(seq));
      }
    }
    const auto shares_a_prefill = [&](uint64_t key) {
      return std::find(prefilling.begin(), prefilling.end(), key) != prefilling.end();
    };
    for (const SeqId id : waiting_) {
      if (running >= options_.max_num_seqs || free_slots == 0 || token_budget == 0) break;
      const Sequence& seq = seqs_.at(id);
      const bool can_hit = seq.uses_prefix_cache && CanHitPages(seq);
      const uint64_t first_page = can_hit ? FirstPageKey(seq) : 0;
      // A cached prefix is attached, not allocated: its pages that no list holds leave the free
      // count, and the prefill starts after it.
      int idle_cached = 0;
      int cached_pages = CachedPrefixPages(seq, &idle_cached);
      if (can_hit && cached_pages == 0 && shares_a_prefill(first_page)) continue;
      bool keep_prompt_pages = !seq.compressed_layers.empty();
      const int after = PagesAfterCompression(seq);
      ScheduledSequence scheduled;
      int needed = 0;
      int chunk = 0;
      const auto plan_first_chunk = [&] {
        chunk = ChunkSize(seq, chunk_budget(seq), cached_pages * kv_->page_size());
        if (chunk == 0) return;
        scheduled =
            PlanPrefill(seq, chunk, cached_pages * kv_->page_size(), plan, keep_prompt_pages);
        needed = kv_->PagesToGrow(-1, plan.Capacities(scheduled)) -
                 cached_pages * kv_->num_layers() + idle_cached;
      };
      plan_first_chunk();
      if (chunk > 0 && needed > free_pages && keep_prompt_pages) {
        // A sparse prompt's pages kept whole beside its kept entries do not fit now: as without
        // the cache (compressed over the prompt's head, nothing attached or keyed), so caching
        // never holds back a request.
        plan.DropLayerRows(scheduled.layer_rows);
        keep_prompt_pages = false;
        cached_pages = 0;
        idle_cached = 0;
        plan_first_chunk();
      }
      if (chunk == 0) break;
      const int cached_tokens = cached_pages * kv_->page_size();
      if (needed > free_pages || pages_after + after > kv_->num_pages()) break;
      free_pages -= needed;
      pages_after += after;
      token_budget -= chunk;
      if (seq.prompt_logprobs) logprob_rows -= chunk;
      plan.num_tokens += chunk;
      ++running;
      --free_slots;
      plan.Admit(id, cached_tokens, !seq.compressed_layers.empty() && !keep_prompt_pages);
      if (can_hit && (seq.compressed_layers.empty() || keep_prompt_pages)) {
        prefilling.push_back(first_page);
      }
      plan.prefills.push_back(std::move(scheduled));
    }
  }
}

void Scheduler::SwapOut(Sequence& seq) {
  const int layers = kv_->num_layers();
  seq.swapped_lengths.resize(layers);
  seq.swap_slots.clear();
  for (int layer = 0; layer < layers; ++layer) {
    seq.swapped_lengths[layer] = kv_->Length(seq.id, layer);
    // Every page it references, shared prefix pages too: it gets private ones back.
    for (const int32_t page : kv_->Pages(seq.id, layer)) {
      SIEVE_CHECK(!free_swap_slots_.empty()) << "planned swap slots are gone";
      seq.swap_slots.push_back(free_swap_slots_.back());
      free_swap_slots_.pop_back();
      swaps_.out_pages.push_back(page);
      swaps_.out_slots.push_back(seq.swap_slots.back());
    }
  }
  kv_->RemoveSequence(seq.id);
  seq.state = SequenceState::kSwapped;
  ++num_swapped_out_;
  const auto position = std::find_if(swapped_.begin(), swapped_.end(), [&](SeqId other) {
    return seqs_.at(other).arrival > seq.arrival;
  });
  swapped_.insert(position, seq.id);
}

void Scheduler::SwapIn(Sequence& seq) {
  const auto slot = kv_->AddSequence(seq.id);
  SIEVE_CHECK(slot.ok()) << slot.status().ToString();
  SIEVE_CHECK(kv_->Grow(seq.id, seq.swapped_lengths))
      << "planned swap-in of sequence " << seq.id << " found too few pages";
  kv_->SetLengths(seq.id, seq.swapped_lengths);
  size_t index = 0;
  for (int layer = 0; layer < kv_->num_layers(); ++layer) {
    for (const int32_t page : kv_->Pages(seq.id, layer)) {
      SIEVE_CHECK(index < seq.swap_slots.size());
      swaps_.in_slots.push_back(seq.swap_slots[index++]);
      swaps_.in_pages.push_back(page);
    }
  }
  SIEVE_CHECK(index == seq.swap_slots.size()) << "sequence " << seq.id << " came back resized";
  // Freed now: a later swap-out that takes them is copied after these copies (stream order).
  for (const int32_t swap_slot : seq.swap_slots) free_swap_slots_.push_back(swap_slot);
  seq.swap_slots.clear();
  seq.swapped_lengths.clear();
  // Its fresh pages carry no keys: it keys pages from where it stopped (a page's key taken by
  // its old page is left to that one).
  seq.state = SequenceState::kRunning;
  ++num_swapped_in_;
  std::erase(swapped_, seq.id);
  const auto position = std::find_if(running_.begin(), running_.end(), [&](SeqId other) {
    return seqs_.at(other).arrival > seq.arrival;
  });
  running_.insert(position, seq.id);
}

void Scheduler::Commit(const StepPlan& plan) {
  swaps_.Clear();
  for (size_t index = 0; index < plan.preempted.size(); ++index) {
    const SeqId id = plan.preempted[index];
    Sequence& seq = seqs_.at(id);
    if (seq.uses_prefix_cache) KeyComputedPages(seq);
    std::erase(running_, id);
    ++seq.num_preemptions;
    ++num_preemptions_;
    if (plan.preempted_swap[index]) {
      SwapOut(seq);
      continue;
    }
    if (options_.preemption_mode == PreemptionMode::kSwap) ++num_swap_fallbacks_;
    kv_->RemoveSequence(id);
    seq.state = SequenceState::kWaiting;
    seq.num_computed = 0;
    // Dense: everything at once. Sparse: the prompt, then the generated tokens replayed.
    // Batch invariance replays a dense sequence's tokens as well: prefilled, their rows would
    // get prefill attention's arithmetic instead of the decode steps' that computed them first
    // (and the prompt's last chunk would end elsewhere).
    seq.prefill_target = seq.policy->IsDense() && options_.batch_invariant_chunk == 0
                             ? static_cast<int>(seq.tokens.size())
                             : seq.num_prompt_tokens;
    seq.final_chunk_rows = seq.policy->FinalChunkRows(seq.prefill_target);
    ResetPrefixCache(seq);  // its keyed pages stay cached: readmission may attach them
    // Back to the queue in arrival order: it goes before everything that came after it.
    const auto position = std::find_if(waiting_.begin(), waiting_.end(), [&](SeqId other) {
      return seqs_.at(other).arrival > seq.arrival;
    });
    waiting_.insert(position, id);
  }
  for (size_t index = 0; index < plan.admitted.size(); ++index) {
    const SeqId id = plan.admitted[index];
    Sequence& seq = seqs_.at(id);
    const auto slot = kv_->AddSequence(id);
    SIEVE_CHECK(slot.ok()) << slot.status().ToString();
    // Attached before any growth of this step, which could evict them.
    const int cached_tokens = plan.admitted_cached_tokens[index];
    if (plan.admitted_uncached[index]) {
      seq.uses_prefix_cache = false;
      seq.compressed_layers.clear();
    }
    if (seq.uses_prefix_cache) {
      prefix_cache_queries_ += seq.prefill_target;
      prefix_cache_hits_ += cached_tokens;
    }
    if (cached_tokens > 0) {
      const int pages = cached_tokens / kv_->page_size();
      seq.key_chain_tail.assign(kv_->num_layers(), 0);
      for (int layer = 0; layer < kv_->num_layers(); ++layer) {
        const std::vector<PageKey> keys = SequenceKeys(seq, layer, 0, pages, 0);
        SIEVE_CHECK(kv_->CachedPrefixPages(keys) == pages)
            << "a planned cached prefix of sequence " << id << " is gone";
        kv_->AttachCachedPages(id, layer, keys);
        seq.key_chain_tail[layer] = keys.back().hash;
      }
      seq.num_computed = cached_tokens;
      seq.pages_keyed = pages;
    }
    seq.state = SequenceState::kRunning;
    std::erase(waiting_, id);
    const auto position = std::find_if(running_.begin(), running_.end(), [&](SeqId other) {
      return seqs_.at(other).arrival > seq.arrival;
    });
    running_.insert(position, id);
  }
  // After the admissions have attached their cached prefixes: a swap-in's fresh pages, like any
  // growth, may evict cached pages.
  for (const SeqId id : plan.swapped_in) SwapIn(seqs_.at(id));
  for (const auto* list : {&plan.prefills, &plan.decodes}) {
    for (const ScheduledSequence& scheduled : *list) {
      if (scheduled.is_decode && scheduled.new_pages == 0) continue;  // nothing to allocate
      const bool grown = scheduled.is_decode ? kv_->GrowForAppend(scheduled.id)
                                             : kv_->Grow(scheduled.id, plan.Capacities(scheduled));
      SIEVE_CHECK(grown) << "planned KV growth failed for sequence " << scheduled.id;
    }
  }
}

void Scheduler::ReleasePromptPages(Sequence& seq, const ScheduledSequence& scheduled,
                                   const StepPlan& plan) {
  const int layers = kv_->num_layers();
  const int prompt_pages = scheduled.kept_offset / kv_->page_size();
  const int full = seq.prefill_target / kv_->page_size();  // a sparse prompt's tokens are known
  seq.key_chain_tail.resize(layers, 0);
  const std::span<const int> lengths_after = plan.LengthsAfter(scheduled);
  for (int layer = 0; layer < layers; ++layer) {
    if (!scheduled.compress[layer].compress) continue;
    const std::vector<PageKey> keys =
        SequenceKeys(seq, layer, seq.pages_keyed, full, seq.key_chain_tail[layer]);
    kv_->ReleasePromptPages(seq.id, layer, prompt_pages, seq.pages_keyed, keys,
                            lengths_after[layer]);
  }
}

void Scheduler::Complete(const StepPlan& plan) {
  for (const auto* list : {&plan.prefills, &plan.decodes}) {
    for (const ScheduledSequence& scheduled : *list) {
      Sequence& seq = seqs_.at(scheduled.id);
      seq.num_computed += scheduled.num_tokens;
      if (scheduled.is_decode && !seq.caught_up()) ++num_replayed_tokens_;
      if (scheduled.kept_offset > 0) ReleasePromptPages(seq, scheduled, plan);
      kv_->SetLengths(scheduled.id, plan.LengthsAfter(scheduled));
      // A page filled (no division: this runs for every decode of every step).
      if (seq.uses_prefix_cache && seq.num_computed >= (seq.pages_keyed + 1) * kv_->page_size()) {
        KeyComputedPages(seq);
      }
    }
  }
}

}  // namespace sieve
