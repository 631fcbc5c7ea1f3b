// A serving run over R identical replicas (each a TP x PP group of devices
// holding the whole model): requests dispatched round-robin in arrival order
// (each replica then runs its own scheduler, scheduler.h), and the KV cache a
// replica can hold.
#pragma once

#include <cstdint>
#include <vector>

#include "model/serve/metrics.h"
#include "model/serve/scheduler.h"

namespace shardlab::serve {

struct ServeOptions {
  int replicas = 1;
  SchedulerOptions scheduler;
};

struct ServeResult {
  std::vector<ReplicaResult> replicas;
  ServeSummary summary;
};

// Replicas are identical and independent after dispatch, so one executor
// times every replica's steps.
ServeResult simulate_serving(const std::vector<Request>& requests, const ServeOptions& o,
                             StepExecutor& executor);

// The KV blocks one device leaves room for, as vLLM plans it: of
// `capacity_bytes` a fraction (gpu_memory_utilization) is usable; weights
// and the peak activations of a step come first; the rest holds blocks of
// `block` tokens at `kv_bytes_per_token` (this device's layers and heads).
// A replica's count is the smallest over its devices. 0 when nothing is left.
int64_t kv_blocks_on_device(double capacity_bytes, double fraction, double weight_bytes,
                            double activation_bytes, double kv_bytes_per_token, int block);

}  // namespace shardlab::serve
