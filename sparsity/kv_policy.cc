#include "sparsity/kv_policy.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdint>
#include <optional>
#include <sstream>

#include "core/check.h"

namespace sieve {

namespace {

// Larger budgets would overflow the int32 entry counts of CompressionJob and the page tables.
constexpr int64_t kMaxEntries = int64_t{1} << 30;

constexpr PolicyKind kAllKinds[] = {PolicyKind::kFull, PolicyKind::kSnapKv, PolicyKind::kPyramidKv,
                                    PolicyKind::kStreamingLlm, PolicyKind::kH2o};

std::string_view Trim(std::string_view text) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front()))) {
    text.remove_prefix(1);
  }
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) {
    text.remove_suffix(1);
  }
  return text;
}

std::vector<std::string_view> Split(std::string_view text, char separator) {
  std::vector<std::string_view> parts;
  size_t begin = 0;
  while (true) {
    const size_t end = text.find(separator, begin);
    if (end == std::string_view::npos) {
      parts.push_back(text.substr(begin));
      return parts;
    }
    parts.push_back(text.substr(begin, end - begin));
    begin = end + 1;
  }
}

std::optional<PolicyKind> KindFromName(std::string_view name) {
  std::string lower(name);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (PolicyKind kind : kAllKinds) {
    if (lower == PolicyKindName(kind)) return kind;
  }
  return std::nullopt;
}

