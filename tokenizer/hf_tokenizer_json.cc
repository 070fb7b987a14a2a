#include "tokenizer/hf_tokenizer_json.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <unordered_map>

#include "tokenizer/byte_level_bpe.h"
#include "tokenizer/flat_hash_map.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/tiktoken_model.h"

namespace sieve {
namespace {

using Json = nlohmann::json;

constexpr int32_t kMaxVocabularyId = 1 << 24;
constexpr int32_t kLlama3NumRanks = 128000;

// Reads tokenizer.json in one pass, streaming the two big members (model.vocab: ~100k entries,
// model.merges: ~300k) into flat vectors and building an ordinary DOM for everything else. A full
// DOM of the Llama 3 file takes ~0.8 s to build and free; this reader takes ~0.1 s.
class TokenizerJsonReader : public nlohmann::json_sax<Json> {
 public:
  Json root;
  bool has_vocab = false;
  std::vector<std::pair<std::string, int64_t>> vocab;  // [num_pieces] (piece, id)
  // [num_merges] an "a b" string (in .first) or an [a, b] array (in .first, .second); see
  // merge_is_pair().
  std::vector<std::pair<std::string, std::string>> merges;
  std::string error;

  bool null() override { return Value(nullptr); }
  bool boolean(bool value) override { return Value(value); }
  bool number_integer(number_integer_t value) override {
    if (mode_ == Mode::kVocab) return VocabId(value);
    return Value(value);
  }
  bool number_unsigned(number_unsigned_t value) override {
    if (mode_ == Mode::kVocab) {
      return VocabId(value > static_cast<number_unsigned_t>(kMaxVocabularyId)
                         ? -1
                         : static_cast<int64_t>(value));
    }
    return Value(value);
  }
  bool number_float(number_float_t value, const string_t& /*text*/) override {
    if (mode_ == Mode::kVocab) return Fail("model.vocab has a non-integer id");
    return Value(value);
  }
  bool string(string_t& value) override {
    if (mode_ == Mode::kMerges) {
      merges.emplace_back(std::move(value), std::string());
      merge_is_pair_.push_back(false);
      return true;
    }
    if (mode_ == Mode::kMergePair) {
      if (pair_size_ == 0) {
        merges.back().first = std::move(value);
      } else if (pair_size_ == 1) {
        merges.back().second = std::move(value);
      }
      ++pair_size_;
      return true;
    }
    if (mode_ == Mode::kVocab) return Fail("model.vocab has a non-integer id");
    return Value(std::move(value));
  }
  bool binary(binary_t& /*value*/) override { return Fail("unexpected binary value"); }
  bool start_object(std::size_t /*size*/) override {
    if (mode_ != Mode::kDom) return Fail("model.vocab or model.merges has an unexpected object");
    if (pending_ == Pending::kVocab) {
      pending_ = Pending::kNone;
      mode_ = Mode::kVocab;
      has_vocab = true;
      return true;
    }
    pending_ = Pending::kNone;
    return Open(Json::object());
  }
  bool key(string_t& value) override {
    if (mode_ == Mode::kVocab) {
      vocab.emplace_back(std::move(value), -1);
      return true;
    }
    pending_ = Pending::kNone;
    if (stack_.size() == 2 && path_.size() == 2 && path_[1] == "model") {
      if (value == "vocab") pending_ = Pending::kVocab;
      if (value == "merges") pending_ = Pending::kMerges;
    }
    key_ = std::move(value);
    return true;
  }
  bool end_object() override {
    if (mode_ == Mode::kVocab) {
      mode_ = Mode::kDom;
      return true;
    }
    return Close();
  }
  bool start_array(std::size_t /*size*/) override {
    if (mode_ == Mode::kMerges) {
      mode_ = Mode::kMergePair;
      pair_size_ = 0;
      merges.emplace_back();
      merge_is_pair_.push_back(true);
      return true;
    }
    if (mode_ != Mode::kDom) return Fail("model.vocab or model.merges is malformed");
    if (pending_ == Pending::kMerges) {
      pending_ = Pending::kNone;
      mode_ = Mode::kMerges;
      return true;
    }
    pending_ = Pending::kNone;
    return Open(Json::array());
  }
  bool end_array() override {
    if (mode_ == Mode::kMergePair) {
      if (pair_size_ != 2) return Fail("a model.merges entry is not a pair of tokens");
      mode_ = Mode::kMerges;
      return true;
    }
    if (mode_ == Mode::kMerges) {
      mode_ = Mode::kDom;
      return true;
    }
    return Close();
  }
  bool parse_error(std::size_t /*position*/, const std::string& /*last_token*/,
                   const nlohmann::detail::exception& exception) override {
    return Fail(exception.what());
  }

