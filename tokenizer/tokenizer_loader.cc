#include "tokenizer/tokenizer_loader.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/check.h"
#include "tokenizer/byte_level_bpe.h"
#include "tokenizer/hf_tokenizer_json.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/sentencepiece_bpe.h"
#include "tokenizer/sentencepiece_model.h"
#include "tokenizer/tiktoken_model.h"

namespace sieve {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

constexpr std::string_view kTokenizerJson = "tokenizer.json";
constexpr std::string_view kTokenizerModel = "tokenizer.model";
constexpr std::string_view kTokenizerConfig = "tokenizer_config.json";
constexpr std::string_view kEotText = "<|eot_id|>";

bool IsFile(const fs::path& path) {
  std::error_code error;
  return fs::is_regular_file(path, error);
}

Result<std::string> ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFoundError("cannot open '" + path.string() + "'");
  std::ostringstream contents;
  contents << in.rdbuf();
  if (in.bad()) return DataLossError("cannot read '" + path.string() + "'");
  return std::move(contents).str();
}

Result<std::unique_ptr<Tokenizer>> LoadJsonFile(const fs::path& path) {
  SIEVE_ASSIGN_OR_RETURN(const std::string contents, ReadFile(path));
  Result<std::unique_ptr<Tokenizer>> tokenizer = ParseHfTokenizerJson(contents);
  if (!tokenizer.ok()) return tokenizer.status().WithContext(path.string());
  return tokenizer;
}

Result<std::unique_ptr<Tokenizer>> ParseModelFile(std::string_view contents) {
  // A ModelProto opens with field 1 (a piece, length-delimited): tag byte 0x0a. A tiktoken file
  // opens with base64 text.
  if (!contents.empty() && contents.front() == '\x0a') {
    SIEVE_ASSIGN_OR_RETURN(const SentencePieceModel model, ParseSentencePieceModel(contents));
    SIEVE_ASSIGN_OR_RETURN(std::unique_ptr<SentencePieceBpe> tokenizer,
                           SentencePieceBpe::Create(model));
    return std::unique_ptr<Tokenizer>(std::move(tokenizer));
  }
  if (LooksLikeTiktokenModel(contents)) return ParseTiktokenModel(contents);
  return DataLossError(
      "tokenizer.model is neither a SentencePiece model (protobuf) nor a tiktoken file "
      "(base64 token and rank per line)");
}

Result<std::unique_ptr<Tokenizer>> LoadModelFile(const fs::path& path) {
  SIEVE_ASSIGN_OR_RETURN(const std::string contents, ReadFile(path));
  Result<std::unique_ptr<Tokenizer>> tokenizer = ParseModelFile(contents);
  if (!tokenizer.ok()) return tokenizer.status().WithContext(path.string());
  return tokenizer;
}

// bos_token / eos_token: a string, an AddedToken object with "content", or null.
std::optional<std::string> TokenText(const Json& node) {
  if (node.is_string()) return node.get<std::string>();
  if (node.is_object() && node.contains("content") && node["content"].is_string()) {
    return node["content"].get<std::string>();
  }
  return std::nullopt;
}

Result<int32_t> IdOfConfigToken(const Tokenizer& tokenizer, const std::string& key,
                                const std::string& text) {
  const std::optional<int32_t> id = tokenizer.TokenToId(text);
  if (!id) {
    return DataLossError(std::string(kTokenizerConfig) + " " + key + " '" + text +
                         "' is not a token of the tokenizer");
  }
  return *id;
}

Status ApplyConfig(const Json& config, Tokenizer& tokenizer) {
  if (!config.is_object()) return DataLossError("it is not a JSON object");
  if (config.contains("added_tokens_decoder") && config["added_tokens_decoder"].is_object()) {
    for (const auto& [id_text, entry] : config["added_tokens_decoder"].items()) {
      int32_t id = -1;
      try {
        id = std::stoi(id_text);
      } catch (const std::exception&) {
        return DataLossError("added_tokens_decoder key '" + id_text + "' is not an id");
      }
      SIEVE_RETURN_IF_ERROR(tokenizer.AddAddedToken(AddedToken{
          .content = entry.at("content").get<std::string>(),
          .id = id,
          .special = entry.value("special", false),
          .lstrip = entry.value("lstrip", false),
          .rstrip = entry.value("rstrip", false),
      }));
    }
  }
  std::optional<int32_t> bos = tokenizer.bos_id();
  bool add_bos = tokenizer.add_bos();
  if (config.contains("bos_token")) {
    const std::optional<std::string> text = TokenText(config["bos_token"]);
    if (text) {
      SIEVE_ASSIGN_OR_RETURN(bos, IdOfConfigToken(tokenizer, "bos_token", *text));
    } else {
      bos.reset();
    }
  }
  if (config.contains("add_bos_token") && config["add_bos_token"].is_boolean()) {
    add_bos = config["add_bos_token"].get<bool>();
  }
  tokenizer.SetBos(bos, add_bos);
  if (config.contains("eos_token")) {
    if (const std::optional<std::string> text = TokenText(config["eos_token"])) {
      SIEVE_ASSIGN_OR_RETURN(const int32_t eos, IdOfConfigToken(tokenizer, "eos_token", *text));
      tokenizer.SetEosIds({eos});
    }
  }
  if (config.contains("chat_template")) {
    const Json& node = config["chat_template"];
    if (node.is_string()) {
      tokenizer.SetChatTemplate(ChatTemplate::FromJinja(node.get<std::string>()));
    } else if (node.is_array()) {
      // Named templates: the "default" one is the chat format.
      bool found = false;
      for (const Json& entry : node) {
        if (entry.value("name", std::string()) == "default") {
          tokenizer.SetChatTemplate(
              ChatTemplate::FromJinja(entry.at("template").get<std::string>()));
          found = true;
        }
      }
      if (!found) {
        tokenizer.SetChatTemplate(NotFoundError("chat_template lists no template named 'default'"));
      }
    }
  }
  return Status::Ok();
}