// A layer number: decimal digits only (no sign, no spaces inside).
std::optional<int> ParseLayerNumber(std::string_view text) {
  if (text.empty()) return std::nullopt;
  for (char c : text) {
    if (!std::isdigit(static_cast<unsigned char>(c))) return std::nullopt;
  }
  int value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

std::string RangeText(int first, int last) {
  return first == last ? std::to_string(first) : std::to_string(first) + "-" + std::to_string(last);
}

// "a-b" or "a" within [0, num_layers).
Status ParseRange(std::string_view entry, std::string_view text, int num_layers, int* first,
                  int* last) {
  const size_t dash = text.find('-');
  const std::optional<int> begin = ParseLayerNumber(Trim(text.substr(0, dash)));
  const std::optional<int> end =
      dash == std::string_view::npos ? begin : ParseLayerNumber(Trim(text.substr(dash + 1)));
  if (!begin || !end) {
    return InvalidArgumentError("bad layer range '" + std::string(text) + "' in '" +
                                std::string(entry) + "' (expected 'a-b' or 'a')");
  }
  if (*begin > *end) {
    return InvalidArgumentError("layer range '" + std::string(text) + "' in '" +
                                std::string(entry) + "' is reversed");
  }
  if (*end >= num_layers) {
    return InvalidArgumentError("layer " + std::to_string(*end) + " in '" + std::string(entry) +
                                "' is out of range (the model has " + std::to_string(num_layers) +
                                " layers)");
  }
  *first = *begin;
  *last = *end;
  return Status::Ok();
}

bool UsesDecodeCap(PolicyKind kind) {
  return kind != PolicyKind::kStreamingLlm && kind != PolicyKind::kH2o;
}

// No pooling is spelled two ways (kNone, or kernel 1); plans use one spelling.
bool Pools(const KvPolicyOptions& options) {
  return options.pool != PoolKind::kNone && options.kernel > 1;
}

// The largest budget any pyramid layer gets, over every prompt length: layer 0 of a long prompt
// (max_num + W), or the uniform C of a short one.
int64_t PyramidTopBudget(const KvPolicyOptions& options) {
  const int64_t prefix = options.budget - options.window;
  const int64_t top = 2 * prefix - prefix / options.beta + options.window;
  return std::max<int64_t>(options.budget, top);
}

std::string PoolText(const KvPolicyOptions& options) {
  if (!Pools(options)) return "no pooling";
  return std::string(options.pool == PoolKind::kMax ? "maxpool " : "avgpool ") +
         std::to_string(options.kernel);
}

Status ValidateOptions(const std::vector<bool>& present, const KvPolicyOptions& options) {
  const auto has = [&](PolicyKind kind) { return present[static_cast<int>(kind)]; };
  const bool scored = has(PolicyKind::kSnapKv) || has(PolicyKind::kPyramidKv);
  if (scored) {
    if (options.window < 1) {
      return InvalidArgumentError("window " + std::to_string(options.window) + " < 1");
    }
    if (options.window >= options.budget) {
      return InvalidArgumentError("window " + std::to_string(options.window) + " >= budget " +
                                  std::to_string(options.budget));
    }
    if (options.budget > kMaxEntries) {
      return InvalidArgumentError("budget " + std::to_string(options.budget) + " is too large");
    }
    if (options.pool != PoolKind::kNone && options.pool != PoolKind::kMax &&
        options.pool != PoolKind::kAvg) {
      return InvalidArgumentError("unknown pooling kind " +
                                  std::to_string(static_cast<int>(options.pool)));
    }
    if (options.pool != PoolKind::kNone) {
      if (options.kernel < 1) {
        return InvalidArgumentError("pooling kernel " + std::to_string(options.kernel) + " < 1");
      }
      if (options.kernel % 2 == 0) {
        // An even kernel has no centre: "same"-length pooling would shift scores by half a slot.
        return InvalidArgumentError("even pooling kernel " + std::to_string(options.kernel));
      }
    }
  }
  if (scored || has(PolicyKind::kH2o)) {
    if (options.reduce != GroupReduce::kMean && options.reduce != GroupReduce::kMax) {
      return InvalidArgumentError("unknown GQA reduction " +
                                  std::to_string(static_cast<int>(options.reduce)));
    }
  }
  if (has(PolicyKind::kPyramidKv) && options.beta < 1) {
    return InvalidArgumentError("pyramid beta " + std::to_string(options.beta) + " < 1");
  }
  if (has(PolicyKind::kStreamingLlm) || has(PolicyKind::kH2o)) {
    if (options.recent < 1) {
      return InvalidArgumentError("recent " + std::to_string(options.recent) + " < 1");
    }
  }
  if (has(PolicyKind::kStreamingLlm)) {
    if (options.sinks < 0) {
      return InvalidArgumentError("sinks " + std::to_string(options.sinks) + " < 0");
    }
    if (int64_t{options.sinks} + options.recent > kMaxEntries) {
      return InvalidArgumentError("sinks + recent is too large");
    }
  }
  if (has(PolicyKind::kH2o)) {
    if (options.heavy < 0) {
      return InvalidArgumentError("heavy " + std::to_string(options.heavy) + " < 0");
    }
    if (int64_t{options.heavy} + options.recent > kMaxEntries) {
      return InvalidArgumentError("heavy + recent is too large");
    }
  }
  if (options.decode_cap < 0) {
    return InvalidArgumentError("decode cap " + std::to_string(options.decode_cap) + " < 0");
  }
  if (options.decode_cap > 0) {
    // A cap below what the prompt leaves would never be reached by evicting one entry per step.
    if (has(PolicyKind::kSnapKv) && options.decode_cap < options.budget) {
      return InvalidArgumentError("decode cap " + std::to_string(options.decode_cap) +
                                  " < budget " + std::to_string(options.budget) +
                                  " of the snapkv layers");
    }
    if (has(PolicyKind::kPyramidKv) && options.decode_cap < PyramidTopBudget(options)) {
      return InvalidArgumentError("decode cap " + std::to_string(options.decode_cap) +
                                  " < largest pyramidkv layer budget " +
                                  std::to_string(PyramidTopBudget(options)));
    }
  }
  return Status::Ok();
}

}  // namespace

std::string_view PolicyKindName(PolicyKind kind) {
  switch (kind) {
    case PolicyKind::kFull:
      return "full";
    case PolicyKind::kSnapKv:
      return "snapkv";
    case PolicyKind::kPyramidKv:
      return "pyramidkv";
    case PolicyKind::kStreamingLlm:
      return "streamingllm";
    case PolicyKind::kH2o:
      return "h2o";
  }
  return "unknown";
}

