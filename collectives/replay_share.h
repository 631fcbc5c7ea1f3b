// One replay of a folded collective for every running member of its group
// in this process (folded.cc). Internal to collectives/.
//
// The running members of a group with folded members each replay the whole
// collective (folded.h), and they replay it from the same inputs: they told
// each other their clocks (and, where another stream shares a port, their
// ports), and every folded member starts from its representative's. So they
// would compute the same replay, each taking its own marks from it. Here the
// first member to ask replays, keeping the marks of every member the replay
// plays (ReplayOutcome); the others wait for it and take their marks from the
// same outcome (replay_marks). The DeepSeek-V3 step on 2,048 GPUs folds by
// place to 8 running members of every dp and ep group: one replay where
// there were eight.
//
// Exactness: an outcome is reused only for inputs equal to the ones it was
// replayed from, compared in full (not by hash): the profile (its interned
// text, every field), the members, the shape and algorithm, every member's
// start clocks, the stream and every port copy the replay books on
// (segments, the count held before them, free times). The replay is a pure
// function of these, so a reuse gives the bits a replay would.
//
// Thread safety: any device thread may ask; an entry is filled once, outside
// the table's lock, while the others wait for it (std::call_once), and goes
// when the last of `consumers` has taken it. Entries whose consumers never
// all come (a run that failed mid-call) are dropped past kMaxEntries.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "collectives/tuner.h"
#include "runtime/port.h"
#include "runtime/profile.h"

namespace shardlab::collectives::detail {

// The profile's text (profile_to_json: every field), interned for the
// process: two profiles share a pointer exactly when every field is equal,
// whatever their addresses. Cached per thread for the profile it last met.
const std::string* interned_profile_text(const HardwareProfile& p);

// Everything a replay reads (replay_outcome's arguments but the profile's
// object, and `need`: a shared outcome keeps every played member's marks).
struct ReplayInputs {
  const std::string* profile = nullptr;  // interned_profile_text
  std::vector<int> members;
  CollShape shape;  // its proto not kAuto
  Algo algo = Algo::kRing;
  std::vector<MemberClock> clocks;
  int stream = 0;           // the stream kind the replay books for (with ports)
  std::vector<Port> ports;  // every member's copies (ReplayPorts' layout); empty: FIFO clocks
  bool operator==(const ReplayInputs&) const = default;
};

struct SharedReplay {
  ReplayOutcome outcome;
  std::vector<Port> ports;  // the copies after the replay (empty without)
};

// The replay of `in` on `p` (whose text is in.profile), shared by the
// `consumers` running members of this process that ask for it (consumers
// <= 1: replayed for the caller alone, keeping the marks `need` says).
std::shared_ptr<const SharedReplay> shared_replay(const HardwareProfile& p, ReplayInputs in, int consumers,
                                                  std::span<const char> need);

// How many shared replays this process computed and how many it reused
// (tests; counted only for consumers > 1).
struct ReplayShareCounts {
  uint64_t replayed = 0, reused = 0;
};
ReplayShareCounts replay_share_counts();

inline constexpr size_t kMaxSharedReplays = 512;

}  // namespace shardlab::collectives::detail
