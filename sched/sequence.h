// Sequence: one request's tokens and progress, as the scheduler sees them.
#pragma once

#include <cstdint>
#include <vector>

#include "kv/kv_cache_manager.h"
#include "kv/page_key.h"
#include "sparsity/kv_policy.h"

namespace sieve {

// kSwapped: preempted by swapping (SchedulerOptions::preemption_mode): its KV entries wait in host
// memory, to be copied back into fresh pages before it runs again.
enum class SequenceState { kWaiting, kRunning, kSwapped, kFinished };

// In Sequence::tokens, a token sampled by a step whose samples the engine has not read yet (the
// device has it: Engine's overlapped steps).
inline constexpr int32_t kUnknownToken = -1;

struct Sequence {
  SeqId id = 0;
  int64_t arrival = 0;               // FCFS order (smaller = earlier)
  std::vector<int32_t> tokens;       // the prompt, then every generated token
  int num_prompt_tokens = 0;         // the original prompt
  int max_total_tokens = 0;          // prompt + max new tokens (never past the context)
  const KvPolicy* policy = nullptr;  // owned by the engine
  SequenceState state = SequenceState::kWaiting;
  // Progress of the KV cache: tokens [0, num_computed) are in it (or were, then compressed).
  int num_computed = 0;
  // Tokens to prefill before decoding: the prompt, or after a preemption of a dense sequence the
  // prompt and the tokens generated so far (recompute). A sparse sequence prefills its prompt
  // again and then replays its generated tokens as decode steps (see Scheduler).
  int prefill_target = 0;
  // The prompt rows its policy scores in the final prefill chunk
  // (KvPolicy::FinalChunkRows(prefill_target)), set with prefill_target: planning reads it every
  // step.
  int final_chunk_rows = 0;
  int num_preemptions = 0;
  // Prompt logprobs (SamplingParams::prompt_logprobs) still to compute: every row of its prefill
  // chunks before the prompt's last is sampled too, so its chunks are capped at
  // SchedulerOptions::prompt_logprob_rows (the engine clears this once the prompt is scored).
  bool prompt_logprobs = false;
  // Its last token has been sampled by a step whose results the engine has not read yet
  // (Engine's overlapped steps): no further step is planned for it.
  bool finishing = false;
  // Prefix caching (Scheduler, kv/README.md "Prefix caching"): whether this sequence looks up
  // and keys its full pages (prompt and generated tokens), the extra key its pages carry (policy
  // and knobs; the layer is mixed in per layer), how many of its pages are keyed or attached,
  // and each layer's last such page's hash (the next key's parent).
  bool uses_prefix_cache = false;
  uint64_t cache_extra = 0;
  int pages_keyed = 0;
  std::vector<uint64_t> key_chain_tail;  // [L]
  // [L] while it uses the prefix cache with a sparse policy: the layers whose prompt the policy
  // compresses. Their prompt's pages are keyed like any other layer's and stay as computed; the
  // kept entries go to pages of their own (Scheduler::PlanPrefill). Past the prompt only the
  // other layers key pages.
  std::vector<uint8_t> compressed_layers;
  // While swapped out (kSwapped): each layer's length (its list holds PagesFor(length) pages),
  // and the host swap slot of each page, layer by layer in list order.
  std::vector<int> swapped_lengths;  // [L]
  std::vector<int32_t> swap_slots;   // [pages over all layers]

  int num_generated() const { return static_cast<int>(tokens.size()) - num_prompt_tokens; }
  // Leading tokens whose values the host knows (all but the unknown last ones).
  int num_known_tokens() const { return num_prompt_tokens + num_known_generated(); }
  // Generated tokens whose values the host knows (the unknown ones are the last).
  int num_known_generated() const {
    int known = num_generated();
    for (auto it = tokens.rbegin(); it != tokens.rend() && *it == kUnknownToken; ++it) --known;
    return known;
  }
  bool in_prefill() const { return num_computed < prefill_target; }
  // After a step (Scheduler::Complete): whether every known token is in the cache, so that the
  // step's logits give the next token. False while a preempted sequence replays.
  bool caught_up() const { return num_computed == static_cast<int>(tokens.size()); }
};

}  // namespace sieve
