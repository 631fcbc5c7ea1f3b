// The tuner's replay (collectives/tuner.cc, replay_algos.cc): each member's
// clocks and ports as Device and Ctx keep them, and the message schedule of
// every algorithm played on them. Internal to the collectives library.
#pragma once

#include <map>
#include <span>
#include <vector>

#include "collectives/detail.h"
#include "collectives/tuner.h"
#include "runtime/link_model.h"

namespace shardlab::collectives::replay {

// A message in flight: what the receiver needs to book its ingress port.
struct Posted {
  bool sent = false;  // false: no message (an empty tree piece)
  Time depart = 0;
  Time wire = 0;
  Time latency = 0;
  int port = 0;
  int from = -1;  // group index of the sender
  uint64_t bytes = 0;
  Time left = 0;  // when its last byte left the egress port (depart + wire on a FIFO port)
};

// One member's clocks, as Device (stream, ports) and Ctx (last send) keep them.
using Clock = MemberClock;

class Replay {
 public:
  Replay(const HardwareProfile& p, std::span<const int> members, int elem_size, Proto proto)
      : p_(p),
        links_(p),
        dpn_(p.devices_per_node),
        members_(members),
        esize_(static_cast<uint64_t>(elem_size)),
        engine_(proto_engine(proto)),
        clocks_(members.size()) {
    for (Clock& c : clocks_) c.now = collective_start(p, n(), proto);
  }
  // From given clocks (after the collective's start).
  Replay(const HardwareProfile& p, std::span<const int> members, int elem_size, Proto proto,
         std::span<const Clock> start)
      : Replay(p, members, elem_size, proto) {
    clocks_.assign(start.begin(), start.end());
    for (Clock& c : clocks_) c.last_send = 0;
  }
  const std::vector<Clock>& clocks() const { return clocks_; }
  std::vector<Clock>& clocks() { return clocks_; }
  // Keeps the marks of the played members that stand for a member i with
  // need[i] != 0 (after set_symmetric or set_period), each peer as a group
  // index, in the replay's order (take_kept sorts them by member).
  void keep(std::span<const char> need) {
    keep_.assign(members_.size(), 0);
    for (size_t i = 0; i < need.size(); ++i)
      if (need[i]) keep_[size_t(symmetric_ ? 0 : base(int(i)))] = 1;
  }
  // The kept marks by member (stably: each in program order), member r's at
  // [first[r], first[r + 1]).
  void take_kept(std::vector<ReplayMark>& marks, std::vector<size_t>& first) {
    first.assign(members_.size() + 1, 0);
    for (const ReplayMark& m : kept_) ++first[size_t(m.index) + 1];
    for (size_t i = 1; i < first.size(); ++i) first[i] += first[i - 1];
    marks.resize(kept_.size());
    std::vector<size_t> at(first.begin(), first.end() - 1);
    for (ReplayMark& m : kept_) {
      const auto r = size_t(m.index);
      m.index = -1;
      marks[at[r]++] = m;
    }
    kept_.clear();
  }
  // Ctx::set_rate_cap: every later send moves at most at this rate (0: none).
  void set_rate_cap(uint64_t bytes_per_second) { cap_ = bytes_per_second; }
  // Books every transfer on these ports (tuner.h: ReplayPorts).
  void use_ports(const ReplayPorts* ports) { ports_ = ports; }
  // Member 0 stands for every member (uniform_pairs, replay_time): the
  // lock-step exchanges below replay it alone; the others keep their start.
  void set_symmetric() { symmetric_ = true; }
  // After a symmetric replay: every member ends as member 0.
  void spread() {
    for (Clock& c : clocks_) c = clocks_[0];
  }
  bool symmetric() const { return symmetric_; }
  // Members i and i + m are alike (replay_period): the lock-step exchanges
  // replay members 0..m-1 alone, each of whose messages stands for its
  // twins m, 2m, ... further on; spread_period() then copies their clocks.
  void set_period(int m) { period_ = m; }
  int period() const { return period_; }
  // The members a lock-step exchange replays, and the one that stands for member i.
  int played() const { return period_ > 0 ? period_ : n(); }
  int base(int i) const { return period_ > 0 ? i % period_ : i; }
  // Member i's message: its base's, from i (the receiver logs i as its peer).
  static Posted twin(Posted m, int from) {
    m.from = from;
    return m;
  }
  void spread_period() {
    for (int i = period_; i < n(); ++i) clocks_[size_t(i)] = clocks_[size_t(i % period_)];
    if (!ports_) return;
    const size_t stride = size_t(period_) * size_t(kReplayPorts);
    for (size_t q = stride; q < ports_->ports.size(); ++q)
      ports_->ports[q] = ports_->ports[q % stride];
  }

  int n() const { return static_cast<int>(members_.size()); }
  const HardwareProfile& profile() const { return p_; }
  std::span<const int> members() const { return members_; }
  // Group index `offset` steps from `me` (wraps), as Ctx::rel.
  int rel(int me, int offset) const { return ((me + offset) % n() + n()) % n(); }

