#include "python/run_thread.h"

#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "cli/field_flags.h"
#include "runtime/cancel.h"
#include "runtime/progress.h"

namespace py = pybind11;

namespace shardlab::python {

// Input errors that say a device runs out of memory: an arena's OutOfMemory
// on a device ("device 0: out of memory allocating ...", runtime/arena.cc)
// and the preflight's ConfigError ("device 0 (...): out of memory: ...").
std::string input_error_kind(const char* what) {
  return std::string(what).find(": out of memory") != std::string::npos ? "out_of_memory" : "config";
}

std::string run_error_kind(const RunError& e) {
  switch (e.cause()) {
    case RunCause::kInput: return input_error_kind(e.what());
    case RunCause::kDeadlock: return "deadlock";
    case RunCause::kDeviceFailure: return "device_failure";
    case RunCause::kProgram:
    case RunCause::kFolding: return "run";
  }
  return "run";
}

namespace {

// The device threads inside Python code and the exception each gets when a
// run is cancelled. GUARDED_BY(the GIL): every access holds it.
std::map<unsigned long, PyObject*>& python_devices() {
  static auto* m = new std::map<unsigned long, PyObject*>;  // never destroyed: used until exit
  return *m;
}

void interrupt_python_devices() {
  for (const auto& [id, aborted] : python_devices()) PyThreadState_SetAsyncExc(id, aborted);
}

}  // namespace

PythonDeviceThread::PythonDeviceThread(PyObject* aborted) : id_(PyThread_get_thread_ident()) {
  python_devices()[id_] = aborted;
}

PythonDeviceThread::~PythonDeviceThread() {
  python_devices().erase(id_);
  PyThreadState_SetAsyncExc(id_, nullptr);  // one raised too late stays unraised
}

namespace {

void guarded(const std::function<void(Outcome&)>& body, Outcome& o) {
  auto fail = [&o](const char* kind, const char* what) {
    o.error = kind;
    o.message = cli::with_flag_names(what);
  };
  try {
    body(o);
  } catch (const ConfigError& e) {
    fail(input_error_kind(e.what()).c_str(), e.what());
  } catch (const OutOfMemory& e) {
    fail("out_of_memory", e.what());
  } catch (const Cancelled& e) {
    fail("cancelled", e.what());
  } catch (const RunError& e) {
    fail(run_error_kind(e).c_str(), e.what());
    o.rank = e.rank();
    o.cause = run_cause_name(e.cause());
  } catch (const std::exception& e) {
    fail("run", e.what());
  }
  // A cancelled command whose runs' errors were caught inside it (a sweep's points).
  if (cancel_requested() && o.error.empty()) fail("cancelled", "run cancelled");
}

class Waiter {
 public:
  // From device 0's thread (runtime/progress.h): kept for the waiting thread.
  void step_done(const StepDone& s) {
    std::lock_guard lock(mu_);
    steps_.push_back(s);
  }
  // Hands the steps reported so far to on_step(step, steps, virtual_s, loss),
  // in order, with the GIL; false when it raised (the error is then set).
  bool deliver_steps(const py::object& on_step) {
    std::vector<StepDone> ready;
    {
      py::gil_scoped_release nogil;  // a device thread may hold mu_ and want nothing else
      std::lock_guard lock(mu_);
      ready.swap(steps_);
    }
    for (const StepDone& s : ready) {
      PyObject* r = PyObject_CallFunction(on_step.ptr(), "iidd", s.step, s.steps, to_seconds(s.virtual_time), s.loss);
      Py_XDECREF(r);
      if (!r) return false;
    }
    return true;
  }
  void finish(Outcome o) {
    std::lock_guard lock(mu_);
    outcome_ = std::move(o);
    done_ = true;
    cv_.notify_all();
  }
  // Waits without the GIL; true when a signal handler raised (the Python
  // error is then set) and the run was cancelled.
  bool wait(const py::object& tick, const py::object& on_step) {
    bool interrupted = false;
    const auto start = std::chrono::steady_clock::now();
    int polls = 0;
    py::gil_scoped_release nogil;
    std::unique_lock lock(mu_);
    while (!cv_.wait_for(lock, std::chrono::milliseconds(50), [this] { return done_; })) {
      lock.unlock();
      {
        py::gil_scoped_acquire gil;
        if (!interrupted) {
          // A signal handler's exception (KeyboardInterrupt), or a callback's, is now the Python error.
          interrupted = PyErr_CheckSignals() != 0 || (++polls % 20 == 0 && !tick.is_none() && !call(tick, start)) ||
                        (!on_step.is_none() && !deliver_steps(on_step));
          if (interrupted) request_cancel();
        }
        // Blocked devices wake by the cancel flag; Python loops that never call in, by this, every poll.
        if (interrupted) interrupt_python_devices();
      }
      lock.lock();
    }
    return interrupted;
  }
  const Outcome& outcome() const { return outcome_; }

 private:
  // tick(seconds elapsed); false when it raised (the error is set).
  static bool call(const py::object& tick, std::chrono::steady_clock::time_point start) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    PyObject* r = PyObject_CallOneArg(tick.ptr(), py::float_(s).ptr());
    Py_XDECREF(r);
    return r != nullptr;
  }

  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;            // GUARDED_BY(mu_)
  Outcome outcome_;              // GUARDED_BY(mu_) until done_
  std::vector<StepDone> steps_;  // GUARDED_BY(mu_): reported, not yet delivered
};

}  // namespace

py::dict run_interruptible(std::function<void(Outcome&)> body, py::object tick, py::object on_step) {
  clear_cancel();
  auto waiter = std::make_shared<Waiter>();
  if (!on_step.is_none()) set_step_observer([waiter](const StepDone& s) { waiter->step_done(s); });
  std::thread worker([waiter, body = std::move(body)] {
    Outcome o;
    guarded(body, o);
    waiter->finish(std::move(o));
  });
  bool interrupted = waiter->wait(tick, on_step);
  worker.join();
  set_step_observer({});
  clear_cancel();
  // The steps that finished since the last poll.
  if (!interrupted && !on_step.is_none()) interrupted = !waiter->deliver_steps(on_step);
  if (interrupted) throw py::error_already_set();
  const Outcome& o = waiter->outcome();
  py::dict d;
  d["code"] = o.code;
  d["json"] = o.json.empty() ? py::object(py::none()) : py::object(py::str(o.json));
  d["error"] = o.error;
  d["message"] = o.message;
  d["rank"] = o.rank;
  d["cause"] = o.cause;
  return d;
}

}  // namespace shardlab::python
