// Sharing a run's results across processes (runtime/transport.h). Under
// mpirun each process's device threads write only the results of the
// devices it runs; flat buffers written disjointly into zeroed storage merge
// with merge_disjoint (runtime/transport.h), and these two give every
// process the rest, bit for bit: per-device rows of any shape, and a value
// one process holds (the sampler's tokens, the leader's step records).
//
// Both are collective: every process calls them in the same order, on its
// main thread, after the run. No-ops in a single process.
#pragma once

#include <cstddef>
#include <functional>
#include <vector>

#include "runtime/wire.h"

namespace shardlab::engine {

// Every process writes the rows of the devices it ran (`put(w, d)` for each
// device d with owners[d] its process, in order) and reads every process's
// (`get(r, d)`), its own included. `owners[d]`: runtime::device_owners.
void share_device_rows(const std::vector<int>& owners,
                       const std::function<void(wire::Writer&, size_t)>& put,
                       const std::function<void(wire::Reader&, size_t)>& get);

// Process `owner` writes a value (`put`); every process, the owner
// included, reads it (`get`).
void share_from_process(int owner, const std::function<void(wire::Writer&)>& put,
                        const std::function<void(wire::Reader&)>& get);

}  // namespace shardlab::engine