  // Whether merge `index` came as an [a, b] array rather than an "a b" string.
  bool merge_is_pair(size_t index) const { return merge_is_pair_[index]; }

 private:
  enum class Mode { kDom, kVocab, kMerges, kMergePair };
  enum class Pending { kNone, kVocab, kMerges };

  bool Fail(std::string message) {
    if (error.empty()) error = std::move(message);
    return false;
  }
  bool VocabId(int64_t id) {
    if (vocab.empty() || vocab.back().second != -1) return Fail("model.vocab is malformed");
    if (id < 0 || id >= kMaxVocabularyId) {
      return Fail("model.vocab token '" + vocab.back().first + "' has id " + std::to_string(id));
    }
    vocab.back().second = id;
    return true;
  }
  // Places a scalar in the current container.
  bool Value(Json value) {
    if (mode_ != Mode::kDom) return Fail("model.vocab or model.merges has an unexpected value");
    pending_ = Pending::kNone;
    Insert(std::move(value));
    return true;
  }
  bool Open(Json container) {
    std::string key = stack_.empty() || stack_.back()->is_array() ? std::string() : key_;
    stack_.push_back(Insert(std::move(container)));
    path_.push_back(std::move(key));
    return true;
  }
  bool Close() {
    if (stack_.empty()) return Fail("unbalanced JSON");
    stack_.pop_back();
    path_.pop_back();
    return true;
  }
  // Pointers stay valid: a container only grows while it is the innermost open one.
  Json* Insert(Json value) {
    if (stack_.empty()) {
      root = std::move(value);
      return &root;
    }
    Json& parent = *stack_.back();
    if (parent.is_array()) {
      parent.push_back(std::move(value));
      return &parent.back();
    }
    Json& slot = parent[key_];
    slot = std::move(value);
    return &slot;
  }

