// What the processes of one run agree on after it (cluster.cc, transport.h):
// its failure and every device's record. Internal to the runtime.
//
// Thread safety: called on the main thread between runs (after the device
// threads joined); the trace-name table these calls fill is guarded by its
// own mutex (cluster_share.cc), as trace names outlive the run.
#pragma once

#include <functional>
#include <optional>
#include <vector>

#include "runtime/cluster.h"
#include "runtime/transport.h"

namespace shardlab {

// The RunError `rethrow` throws, as a RunFailure.
std::optional<RunFailure> failure_of(const std::function<void()>& rethrow);

// Every process gives its own failure (or none); all of them then throw the
// same RunError, the failure of the lowest rank (a deadlock's, -1, first),
// or return when there was none anywhere.
void agree_on_failure(Transport& t, const std::optional<RunFailure>& mine);

// Fills in the other processes' devices: `stats` by rank (each process has
// its own set), `traces` merged in rank order.
void share_records(Transport& t, std::vector<std::optional<DeviceStats>>& stats, std::vector<DeviceTrace>& traces);

}  // namespace shardlab