  // Ctx::open_lanes: every member's channels 0..C-1 get a cursor each, from
  // its stream time (a no-op while open); close_lanes, as Ctx::finish,
  // brings each member's stream to its latest lane.
  void open_lanes(int channels) {
    if (lane_channels_ > 0) return;
    lane_channels_ = channels;
    lanes_.resize(size_t(n()) * size_t(channels));
    for (int r = 0; r < n(); ++r)
      for (int ch = 0; ch < channels; ++ch) lanes_[size_t(r * channels + ch)] = clocks_[size_t(r)].now;
  }
  void close_lanes() {
    if (lane_channels_ == 0) return;
    for (int r = 0; r < n(); ++r)
      for (int ch = 0; ch < lane_channels_; ++ch)
        clocks_[size_t(r)].now = std::max(clocks_[size_t(r)].now, lanes_[size_t(r * lane_channels_ + ch)]);
    lane_channels_ = 0;
  }
  // Member r's cursor: its stream, or its lane `lane` (Ctx::on_lane).
  Time& cursor(int r, int lane) {
    return lane < 0 ? clocks_[size_t(r)].now : lanes_[size_t(r * lane_channels_ + lane)];
  }

  // Device::isend: depart = max(stream, egress free); egress held for w.
  Posted send(int from, int to, size_t count, int lane = -1) {
    Link l = links_.link(members_[static_cast<size_t>(from)], members_[static_cast<size_t>(to)]);
    if (cap_ > 0 && cap_ < l.bytes_per_second) l.bytes_per_second = cap_;  // Ctx::set_rate_cap
    if (links_.shares_intra()) {
      // Ctx::send's cap: this step's share of the PCIe tree's shared links.
      const int node = members_[static_cast<size_t>(from)] / dpn_;
      auto it = local_.find(node);
      if (it == local_.end()) it = local_.emplace(node, links_.local_members(members_, node)).first;
      const uint64_t cap = links_.shared_rate(members_[static_cast<size_t>(from)], members_[static_cast<size_t>(to)],
                                              members_, it->second, ((to - from) % n() + n()) % n());
      if (cap > 0 && cap < l.bytes_per_second) l.bytes_per_second = cap;
    }
    Clock& c = clocks_[static_cast<size_t>(from)];
    const int port = static_cast<int>(l.port);
    const Time ready = cursor(from, lane);
    const Time wire = l.wire_time(count * esize_, engine_);
    Posted m{true, std::max(ready, c.egress[port]), wire, l.latency_of(engine_), port};
    m.left = m.depart + wire;
    if (ports_) {
      // Device::isend: Port::book, shared with the other streams' spans.
      Port& e = ports_->ports[static_cast<size_t>(from * kReplayPorts + port)];
      const Port::Booking b = e.book(ports_->stream, ready, wire);
      m.depart = b.start;
      m.left = b.end;
      c.egress[port] = e.free(ports_->stream);
    } else {
      c.egress[port] = m.left;
    }
    c.last_send = std::max(c.last_send, m.left);
    m.from = from;
    m.bytes = count * esize_;
    log(from, to, {.send = true, .start = m.depart, .end = m.left,
               .bytes = m.bytes, .port = port, .ready = ready, .work = wire, .booked_start = m.depart,
               .booked_end = m.left});
    return m;
  }
  // Device::recv: arrival = max(depart + a, ingress free) + w; the stream waits.
  void recv(int at, const Posted& m, int lane = -1) {
    Clock& c = clocks_[static_cast<size_t>(at)];
    Time& now = cursor(at, lane);
    const Time first = m.depart + m.latency;
    Port::Booking b{std::max(first, c.ingress[m.port]), 0};
    b.end = b.start + m.wire;
    if (ports_) {
      Port& in = ports_->ports[static_cast<size_t>(at * kReplayPorts + kNumLinkClasses + m.port)];
      b = in.book(ports_->stream, first, m.wire);
      c.ingress[m.port] = in.free(ports_->stream);
    } else {
      c.ingress[m.port] = b.end;
    }
    const Time arrival = std::max(b.end, m.left + m.latency);
    log(at, m.from, {.send = false, .start = now, .end = arrival,
             .bytes = m.bytes, .port = m.port, .ready = first, .work = m.wire, .booked_start = b.start,
             .booked_end = b.end});
    now = std::max(now, arrival);
  }
  // Ctx::finish: the stream also covers the last send; the latest member's end.
  Time makespan() const {
    Time t = 0;
    for (const Clock& c : clocks_) t = std::max({t, c.now, c.last_send});
    return t;
  }

 private:
  const HardwareProfile& p_;
  ProfileLinkModel links_;
  int dpn_;                                     // devices per node
  std::map<int, std::vector<int>> local_;       // PCIe trees: each node's members (group indices)
  std::span<const int> members_;
  uint64_t esize_;
  uint64_t cap_ = 0;  // set_rate_cap
  Engine engine_;  // the protocol's (proto_engine)
  std::vector<Clock> clocks_;
  std::vector<Time> lanes_;  // n x lane_channels_: member r's lane ch at r * lane_channels_ + ch
  int lane_channels_ = 0;    // 0: no lanes open
  // Member r's mark, kept if r stands for a needed member (keep).
  void log(int r, int peer, ReplayMark mark) {
    if (keep_.empty() || !keep_[static_cast<size_t>(r)]) return;
    mark.peer = peer;
    mark.index = r;  // until take_kept
    kept_.push_back(mark);
  }

  std::vector<char> keep_;         // by group index: whose marks are kept
  std::vector<ReplayMark> kept_;   // in the replay's order
  const ReplayPorts* ports_ = nullptr;
  bool symmetric_ = false;
  int period_ = 0;  // 0: every member replayed
};

// Plays `algo`'s messages for `s` on R (replay_algos.cc), then closes its lanes.
void play(Replay& R, const HardwareProfile& p, std::span<const int> members, const RingPlan& plan,
          const CollShape& s, Algo algo);

}  // namespace shardlab::collectives::replay
