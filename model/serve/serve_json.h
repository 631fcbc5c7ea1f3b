// A serving run's results as JSON, the pieces of `shardlab serve --json` and
// --report (the Python bindings return the same): beside summary_json
// (metrics.h). Its own header, so that nlohmann's full header stays out of
// the serving headers.
//
// Thread safety: pure functions of their arguments.
#pragma once

#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "model/serve/cluster_step.h"
#include "model/serve/serving.h"
#include "model/serve/workload.h"

namespace shardlab::serve {

// One entry per device of a replica: rank, capacity_bytes, weight_bytes,
// activation_bytes, kv_bytes_per_token.
nlohmann::json plan_json(const ReplicaPlan& plan);

// Every request, in id order: id, replica, arrival_s, first_token_s,
// finish_s, prompt_len, output_len, preemptions; disaggregated, its
// hand-off (the replicas, the bytes, when ready, sent and arrived, the time
// on the links); with `prompts` (a run on values: the requests by id) also
// prompt_tokens and the generated tokens.
nlohmann::json requests_json(const ServeResult& result, const std::vector<Request>* prompts);

// Every step of every replica: replica, t, step_s, used_blocks, running,
// waiting, batch_tokens.
nlohmann::json usage_json(const ServeResult& result);

}  // namespace shardlab::serve
