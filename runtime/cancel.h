// Cancelling runs from outside the device threads (Ctrl-C in the Python
// bindings, python/): a process-wide flag, set by any thread.
//
// Cluster::run refuses to start while it is set, and its watchdog, which
// wakes every ClusterOptions::watchdog_period (100 ms), aborts the fabric
// when it sees it: blocked receives wake and every device's next operation
// (Device::check_abort, called by every op) ends its program. The run then
// throws Cancelled on the thread that called run(). The flag stays set until
// clear_cancel(), so a command made of many runs (train's steps, a sweep's
// points) stops at its next run instead of starting it.
#pragma once

#include <stdexcept>

namespace shardlab {

// What Cluster::run throws when the run was cancelled.
class Cancelled : public std::runtime_error {
 public:
  Cancelled() : std::runtime_error("run cancelled") {}
};

void request_cancel();
void clear_cancel();
bool cancel_requested();

}  // namespace shardlab
