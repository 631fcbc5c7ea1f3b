// Device: the context one virtual GPU's program runs with.
//
// A device has a rank, an arena, a cost model and two streams (compute and
// communication), each a virtual-time cursor like a CUDA stream. Ops on a
// stream start at the stream's current time and push it forward; events let
// one stream wait for a point on another, so communication overlaps compute
// exactly as far as the program's dependencies allow.
//
// Thread safety: a Device and everything it owns (arena, streams, trace
// buffer, ports) are used only by the device's own thread (or fiber,
// runtime/fiber.h), unpark() excepted. The only shared object it touches is
// the Fabric, which synchronises itself.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include <spdlog/logger.h>

#include "runtime/arena.h"
#include "runtime/cost_model.h"
#include "runtime/fabric.h"
#include "runtime/fault.h"
#include "runtime/port.h"
#include "runtime/profile.h"
#include "runtime/tensor.h"
#include "runtime/trace.h"

namespace shardlab {

class Device;

// A point in virtual time on some stream, to make another stream wait for it.
struct Event {
  Time time = 0;
};

class Stream {
 public:
  Stream(Device* owner, StreamKind kind) : owner_(owner), kind_(kind) {}

  StreamKind kind() const { return kind_; }
  Time now() const { return now_; }
  Event record() const { return {now_}; }
  // The stream idles until `e` has happened.
  void wait(Event e);
  // Occupies [now(), now() + duration); returns the end. Traced under `name`.
  Time run(const char* name, Time duration, uint64_t bytes = 0, double flops = 0);
  // Marks [start, end) busy and traced without moving the cursor (a transfer
  // that proceeds while the stream goes on), or moves it with `advance`.
  void mark(const char* name, Time start, Time end, uint64_t bytes, int peer, bool advance);

  // Union of busy intervals so far (in any order: see add_busy).
  Time busy() const { return busy_; }
  // The part of busy() spent in sends and receives (communication run on this stream).
  Time transfer_busy() const { return transfer_busy_; }
  // FLOPs of the ops run on this stream (recomputed ones included).
  double flops() const { return flops_; }
  // The busy intervals themselves, merged, in time order.
  struct Interval {
    Time start, end;
  };
  const std::vector<Interval>& intervals() const { return intervals_; }

  // A channel lane (collectives/detail.h) is a Stream reused call after
  // call: restart empties it (keeping its storage) and sets it to `kind` at
  // `t`; absorb adds another stream's busy intervals to this one's busy and
  // transfer time, untraced (the lane traced its transfers itself).
  void restart(StreamKind kind, Time t);
  void absorb(const Stream& other);

 private:
  void add_busy(Time start, Time end);

  Device* owner_;
  StreamKind kind_;
  Time now_ = 0;
  Time busy_ = 0;
  Time transfer_busy_ = 0;
  double flops_ = 0;
  std::vector<Interval> intervals_;
};

// Total length of the overlap of two sorted, merged interval lists.
Time overlap(const std::vector<Stream::Interval>& a, const std::vector<Stream::Interval>& b);

// What isend returns: when the payload has left the sender's egress port.
struct SendHandle {
  Time done = 0;
};

// What irecv returns: a receive posted now, completed by Device::wait. The
// virtual arrival does not depend on when it was posted (eager protocol), and
// the ingress port is booked at wait, in the program's wait order.
struct RecvHandle {
  int src = -1;
  Tag tag = 0;
  Time posted = 0;
};

struct DeviceConfig {
  int rank = 0;
  int world_size = 1;
  uint64_t memory_bytes = 0;
  Precision precision = Precision::kFp32;
  double pace = 0;  // wall seconds per virtual second; 0 = as fast as possible
  bool trace = false;
  // Folded phantom runs (ClusterOptions::representative): the rank that
  // plays each rank, itself for the ranks that run. Null: none folded.
  const std::vector<int>* representative = nullptr;
  // Injected faults (fault.h), or null: this device's kernels, transfers and
  // their failures follow them.
  const FaultPlan* faults = nullptr;
  // Every device of the run is a thread of this process, on the profile's
  // own links, with no test hooks or faults: collectives may meet instead
  // of passing messages (collectives/rendezvous.h), with the same bits and
  // times. Set by Cluster (ClusterOptions::rendezvous).
  bool rendezvous = false;
};

class Device {
 public:
  Device(const DeviceConfig& cfg, const HardwareProfile& profile, const LinkModel& links,
         Fabric& fabric, FabricHooks* hooks, std::shared_ptr<spdlog::logger> log,
         std::chrono::steady_clock::time_point wall_start);
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  int rank() const { return cfg_.rank; }
  int world_size() const { return cfg_.world_size; }
  int node() const { return profile_.node_of(cfg_.rank); }
  const HardwareProfile& profile() const { return profile_; }
  const CostModel& cost() const { return cost_; }
  Precision precision() const { return cfg_.precision; }
  Arena& arena() { return arena_; }
  const Arena& arena() const { return arena_; }
  Stream& compute() { return compute_; }
  Stream& comm() { return comm_; }
  const Stream& compute() const { return compute_; }
  const Stream& comm() const { return comm_; }
  spdlog::logger& log() { return *log_; }
  bool tracing() const { return cfg_.trace; }

