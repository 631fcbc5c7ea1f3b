// One replay of a folded collective for every running member of its group
// (collectives/replay_share.h): each member's part of the shared outcome
// equals the replay it would have computed alone (tolerance 0: clocks, marks,
// watched marks and port copies compared field by field); the members that
// ask with equal inputs replay once; an input that differs in any field the
// replay reads misses; an entry goes when its last consumer has taken it.
#include "collectives/replay_share.h"

#include <numeric>
#include <thread>

#include "tests/collectives/test_util.h"

namespace shardlab::collectives::testing {
namespace {

using detail::ReplayInputs;
using detail::shared_replay;
using detail::SharedReplay;

constexpr int kMembers = 24, kPlaces = 8;  // three nodes of h100-nvlink, folded by place (period 8)

HardwareProfile three_nodes() {
  HardwareProfile p = load_profile("h100-nvlink");
  p.nodes = 3;
  return p;
}

// A ring all-reduce over 24 consecutive GPUs, as a dp group folded by place
// enters it: member i starts as member i mod 8 (places 1.5 us apart on the
// stream, 0.7 us on the NIC's egress). With ports: every member's NIC ports
// carry a pipeline-stream span past the start, so the replay books on them.
ReplayInputs inputs(const HardwareProfile& p, bool with_ports) {
  ReplayInputs in;
  in.profile = detail::interned_profile_text(p);
  in.members.resize(kMembers);
  std::iota(in.members.begin(), in.members.end(), 0);
  in.shape = CollShape{OpKind::kAllReduce, size_t(kMembers) * 1000003, 2, 0, Proto::kSimple};
  in.algo = Algo::kRing;
  in.stream = static_cast<int>(StreamKind::kComm);
  in.clocks.resize(kMembers);
  for (int i = 0; i < kMembers; ++i) {
    MemberClock& c = in.clocks[size_t(i)];
    c.now = collective_start(p, kMembers, Proto::kSimple) + (i % kPlaces) * 1'500'000;
    c.egress[1] = c.now + (i % kPlaces) * 700'000;
  }
  if (!with_ports) return in;
  in.ports.resize(size_t(kMembers) * kReplayPorts);
  for (int i = 0; i < kMembers; ++i)
    for (int q = 0; q < kReplayPorts; ++q) {
      const MemberClock& c = in.clocks[size_t(i)];
      const Time free[Port::kStreams] = {0, q % kNumLinkClasses == 1 ? c.egress[1] : 0, c.now + 30'000'000, 0};
      const Port::Segment nic{c.now + 1'000'000, c.now + 30'000'000, uint8_t(1u << 2)};
      in.ports[size_t(i * kReplayPorts + q)].restore(
          q % kNumLinkClasses == 1 ? std::span<const Port::Segment>(&nic, 1) : std::span<const Port::Segment>(),
          free);
    }
  return in;
}

// What member `me` computed alone before the replay was shared.
struct Alone {
  std::vector<MemberClock> end;
  std::vector<ReplayMark> marks, watched;
  std::vector<Port> ports;
};
Alone alone(const HardwareProfile& p, const ReplayInputs& in, int me, std::span<const char> watch) {
  Alone a;
  a.ports = in.ports;
  const ReplayPorts ports{a.ports, in.stream};
  a.end = replay_collective(p, in.members, in.shape, in.algo, in.clocks, me, &a.marks, watch, &a.watched,
                            a.ports.empty() ? nullptr : &ports);
  return a;
}

// The members member `me` plays (folded by place: its twins on the other nodes).
std::vector<char> played_by(int me) {
  std::vector<char> v(kMembers);
  for (int i = 0; i < kMembers; ++i) v[size_t(i)] = i % kPlaces == me % kPlaces;
  return v;
}

// Member me's part of `r` equals its replay alone; returns the marks
// compared and raises `max_diff` to the largest difference of an end or a
// mark's times (ps).
size_t expect_as_alone(const HardwareProfile& p, const ReplayInputs& in, const SharedReplay& r, int me,
                       Time& max_diff) {
  const std::vector<char> watch = played_by(me);
  const Alone a = alone(p, in, me, watch);
  std::vector<ReplayMark> marks, watched;
  replay_marks(r.outcome, in.members, me, &marks, watch, &watched);
  auto diff = [&](Time a, Time b) { max_diff = std::max(max_diff, a > b ? a - b : b - a); };
  for (size_t i = 0; i < a.end.size() && i < r.outcome.end.size(); ++i) {
    diff(a.end[i].now, r.outcome.end[i].now);
    diff(a.end[i].last_send, r.outcome.end[i].last_send);
  }
  for (size_t i = 0; i < a.marks.size() && i < marks.size(); ++i) {
    diff(a.marks[i].start, marks[i].start);
    diff(a.marks[i].end, marks[i].end);
  }
  EXPECT_EQ(r.outcome.end, a.end) << "member " << me;
  EXPECT_EQ(marks, a.marks) << "member " << me;
  EXPECT_EQ(watched, a.watched) << "member " << me;
  EXPECT_EQ(r.ports, a.ports) << "member " << me;
  return marks.size() + watched.size();
}

TEST(ReplayShareTest, EveryRunningMemberTakesTheReplayItWouldHaveComputed) {
  const HardwareProfile p = three_nodes();
  for (bool with_ports : {false, true}) {
    const ReplayInputs in = inputs(p, with_ports);
    const detail::ReplayShareCounts before = detail::replay_share_counts();
    // The 8 running members (node 0's places) ask at once.
    std::vector<std::shared_ptr<const SharedReplay>> got(kPlaces);
    std::vector<std::thread> threads;
    for (int me = 0; me < kPlaces; ++me)
      threads.emplace_back([&, me] { got[size_t(me)] = shared_replay(p, in, kPlaces, played_by(me)); });
    for (std::thread& t : threads) t.join();
    const detail::ReplayShareCounts after = detail::replay_share_counts();
    EXPECT_EQ(after.replayed - before.replayed, 1u);
    EXPECT_EQ(after.reused - before.reused, uint64_t(kPlaces - 1));
    size_t compared = 0;
    Time max_diff = 0;
    for (int me = 0; me < kPlaces; ++me) {
      EXPECT_EQ(got[size_t(me)].get(), got[0].get());
      EXPECT_EQ(got[size_t(me)]->outcome.period, kPlaces);
      compared += expect_as_alone(p, in, *got[size_t(me)], me, max_diff);
    }
    EXPECT_GT(compared, 0u);
    // Alone (one running member here): the same as shared.
    size_t alone_compared = 0;
    for (int me : {0, 5}) {
      const auto r = shared_replay(p, in, 1, played_by(me));
      alone_compared += expect_as_alone(p, in, *r, me, max_diff);
    }
    EXPECT_EQ(detail::replay_share_counts().replayed, after.replayed);  // alone: not in the table
    std::printf("  %s: 1 replay for %d members, %zu marks equal to each one's own replay (tolerance 0, max "
                "difference %lld ps), %zu alone\n",
                with_ports ? "ports" : "FIFO clocks", kPlaces, compared, static_cast<long long>(max_diff),
                alone_compared);
    EXPECT_EQ(max_diff, 0);
  }
}

TEST(ReplayShareTest, AnInputThatDiffersMisses) {
  const HardwareProfile p = three_nodes();
  const ReplayInputs base = inputs(p, true);
  HardwareProfile slower = p;
  slower.inter.latency_us += 0.001;  // one nanosecond more between nodes
  std::vector<std::pair<const char*, ReplayInputs>> variants;
  auto vary = [&](const char* what, auto change, const HardwareProfile& q) {
    ReplayInputs v = base;
    change(v);
    v.profile = detail::interned_profile_text(q);
    variants.emplace_back(what, std::move(v));
  };
  vary("a member's stream clock", [](ReplayInputs& v) { v.clocks[13].now += 1; }, p);
  vary("a member's ingress clock", [](ReplayInputs& v) { v.clocks[20].ingress[0] += 1; }, p);
  vary("a port segment's end", [](ReplayInputs& v) {
    Port& port = v.ports[size_t(9 * kReplayPorts + 1)];
    std::vector<Port::Segment> segs = port.segments();
    segs.back().end += 1;
    const Time free[Port::kStreams] = {port.free(0), port.free(1), port.free(2), port.free(3), port.free(4)};
    port.restore(segs, free);
  }, p);
  vary("a port's free time", [](ReplayInputs& v) { v.ports[size_t(17 * kReplayPorts + 3)].set_free(2, 1); }, p);
  vary("the segments a port holds before its copy", [](ReplayInputs& v) {
    Port& port = v.ports[size_t(4 * kReplayPorts + 1)];
    const std::vector<Port::Segment> segs = port.segments();
    const Time free[Port::kStreams] = {port.free(0), port.free(1), port.free(2), port.free(3), port.free(4)};
    port.restore(segs, free, 4000);
  }, p);
  vary("the stream", [](ReplayInputs& v) { v.stream = static_cast<int>(StreamKind::kPipeline); }, p);
  vary("the count", [](ReplayInputs& v) { v.shape.count += kMembers; }, p);
  vary("the protocol", [](ReplayInputs& v) { v.shape.proto = Proto::kLL128; }, p);
  vary("the algorithm", [](ReplayInputs& v) { v.algo = Algo::kDirect; }, p);
  vary("the members", [](ReplayInputs& v) { std::swap(v.members[3], v.members[4]); }, p);
  vary("the profile", [](ReplayInputs&) {}, slower);
  const HardwareProfile* profile_of_variant;
  auto counts = [] { return detail::replay_share_counts(); };
  // The base entry waits for its second consumer while every variant comes and goes.
  detail::ReplayShareCounts c0 = counts();
  const auto first = shared_replay(p, base, 2, played_by(0));
  EXPECT_EQ(counts().replayed, c0.replayed + 1);
  for (const auto& [what, v] : variants) {
    profile_of_variant = v.profile == base.profile ? &p : &slower;
    const detail::ReplayShareCounts c = counts();
    const auto miss = shared_replay(*profile_of_variant, v, 2, played_by(0));
    EXPECT_EQ(counts().replayed, c.replayed + 1) << what << " did not miss";
    EXPECT_NE(miss.get(), first.get()) << what;
    Time max_diff = 0;
    expect_as_alone(*profile_of_variant, v, *miss, 0, max_diff);
    EXPECT_EQ(max_diff, 0) << what;
    const auto again = shared_replay(*profile_of_variant, v, 2, played_by(1));  // its second consumer
    EXPECT_EQ(again.get(), miss.get()) << what;
    EXPECT_EQ(counts().reused, c.reused + 1) << what;
  }
  const auto second = shared_replay(p, base, 2, played_by(1));
  EXPECT_EQ(second.get(), first.get());
  // Both consumers have taken it: the entry is gone, the next ask replays.
  c0 = counts();
  const auto third = shared_replay(p, base, 2, played_by(0));
  EXPECT_EQ(counts().replayed, c0.replayed + 1);
  EXPECT_NE(third.get(), first.get());
  (void)shared_replay(p, base, 2, played_by(1));
  std::printf("  %zu inputs that differ in one field each missed the shared replay\n", variants.size());
}

}  // namespace
}  // namespace shardlab::collectives::testing
