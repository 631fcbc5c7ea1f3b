// A serving run over R identical replicas (each a TP x PP group of devices
// holding the whole model), and the KV cache a replica can hold.
//
// Routing (--router): a request goes to a replica when it arrives.
//   round-robin   request i to replica i mod R (then each replica runs its
//                 own scheduler, scheduler.h, independently)
//   least-loaded  the replica with the fewest unfinished requests (ties: the
//                 lowest), as vLLM's production-stack and SGLang's routers
//                 count them: the replicas run side by side in virtual time
//                 (the one whose next step starts first steps), and a
//                 replica's count is as of its last step's end
//   prefix        the replica whose prefix cache holds the longest leading
//                 run of the request's prompt (prefix caching; SGLang's
//                 cache-aware routing), ties and no hit: least-loaded
//
// Disaggregated serving (Splitwise, DistServe): P prefill replicas run each
// request's prefill alone (it produces the first token), then hand its
// prompt's K and V over the network (kv_transfer.h) to one of D decode
// replicas, routed when the prefill ends (the prefix policy routes decodes
// least-loaded); the decode replica admits it when its K and V have arrived
// and decodes the rest. TTFT runs to the arrival (the first token leaves
// with the K and V, as in vLLM's disaggregated proxy); a request of one
// output token ends with its prefill. The prefill replica's blocks are
// freed when the transfer is sent (it waits for no acknowledgement), and a
// decode replica's queue holds what arrived until blocks are free.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "model/serve/kv_transfer.h"
#include "model/serve/metrics.h"
#include "model/serve/scheduler.h"

namespace shardlab::serve {

enum class Routing { kRoundRobin, kLeastLoaded, kPrefix };
Routing parse_routing(const std::string& text);  // --router
const char* routing_name(Routing r);

// --disaggregate prefill=N,decode=M (N, M >= 1); ConfigError naming it.
struct Disaggregation {
  int prefill = 0, decode = 0;  // 0: colocated
  bool on() const { return prefill > 0; }
};
Disaggregation parse_disaggregate(const std::string& text);

struct ServeOptions {
  int replicas = 1;  // colocated; disaggregated: prefill + decode
  SchedulerOptions scheduler;
  Routing router = Routing::kRoundRobin;  // --router
  Disaggregation disaggregate;
};

// Disaggregated: each phase's figures.
struct PhaseSummary {
  Percentiles prefill_ttft_s;  // arrival to the prefill's end
  Percentiles transfer_s;      // on the links
  Percentiles handoff_wait_s;  // prefill's end to the transfer's start (busy ports)
  uint64_t kv_bytes = 0;       // moved, over every request
  int64_t transfers = 0;
};

struct ServeResult {
  std::vector<ReplicaResult> replicas;  // disaggregated: the prefill replicas, then the decode ones
  std::vector<RequestRecord> requests;  // every request's, in id order (disaggregated: both phases')
  std::vector<Handoff> handoffs;        // disaggregated: by request id (none for one output token)
  ServeSummary summary;
  PhaseSummary phases;
};

// `executors`: one per replica (needed by routers other than round-robin
// when a step executor keeps a replica's state, as ClusterStepExecutor
// does), or one that times every replica's steps. `transfer`: the KV
// cache's links, when disaggregated. ConfigError for a combination that
// means nothing (the prefix router without prefix caching, static batching
// or speculative decoding disaggregated).
ServeResult simulate_serving(const std::vector<Request>& requests, const ServeOptions& o,
                             std::span<StepExecutor* const> executors, KvTransfer* transfer = nullptr);
inline ServeResult simulate_serving(const std::vector<Request>& requests, const ServeOptions& o,
                                    StepExecutor& executor) {
  StepExecutor* one = &executor;
  return simulate_serving(requests, o, std::span<StepExecutor* const>(&one, 1));
}

// The KV blocks one device leaves room for, as vLLM plans it: of
// `capacity_bytes` a fraction (gpu_memory_utilization) is usable; weights
// and the peak activations of a step come first; the rest holds blocks of
// `block` tokens at `kv_bytes_per_token` (this device's layers and heads).
// A replica's count is the smallest over its devices. 0 when nothing is left;
// at most kMaxKvBlocks, as blocks are named by 32-bit ids (a tiny model's KV
// in blocks of one token on an 80 GB GPU would be 2.3 billion blocks; the
// cap still holds 2^31 - 1 tokens, more than any workload here can fill).
inline constexpr int64_t kMaxKvBlocks = (int64_t{1} << 31) - 1;
int64_t kv_blocks_on_device(double capacity_bytes, double fraction, double weight_bytes,
                            double activation_bytes, double kv_bytes_per_token, int block);

}  // namespace shardlab::serve
