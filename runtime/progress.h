// Step-level progress of long runs, for whoever watches from outside the
// device threads (the Python bindings' progress bar, python/run_thread.h):
// one process-wide observer, as the cancel flag is one process-wide flag
// (runtime/cancel.h). The training loop reports each finished step from
// device 0's thread (model/train/device_program.cc); the CLI's own progress
// bar stays on its StepCallback, so with no observer installed nothing
// changes.
#pragma once

#include <functional>

#include "runtime/time.h"

namespace shardlab {

struct StepDone {
  int step = 0;   // the step that finished, 0-based
  int steps = 0;  // the run's total (its --steps)
  Time virtual_time = 0;  // device 0's clock at the step's end
  double loss = 0;
};
using StepObserver = std::function<void(const StepDone&)>;

// Installs `observer` (empty: none). Thread-safe; an observer being called
// when it is replaced finishes its call.
void set_step_observer(StepObserver observer);
// Calls the observer, if any, on this thread. Allocation-free.
void report_step(const StepDone& step);

}  // namespace shardlab