  // ---- Faults (fault.h) ----------------------------------------------------
  // The training step the program is in (faults that start at a step).
  void set_step(int step) { step_ = step; }
  int step() const { return step_; }
  bool faulty() const { return cfg_.faults != nullptr; }
  // What the program is doing, named in a fault's message: the collectives
  // fill it while they run (only on a faulty() device), empty outside them.
  std::string& activity() { return activity_; }

  // ---- Folding (phantom runs of symmetric ranks) ---------------------------
  // The rank whose thread plays `rank` (rank itself unless it is folded).
  int representative(int rank) const {
    return cfg_.representative ? (*cfg_.representative)[static_cast<size_t>(rank)] : rank;
  }
  bool folded(int rank) const { return representative(rank) != rank; }
  bool folding() const { return cfg_.representative != nullptr; }
  // Whether `rank` has a thread of this process (not folded, not another process's).
  bool runs_here(int rank) const { return !folded(rank) && fabric_.local(rank); }
  // The link between two devices (at this device's step): what a folded
  // program checks its members' transfers against (the cp ring).
  Link link(int src, int dst) const { return links_.link_at(src, dst, step_); }
  // The link ports (port.h), by link class: the egress and the ingress side.
  const Port& egress(int link_class) const { return egress_[link_class]; }
  const Port& ingress(int link_class) const { return ingress_[link_class]; }
  // Sets stream `kind`'s free times on every port (a collective replayed
  // for folded members advances this device's ports as the real one would).
  void set_ports(StreamKind kind, const Time egress[kNumLinkClasses], const Time ingress[kNumLinkClasses]);
  // Sets every stream's free times (a resumed run).
  void set_all_ports(const Time egress[kNumLinkClasses], const Time ingress[kNumLinkClasses]);
  // Books a replayed transfer on this device's port of `link_class` (the
  // egress side for a send, else the ingress side), as isend / recv would
  // have (folding: collectives/folded.cc books the replay's transfers of
  // this device in its program order, so the shares and backlogs of other
  // streams are the unfolded run's). `ready`: the send's stream time or
  // the message's first byte; `work`: its wire time.
  Port::Booking book_replayed(bool send, int link_class, StreamKind kind, Time ready, Time work);
  // Folded members may leave a collective with port free times other than
  // their representative's while the stream times agree. That is harmless
  // as long as every later use of a port comes after all of them: the port
  // is "in doubt" until then, and a send that would depart (or a message
  // that would arrive) earlier on it fails the run ("cannot be folded
  // exactly"). widen_doubt extends the windows; doubt_until reads them.
  void widen_doubt(const Time egress[kNumLinkClasses], const Time ingress[kNumLinkClasses]);
  Time egress_doubt(int port) const { return egress_doubt_[port]; }
  Time ingress_doubt(int port) const { return ingress_doubt_[port]; }
  // Untimed messages between running devices, through the fabric (the
  // watchdog sees their waits): what folded collectives exchange to agree
  // on their members' clocks. They book no port and take no virtual time.
  void post_control(int dst, Tag tag, std::span<const std::byte> payload);
  Message take_control(int src, Tag tag);
  // Whether collectives may meet (DeviceConfig::rendezvous), and the
  // meeting itself (Fabric::meet).
  bool rendezvous() const { return cfg_.rendezvous; }
  void meet(std::span<const int> members, int index, Tag tag, void* deposit, const Fabric::MeetingDone& complete) {
    check_abort();
    fabric_.meet(cfg_.rank, members, index, tag, deposit, complete);
  }
  // A wait of the program's own on the host (a serving device waiting for
  // its next batch, model/serve/cluster_step.cc): with `lock` held, sleeps
  // until unpark() or spuriously; callers loop on their condition. Waiting
  // any other way would stop a fiber's host thread (runtime/fiber.h).
  // unpark() may be called from any thread.
  void park(std::unique_lock<std::mutex>& lock) { fabric_.park(cfg_.rank, lock); }
  void unpark() { fabric_.unpark(cfg_.rank); }

  // The latest time on any stream, and making every stream reach it.
  Time now() const;
  void synchronize();

  // Allocates a tensor in this device's arena at the device's precision.
  Tensor alloc(std::string name, Shape shape, MemKind kind, bool phantom = false);

  // Charges a compute op to `s` by the cost model; returns its end time.
  // On the compute stream the op shares the SMs with the collectives noted
  // busy (note_collective) over its span: see compute_end.
  Time run(Stream& s, const char* name, const OpCost& op);