Result<KvPolicy> KvPolicy::Parse(std::string_view spec, int num_layers,
                                 const KvPolicyOptions& options) {
  if (num_layers < 1) {
    return InvalidArgumentError("KV policy for " + std::to_string(num_layers) + " layers");
  }
  const std::string_view trimmed = Trim(spec);
  if (trimmed.empty()) return InvalidArgumentError("empty KV policy");

  KvPolicy policy;
  policy.options_ = options;
  std::vector<int> owner(num_layers, -1);  // [num_layers] index into ranges_ of the layer's entry
  std::vector<std::string_view> entries = Split(trimmed, ',');
  for (std::string_view raw_entry : entries) {
    const std::string_view entry = Trim(raw_entry);
    if (entry.empty()) {
      return InvalidArgumentError("empty entry in KV policy '" + std::string(spec) + "'");
    }
    const size_t colon = entry.find(':');
    const std::string_view name = Trim(entry.substr(0, colon));
    const std::optional<PolicyKind> kind = KindFromName(name);
    if (!kind) return InvalidArgumentError("unknown policy '" + std::string(name) + "'");
    Range range{*kind, 0, num_layers - 1};
    if (colon == std::string_view::npos) {
      if (entries.size() > 1) {
        return InvalidArgumentError("'" + std::string(entry) +
                                    "' has no layer range (a policy without one must be the only "
                                    "entry)");
      }
    } else {
      SIEVE_RETURN_IF_ERROR(
          ParseRange(entry, Trim(entry.substr(colon + 1)), num_layers, &range.first, &range.last));
    }
    for (int layer = range.first; layer <= range.last; ++layer) {
      if (owner[layer] >= 0) {
        const Range& other = policy.ranges_[owner[layer]];
        return InvalidArgumentError("layer " + std::to_string(layer) + " covered twice ('" +
                                    std::string(entry) + "' and '" +
                                    std::string(PolicyKindName(other.kind)) + ":" +
                                    RangeText(other.first, other.last) + "')");
      }
      owner[layer] = static_cast<int>(policy.ranges_.size());
    }
    policy.ranges_.push_back(range);
  }
  for (int layer = 0; layer < num_layers; ++layer) {
    if (owner[layer] >= 0) continue;
    int last = layer;
    while (last + 1 < num_layers && owner[last + 1] < 0) ++last;
    return InvalidArgumentError((layer == last ? "layer " : "layers ") + RangeText(layer, last) +
                                (layer == last ? " has" : " have") + " no policy");
  }
  std::sort(policy.ranges_.begin(), policy.ranges_.end(),
            [](const Range& a, const Range& b) { return a.first < b.first; });
  policy.layer_kind_.resize(num_layers);
  std::vector<bool> present(std::size(kAllKinds), false);
  for (const Range& range : policy.ranges_) {
    present[static_cast<int>(range.kind)] = true;
    std::fill(policy.layer_kind_.begin() + range.first, policy.layer_kind_.begin() + range.last + 1,
              range.kind);
  }
  SIEVE_RETURN_IF_ERROR(ValidateOptions(present, options));
  policy.CacheDecodeLimits();
  return policy;
}

KvPolicy KvPolicy::Dense(int num_layers) {
  KvPolicy policy;
  if (num_layers > 0) policy.ranges_.push_back({PolicyKind::kFull, 0, num_layers - 1});
  policy.layer_kind_.assign(std::max(num_layers, 0), PolicyKind::kFull);
  policy.CacheDecodeLimits();
  return policy;
}

int KvPolicy::num_layers() const { return static_cast<int>(layer_kind_.size()); }

PolicyKind KvPolicy::kind(int layer) const {
  SIEVE_CHECK(layer >= 0 && layer < num_layers()) << "layer " << layer;
  return layer_kind_[layer];
}

bool KvPolicy::IsDense() const {
  const bool all_full = std::all_of(layer_kind_.begin(), layer_kind_.end(),
                                    [](PolicyKind kind) { return kind == PolicyKind::kFull; });
  return all_full && options_.decode_cap == 0;
}

const KvPolicyOptions& KvPolicy::options() const { return options_; }

