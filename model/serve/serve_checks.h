// The checks of a serving run that need no thread, as training's preflight
// (model/train/preflight.h): the requests against the replica's model and,
// for a run on the model's values, the host memory it holds. Each throws
// ConfigError with one line; the line names option fields in backquotes
// (`block_size`, `max_seqs`), which the command-line tool shows as its flags.
//
// Thread safety: pure functions of their arguments.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/serve/cluster_step.h"
#include "model/serve/workload.h"

namespace shardlab::serve {

// Where the requests came from, for the messages.
struct RequestSource {
  std::string workload;  // the trace file (load_trace); empty: drawn (make_workload)
  // Drawn with both prompt_len and output_len at this default, not given: a
  // hint in the context error. 0: the lengths were given.
  int default_len = 0;
};

// Every prompt token inside the vocabulary [0, token_vocab) and every
// request's prompt + output - 1 tokens inside the model's context
// (block_size): the last generated token is never fed back.
void check_requests(const model::GPTConfig& model, const std::vector<Request>& requests,
                    const RequestSource& source);

// A run on values keeps every device's fp32 weights on the host and, for each
// running sequence (at most max_seqs of the `requests`), K and V of a whole
// context on each of the ep replicas of the batch: refused when that passes
// 80% of `host_memory` (host_memory_bytes(), runtime/host_memory.h). With
// speculative decoding the draft model's weights and contexts count too, and
// a disaggregated run keeps the K and V of `handed_tokens` prompt tokens on
// their way from the prefill replicas to the decode ones; `replicas` run at
// once (routed side by side, serving.h) hold all that each.
void check_host_memory(const ReplicaShape& shape, size_t requests, int max_seqs, uint64_t host_memory,
                       int64_t handed_tokens = 0, int replicas = 1);

}  // namespace shardlab::serve
