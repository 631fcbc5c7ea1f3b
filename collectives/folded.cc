#include "collectives/folded.h"

#include <cstring>
#include <stdexcept>
#include <vector>

#include <fmt/format.h>

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

MemberClock own_clock(const Device& dev, const Stream& s) {
  MemberClock c;
  c.now = s.now();
  const int k = static_cast<int>(s.kind());
  for (int p = 0; p < kNumLinkClasses; ++p) {
    c.egress[p] = dev.egress(p).free(k);
    c.ingress[p] = dev.ingress(p).free(k);
  }
  return c;
}

// Every running member's clock, by group index (folded members left empty).
std::vector<MemberClock> running_clocks(Device& dev, const ProcessGroup& g, const Stream& s,
                                        Tag tag) {
  std::vector<MemberClock> clocks(size_t(g.size()));
  clocks[size_t(g.rank())] = own_clock(dev, s);
  const Tag ctl = tag + kControlPhase;
  const auto* mine = reinterpret_cast<const std::byte*>(&clocks[size_t(g.rank())]);
  for (int i = 0; i < g.size(); ++i) {
    const int r = g.global_rank(i);
    if (i != g.rank() && !dev.folded(r)) dev.post_control(r, ctl, {mine, sizeof(MemberClock)});
  }
  for (int i = 0; i < g.size(); ++i) {
    const int r = g.global_rank(i);
    if (i == g.rank() || dev.folded(r)) continue;
    const Message m = dev.take_control(r, ctl);
    SHARDLAB_CHECK(m.payload.size() == sizeof(MemberClock), "folded collective: bad control message");
    std::memcpy(&clocks[size_t(i)], m.payload.data(), sizeof(MemberClock));
  }
  return clocks;
}

}  // namespace

bool has_folded_member(const Device& dev, const ProcessGroup& g) {
  if (!dev.folding()) return false;
  for (int r : g.members())
    if (dev.folded(r)) return true;
  return false;
}

void run_folded(Device& dev, const ProcessGroup& g, Stream& s, Tag tag, const CollShape& shape,
                Algo algo) {
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
  std::vector<MemberClock> start = running_clocks(dev, g, s, tag);
  std::vector<int> rep_index(size_t(g.size()));
  for (int i = 0; i < g.size(); ++i) {
    const int rep = dev.representative(g.global_rank(i));
    rep_index[size_t(i)] = index_of(g, rep);
    if (rep_index[size_t(i)] < 0)
      throw FoldingError(fmt::format(
          "folding: device {} of group {} is played by device {}, which is not in the group",
          g.global_rank(i), g.to_string(), rep));
  }
  for (int i = 0; i < g.size(); ++i) start[size_t(i)] = start[size_t(rep_index[size_t(i)])];
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
  // The replay knows one stream, and so does this check: the run it stands
  // for would share a port with another stream of this device (port.h)
  // wherever a transfer of this device, or of a member it plays, overlaps
  // that stream's spans. Elsewhere the shared port is a FIFO, as replayed.
  std::vector<char> played(size_t(g.size()));
  for (int i = 0; i < g.size(); ++i) played[size_t(i)] = rep_index[size_t(i)] == g.rank();
  std::vector<ReplayMark> marks, spans;
  const std::vector<MemberClock> end =
      replay_collective(dev.profile(), g.members(), shape, algo, start, g.rank(), &marks, played, &spans);
  const ProfileLinkModel links(dev.profile());
  const int stream = static_cast<int>(s.kind());
  for (const ReplayMark& m : spans) {
    const Link l = m.send ? links.link(m.member, m.peer) : links.link(m.peer, m.member);
    const Port& port = m.send ? dev.egress(static_cast<int>(l.port)) : dev.ingress(static_cast<int>(l.port));
    const Time from = m.send ? m.start : m.end - l.wire_time(m.bytes, proto_engine(shape.proto));
    if (port.others_in(stream, from, m.end))
      throw FoldingError(fmt::format(
          "folding: {} on {} shares device {}'s ports with another stream's transfers in [{}, {}) ps: "
          "not foldable exactly",
          op_kind_name(shape.op), g.to_string(), m.member, from, m.end));
  }
  const MemberClock& mine = end[size_t(g.rank())];
  for (int i = 0; i < g.size(); ++i) {
    const MemberClock& e = end[size_t(i)];
    const MemberClock& r = end[size_t(rep_index[size_t(i)])];
    if (e.now == r.now && e.last_send == r.last_send) {
      // Equal streams; ports may differ: in doubt until the later one frees.
      if (rep_index[size_t(i)] == g.rank() && !(e == r)) {
        Time eg[kNumLinkClasses], in[kNumLinkClasses];
        for (int p = 0; p < kNumLinkClasses; ++p) {
          eg[p] = std::max(e.egress[p], r.egress[p]);
          in[p] = std::max(e.ingress[p], r.ingress[p]);
        }
        dev.widen_doubt(eg, in);
      }
      continue;
    }
    throw FoldingError(fmt::format(
        "folding: {} of {} elements ({}) on {} is not symmetric (device {} would end at {} ps, its "
        "representative {} at {} ps): not foldable exactly",
        op_kind_name(shape.op), shape.count, algo_name(algo), g.to_string(), g.global_rank(i), end[size_t(i)].now,
        g.global_rank(rep_index[size_t(i)]), end[size_t(rep_index[size_t(i)])].now));
  }
  for (const ReplayMark& m : marks) {
    s.mark(m.send ? "send" : "recv", m.start, m.end, m.bytes, m.peer, /*advance=*/!m.send);
    // The spans the real run would have booked, for later transfers of other
    // streams to share (port.h).
    if (m.send)
      dev.note_send(s.kind(), m.peer, m.start, m.end);
    else
      dev.note_recv(s.kind(), m.peer, m.end, m.bytes, proto_engine(shape.proto));
  }
  dev.set_ports(s.kind(), mine.egress, mine.ingress);
  s.wait({mine.last_send});
}

}  // namespace shardlab::collectives::detail