std::vector<LayerPlan> KvPolicy::PlanPrompt(int n) const {
  const int num_pyramid =
      static_cast<int>(std::count(layer_kind_.begin(), layer_kind_.end(), PolicyKind::kPyramidKv));
  const std::vector<int> pyramid_budgets =
      num_pyramid > 0
          ? PyramidBudgets(options_.budget, options_.window, n, num_pyramid, options_.beta)
          : std::vector<int>();
  const bool pools = Pools(options_);
  std::vector<LayerPlan> plans(layer_kind_.size());
  int pyramid_index = 0;  // l': the layer's index among the pyramid layers only
  for (size_t layer = 0; layer < layer_kind_.size(); ++layer) {
    LayerPlan& plan = plans[layer];
    switch (layer_kind_[layer]) {
      case PolicyKind::kFull:
        plan.budget = n;
        break;
      case PolicyKind::kSnapKv:
      case PolicyKind::kPyramidKv:
        plan.budget = layer_kind_[layer] == PolicyKind::kSnapKv ? options_.budget
                                                                : pyramid_budgets[pyramid_index++];
        plan.window = options_.window;
        plan.score_rows = options_.window;
        plan.pool = pools ? options_.pool : PoolKind::kNone;
        plan.kernel = pools ? options_.kernel : 1;
        plan.reduce = options_.reduce;
        plan.mode = SelectMode::kTopScores;
        break;
      case PolicyKind::kStreamingLlm:
        plan.budget = options_.sinks + options_.recent;
        plan.window = options_.recent;
        plan.score_rows = 0;
        plan.mode = SelectMode::kFirstPositions;
        break;
      case PolicyKind::kH2o:
        // H2O ranks prompt positions by the attention of every prompt row, not just a window.
        plan.budget = options_.heavy + options_.recent;
        plan.window = options_.recent;
        plan.score_rows = n;
        plan.reduce = options_.reduce;
        plan.mode = SelectMode::kTopScores;
        break;
    }
    plan.compress = layer_kind_[layer] != PolicyKind::kFull && n > plan.budget;
    if (layer_kind_[layer] == PolicyKind::kH2o && !plan.compress && n > 0) {
      // H2O's accumulated scores start from every prompt row's attention even when nothing is
      // dropped: a job that keeps all n entries computes them (and keeps the cache order).
      plan.compress = true;
      plan.budget = n;
      plan.window = std::min(plan.window, n);
    }
  }
  return plans;
}

std::vector<int> KvPolicy::EntriesAfterPrompt(int n) const {
  std::vector<int> entries;
  entries.reserve(layer_kind_.size());
  for (const LayerPlan& plan : PlanPrompt(n)) entries.push_back(plan.compress ? plan.budget : n);
  return entries;
}

void KvPolicy::CacheDecodeLimits() {
  decode_limits_.clear();
  for (int layer = 0; layer < num_layers(); ++layer)
    decode_limits_.push_back(ComputeDecodeLimit(layer));
}

const DecodeLimit& KvPolicy::DecodeLimitFor(int layer) const {
  SIEVE_CHECK(layer >= 0 && layer < static_cast<int>(decode_limits_.size())) << "layer " << layer;
  return decode_limits_[layer];
}

DecodeLimit KvPolicy::ComputeDecodeLimit(int layer) const {
  DecodeLimit limit;
  switch (kind(layer)) {
    case PolicyKind::kStreamingLlm:
      // Evicting the oldest non-sink entry keeps the sinks and the most recent `recent`.
      limit.max_entries = options_.sinks + options_.recent;
      limit.evict = DecodeLimit::Evict::kOldest;
      limit.sinks = options_.sinks;
      return limit;
    case PolicyKind::kH2o:
      limit.max_entries = options_.heavy + options_.recent;
      limit.evict = DecodeLimit::Evict::kLowestScore;
      limit.protect_recent = options_.recent;
      return limit;
    case PolicyKind::kFull:
    case PolicyKind::kSnapKv:
    case PolicyKind::kPyramidKv:
      if (options_.decode_cap == 0) return limit;
      limit.max_entries = options_.decode_cap;
      limit.evict = options_.decode_cap_by_score ? DecodeLimit::Evict::kLowestScore
                                                 : DecodeLimit::Evict::kOldest;
      limit.protect_recent = kind(layer) == PolicyKind::kFull ? 0 : options_.window;
      return limit;
  }
  return limit;
}

int KvPolicy::FinalChunkRows(int n) const {
  int rows = 0;
  for (const LayerPlan& plan : PlanPrompt(n)) {
    if (plan.compress) rows = std::max(rows, plan.score_rows);
  }
  return rows;
}

bool KvPolicy::NeedsScorePool() const {
  for (PolicyKind kind : layer_kind_) {
    if (kind == PolicyKind::kH2o) return true;
    if (UsesDecodeCap(kind) && options_.decode_cap > 0 && options_.decode_cap_by_score) {
      return true;
    }
  }
  return false;
}