Status LoadConfig(const fs::path& path, Tokenizer& tokenizer) {
  SIEVE_ASSIGN_OR_RETURN(const std::string contents, ReadFile(path));
  return ApplyTokenizerConfig(contents, tokenizer).WithContext(path.string());
}

// Llama 3 chat turns end in <|eot_id|>, so a chat model stops there as well as at its EOS.
void AddChatEos(Tokenizer& tokenizer) {
  const ChatTemplate* chat_template = tokenizer.chat_template();
  if (chat_template == nullptr || chat_template->kind() != ChatTemplate::Kind::kLlama3) return;
  if (const std::optional<int32_t> eot = tokenizer.TokenToId(kEotText)) tokenizer.AddEosId(*eot);
}

}  // namespace

Status ApplyTokenizerConfig(std::string_view json_text, Tokenizer& tokenizer) {
  try {
    return ApplyConfig(Json::parse(json_text), tokenizer);
  } catch (const Json::exception& error) {
    return DataLossError(std::string("malformed: ") + error.what());
  }
}

Result<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& path_text) {
  const fs::path path(path_text);
  std::error_code error;
  const bool is_directory = fs::is_directory(path, error);
  if (!is_directory && !IsFile(path)) {
    return NotFoundError("tokenizer path '" + path_text + "' does not exist");
  }
  std::unique_ptr<Tokenizer> tokenizer;
  fs::path directory;
  if (is_directory) {
    directory = path;
    const fs::path json_path = path / kTokenizerJson;
    const fs::path model_path = path / kTokenizerModel;
    if (IsFile(json_path)) {
      Result<std::unique_ptr<Tokenizer>> loaded = LoadJsonFile(json_path);
      // A tokenizer.json of a kind Sieve does not read often sits beside the tokenizer.model it
      // was converted from (Llama 2, Mistral).
      if (!loaded.ok() && loaded.status().code() == StatusCode::kUnimplemented &&
          IsFile(model_path)) {
        loaded = LoadModelFile(model_path);
      }
      if (!loaded.ok()) return loaded.status();
      tokenizer = std::move(loaded).value();
    } else if (IsFile(model_path)) {
      SIEVE_ASSIGN_OR_RETURN(tokenizer, LoadModelFile(model_path));
    } else {
      return NotFoundError("no tokenizer in directory '" + path_text + "': looked for " +
                           std::string(kTokenizerJson) + " and " + std::string(kTokenizerModel));
    }
  } else {
    directory = path.parent_path();
    if (path.filename() == kTokenizerConfig) {
      return InvalidArgumentError("'" + path_text +
                                  "' is a tokenizer config, not a tokenizer: pass the model "
                                  "directory, a tokenizer.json or a tokenizer.model");
    }
    if (path.extension() == ".json") {
      SIEVE_ASSIGN_OR_RETURN(tokenizer, LoadJsonFile(path));
    } else {
      SIEVE_ASSIGN_OR_RETURN(tokenizer, LoadModelFile(path));
    }
  }
  const fs::path config_path = (directory.empty() ? fs::path(".") : directory) / kTokenizerConfig;
  if (IsFile(config_path)) SIEVE_RETURN_IF_ERROR(LoadConfig(config_path, *tokenizer));
  AddChatEos(*tokenizer);
  return tokenizer;
}

std::unique_ptr<Tokenizer> MakeEmbeddedByteTokenizer() {
  ByteLevelBpe::Vocabulary vocabulary;
  vocabulary.merge_rule = ByteLevelBpe::MergeRule::kTokenRank;
  for (int byte = 0; byte < 256; ++byte) vocabulary.tokens.emplace_back(1, static_cast<char>(byte));
  PreTokenizer pre_tokenizer;
  SIEVE_CHECK(
      pre_tokenizer.AddSplit(kLlama3SplitPattern, false, SplitBehavior::kIsolated, false).ok());
  Result<std::unique_ptr<ByteLevelBpe>> created =
      ByteLevelBpe::Create(std::move(vocabulary), std::move(pre_tokenizer), "bpe");
  SIEVE_CHECK(created.ok()) << created.status().ToString();
  std::unique_ptr<Tokenizer> tokenizer = std::move(created).value();
  const char* const kSpecials[] = {"<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                                   "<|end_header_id|>", "<|eot_id|>"};
  for (int32_t index = 0; index < 5; ++index) {
    SIEVE_CHECK(
        tokenizer->AddAddedToken(AddedToken{.content = kSpecials[index], .id = 256 + index}).ok());
  }
  tokenizer->SetBos(256, /*add_bos=*/true);
  tokenizer->SetEosIds({257});
  tokenizer->SetChatTemplate(ChatTemplate(ChatTemplate::Kind::kLlama3));
  AddChatEos(*tokenizer);
  return tokenizer;
}

}  // namespace sieve
