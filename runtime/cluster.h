// Cluster: launches one SPMD program on N virtual devices, one OS thread each
// (or fibers on fewer threads: ClusterOptions::host_threads).
//
//   Cluster cluster(load_profile("a100-nvlink"), {.world_size = 8});
//   RunResult r = cluster.run([](Device& dev) { ... });
//
// Each run() starts from fresh devices (arenas, clocks, ports) and joins every
// thread before returning. The first exception on any device aborts the
// others (blocked receives are woken) and is rethrown as RunError with its
// rank; a deadlock found by the watchdog is a RunError with rank -1.
//
// Thread safety: run() may be called from several threads on different
// Cluster objects at once (independent emulations side by side); one Cluster
// runs one program at a time.
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/device.h"
#include "runtime/profile.h"
#include "runtime/trace.h"
#include "runtime/transport.h"

namespace shardlab {

struct ClusterOptions {
  int world_size = 0;          // 0: every device of the profile
  uint64_t memory_bytes = 0;   // per-device arena capacity; 0: the profile's
  Precision precision = Precision::kFp32;
  double pace = 0;             // wall seconds per virtual second; 0: off
  bool trace = false;          // record trace events
  const LinkModel* links = nullptr;  // nullptr: ProfileLinkModel
  FabricHooks* hooks = nullptr;      // test hooks at the channel boundary
  std::chrono::milliseconds watchdog_period{100};
  // Folding (phantom runs only, model/engine/fold.h): representative[r] is the
  // rank whose thread plays rank r; only ranks with representative[r] == r
  // run, and a folded rank's DeviceStats are its representative's (with its
  // own rank and node). Empty: every rank runs.
  std::vector<int> representative;
  // Injected faults (runtime/fault.h), or null. Checked against world_size
  // and the capacity when the Cluster is built; their links wrap `links`.
  std::shared_ptr<const FaultPlan> faults;
  // Under mpirun (runtime/transport.h): run every device in this process
  // instead of spreading them over the processes (a small side run, like
  // verify's unsharded reference, that each process computes itself).
  bool single_process = false;
  // Collectives whose members all run here meet in one rendezvous instead
  // of passing messages step by step (collectives/rendezvous.h): the same
  // bits and virtual times with far fewer thread hand-offs. Only without a
  // transport, on the profile's own links (links null), without hooks or
  // faults; false: always the messages (tests compare the two).
  bool rendezvous = true;
  // Host threads the devices' programs share as fibers (runtime/fiber.h):
  // 0, one OS thread per device; N > 0, the running devices in N blocks of
  // consecutive ranks, each block's programs fibers of one thread, so that
  // a wait gives the thread to the next ready device instead of sleeping
  // in the kernel. The same bits, virtual times and traces either way. Only
  // in one process and without pacing (a paced device sleeps on the wall
  // clock, which would stop its block); otherwise one thread per device.
  int host_threads = 0;
};

struct DeviceStats {
  int rank = 0;
  int node = 0;
  Time compute_end = 0;   // stream cursors when the program returned
  Time comm_end = 0;
  Time compute_busy = 0;  // union of busy intervals per stream
  Time comm_busy = 0;
  Time comm_exposed = 0;  // comm busy time not hidden under compute
  Time compute_transfer = 0;  // compute-stream time spent in collectives run there (TP)
  double compute_flops = 0;  // FLOPs the compute stream ran (hardware FLOPs: recompute included)
  uint64_t peak_bytes = 0;
  uint64_t capacity_bytes = 0;
  uint64_t peak_by_kind[kNumMemKinds] = {};
  Time end() const { return std::max(compute_end, comm_end); }
};

struct RunResult {
  std::vector<DeviceStats> devices;
  std::vector<DeviceTrace> traces;  // empty unless options.trace
  double wall_seconds = 0;
  Time makespan() const;            // latest end over devices
};

class Cluster {
 public:
  // Throws ConfigError if world_size exceeds the profile's devices.
  Cluster(HardwareProfile profile, ClusterOptions options);

  using Program = std::function<void(Device&)>;
  RunResult run(const Program& program);

  const HardwareProfile& profile() const { return profile_; }
  const ClusterOptions& options() const { return options_; }
  int world_size() const { return options_.world_size; }
  // The transport its runs spread over (transport.h), or null: in one process.
  Transport* transport() const;
  // Folding for the next run (ClusterOptions::representative); empty: none.
  void set_representatives(std::vector<int> representative) {
    options_.representative = std::move(representative);
  }
  // Whether the next runs' collectives may meet (ClusterOptions::rendezvous).
  void set_rendezvous(bool on) { options_.rendezvous = on; }
  // The host threads of the next runs (ClusterOptions::host_threads).
  void set_host_threads(int n) { options_.host_threads = n; }

 private:
  std::vector<std::unique_ptr<Device>> make_devices(Fabric& fabric, const std::function<bool(int)>& local,
                                                    std::chrono::steady_clock::time_point wall_start,
                                                    int& running) const;
  RunResult collect(std::vector<std::unique_ptr<Device>>& devices,
                    std::chrono::steady_clock::time_point wall_start) const;

  HardwareProfile profile_;
  ClusterOptions options_;
  std::unique_ptr<LinkModel> default_links_;
  std::unique_ptr<LinkModel> fault_links_;  // over options_.links when there are faults
  const LinkModel* links_ = nullptr;        // what the devices use
};

}  // namespace shardlab
