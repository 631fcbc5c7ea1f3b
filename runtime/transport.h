// Transport: the virtual cluster spread over several OS processes (MPI).
//
// Under `mpirun -np R`, every process runs the same command (SPMD at the
// process level): the same Cluster::run calls in the same order. A run's
// devices are split over the processes in contiguous blocks (whole profile
// nodes where there are enough of them, `device_owners`); each process runs
// threads only for its own devices. A message for a device of another
// process leaves the Fabric through the Transport and is posted into that
// process's Fabric as it was sent: its source, tag, link, departure time and
// modeled bytes travel with it, and the receiver books its ingress port in
// its program's receive order exactly as in one process, so every virtual
// time (and every bit) is the single-process run's.
//
// Between runs, on the main thread, the processes agree on what the run
// produced: `exchange` is an all-gather of one byte string per process, used
// for the run's error, its DeviceStats and its traces (cluster.cc), and the
// helpers below merge the program's own outputs.
//
// Without MPI (a build without it, or a plain `shardlab ...` not launched by
// mpirun) there is no transport: process_transport() is null and everything
// is single-process, unchanged.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "runtime/fabric.h"

#include "runtime/errors.h"

namespace shardlab {

struct HardwareProfile;

// The error a run ended with, as every process learns it (cluster.cc).
struct RunFailure {
  int rank = 0;
  std::string what;
  RunCause cause = RunCause::kProgram;
};

// One live device's state for the waits-for check (Fabric::snapshot).
struct DeviceWait {
  int rank = 0;
  bool finished = false;
  bool blocked = false;  // waiting in take() for a message not in its mailbox
  int src = -1;
  Tag tag = 0;
};

// "deadlock: every live device is blocked: ..." when every unfinished device
// in `waits` (all devices, in rank order) is blocked; nullopt otherwise.
std::optional<std::string> describe_deadlock(const std::vector<DeviceWait>& waits);

class Transport {
 public:
  virtual ~Transport() = default;
  virtual int process() const = 0;    // this process's index, 0 = the leader
  virtual int processes() const = 0;  // how many

  // A run starts (every process, same order): messages for other processes'
  // devices leave through forward(), arriving ones are posted into `fabric`.
  // `owners[r]` is the process of device r. The transport checks for a
  // deadlock across processes every `period` (the waits-for check), and on
  // a failure anywhere calls `on_abort` (from its own thread) with the
  // failure when the leader found a deadlock, empty otherwise.
  struct RunHooks {
    std::function<void(const RunFailure*)> on_abort;
    std::chrono::milliseconds period{100};
  };
  virtual void begin_run(Fabric& fabric, std::vector<int> owners, RunHooks hooks) = 0;
  // A device thread's message for a device of process `to`.
  virtual void forward(int to, Message&& m) = 0;
  // This process's devices failed: wake the other processes' devices.
  virtual void abort_others() = 0;
  // Every local device has returned; returns when every process's have and
  // every message of the run is delivered (no packet of this run is left).
  virtual void end_run() = 0;

  // Main thread, between runs: every process's `mine`, in process order.
  virtual std::vector<std::string> exchange(const std::string& mine) = 0;
  // The same during a run, from one host thread that is not a device's (the
  // serving scheduler between its steps, model/serve/cluster_step.h), every
  // process calling it equally often; nullopt once the run was aborted
  // anywhere (a device failed, or the watchdog found a deadlock): the run's
  // end then reports the failure as usual.
  virtual std::optional<std::vector<std::string>> exchange_in_run(const std::string& mine) = 0;
  // Main thread: bitwise OR of `bytes` over the processes, in place.
  virtual void or_bytes(std::span<std::byte> bytes) = 0;
};

// The process's transport, or null when it runs alone.
Transport* process_transport();
void set_process_transport(Transport* t);
// This process writes the run's files and prints (true when alone).
bool leader_process();

// Device r's process: contiguous blocks, of whole nodes of `profile` when the
// devices fill at least one node per process, else of ceil(world / R) devices.
std::vector<int> device_owners(int world, int processes, const HardwareProfile& profile);

// Merges a buffer each of whose elements one process wrote while the others
// left it zero-filled (disjoint writes into zeroed storage, like the device
// threads' outputs): afterwards every process holds every element, bit for
// bit. A no-op when alone.
template <class T>
void merge_disjoint(std::vector<T>& v) {
  static_assert(std::is_trivially_copyable_v<T>);
  if (Transport* t = process_transport(); t && !v.empty())
    t->or_bytes({reinterpret_cast<std::byte*>(v.data()), v.size() * sizeof(T)});
}

// MPI's lifetime for main(): initialises MPI when the process was started
// by mpirun (and the build has MPI), installs the transport, silences stdout
// of every process but the leader (their stderr goes to a private log);
// finalises at exit.
class ProcessSession {
 public:
  ProcessSession(int& argc, char**& argv);
  ~ProcessSession();
  // main's exit code once the command has ended, `code`. Under mpirun every
  // process meets the others here. A failure the others do not share (an
  // error outside a run: a file missing on one host, a write failing on the
  // leader) would leave them waiting for this process forever; so a failed
  // process that does not meet every other within `patience` shows its
  // error lines (a non-leader's with its process number) and ends the whole
  // job with `code` (MPI_Abort). Alone: returns `code`.
  int settle(int code, std::chrono::milliseconds patience = std::chrono::seconds(10));
  ProcessSession(const ProcessSession&) = delete;
  ProcessSession& operator=(const ProcessSession&) = delete;
};

}  // namespace shardlab
