// Collectives as one meeting: when every member of a group is a thread of
// this process (Device::rendezvous), an all_reduce or all_gather need not
// pass its algorithm's messages step by step. A ring all_reduce over n
// members is 2(n-1) messages per member, and on a host with fewer cores
// than devices nearly every receive is a sleep and a wake-up; serving at
// tp 8 on 2 cores spent most of its wall time in those hand-offs.
//
// Instead every member deposits its buffers and clocks (its stream's time
// after the launch, its ports) at the group's meeting point
// (Fabric::meet). The last to arrive computes every member's result in
// exactly the order of operations the algorithm uses (below), while the
// others sleep, and wakes each of them once. Each member then replays the
// algorithm's messages on the link model from every member's clocks
// (tuner.h replay_collective, the replay folded phantom runs use) and puts
// its own sends and receives on its stream and ports (folded.h
// apply_replay): the same marks, bookings and end as the messages give.
//
// Bits. Direct all_reduce: ((x0 op x1) op x2) ... op x(n-1) for every
// element, as direct.cc's combine_in_member_order. Ring all_reduce: chunk c
// (chunk_range) is x[c+1], then x[c+2] op that, ..., x[c] op that (each
// member's own value on the left, as ring.cc's reduce_into on the
// receiver), divided by n for avg, and every member gets the owner's bits.
// Tree all_reduce: tree.cc's recursive halving replayed over copies of
// every member's buffer (at each step the receiver's own partial on the
// left), then chunk c from member c. all_gather copies. tests/collectives/rendezvous_test.cc runs both paths
// on the same inputs and compares every bit, stream, port and trace event.
//
// Covered: all_reduce and all_gather by direct, tree, or a single ring (a
// group inside one node; ring_plan(...).single()), on profiles without a
// PCIe tree, with at least one element, in a run that folds no rank.
// Anything else passes its messages as before.
#pragma once

#include <cstdint>

#include "collectives/collectives.h"
#include "collectives/tuner.h"

namespace shardlab::collectives::detail {

// A member's buffers and reduction (all_reduce: in and out of `count`
// elements; all_gather: in is its chunk of out). Null: phantom.
struct MeetData {
  const float* in = nullptr;
  float* out = nullptr;
  ReduceOp op = ReduceOp::kSum;
};

// Whether this call meets: the same answer on every member (it depends on
// the run, the group, the profile, the shape and the algorithm only).
bool can_meet(const Device& dev, const ProcessGroup& g, const CollShape& shape, Algo algo);

// Runs the call as a meeting on stream `s` (waiting for its inputs, after
// the launch). `tag`: the call's (ProcessGroup::next_tag). Members that
// disagree on the call (op, count, algorithm, reduction) fail with one
// error naming the group.
void run_met(Device& dev, const ProcessGroup& g, Stream& s, Tag tag, const CollShape& shape, Algo algo,
             const MeetData& data);

// Meetings completed in this process so far (tests: the path ran).
uint64_t meetings_completed();

}  // namespace shardlab::collectives::detail
