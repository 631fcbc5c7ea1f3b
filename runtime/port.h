// Port: one side of a device's link class (its egress or its ingress on
// NVLink, or on its NIC), shared by the device's streams.
//
// Transfers of one stream kind queue on the port in program order (FIFO, as
// NCCL's channels of one communicator do). Transfers of different kinds (the
// compute stream's tensor-parallel collectives, the comm stream's
// data-parallel all-reduce, the pipeline stream's sends, --tp-comm-overlap's
// side stream's tensor-parallel collectives, the cp ring's K/V) share the
// port's bandwidth: in any span where k streams move data, each moves at
// 1/k of the rate (max-min fair between equal flows).
//
// Determinism. A port is booked by its device's thread only, in the
// device's program order, so nothing here depends on host scheduling. A
// transfer booked after another stream's transfers that lie later in virtual
// time (a "late" transfer: the program issued the all-reduce first, the
// pipeline send after, at an earlier stream time) cannot move the times the
// earlier bookings already gave: they are on the wire, their receivers may
// have used them. So the late transfer takes its fair share of those spans
// (it runs at 1/(k+1) there), and the bandwidth it took is charged to the
// streams it shared with as a backlog placed after everything booked on the
// port: their next transfers there wait for it. Every byte still
// crosses the port once at its rate; what the late transfer cannot do is
// slow a transfer already booked. docs/architecture.md, "Shared ports",
// gives the argument and the bound on that error.
//
// The busy spans are kept as disjoint segments, each with the set of
// streams that move data in it; the oldest are dropped past kMaxSegments
// (a late transfer that starts before the oldest kept segment sees the port
// idle there: deterministic, documented, rare).
//
// Thread safety: none; owned and used by one device thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "runtime/time.h"

namespace shardlab {

class Port {
 public:
  static constexpr int kStreams = 6;  // StreamKind's values: compute, comm, pipeline, tp-comm, cp-comm, ep-comm
  static constexpr size_t kMaxSegments = 4096;

  struct Booking {
    Time start = 0;  // when the transfer starts moving data (after its stream's earlier ones)
    Time end = 0;    // when its last byte has crossed the port
  };
  // Books a transfer of stream `stream` that needs `work` ps of the port
  // alone and may start at `ready`.
  Booking book(int stream, Time ready, Time work);

  // When `stream`'s next transfer may start (its FIFO free time), and the
  // latest over all streams.
  Time free(int stream) const { return free_[stream]; }
  Time latest() const;
  void set_free(int stream, Time t) { free_[stream] = t; }
  void set_all_free(Time t);
  // The latest end of a span in which a stream other than `stream` moves
  // data (0: none). A booking of `stream` that starts at or after it is
  // plain FIFO: what a folded collective's replay checks before it bothers
  // with the spans (collectives/folded.cc).
  Time others_end(int stream) const;

  struct Segment {
    Time start = 0, end = 0;
    uint8_t streams = 0;  // bit s: stream s moves data in [start, end)
    bool operator==(const Segment&) const = default;
  };
  const std::vector<Segment>& segments() const { return segs_; }
  // The segments that end after `from`: all that a booking starting at or
  // after `from` can meet (book walks no earlier one).
  std::span<const Segment> segments_after(Time from) const;
  // Makes this port the one with these segments (disjoint, in time order)
  // and free times: a copy of another device's port from some time on,
  // which a folded collective's replay books as that device would.
  // `held_before`: how many older segments the original holds before them
  // (segments().size() less the tail's), which the copy counts without
  // holding, so it drops its oldest exactly when and as the original does
  // (kMaxSegments).
  void restore(std::span<const Segment> segs, const Time free[kStreams], size_t held_before = 0);
  // Everything a booking reads or changes is equal (segments, the count
  // held before them, free times, latest ends): two equal ports book alike.
  bool operator==(const Port&) const = default;

 private:
  // ORs `bit` into [start, end), splitting and merging segments.
  void mark(Time start, Time end, uint8_t bit);
  void prune();

  std::vector<Segment> segs_;  // disjoint, in time order, streams != 0
  size_t held_before_ = 0;     // a copy's: the original's older segments it does not hold (restore)
  Time free_[kStreams] = {};
  Time last_end_[kStreams] = {};  // the latest end marked for each stream (kept past pruning)
};

}  // namespace shardlab