  Mode mode_ = Mode::kDom;
  Pending pending_ = Pending::kNone;
  std::vector<Json*> stack_;       // open containers, outermost first
  std::vector<std::string> path_;  // the key each open container sits under ("" in arrays)
  std::string key_;
  int pair_size_ = 0;
  std::vector<bool> merge_is_pair_;
};

std::string TypeOf(const Json& node) {
  if (node.is_object() && node.contains("type") && node["type"].is_string()) {
    return node["type"].get<std::string>();
  }
  return "(no type)";
}

bool IsNullOrAbsent(const Json& parent, const char* key) {
  return !parent.contains(key) || parent[key].is_null();
}

// A token id as the file writes it: an integer that fits int32 (nlohmann's get<int32_t> would
// convert a float such as 1e300 with undefined behaviour).
Result<int32_t> TokenId(const Json& value, std::string_view where) {
  if (value.is_number_integer()) {
    const bool fits = value.is_number_unsigned()
                          ? value.get<uint64_t>() <= uint64_t{INT32_MAX}
                          : value.get<int64_t>() >= INT32_MIN && value.get<int64_t>() <= INT32_MAX;
    if (fits) return static_cast<int32_t>(value.get<int64_t>());
  }
  return DataLossError("tokenizer.json " + std::string(where) + " id " +
                       value.dump(-1, ' ', false, Json::error_handler_t::replace) +
                       " is not a 32-bit integer");
}

// Walks a pre_tokenizer node into `pre_tokenizer`; `byte_level` records that a ByteLevel step was
// seen, which is what makes the vocabulary byte-level.
Status AddPreTokenizer(const Json& node, PreTokenizer& pre_tokenizer, bool& byte_level) {
  const std::string type = TypeOf(node);
  if (type == "Sequence") {
    for (const Json& child : node.at("pretokenizers")) {
      SIEVE_RETURN_IF_ERROR(AddPreTokenizer(child, pre_tokenizer, byte_level));
    }
    return Status::Ok();
  }
  if (type == "ByteLevel") {
    byte_level = true;
    return pre_tokenizer.AddByteLevel(node.value("add_prefix_space", true),
                                      node.value("use_regex", true));
  }
  if (type == "Split") {
    const Json& pattern = node.at("pattern");
    bool literal = false;
    std::string text;
    if (pattern.contains("Regex")) {
      text = pattern["Regex"].get<std::string>();
    } else if (pattern.contains("String")) {
      text = pattern["String"].get<std::string>();
      literal = true;
    } else {
      return DataLossError("tokenizer.json Split pre-tokenizer has no Regex or String pattern");
    }
    SIEVE_ASSIGN_OR_RETURN(const SplitBehavior behavior,
                           ParseSplitBehavior(node.value("behavior", std::string("Isolated"))));
    return pre_tokenizer.AddSplit(text, literal, behavior, node.value("invert", false));
  }
  return UnimplementedError("tokenizer.json pre_tokenizer type '" + type +
                            "' is not supported (Sieve reads byte-level BPE: ByteLevel, Split, "
                            "Sequence)");
}

Status CheckDecoder(const Json& node) {
  const std::string type = TypeOf(node);
  if (type == "ByteLevel") return Status::Ok();
  if (type == "Sequence") {
    for (const Json& child : node.at("decoders")) SIEVE_RETURN_IF_ERROR(CheckDecoder(child));
    return Status::Ok();
  }
  return UnimplementedError("tokenizer.json decoder type '" + type +
                            "' is not supported (byte-level BPE decodes with ByteLevel)");
}

// The BOS that TemplateProcessing puts in front of a single sequence, if any. Special tokens it
// names are registered, since some files list them only here.
Result<std::optional<int32_t>> ReadPostProcessor(const Json& node, Tokenizer& tokenizer) {
  const std::string type = TypeOf(node);
  if (type == "ByteLevel") return std::optional<int32_t>();
  if (type == "Sequence") {
    std::optional<int32_t> bos;
    for (const Json& child : node.at("processors")) {
      SIEVE_ASSIGN_OR_RETURN(std::optional<int32_t> child_bos, ReadPostProcessor(child, tokenizer));
      if (child_bos) bos = child_bos;
    }
    return bos;
  }
  if (type != "TemplateProcessing") {
    return UnimplementedError("tokenizer.json post_processor type '" + type +
                              "' is not supported (TemplateProcessing, ByteLevel, Sequence are)");
  }
  std::unordered_map<std::string, int32_t> special_ids;
  if (node.contains("special_tokens")) {
    for (const auto& [name, entry] : node["special_tokens"].items()) {
      const Json& ids = entry.at("ids");
      const Json& tokens = entry.at("tokens");
      if (ids.size() != 1 || tokens.size() != 1) {
        return UnimplementedError("tokenizer.json TemplateProcessing special token '" + name +
                                  "' stands for several tokens");
      }
      SIEVE_ASSIGN_OR_RETURN(const int32_t id,
                             TokenId(ids[0], "TemplateProcessing special token '" + name + "'"));
      special_ids[name] = id;
      const std::string content = tokens[0].get<std::string>();
      SIEVE_RETURN_IF_ERROR(tokenizer.AddAddedToken(AddedToken{.content = content, .id = id}));
      // added_tokens, read first, win a clash (AddAddedToken keeps the first), so the id given
      // here may name no token or another one: Encode would then prepend a stranger as BOS.
      const std::optional<int32_t> registered = tokenizer.TokenToId(content);
      if (registered != id) {
        return DataLossError("tokenizer.json TemplateProcessing special token '" + name +
                             "' has id " + std::to_string(id) + ", but the tokenizer has '" +
                             content + "' as " +
                             (registered ? "id " + std::to_string(*registered) : "no token"));
      }
    }
  }
  std::optional<int32_t> bos;
  bool seen_sequence = false;
  for (const Json& item : node.at("single")) {
    if (item.contains("Sequence")) {
      seen_sequence = true;
      continue;
    }
    if (!item.contains("SpecialToken")) {
      return DataLossError(
          "tokenizer.json TemplateProcessing has an item that is neither "
          "SpecialToken nor Sequence");
    }
    const std::string name = item["SpecialToken"].at("id").get<std::string>();
    const auto it = special_ids.find(name);
    if (it == special_ids.end()) {
      return DataLossError("tokenizer.json TemplateProcessing uses undeclared special token '" +
                           name + "'");
    }
    if (seen_sequence || bos) {
      return UnimplementedError("tokenizer.json TemplateProcessing adds '" + name +
                                "' beyond a single leading BOS; not supported");
    }
    bos = it->second;
  }
  return bos;
}

Result<std::unique_ptr<Tokenizer>> Parse(const TokenizerJsonReader& reader) {
  const Json& root = reader.root;
  if (!root.is_object() || !root.contains("model")) {
    return DataLossError("tokenizer.json has no 'model' object");
  }
  const Json& model = root["model"];
  const std::string model_type =
      model.contains("type") ? model["type"].get<std::string>() : std::string("BPE");
  if (model_type != "BPE") {
    return UnimplementedError("tokenizer.json model type '" + model_type +
                              "' is not supported (Sieve reads byte-level BPE)");
  }
  if (!IsNullOrAbsent(root, "normalizer")) {
    return UnimplementedError("tokenizer.json normalizer '" + TypeOf(root["normalizer"]) +
                              "' is not supported (byte-level BPE files have none)");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (!IsNullOrAbsent(model, key) && !model[key].get<std::string>().empty()) {
      return UnimplementedError(std::string("tokenizer.json BPE with ") + key +
                                " is not supported");
    }
  }

  PreTokenizer pre_tokenizer;
  bool byte_level = false;
  if (!IsNullOrAbsent(root, "pre_tokenizer")) {
    SIEVE_RETURN_IF_ERROR(AddPreTokenizer(root["pre_tokenizer"], pre_tokenizer, byte_level));
  }
  if (!byte_level) {
    return UnimplementedError(
        "tokenizer.json BPE without a ByteLevel pre-tokenizer (e.g. a SentencePiece-style "
        "Metaspace/byte_fallback vocabulary) is not supported; use its tokenizer.model");
  }
  if (!IsNullOrAbsent(root, "decoder")) SIEVE_RETURN_IF_ERROR(CheckDecoder(root["decoder"]));

  // Vocabulary: byte-level strings -> raw bytes, indexed by id.
  ByteLevelBpe::Vocabulary vocabulary;
  vocabulary.merge_rule = ByteLevelBpe::MergeRule::kMergeList;
  vocabulary.ignore_merges = model.value("ignore_merges", false);
  if (!reader.has_vocab) return DataLossError("tokenizer.json model.vocab is not an object");
  FlatHashMap<std::string_view, int32_t> id_of_piece;
  id_of_piece.Reserve(reader.vocab.size());
  for (const auto& [piece, id] : reader.vocab) {
    if (static_cast<size_t>(id) >= vocabulary.tokens.size()) {
      vocabulary.tokens.resize(static_cast<size_t>(id) + 1);
    }
    // A piece outside the byte alphabet can only be literal text (an added token's content).
    std::optional<std::string> bytes = UnicodeToBytes(piece);
    vocabulary.tokens[static_cast<size_t>(id)] = bytes ? std::move(*bytes) : piece;
    id_of_piece.Insert(piece, static_cast<int32_t>(id));
  }
  const auto lookup = [&](std::string_view piece, size_t rank) -> Result<int32_t> {
    const int32_t* id = id_of_piece.Find(piece);
    if (id == nullptr) {
      return DataLossError("tokenizer.json merge " + std::to_string(rank) + " uses '" +
                           std::string(piece) + "', which is not in the vocabulary");
    }
    return *id;
  };
  vocabulary.merges.reserve(reader.merges.size());
  for (size_t rank = 0; rank < reader.merges.size(); ++rank) {
    std::string_view left = reader.merges[rank].first;
    std::string_view right = reader.merges[rank].second;
    if (!reader.merge_is_pair(rank)) {
      // "a b": byte-level pieces never hold a raw space, so there is exactly one.
      const std::string_view text = left;
      const size_t space = text.find(' ');
      if (space == std::string_view::npos || text.find(' ', space + 1) != std::string_view::npos) {
        return DataLossError("tokenizer.json merge " + std::to_string(rank) + " '" +
                             std::string(text) + "' is not two tokens separated by a space");
      }
      left = text.substr(0, space);
      right = text.substr(space + 1);
    }
    SIEVE_ASSIGN_OR_RETURN(const int32_t left_id, lookup(left, rank));
    SIEVE_ASSIGN_OR_RETURN(const int32_t right_id, lookup(right, rank));
    vocabulary.merges.emplace_back(left_id, right_id);
  }
  if (!IsNullOrAbsent(model, "unk_token")) {
    const std::string unk = model["unk_token"].get<std::string>();
    if (const int32_t* id = id_of_piece.Find(unk)) vocabulary.unk_id = *id;
  }
  const auto num_model_tokens = static_cast<int32_t>(vocabulary.tokens.size());

  SIEVE_ASSIGN_OR_RETURN(
      std::unique_ptr<ByteLevelBpe> tokenizer,
      ByteLevelBpe::Create(std::move(vocabulary), std::move(pre_tokenizer), "bpe"));

  if (root.contains("added_tokens") && root["added_tokens"].is_array()) {
    for (const Json& entry : root["added_tokens"]) {
      SIEVE_ASSIGN_OR_RETURN(const int32_t id, TokenId(entry.at("id"), "added token"));
      SIEVE_RETURN_IF_ERROR(tokenizer->AddAddedToken(AddedToken{
          .content = entry.at("content").get<std::string>(),
          .id = id,
          .special = entry.value("special", false),
          .lstrip = entry.value("lstrip", false),
          .rstrip = entry.value("rstrip", false),
      }));
    }
  }
  const bool had_added_tokens = !tokenizer->added_tokens().empty();
  std::optional<int32_t> bos;
  if (!IsNullOrAbsent(root, "post_processor")) {
    SIEVE_ASSIGN_OR_RETURN(bos, ReadPostProcessor(root["post_processor"], *tokenizer));
  }
  tokenizer->SetBos(bos, bos.has_value());

  // Meta's Llama 3 vocabulary converted without its specials: complete it as tiktoken would.
  if (!had_added_tokens && num_model_tokens == kLlama3NumRanks && bos == kLlama3NumRanks &&
      tokenizer->TokenToId("<|begin_of_text|>") == kLlama3NumRanks) {
    const std::vector<std::string> specials = MetaLlama3SpecialTokens();
    for (size_t index = 0; index < specials.size(); ++index) {
      SIEVE_RETURN_IF_ERROR(tokenizer->AddAddedToken(AddedToken{
          .content = specials[index], .id = kLlama3NumRanks + static_cast<int32_t>(index)}));
    }
    tokenizer->SetEosIds({kLlama3NumRanks + 1});
  }
  return std::unique_ptr<Tokenizer>(std::move(tokenizer));
}

}  // namespace

Result<std::unique_ptr<Tokenizer>> ParseHfTokenizerJson(std::string_view json_text) {
  try {
    TokenizerJsonReader reader;
    if (!Json::sax_parse(json_text, &reader)) {
      return DataLossError("tokenizer.json is malformed: " +
                           (reader.error.empty() ? std::string("parse error") : reader.error));
    }
    return Parse(reader);
  } catch (const Json::exception& error) {
    return DataLossError(std::string("tokenizer.json is malformed: ") + error.what());
  }
}

}  // namespace sieve
