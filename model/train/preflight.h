// Checks made before any thread starts, so that an oversized run never
// reaches the host allocator: the modeled out-of-memory of a device whose
// parameters, gradients and optimizer state alone exceed its capacity, and
// a real run whose host buffers would not fit this machine's memory.
#pragma once

#include <cstdint>

#include "model/train/trainer.h"

namespace shardlab::train {

struct MemoryEstimate {
  int64_t local_params = 0;    // the largest parameter count a device holds
  int worst_rank = 0;          // a device holding that many
  uint64_t device_bytes = 0;   // its modeled parameters + gradients + optimizer state (a lower bound)
  uint64_t params_bytes = 0, grads_bytes = 0, optimizer_bytes = 0;
  uint64_t host_bytes = 0;     // host buffers of every device's parameters, gradients and Adam state
};

// Counts each device's local parameters from the sharding rules (no buffer
// is allocated). `elem`: modeled bytes per element (4 fp32, 2 bf16).
MemoryEstimate estimate_memory(const TrainOptions& options, int elem);

// Throws ConfigError: "device R (TP(2)-...): parameters ..., gradients ...
// and optimizer state ... need X, more than its capacity Y", or "a real run
// needs about X of host memory ... this machine has Y".
void check_memory(const TrainOptions& options, uint64_t device_capacity, int elem,
                  uint64_t host_memory);

// This machine's physical memory (bytes).
uint64_t host_memory_bytes();

}  // namespace shardlab::train
