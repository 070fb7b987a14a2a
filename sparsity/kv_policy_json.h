// KvPolicyOptions as JSON: how a server describes its policy's knobs (GET /server_info) and how
// `sieve bench` reads them back for its bound. Keys are the --kv-* flags' names without "--kv-",
// with '-' as '_' (budget, window, pool, kernel, group_reduce, pyramid_beta, sinks, recent, heavy,
// decode_cap, decode_cap_by); enumerations are the flags' words.
#pragma once

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "sparsity/kv_policy.h"

namespace sieve {

nlohmann::json KvPolicyOptionsToJson(const KvPolicyOptions& options);

// Every key is optional (absent: the default); one of the wrong type or value, or an unknown
// key, is an error that names it. Values are not checked against each other: KvPolicy::Parse
// does that for the policies in use.
Result<KvPolicyOptions> KvPolicyOptionsFromJson(const nlohmann::json& json);

}  // namespace sieve
