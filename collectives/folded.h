// Folded collectives: a collective whose group holds ranks that no thread
// runs (a phantom run folds ranks that are provably symmetric, such as the
// data-parallel replicas and the tensor-parallel peers of a dense model;
// model/engine/fold.h decides). Internal to collectives/.
//
// Every running member of the group replays the whole algorithm over all
// members on the link model (tuner.h: replay_collective), each folded member
// starting from its representative's clocks, and takes its own result: the
// stream marks of its sends and receives, its ports, its end. The running
// members first tell each other their clocks with untimed control messages;
// where another stream moves data on a member's port after the call's
// start, also their ports from then on, and the replay books every member's
// transfers on copies of them as the device would (runtime/port.h), so the
// shared ports give the unfolded run's times.
// The replay is exact, so the result equals the unfolded run's as long as
// the folded members really are in their representatives' state: after the
// replay every folded member must end exactly where its representative
// ends, or the call fails ("not symmetric"), so folding never changes a
// reported figure silently.
#pragma once

#include <functional>
#include <span>

#include "collectives/collectives.h"
#include "collectives/tuner.h"

namespace shardlab::collectives::detail {

// Whether any member of `g` is folded (played by another rank).
bool has_folded_member(const Device& dev, const ProcessGroup& g);

// A member's clocks as it enters a call on stream `s` (after the launch),
// and the latest end of another stream's span on its ports (others_end).
MemberClock entry_clock(const Device& dev, const Stream& s, Time* others_end);
// The device's port of replay slot q (tuner.h: egress by link class, then ingress).
const Port& device_port(const Device& dev, int q);
// Puts a member's replayed call on its stream and ports, as its sends and
// receives would have: marks the transfers, books them on its ports in
// program order (`mismatch` is called where a booking differs from the
// replay's), sets the stream's port clocks to `end` and waits for the last
// send. Shared by the folded and the rendezvous paths.
void apply_replay(Device& dev, Stream& s, std::span<const ReplayMark> marks, const MemberClock& end,
                  const std::function<void(const ReplayMark&, const Port::Booking&)>& mismatch);

// Runs the collective `shape` by `algo` on stream `s` (already waiting for
// its inputs) for this member, as the unfolded members would. `tag` is the
// call's tag (ProcessGroup::next_tag). Data is never moved: folding exists
// only in phantom runs.
void run_folded(Device& dev, const ProcessGroup& g, Stream& s, Tag tag, const CollShape& shape,
                Algo algo);

}  // namespace shardlab::collectives::detail
