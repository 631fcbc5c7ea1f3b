// A generation's result as JSON: what `shardlab generate --json` prints and
// what the Python bindings return. Its own header, so that nlohmann's full
// header stays out of generate.h.
//
// Thread safety: a pure function of its arguments.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include "model/infer/generate.h"

namespace shardlab::infer {

// {"parallel": {tp, pp, ep}, "phantom", "sampling": {temperature, top_k,
// seed}, "prompt", "tokens", "ttft_s", "tpot_s", "decode_step_s",
// "sampler_rank", "devices": [{rank, name (TP(2)-...), kv_cache_bytes,
// kv_tokens, peak_bytes, peak_bytes_by_kind}]}. The model's shape
// (model_json), the profile and the --init path are the caller's to add.
nlohmann::json generate_json(const GenerateOptions& options, const GenerateResult& result);

}  // namespace shardlab::infer
