#include "collectives/folded.h"

#include <algorithm>
#include <cstring>
#include <span>
#include <stdexcept>
#include <vector>

#include <fmt/format.h>

#include "collectives/replay_share.h"
#include "runtime/errors.h"

namespace shardlab::collectives::detail {

namespace {

// Control messages use the call's tag with phase byte 0xFF (no algorithm has
// 255 phases), so they never mix with data messages.
constexpr Tag kControlPhase = 0xFF;

int index_of(const ProcessGroup& g, int global) {
  for (int i = 0; i < g.size(); ++i)
    if (g.global_rank(i) == global) return i;
  return -1;
}

// What a running member tells the others first: its clock, and the latest
// end of another stream's span on its ports (Port::others_end), which
// decides whether the replay needs the ports' spans (a second message).
struct Control {
  MemberClock clock;
  Time others_end = 0;
};

Control own_control(const Device& dev, const Stream& s) {
  Control c;
  c.clock = entry_clock(dev, s, &c.others_end);
  return c;
}

// Every running member's control message, by group index (folded members
// left empty). Control messages use the call's tag with phase byte 0xFF (no
// algorithm has 255 phases), so they never mix with data messages; a
// second exchange on the same tag (exchange_ports) follows in order.
std::vector<Control> running_controls(Device& dev, const ProcessGroup& g, const Stream& s, Tag ctl) {
  std::vector<Control> controls(size_t(g.size()));
  controls[size_t(g.rank())] = own_control(dev, s);
  const auto* mine = reinterpret_cast<const std::byte*>(&controls[size_t(g.rank())]);
  for (int i = 0; i < g.size(); ++i) {
    const int r = g.global_rank(i);
    if (i != g.rank() && !dev.folded(r)) dev.post_control(r, ctl, {mine, sizeof(Control)});
  }
  for (int i = 0; i < g.size(); ++i) {
    const int r = g.global_rank(i);
    if (i == g.rank() || dev.folded(r)) continue;
    const Message m = dev.take_control(r, ctl);
    SHARDLAB_CHECK(m.payload.size() == sizeof(Control), "folded collective: bad control message");
    std::memcpy(&controls[size_t(i)], m.payload.data(), sizeof(Control));
  }
  return controls;
}

// A device's ports from `from` on, as words: per replay slot its four
// streams' free times, the number of segments, the number it holds before
// them, then each segment's start, end and streams. Everything Port::book
// can meet from `from` on, and when the port drops its oldest segments.
void append_ports(const Device& dev, Time from, std::vector<Time>& out) {
  for (int q = 0; q < kReplayPorts; ++q) {
    const Port& port = device_port(dev, q);
    for (int k = 0; k < Port::kStreams; ++k) out.push_back(port.free(k));
    const std::span<const Port::Segment> segs = port.segments_after(from);
    out.push_back(static_cast<Time>(segs.size()));
    out.push_back(static_cast<Time>(port.segments().size() - segs.size()));
    for (const Port::Segment& g : segs) out.insert(out.end(), {g.start, g.end, Time{g.streams}});
  }
}

// append_ports' words back into ports[0, kReplayPorts).
void read_ports(std::span<const Time> words, std::span<Port> ports) {
  size_t at = 0;
  auto next = [&] {
    SHARDLAB_CHECK(at < words.size(), "folded collective: short port message");
    return words[at++];
  };
  std::vector<Port::Segment> segs;
  for (int q = 0; q < kReplayPorts; ++q) {
    Time free[Port::kStreams];
    for (Time& f : free) f = next();
    segs.resize(static_cast<size_t>(next()));
    // The copy counts the segments the port holds before the tail, so it
    // drops its oldest past Port::kMaxSegments as the port does.
    const auto held_before = static_cast<size_t>(next());
    for (Port::Segment& g : segs) {
      g.start = next();
      g.end = next();
      g.streams = static_cast<uint8_t>(next());
    }
    ports[size_t(q)].restore(segs, free, held_before);
  }
  SHARDLAB_CHECK(at == words.size(), "folded collective: long port message");
}

// Every member's ports from `from` on (group order, kReplayPorts each): the
// running members exchange theirs, a folded member gets its representative's.
std::vector<Port> exchange_ports(Device& dev, const ProcessGroup& g, Tag ctl, Time from,
                                 std::span<const int> rep_index) {
  std::vector<Port> ports(size_t(g.size()) * size_t(kReplayPorts));
  std::vector<Time> mine;
  append_ports(dev, from, mine);
  const std::span<const std::byte> bytes{reinterpret_cast<const std::byte*>(mine.data()), mine.size() * sizeof(Time)};
  for (int i = 0; i < g.size(); ++i) {
    const int r = g.global_rank(i);
    if (i != g.rank() && !dev.folded(r)) dev.post_control(r, ctl, bytes);
  }
  auto slots = [&](int i) { return std::span<Port>(ports).subspan(size_t(i) * size_t(kReplayPorts), size_t(kReplayPorts)); };
  // This device reads its own words back, so every member builds the same copies.
  read_ports(mine, slots(g.rank()));
  std::vector<Time> words;
  for (int i = 0; i < g.size(); ++i) {
    const int r = g.global_rank(i);
    if (i == g.rank() || dev.folded(r)) continue;
    const Message m = dev.take_control(r, ctl);
    SHARDLAB_CHECK(m.payload.size() % sizeof(Time) == 0, "folded collective: bad port message");
    words.resize(m.payload.size() / sizeof(Time));
    std::memcpy(words.data(), m.payload.data(), m.payload.size());
    read_ports(words, slots(i));
  }
  for (int i = 0; i < g.size(); ++i)
    if (rep_index[size_t(i)] != i) {
      const std::span<Port> from_rep = slots(rep_index[size_t(i)]);
      std::copy(from_rep.begin(), from_rep.end(), slots(i).begin());
    }
  return ports;
}

// Whether member `a`'s and member `b`'s bookings on replay slot q (marks
// in program order: ReplayOutcome::marks_of, which gives a member the marks
// of the member the replay played for it, the same bookings) are the same spans in
// the same order: then, from equal ports, the ports end equal (Port::book's
// end grows strictly with the work from a given start, so equal spans mean
// equal work, equal shares and equal backlogs). Empty transfers (a tree's
// empty piece) book nothing (Port::book) and are skipped.
bool same_bookings(std::span<const ReplayMark> a, std::span<const ReplayMark> b, int q) {
  auto on = [q](const ReplayMark& m) {
    return (m.send ? m.port : kNumLinkClasses + m.port) == q && m.booked_end > m.booked_start;
  };
  size_t i = 0, j = 0;
  while (true) {
    while (i < a.size() && !on(a[i])) ++i;
    while (j < b.size() && !on(b[j])) ++j;
    if (i == a.size() || j == b.size()) return i == a.size() && j == b.size();
    if (a[i].booked_start != b[j].booked_start || a[i].booked_end != b[j].booked_end) return false;
    ++i;
    ++j;
  }
}

}  // namespace

MemberClock entry_clock(const Device& dev, const Stream& s, Time* others_end) {
  MemberClock c;
  c.now = s.now();
  const int k = static_cast<int>(s.kind());
  *others_end = 0;
  for (int p = 0; p < kNumLinkClasses; ++p) {
    c.egress[p] = dev.egress(p).free(k);
    c.ingress[p] = dev.ingress(p).free(k);
    *others_end = std::max({*others_end, dev.egress(p).others_end(k), dev.ingress(p).others_end(k)});
  }
  return c;
}

const Port& device_port(const Device& dev, int q) {
  return q < kNumLinkClasses ? dev.egress(q) : dev.ingress(q - kNumLinkClasses);
}

void apply_replay(Device& dev, Stream& s, std::span<const ReplayMark> marks, const MemberClock& end,
                  const std::function<void(const ReplayMark&, const Port::Booking&)>& mismatch) {
  for (const ReplayMark& m : marks) {
    s.mark(m.send ? "send" : "recv", m.start, m.end, m.bytes, m.peer, /*advance=*/!m.send);
    // This device's ports take the bookings the unfolded run makes, in its
    // program order: later transfers of other streams share with them, and
    // the backlogs charged to other streams are the unfolded run's.
    const Port::Booking b = dev.book_replayed(m.send, m.port, s.kind(), m.ready, m.work);
    if (b.start != m.booked_start || b.end != m.booked_end) mismatch(m, b);
  }
  dev.set_ports(s.kind(), end.egress, end.ingress);
  s.wait({end.last_send});
}

bool has_folded_member(const Device& dev, const ProcessGroup& g) {
  if (!dev.folding()) return false;
  for (int r : g.members())
    if (dev.folded(r)) return true;
  return false;
}

void run_folded(Device& dev, const ProcessGroup& g, Stream& s, Tag tag, const CollShape& shape,
                Algo algo) {
  // NCCL's double binary tree: members at different places in the trees
  // end at different times, so no member can stand for another (auto
  // leaves dbtree out unless asked: tuner.h CollShape::dbtree).
  if (algo == Algo::kDbtree)
    throw FoldingError(fmt::format("folding: all_reduce (dbtree) on {}: a tree's members do not end alike, not "
                                   "foldable; run it unfolded or with another algorithm",
                                   g.to_string()));
  // A PCIe tree: members of one node see different links and shares
  // (link_model.h), which the folded replay's port checks do not follow.
  // Every member decides this from the group and the profile alike, before
  // any control message.
  if (!dev.profile().pcie.empty())
    for (size_t i = 0; i < g.members().size(); ++i)
      for (size_t j = 0; j < i; ++j)
        if (dev.profile().node_of(g.members()[i]) == dev.profile().node_of(g.members()[j]))
          throw FoldingError(fmt::format("folding: {} on {}: members {} and {} share a node's PCIe tree: not foldable "
                                         "exactly",
                                         op_kind_name(shape.op), g.to_string(), g.members()[j], g.members()[i]));
  const Tag ctl = tag + kControlPhase;
  const std::vector<Control> controls = running_controls(dev, g, s, ctl);
  std::vector<int> rep_index(size_t(g.size()));
  for (int i = 0; i < g.size(); ++i) {
    const int rep = dev.representative(g.global_rank(i));
    rep_index[size_t(i)] = index_of(g, rep);
    if (rep_index[size_t(i)] < 0)
      throw FoldingError(fmt::format(
          "folding: device {} of group {} is played by device {}, which is not in the group",
          g.global_rank(i), g.to_string(), rep));
  }
  std::vector<MemberClock> start(size_t(g.size()));
  for (int i = 0; i < g.size(); ++i) start[size_t(i)] = controls[size_t(rep_index[size_t(i)])].clock;
  // Folded members' ports may differ from their representatives' until the
  // doubt windows close; the replay is exact only after them.
  Time earliest = start.front().now;
  for (const MemberClock& c : start) earliest = std::min(earliest, c.now);
  for (int p = 0; p < kNumLinkClasses; ++p) {
    const Time until = std::max(dev.egress_doubt(p), dev.ingress_doubt(p));
    if (earliest < until)
      throw FoldingError(fmt::format(
          "folding: {} on {} starts at {} ps while folded peers' ports may be busy until {} ps: "
          "not foldable exactly",
          op_kind_name(shape.op), g.to_string(), earliest, until));
  }
  // Every transfer of the call is booked at or after `earliest` (a receive's
  // first byte follows its sender's start). Where no member's port has
  // another stream's span past it, Port::book is the FIFO the plain replay
  // computes. Otherwise every member's ports from `earliest` on (folded
  // members: their representatives', which they equal, see the doubt
  // windows) go into the replay, which books on copies of them as each
  // device would (docs/architecture.md, "Shared ports").
  bool shared = false;
  for (int i = 0; i < g.size(); ++i)
    if (rep_index[size_t(i)] == i && controls[size_t(i)].others_end > earliest) shared = true;
  // The running members of this process replay alike: one replay for all of
  // them (replay_share.h), which this member takes its marks from. Alone,
  // it keeps the marks of the members this device plays (the doubt check
  // below compares their bookings).
  std::vector<char> played(size_t(g.size()));
  int consumers = 0;
  for (int i = 0; i < g.size(); ++i) {
    played[size_t(i)] = rep_index[size_t(i)] == g.rank();
    if (dev.runs_here(g.global_rank(i))) ++consumers;
  }
  const std::shared_ptr<const SharedReplay> replayed = shared_replay(
      dev.profile(),
      ReplayInputs{interned_profile_text(dev.profile()), {g.members().begin(), g.members().end()}, shape, algo,
                   std::move(start), static_cast<int>(s.kind()),
                   shared ? exchange_ports(dev, g, ctl, earliest, rep_index) : std::vector<Port>{}},
      consumers, played);
  const std::vector<MemberClock>& end = replayed->outcome.end;
  const std::vector<Port>& ports = replayed->ports;
  const ReplayOutcome& outcome = replayed->outcome;
  std::vector<ReplayMark> marks;
  replay_marks(outcome, g.members(), g.rank(), &marks);
  const MemberClock& mine = end[size_t(g.rank())];
  for (int i = 0; i < g.size(); ++i) {
    const MemberClock& e = end[size_t(i)];
    const MemberClock& r = end[size_t(rep_index[size_t(i)])];
    if (e.now == r.now && e.last_send == r.last_send) {
      // Equal streams; ports may differ (their free times, or the spans a
      // later transfer of another stream would share): in doubt until the
      // later one frees.
      if (rep_index[size_t(i)] != g.rank() || i == g.rank()) continue;
      Time doubt[kReplayPorts] = {};
      bool any = false;
      for (int q = 0; q < kReplayPorts; ++q) {
        const int p = q % kNumLinkClasses;
        const bool out = q < kNumLinkClasses;
        const Time fe = out ? e.egress[p] : e.ingress[p], fr = out ? r.egress[p] : r.ingress[p];
        // Played as the same member (symmetric, or twins by period): the same bookings.
        if (fe == fr && (outcome.played(i) == outcome.played(g.rank()) ||
                         same_bookings(outcome.marks_of(i), outcome.marks_of(g.rank()), q)))
          continue;
        any = true;
        doubt[q] = std::max(fe, fr);
        if (shared)
          doubt[q] = std::max({doubt[q], ports[size_t(i * kReplayPorts + q)].latest(),
                               ports[size_t(g.rank() * kReplayPorts + q)].latest()});
      }
      if (any) dev.widen_doubt(doubt, doubt + kNumLinkClasses);
      continue;
    }
    // The stream's end and its last send's departure: either may differ.
    throw FoldingError(fmt::format(
        "folding: {} of {} elements ({}) on {} is not symmetric (device {} would end at {} ps, its last send "
        "leaving at {} ps; its representative {} at {} ps and {} ps): not foldable exactly",
        op_kind_name(shape.op), shape.count, algo_name(algo), g.to_string(), g.global_rank(i), e.now, e.last_send,
        g.global_rank(rep_index[size_t(i)]), r.now, r.last_send));
  }
  apply_replay(dev, s, marks, mine, [&](const ReplayMark& m, const Port::Booking& b) {
    throw FoldingError(fmt::format(
        "folding: {} on {}: device {}'s port books [{}, {}) ps where the replay booked [{}, {}) ps: not "
        "foldable exactly",
        op_kind_name(shape.op), g.to_string(), dev.rank(), b.start, b.end, m.booked_start, m.booked_end));
  });
}

}  // namespace shardlab::collectives::detail