bool KvPolicy::NeedsPositionPool() const {
  for (int layer = 0; layer < num_layers(); ++layer) {
    if (DecodeLimitFor(layer).max_entries > 0) return true;
  }
  return false;
}

std::string KvPolicy::Spec() const {
  std::string spec;
  for (const Range& range : ranges_) {
    if (!spec.empty()) spec += ',';
    spec += PolicyKindName(range.kind);
    spec += ':';
    spec += RangeText(range.first, range.last);
  }
  return spec;
}

std::string KvPolicy::ToString() const {
  std::ostringstream out;
  std::vector<bool> present(std::size(kAllKinds), false);
  for (const Range& range : ranges_) present[static_cast<int>(range.kind)] = true;
  out << Spec();
  const auto has = [&](PolicyKind kind) { return present[static_cast<int>(kind)]; };
  std::vector<std::string> knobs;
  if (has(PolicyKind::kSnapKv) || has(PolicyKind::kPyramidKv)) {
    knobs.push_back("budget " + std::to_string(options_.budget));
    knobs.push_back("window " + std::to_string(options_.window));
    knobs.push_back(PoolText(options_));
  }
  if (has(PolicyKind::kSnapKv) || has(PolicyKind::kPyramidKv) || has(PolicyKind::kH2o)) {
    knobs.push_back(options_.reduce == GroupReduce::kMean ? "gqa mean" : "gqa max");
  }
  if (has(PolicyKind::kPyramidKv)) knobs.push_back("beta " + std::to_string(options_.beta));
  if (has(PolicyKind::kStreamingLlm)) knobs.push_back("sinks " + std::to_string(options_.sinks));
  if (has(PolicyKind::kH2o)) knobs.push_back("heavy " + std::to_string(options_.heavy));
  if (has(PolicyKind::kStreamingLlm) || has(PolicyKind::kH2o)) {
    knobs.push_back("recent " + std::to_string(options_.recent));
  }
  if (options_.decode_cap > 0) {
    knobs.push_back("decode cap " + std::to_string(options_.decode_cap) +
                    (options_.decode_cap_by_score ? " by score" : " by age"));
  }
  if (!knobs.empty()) {
    out << " (";
    for (size_t index = 0; index < knobs.size(); ++index) {
      out << (index > 0 ? ", " : "") << knobs[index];
    }
    out << ")";
  }
  return out.str();
}

// SPARSITY.md "Budgets per layer", transcribed with Python's floor division (every operand here
// is non-negative, so C++'s truncating division gives the same result).
//
// Where the official code differs (KVCache-Factory pyramidkv/pyramidkv_utils.py,
// PyramidKVCluster.update_kv): it computes steps = (max_num - min_num) // (num_hidden_layers - 1)
// and indexes layer_idx over *all* the model's layers, so a model whose first layers are full
// would still hand the pyramid's top budgets to layers that never compress. Sieve follows
// SPARSITY.md instead: L' and l' count only the pyramid layers, which equals the official code
// when every layer is pyramidal. With L' == 1 (where the official formula would divide by zero)
// steps is 0, so the single layer gets max_num + W.
std::vector<int> PyramidBudgets(int budget, int window, int n, int num_layers, int beta) {
  SIEVE_CHECK(num_layers >= 0 && beta >= 1 && window >= 0 && window < budget)
      << "budget " << budget << " window " << window << " layers " << num_layers << " beta "
      << beta;
  const int64_t prefix = budget - window;  // C - W
  if (n < budget || n < 2 * prefix) return std::vector<int>(num_layers, budget);
  int64_t min_num = prefix / beta;
  int64_t max_num = 2 * prefix - min_num;
  if (max_num >= int64_t{n} - window) {
    max_num = int64_t{n} - window;
    min_num = 2 * prefix - max_num;
  }
  const int64_t steps = num_layers > 1 ? (max_num - min_num) / (num_layers - 1) : 0;
  std::vector<int> budgets(num_layers);
  for (int layer = 0; layer < num_layers; ++layer) {
    budgets[layer] = static_cast<int>(max_num - layer * steps + window);
  }
  return budgets;
}

}  // namespace sieve
