// What a serving run reports, from the replicas' request records: latency
// percentiles (TTFT, TPOT, end to end), throughput and the KV cache's use.
//
//   TTFT  first token - arrival (queueing and the prefill)
//   TPOT  (finish - first token) / (output - 1): the mean time per output
//         token after the first, per request (requests of one output token
//         have none, as in vLLM's benchmark)
//   E2E   finish - arrival
// Percentiles interpolate linearly between order statistics (numpy's
// default): p of n sorted values is at rank p/100 · (n - 1).
#pragma once

#include <cstdint>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "model/serve/scheduler.h"

namespace shardlab::serve {

struct Percentiles {
  double mean = 0, p50 = 0, p90 = 0, p99 = 0, max = 0;
};
Percentiles percentiles(std::vector<double> values);  // all 0 for none

struct ServeSummary : RunCounts {
  int64_t requests = 0;
  Percentiles ttft_s, tpot_s, e2e_s;
  double makespan_s = 0;           // first arrival to last finish
  double requests_per_s = 0;
  double output_tokens_per_s = 0;
  double total_tokens_per_s = 0;   // prompt and output
  int64_t kv_capacity_tokens = 0;  // per replica
  double kv_peak_use = 0;          // peak used blocks / blocks, over replicas
  double kv_mean_use = 0;          // mean over busy time, weighted by step time
  // The counts (RunCounts) over every replica; of the prefix cache's
  // lookups the hit rate, of the drafts the acceptance (0 without any).
  double prefix_hit_rate = 0;
  double draft_acceptance = 0;
};

ServeSummary summarize(const std::vector<ReplicaResult>& replicas, int64_t kv_blocks, int kv_block);
nlohmann::json summary_json(const ServeSummary& s);
nlohmann::json percentiles_json(const Percentiles& p);

}  // namespace shardlab::serve