  // ---- SM contention ------------------------------------------------------
  // A collective on a stream other than compute holds `blocks` SMs (NCCL: one
  // thread block per channel) over [start, end). Compute kernels charged
  // after this call (program order: a booking never waits for a later one)
  // run at (sm_count - blocks) / sm_count of their speed where they overlap
  // it; concurrent collectives add their blocks (at most sm_count - 1 in
  // all). No effect without an SM count (profile device.gemm.sm_count 0).
  void note_collective(Time start, Time end, int blocks);
  // The end of a compute kernel of `work` picoseconds (at full speed) that
  // starts at `start`, slowed over the noted collectives: the first T with
  // sum over [start, T) of free SMs = work * sm_count, rounded up to a
  // picosecond. Drops the collectives that end by `start` (a compute
  // kernel never starts before the one charged before it).
  Time compute_end(Time start, Time work);

  // ---- Point to point ----------------------------------------------------
  // `host` is copied at once (eager); `modeled_bytes` sets the virtual time
  // (may differ from host.size(): bf16 modeling, phantom payloads). `engine`:
  // NCCL's SM kernels (collectives, pipeline send/recv; the default) or the
  // copy engines (cudaMemcpy between peers, as OSU measures): the packet size.
  // `rate_cap` (bytes per second, 0: none): the message moves at most at
  // that rate (a collective step's share of a shared PCIe link,
  // ProfileLinkModel::shared_rate); the receiver books the same rate.
  SendHandle isend(Stream& s, int dst, Tag tag, std::span<const std::byte> host,
                   uint64_t modeled_bytes, Engine engine = Engine::kSm, uint64_t rate_cap = 0);
  void wait(Stream& s, SendHandle h) { s.wait({h.done}); }
  void send(Stream& s, int dst, Tag tag, std::span<const std::byte> host, uint64_t modeled_bytes,
            Engine engine = Engine::kSm) {
    wait(s, isend(s, dst, tag, host, modeled_bytes, engine));
  }
  // Blocks (host) until the message is there; `s` waits for its virtual arrival.
  Message recv(Stream& s, int src, Tag tag);
  // Non-blocking receive: post now, wait later (typically after other work).
  RecvHandle irecv(Stream& s, int src, Tag tag) const { return {src, tag, s.now()}; }
  Message wait(Stream& s, const RecvHandle& h) { return recv(s, h.src, h.tag); }

  // A phantom send in a folded run (the cp ring, model/parallel/context/
  // cp_attention.cc): books this device's egress as isend(s, dst, ...)
  // would and posts the message, without payload, to each delivery's `to`
  // as if `as` had sent it (`as` this device, or a folded member it plays,
  // which sends exactly what this device sends; `to` a running device, maybe
  // this one). dst may be folded: then it gets nothing of this device.
  struct Delivery {
    int as = -1, to = -1;
  };
  SendHandle isend_folded(Stream& s, int dst, Tag tag, uint64_t modeled_bytes, std::span<const Delivery> deliveries);

  // Tensor forms: the receiver copies into `into`, whose size must match.
  SendHandle isend(Stream& s, int dst, Tag tag, const Tensor& t);
  void recv(Stream& s, int src, Tag tag, Tensor& into);

  // Throws Aborted if the run is being torn down. Called by every op.
  void check_abort() const {
    if (fabric_.aborted()) throw Aborted{};
  }

  std::vector<TraceEvent>& trace_events() { return trace_; }

  // The first `n` channel lanes, restarted as empty streams of `kind` at
  // `t` (Ctx::open_lanes). Kept by the device so a collective's lanes
  // allocate nothing once they have grown; valid until the next call.
  Stream* lanes(int n, StreamKind kind, Time t);

 private:
  friend class Stream;
  void record(StreamKind s, const char* name, Time start, Time end, uint64_t bytes, double flops,
              int peer);
  void pace(Time t);
  void check_peer(int peer, const char* what) const;
  // isend's booking: the message to `dst` (no payload yet) with its link,
  // departure and end on this device's egress, marked on `s`.
  Message book_send(Stream& s, int dst, Tag tag, uint64_t modeled_bytes, Engine engine, uint64_t rate_cap);
  // Throws DeviceFailure if a dead device or a downed link stops this transfer.
  void check_fault(int peer, bool sending) const;

  DeviceConfig cfg_;
  const HardwareProfile& profile_;
  const LinkModel& links_;
  Fabric& fabric_;
  FabricHooks* hooks_;
  std::shared_ptr<spdlog::logger> log_;
  std::chrono::steady_clock::time_point wall_start_;
  CostModel cost_;
  Arena arena_;
  Stream compute_;
  Stream comm_;
  std::vector<Stream> lanes_;  // lanes()
  Port egress_[kNumLinkClasses];
  Port ingress_[kNumLinkClasses];
  Time egress_doubt_[kNumLinkClasses] = {0, 0};
  Time ingress_doubt_[kNumLinkClasses] = {0, 0};
  std::vector<TraceEvent> trace_;
  struct Busy {
    Time start, end;
    int blocks;
  };
  std::vector<Busy> collectives_;  // note_collective, in booking order
  int step_ = 0;
  std::string activity_;
};

}  // namespace shardlab
