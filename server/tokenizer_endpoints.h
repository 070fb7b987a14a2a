// The tokenizer endpoints vLLM's server has, with its request and response shapes, so that clients
// made for vLLM (lm-evaluation-harness's remote tokenizer) use the served model's tokenizer:
//
//   POST /tokenize        {"prompt": "...", "add_special_tokens": true, "return_token_strs": false}
//                         or {"messages": [...], "add_generation_prompt": true}
//                      -> {"count": N, "max_model_len": M, "tokens": [...], "token_strs": null}
//   POST /detokenize      {"tokens": [...]}  ->  {"prompt": "..."}
//   GET  /tokenizer_info  -> the tokenizer's configuration (tokenizer_class, bos_token, eos_token,
//                            ..., as vLLM's gives tokenizer_config.json's fields)
//
// Each builds its response body from the request body alone (no engine), so the HTTP session
// answers them on its I/O thread. Bad input is InvalidArgument naming the field in `*param`.
#pragma once

#include <string>

#include <nlohmann/json_fwd.hpp>

#include "core/status.h"
#include "server/completion_request.h"

namespace sieve {

// `limits.tokenizer` null: every endpoint is an error (a model served as token ids only).
Result<nlohmann::json> TokenizeResponse(const nlohmann::json& body, const RequestLimits& limits,
                                        std::string* param);
Result<nlohmann::json> DetokenizeResponse(const nlohmann::json& body, const RequestLimits& limits,
                                          std::string* param);
Result<nlohmann::json> TokenizerInfoResponse(const RequestLimits& limits);

}  // namespace sieve
