// Two-turn tasks (niah-two-turn): turn 1 asks about one needle, turn 2 - a new message after the
// prompt and turn 1's answer - about another in the same context. Turn 2 runs in one of two ways
// (--second-turn), so that a record can say what each costs and scores:
// - kPrefill: a new request whose prompt is the whole conversation so far, prefilled and
//   compressed under turn 2's own window (with prefix caching on, turn 1's prompt pages are
//   reused exactly; off, the context is prefilled again);
// - kReuse: turn 2 continues on the KV cache turn 1's policy left (compressed under turn 1's
//   window): the answer and the new message are appended to it. In process only: the request
//   carries them as forced tokens with Request::sample_after_forced, so they run as decode steps
//   on the compressed cache rather than as one prefill chunk over it. The tokens and the cache are
//   those of reusing a turn's compressed pages; the time counts their decode steps.
#pragma once

#include <memory>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "tokenizer/tokenizer.h"
#include "tools/eval/eval_sample.h"

namespace sieve::eval {

enum class SecondTurn { kPrefill, kReuse };
Result<SecondTurn> ParseSecondTurn(std::string_view text);  // "prefill" | "reuse"
const char* SecondTurnName(SecondTurn mode);

// Turn 2's samples of the two-turn samples among `samples`, given their turn-1 `records` (in the
// same order as `samples`): prompt_ids + the answer's tokens + follow_up's tokens (kReuse: the
// last two as the continuation), no BOS before either, scored against follow_up_expected. A
// sample without a follow-up gets none: the result is parallel to `samples`, with null there.
Result<std::vector<std::unique_ptr<EvalSample>>> SecondTurnSamples(
    const std::vector<const EvalSample*>& samples, const std::vector<SampleRecord>& records,
    SecondTurn mode, const Tokenizer& tokenizer);

// Folds turn 2's records into turn 1's: a two-turn sample's record keeps its turn-1 output and
// score as first_turn_output / first_turn_score and takes turn 2's output, score and error.
void MergeSecondTurn(std::vector<SampleRecord>& records,
                     const std::vector<std::unique_ptr<EvalSample>>& second_samples,
                     const std::vector<SampleRecord>& second_records);

}  // namespace sieve::eval
