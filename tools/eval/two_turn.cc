#include "tools/eval/two_turn.h"

#include <string>

namespace sieve::eval {

Result<SecondTurn> ParseSecondTurn(std::string_view text) {
  if (text == "prefill") return SecondTurn::kPrefill;
  if (text == "reuse") return SecondTurn::kReuse;
  return InvalidArgumentError("--second-turn is prefill or reuse, not '" + std::string(text) + "'");
}

const char* SecondTurnName(SecondTurn mode) {
  return mode == SecondTurn::kReuse ? "reuse" : "prefill";
}

Result<std::vector<std::unique_ptr<EvalSample>>> SecondTurnSamples(
    const std::vector<const EvalSample*>& samples, const std::vector<SampleRecord>& records,
    SecondTurn mode, const Tokenizer& tokenizer) {
  std::vector<std::unique_ptr<EvalSample>> second(samples.size());
  for (size_t index = 0; index < samples.size(); ++index) {
    const EvalSample& first = *samples[index];
    if (first.follow_up.empty()) continue;
    const std::string& answer = records[index].output;
    SIEVE_ASSIGN_OR_RETURN(std::vector<int32_t> answer_ids, tokenizer.Encode(answer, false));
    auto turn = std::make_unique<EvalSample>();
    turn->task = first.task;
    turn->length = first.length;
    turn->depth = first.depth;
    turn->index = first.index;
    turn->max_tokens = first.max_tokens;
    turn->metric = first.metric;
    turn->expected = first.follow_up_expected;
    turn->prompt = first.prompt + answer + first.follow_up;
    turn->prompt_ids = first.prompt_ids;
    std::vector<int32_t>& after =
        mode == SecondTurn::kReuse ? turn->continuation : turn->prompt_ids;
    after.insert(after.end(), answer_ids.begin(), answer_ids.end());
    after.insert(after.end(), first.follow_up_ids.begin(), first.follow_up_ids.end());
    second[index] = std::move(turn);
  }
  return second;
}

void MergeSecondTurn(std::vector<SampleRecord>& records,
                     const std::vector<std::unique_ptr<EvalSample>>& second_samples,
                     const std::vector<SampleRecord>& second_records) {
  size_t next = 0;
  for (size_t index = 0; index < records.size(); ++index) {
    if (!second_samples[index]) continue;
    const SampleRecord& second = second_records[next++];
    SampleRecord& record = records[index];
    record.first_turn_output = std::move(record.output);
    record.first_turn_score = record.score;
    record.output = second.output;
    record.score = second.score;
    if (record.error.empty()) record.error = second.error;
  }
}

}  // namespace sieve::eval
