#include "python/run_thread.h"

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>

#include "cli/field_flags.h"
#include "runtime/cancel.h"

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
  void finish(Outcome o) {
    std::lock_guard lock(mu_);
    outcome_ = std::move(o);
    done_ = true;
    cv_.notify_all();
  }
  // Waits without the GIL; true when a signal handler raised (the Python
  // error is then set) and the run was cancelled.
  bool wait() {
    bool interrupted = false;
    py::gil_scoped_release nogil;
    std::unique_lock lock(mu_);
    while (!cv_.wait_for(lock, std::chrono::milliseconds(50), [this] { return done_; })) {
      if (interrupted) continue;
      lock.unlock();
      {
        py::gil_scoped_acquire gil;
        if (PyErr_CheckSignals() != 0) {  // KeyboardInterrupt (or another handler's exception) is set
          interrupted = true;
          request_cancel();
        }
      }
      lock.lock();
    }
    return interrupted;
  }
  const Outcome& outcome() const { return outcome_; }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;  // GUARDED_BY(mu_)
  Outcome outcome_;    // GUARDED_BY(mu_) until done_
};

}  // namespace

py::dict run_interruptible(std::function<void(Outcome&)> body) {
  clear_cancel();
  auto waiter = std::make_shared<Waiter>();
  std::thread worker([waiter, body = std::move(body)] {
    Outcome o;
    guarded(body, o);
    waiter->finish(std::move(o));
  });
  const bool interrupted = waiter->wait();
  worker.join();
  clear_cancel();
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
