// Fault injection: what goes wrong on the modeled hardware, deterministically.
//
// A fault is a layer over the hardware profile, never a special case in the
// programs: FaultLinkModel decorates the run's LinkModel (a slower or later
// link), Device scales its kernels' durations (a straggler) and checks its
// transfers (a dead device, a link that is down), and the cluster gives a
// device a smaller arena (memory pressure). Faults that start at a step read
// the step the program announces with Device::set_step (the trainer calls it
// at the start of every step; a program that never does is at step 0).
//
// The spec, one per --fault (or a JSON list of these strings in a file):
//   slow-link:A-B:bw=F[,lat_us=+X][,from_step=S]  the link between devices A and B, both ways
//   slow-nic:D:bw=F[,lat_us=+X][,from_step=S]     every link into or out of device D
//   link-down:A-B:step=S                         the link between A and B fails at step S
//   straggler:D:compute=F[,from_step=S]          device D's kernels take F times as long
//   dead:D:step=S                                device D dies at step S
//   memory:D:capacity=SIZE|FRACTION              device D's arena holds SIZE (64MiB) or
//                                                FRACTION (0.5) of its capacity
// bw is a factor in (0, 1] on the bandwidth, lat_us (a leading + optional)
// microseconds added to the latency; either may be left out, not both.
// Faults on one link compose: bandwidth factors multiply, latencies add.
//
// A dead device is noticed where its peers would notice it: at its first
// transfer (a send or receive, inside a collective or not) of step S or
// later; a downed link at the first transfer over it in either direction
// from step S, reported by its lower-numbered end (so the message never
// depends on thread timing). Either throws DeviceFailure, which stops the
// run (RunError::device_failure): at most one such fault per run.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/link_model.h"

namespace shardlab {

enum class FaultKind : uint8_t { kSlowLink, kSlowNic, kLinkDown, kStraggler, kDead, kMemory };
const char* fault_kind_name(FaultKind k);  // "slow-link", ...

struct Fault {
  FaultKind kind = FaultKind::kSlowLink;
  int device = -1;              // slow-nic, straggler, dead, memory; a link's first end
  int peer = -1;                // slow-link, link-down: the link's other end
  double bandwidth = 1;         // slow-*: factor on bytes per second, (0, 1]
  double latency_us = 0;        // slow-*: added to the latency, >= 0
  double compute = 1;           // straggler: factor on kernel durations, >= 1
  int step = 0;                 // from this step on (slow-*, straggler); at this step (link-down, dead)
  uint64_t capacity_bytes = 0;  // memory: absolute (0: use capacity_fraction)
  double capacity_fraction = 0; // memory: share of the device's capacity, (0, 1]
  std::string spec;             // the text it was parsed from, for messages

  bool fatal() const { return kind == FaultKind::kLinkDown || kind == FaultKind::kDead; }
  bool on_link(int a, int b) const {
    return (device == a && peer == b) || (device == b && peer == a);
  }
};

// One spec; throws ConfigError "`faults` SPEC: ..." naming what is wrong.
Fault parse_fault(std::string_view spec);
// Every --fault value in order: a spec, or @FILE.json holding a JSON list of specs.
std::vector<Fault> parse_faults(const std::vector<std::string>& args);

// The faults of one run, checked against it. Read-only once built, so every
// device thread may query it.
class FaultPlan {
 public:
  // Throws ConfigError: a device outside [0, world_size), a step not below
  // `steps` (the fault would never happen), more than one dead device or
  // downed link, a dead device or downed link in a one-device run.
  FaultPlan(std::vector<Fault> faults, int world_size,
            int steps = std::numeric_limits<int>::max());

  const std::vector<Fault>& faults() const { return faults_; }
  bool empty() const { return faults_.empty(); }

  // `base` from src to dst at `step`, slowed by every slow fault on it.
  Link apply(Link base, int src, int dst, int step) const;
  // The factor on a kernel's duration on `rank` at `step` (1: unchanged).
  double compute_scale(int rank, int step) const;
  // The arena capacity of `rank` given its normal capacity.
  uint64_t capacity(int rank, uint64_t normal) const;
  // The fatal fault a transfer from `rank` to or from `peer` at `step` meets, or null.
  const Fault* fatal_for(int rank, int peer, int step) const;

 private:
  std::vector<Fault> faults_;
};

// The decorator over the run's link model (LevelDB's EnvWrapper pattern).
class FaultLinkModel final : public LinkModel {
 public:
  FaultLinkModel(const LinkModel& base, std::shared_ptr<const FaultPlan> plan)
      : base_(base), plan_(std::move(plan)) {}
  Link link(int src, int dst) const override { return base_.link(src, dst); }
  Link link_at(int src, int dst, int step) const override {
    return plan_->apply(base_.link_at(src, dst, step), src, dst, step);
  }

 private:
  const LinkModel& base_;
  std::shared_ptr<const FaultPlan> plan_;
};

}  // namespace shardlab
