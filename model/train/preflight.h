// Checks made before any thread starts, so that an oversized run never
// reaches the host allocator: the modeled out-of-memory of a device whose
// parameters, gradients, master weights and optimizer state alone exceed its
// capacity, and a real run whose host buffers would not fit this machine's
// memory.
//
// The per-device figures are exactly what the run's arena holds of each kind
// (tests/model/train/memory_kinds_test.cc): parameters at the device
// precision (4 B fp32, 2 B bf16), fp32 main gradients (4 B; ZeRO-2: the
// owned chunks plus the largest bucket), fp32 master weights of the owned
// elements (bf16 only) and AdamW's two fp32 moments of the owned elements
// (8 B). Owned: everything without ZeRO, chunk r of every bucket with it
// (model/parallel/data/buckets.h).
#pragma once

#include <cstdint>
#include <vector>

#include "model/train/parallel_plan.h"
#include "model/train/trainer.h"
#include "runtime/host_memory.h"  // host_memory_bytes(): check_memory's host_memory

namespace shardlab::train {

struct DeviceMemory {
  int64_t params = 0;  // local parameters
  uint64_t params_bytes = 0, grads_bytes = 0, master_bytes = 0, optimizer_bytes = 0;
  uint64_t total() const { return params_bytes + grads_bytes + master_bytes + optimizer_bytes; }
};

struct MemoryEstimate {
  std::vector<DeviceMemory> devices;  // by rank (empty when too large to lay out: worst only)
  int worst_rank = 0;                 // a device holding the most bytes
  DeviceMemory worst;
  uint64_t host_bytes = 0;  // host buffers of every device's parameters, gradients and Adam state
};

// Counts each device's local parameters from the sharding rules and its
// buckets from the data-parallel plan (no buffer is allocated). `elem`:
// modeled bytes of a parameter (4 fp32, 2 bf16 and fp8). `fp8`
// (Precision::kFp8): the parameters add Transformer Engine's FP8 copies of
// the linears' weights, W and Wᵀ at 1 B each.
MemoryEstimate estimate_memory(const TrainOptions& options, const ParallelPlan& plan, int elem, bool fp8 = false);

// Whether some data-parallel rank owns a chunk of another size than its
// peers under ZeRO: a bucket (of any stage, tp or ep rank) that its sharding
// group (dp, or HSDP's shards, for dense buckets; edp for expert ones) does
// not divide. False without ZeRO and under ZeRO-1/2, whose padded buckets
// always divide (model/parallel/data/buckets.h, padded_bucket). Folding reads it (model/engine/fold.h):
// with even chunks the dp ranks run the same kernels, collectives and
// allocations, on different elements.
bool uneven_chunks(const TrainOptions& options, const ParallelPlan& plan);

// A lower bound of a real run's activations, in elements: what the worst
// device holds at once (device_elements, at the modeled element size) and
// what every device's host buffers hold together (host_elements, fp32).
struct ActivationFloor {
  double device_elements = 0;
  double host_elements = 0;
};
ActivationFloor activation_floor(const TrainOptions& options, const ParallelPlan& plan);

// Throws ConfigError: "device R (TP(2)-...): out of memory before any
// activation: parameters ..., gradients ... and optimizer state ... need X,
// more than its capacity Y" (with the master weights under bf16); for a real
// run, the same with the activation floor added ("out of memory: ... and the
// activations of one micro-batch at least ..."), or "a real run ... needs at
// least X of host memory ... this machine has Y" (host_memory: usually
// host_memory_bytes()).
void check_memory(const TrainOptions& options, const ParallelPlan& plan, uint64_t device_capacity, int elem,
                  uint64_t host_memory, bool fp8 = false);

}  // namespace shardlab::train
