// Running library code from Python: on a thread of its own, so that the
// calling thread, without the GIL, can wait for it and check for signals
// every 50 ms. Ctrl-C sets the library's cancel flag (runtime/cancel.h):
// the run ends within its watchdog's period (100 ms), every thread of it is
// joined, and KeyboardInterrupt is raised.
//
// Failures come back as data (an Outcome's error, message, rank and cause),
// mapped as cli/main.cc maps them to exit codes; the package's Python half
// raises its exception classes from them (python/shardlab/errors.py).
#pragma once

#include <pybind11/pybind11.h>

#include <functional>
#include <string>

#include "runtime/errors.h"

namespace shardlab::python {

struct Outcome {
  int code = 0;      // a command's exit code
  std::string json;  // its --json value (dumped), or a run's result; empty: none
  // "", "config", "out_of_memory", "deadlock", "device_failure", "run" or "cancelled"
  std::string error;
  std::string message;  // the one line the CLI prints after "shardlab: error: "
  int rank = -1;        // the failing device of a run error; -1: none
  std::string cause;    // a run error's RunCause (run_cause_name)
};

// While it lives, this device thread runs Python code (python/cluster_api.cc):
// when a run is cancelled, the waiting thread raises `aborted` in it
// (PyThreadState_SetAsyncExc), so a device function that never calls into
// its device, a pure Python loop, still ends at its next bytecode. Made and
// destroyed with the GIL held; one at a time per thread.
class PythonDeviceThread {
 public:
  explicit PythonDeviceThread(PyObject* aborted);
  ~PythonDeviceThread();
  PythonDeviceThread(const PythonDeviceThread&) = delete;
  PythonDeviceThread& operator=(const PythonDeviceThread&) = delete;

 private:
  unsigned long id_;
};

// The kind of error a RunError is (Outcome::error).
std::string run_error_kind(const RunError& e);

// Runs `body` on a new thread, its exceptions caught into the Outcome (their
// messages with the CLI's flag names), and returns the Outcome as a dict;
// throws error_already_set (KeyboardInterrupt) when a signal cancelled it.
// Called with the GIL held; `body` runs without it. `tick`, unless None, is
// called with the seconds elapsed about once a second (a progress line);
// `on_step`, unless None, with (step, steps, virtual_s, loss) for each step
// the run loop reports (runtime/progress.h), in order, from this thread. An
// exception either raises cancels the run like a signal.
pybind11::dict run_interruptible(std::function<void(Outcome&)> body, pybind11::object tick = pybind11::none(),
                                 pybind11::object on_step = pybind11::none());

}  // namespace shardlab::python
