// Scoring of `sieve eval` outputs: whole-run matches for the synthetic tasks, SQuAD-style
// normalisation, exact / substring / token F1 for jsonl records.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "tools/eval/eval_sample.h"

namespace sieve::eval {

// `value` occurs in `text` as a whole run: the characters on either side are not of value's
// kind (digits for a number, so "123456" does not contain 12345; letters and digits otherwise,
// so a hex key or a word must stand alone).
bool ContainsWhole(std::string_view text, std::string_view value);
// Fraction of `expected` that ContainsWhole finds (0 when `expected` is empty).
double FractionFound(std::string_view text, const std::vector<std::string>& expected);

// SQuAD's normalize_answer: lower case, ASCII punctuation removed, the articles a / an / the
// removed, whitespace collapsed to single spaces.
std::string NormalizeAnswer(std::string_view text);
// SQuAD's token F1 of the normalised prediction against the normalised truth.
double TokenF1(std::string_view prediction, std::string_view truth);

// An output's score in [0, 1] under the sample's metric (best over answers for jsonl metrics).
// Not for Metric::kPerplexity, whose score is the NLL of forced tokens.
double ScoreOutput(const EvalSample& sample, std::string_view output);

}  // namespace sieve::eval
