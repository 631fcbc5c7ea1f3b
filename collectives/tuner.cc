// The tuner's cost model: each algorithm's message schedule replayed on the
// link model's port clocks (see tuner.h for the rules and the closed forms).
//
// Every function below mirrors one algorithm of ring.cc, tree.cc, dbtree.cc, direct.cc
// or all_to_all.cc message for message, in the same order: which member
// sends how many elements to whom, and in which order each member receives.
// A lock-step algorithm (each member posts its step's sends, then takes its
// step's receives) is evaluated step by step over all members: the sends of
// a step depend only on the state after the previous step. Trees and chains
// are evaluated in dependency order (parents before children, or the chain's
// upstream member first).
#include "collectives/tuner.h"

#include <algorithm>
#include <map>
#include <vector>

#include "collectives/detail.h"
#include "runtime/errors.h"
#include "runtime/link_model.h"

namespace shardlab::collectives {
namespace {

using detail::ceil_log2;
using detail::wrapped_ranges;

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

// Whether every ordered pair of distinct members has the same link: all in
// one node without a PCIe tree, or each on a node of its own at the same
// local GPU (ProfileLinkModel::link depends on nothing else). Started alike,
// the members of a lock-step exchange (ring steps, channel rings, direct
// exchanges, shift rounds: every member sends and receives the same sizes
// at the same offsets) then stay alike after every round, so member 0's
// replay is every member's: O(rounds) instead of O(n x rounds), which at dp
// 3,125 is what the tuner can afford (README "Today's scale").
bool uniform_pairs(const HardwareProfile& p, std::span<const int> members) {
  if (members.size() < 2) return false;
  const int dpn = p.devices_per_node;
  std::vector<int> nodes;
  nodes.reserve(members.size());
  for (int m : members) {
    if (m % dpn != members[0] % dpn) {
      nodes.clear();
      break;
    }
    nodes.push_back(m / dpn);
  }
  if (!nodes.empty()) {
    std::sort(nodes.begin(), nodes.end());
    if (std::adjacent_find(nodes.begin(), nodes.end()) == nodes.end()) return true;  // a node each
  }
  if (!p.pcie.empty()) return false;
  for (int m : members)
    if (m / dpn != members[0] / dpn) return false;
  return true;  // one node, one link
}

bool same_link(const Link& a, const Link& b) {
  return a.port == b.port && a.latency == b.latency && a.bytes_per_second == b.bytes_per_second &&
         a.header_bytes == b.header_bytes &&
         std::equal(a.payload_bytes, a.payload_bytes + 2, b.payload_bytes) &&
         std::equal(a.proto_latency_delta, a.proto_latency_delta + kNumProtocols,
                    b.proto_latency_delta) &&
         std::equal(a.proto_share_ppm, a.proto_share_ppm + kNumProtocols, b.proto_share_ppm);
}

// The period of a group whose members sit in node blocks (m members on the
// first node, then the next node's, ...): m when moving every member m
// places on (i -> i + m mod n) moves every pair onto a pair with the same
// link, 0 otherwise (or with a PCIe tree, whose shares depend on the whole
// group). A dp or ep group over several nodes with the same local GPUs on
// each, as FoldPlan::by_place folds, has period m (its members per node)
// when the fabric gives every node pair the same link, as one leaf does.
// Started alike by period (member i as member i mod m), the members of a
// lock-step exchange stay so after every round, since each round's sends
// and receives of member i + m are member i's moved m places on: replaying
// members 0..m-1 is every member's replay, O(m x rounds) instead of
// O(n x rounds). Checked pair by pair, O(n^2) links, once per group and
// thread.
int replay_period(const HardwareProfile& p, std::span<const int> members) {
  const int n = static_cast<int>(members.size());
  if (n < 2 || !p.pcie.empty()) return 0;
  thread_local std::map<std::pair<const HardwareProfile*, std::vector<int>>, int> known;
  auto key = std::make_pair(&p, std::vector<int>(members.begin(), members.end()));
  if (auto it = known.find(key); it != known.end()) return it->second;
  int m = 0;
  while (m < n && p.node_of(members[size_t(m)]) == p.node_of(members[0])) ++m;
  int period = m < n && n % m == 0 ? m : 0;
  const ProfileLinkModel links(p);
  for (int i = 0; i < n && period > 0; ++i)
    for (int j = 0; j < n && period > 0; ++j)
      if (i != j &&
          !same_link(links.link(members[size_t(i)], members[size_t(j)]),
                     links.link(members[size_t((i + m) % n)], members[size_t((j + m) % n)])))
        period = 0;
  if (known.size() >= 4096) known.clear();  // bounded: a run has far fewer groups per thread
  known.emplace(std::move(key), period);
  return period;
}

// Whether the ring plan moves along with the members: member i + m's
// successor on every channel is member i's moved m places on.
bool plan_periodic(const RingPlan& plan, int n, int m) {
  if (plan.single()) return true;
  for (int c = 0; c < plan.channels; ++c)
    for (int i = 0; i < n; ++i)
      if (plan.next(c, (i + m) % n, n) != (plan.next(c, i, n) + m) % n) return false;
  return true;
}

size_t chunk(size_t count, int n, int i) {
  return static_cast<size_t>(chunk_range(count, n, i).size);
}

// One lock-step round: member r sends size(r) elements to r+dist and then
// receives from r-dist (ring steps, pairwise and Bruck rounds, barrier).
// Symmetric (every size alike): member 0 alone, receiving its own message's twin.
template <class Size>
void shift_round(Replay& R, int dist, Size size, std::vector<Posted>& out) {
  if (R.symmetric()) {
    out[0] = R.send(0, R.rel(0, dist), size(0));
    out[0].from = R.rel(0, -dist);  // the twin's sender
    return R.recv(0, out[0]);
  }
  const int n = R.played();
  for (int r = 0; r < n; ++r) out[static_cast<size_t>(r)] = R.send(r, R.rel(r, dist), size(r));
  for (int r = 0; r < n; ++r) {
    const int from = R.rel(r, -dist);
    R.recv(r, Replay::twin(out[static_cast<size_t>(R.base(from))], from));
  }
}

// ring.cc ring_reduce_scatter / ring_all_gather: member r sends chunk
// r-k-1 (reduce_scatter) or r-k (all_gather) at step k.
// Detail::Ctx::slice: every chunk's message is charged ceil(count/n) elements.
size_t slice(size_t count, int n) { return (count + size_t(n) - 1) / size_t(n); }

void ring(Replay& R, size_t count, int) {
  const int n = R.n();
  std::vector<Posted> out(static_cast<size_t>(n));
  for (int k = 0; k < n - 1; ++k) shift_round(R, 1, [&](int) { return slice(count, n); }, out);
}

// ring.cc channel_ring_reduce_scatter / channel_ring_all_gather: at each of
// the n-1 steps every member sends on channels 0..C-1 to its successor on
// that channel, then receives on channels 0..C-1 from its predecessor, each
// on its channel's lane (the lanes stay open until replay's end, as the
// Ctx's until finish).
void channel_ring(Replay& R, const RingPlan& plan, size_t count) {
  const int n = R.n(), C = plan.channels;
  const size_t charged = (slice(count, n) + size_t(C) - 1) / size_t(C);
  R.open_lanes(C);
  std::vector<Posted> out(static_cast<size_t>(n * C));
  for (int k = 0; k < n - 1; ++k) {
    if (R.symmetric()) {  // member 0's channels; its predecessors' messages are twins of its own
      for (int c = 0; c < C; ++c) out[size_t(c)] = R.send(0, plan.next(c, 0, n), charged, c);
      for (int c = 0; c < C; ++c) {
        out[size_t(c)].from = plan.prev(c, 0, n);  // the twin's sender
        R.recv(0, out[size_t(c)], c);
      }
      continue;
    }
    for (int r = 0; r < R.played(); ++r)
      for (int c = 0; c < C; ++c) out[static_cast<size_t>(r * C + c)] = R.send(r, plan.next(c, r, n), charged, c);
    for (int r = 0; r < R.played(); ++r)
      for (int c = 0; c < C; ++c) {
        const int from = plan.prev(c, r, n);
        R.recv(r, Replay::twin(out[static_cast<size_t>(R.base(from) * C + c)], from), c);
      }
  }
}

// tree.cc halving_reduce_scatter (halving) and doubling_all_gather: at
// distance dist member r sends the non-empty pieces of chunks
// [r+dist, r+dist+m) to r+dist (halving) or [r, r+m) to r-dist (doubling).
// One message of m slices, and the wrapped second piece charged nothing
// (tree.cc send_pieces).
void tree_step(Replay& R, size_t count, int dist, bool halving, std::vector<Posted>& out) {
  const int n = R.n(), m = std::min(dist, n - dist);
  const int to_offset = halving ? dist : -dist;
  for (int r = 0; r < n; ++r) {
    Range pieces[2];
    const int np = wrapped_ranges(count, n, halving ? R.rel(r, dist) : r, m, pieces);
    out[static_cast<size_t>(2 * r)] = R.send(r, R.rel(r, to_offset), size_t(m) * slice(count, n));
    const bool second = np == 2 && pieces[1].size > 0;
    out[static_cast<size_t>(2 * r + 1)] = second ? R.send(r, R.rel(r, to_offset), 0) : Posted{};
  }
  for (int r = 0; r < n; ++r) {
    const auto from = static_cast<size_t>(R.rel(r, -to_offset));
    for (int i = 0; i < 2; ++i)
      if (out[2 * from + static_cast<size_t>(i)].sent)
        R.recv(r, out[2 * from + static_cast<size_t>(i)]);
  }
}

void halving(Replay& R, size_t count) {
  if (count == 0) return;
  std::vector<Posted> out(2 * static_cast<size_t>(R.n()));
  for (int k = ceil_log2(R.n()) - 1; k >= 0; --k) tree_step(R, count, 1 << k, true, out);
}

void doubling(Replay& R, size_t count) {
  if (count == 0) return;
  std::vector<Posted> out(2 * static_cast<size_t>(R.n()));
  for (int k = 0; (1 << k) < R.n(); ++k) tree_step(R, count, 1 << k, false, out);
}

// direct.cc / all_to_all.cc direct: member r posts size(r, r+k) elements to
// r+k for k = 1..n-1, then receives from r-1, r-2, ...
// Symmetric (size by distance alone): member 0 alone; the k-th message it
// receives, from r-k, is the twin of the k-th it sends.
// `nccl_order` (the all_to_all): round k's peers are p2p_order's, not r±k.
// A round of either order is a permutation, so the k-th message a member
// receives is its sender's k-th, a twin of the played member's k-th.
template <class Size>
void direct_exchange(Replay& R, Size size, bool nccl_order = false) {
  const auto n = static_cast<size_t>(R.n());
  std::vector<int> to(n), from(n);
  const auto orders = [&](int r) {
    if (nccl_order) return p2p_order(R.profile(), R.members(), r, to, from);
    for (int k = 0; k < R.n(); ++k) to[size_t(k)] = R.rel(r, k), from[size_t(k)] = R.rel(r, -k);
  };
  if (R.symmetric()) {
    orders(0);
    std::vector<Posted> out(n);
    for (int k = 1; k < R.n(); ++k) out[size_t(k)] = R.send(0, to[size_t(k)], size(0, to[size_t(k)]));
    for (int k = 1; k < R.n(); ++k) {
      out[size_t(k)].from = from[size_t(k)];  // the twin's sender
      R.recv(0, out[size_t(k)]);
    }
    return;
  }
  std::vector<Posted> out(size_t(R.played()) * n);
  std::vector<int> froms(size_t(R.played()) * n);  // each played member's receive order, kept for its receives
  for (int r = 0; r < R.played(); ++r) {
    orders(r);
    for (int k = 1; k < R.n(); ++k) out[size_t(r) * n + size_t(k)] = R.send(r, to[size_t(k)], size(r, to[size_t(k)]));
    std::copy(from.begin(), from.end(), froms.begin() + long(size_t(r) * n));
  }
  for (int r = 0; r < R.played(); ++r)
    for (int k = 1; k < R.n(); ++k) {
      const int f = froms[size_t(r) * n + size_t(k)];
      R.recv(r, Replay::twin(out[size_t(R.base(f)) * n + size_t(k)], f));
    }
}

// direct_broadcast (root sends to root+1, root+2, ...) and direct_reduce
// (every other member sends to root, which receives from root-1, root-2, ...).
void direct_rooted(Replay& R, size_t count, int root, bool to_root) {
  const int n = R.n();
  std::vector<Posted> out(static_cast<size_t>(n));
  for (int k = 1; k < n; ++k) {
    const int peer = R.rel(root, to_root ? -k : k);
    out[static_cast<size_t>(k)] = to_root ? R.send(peer, root, count) : R.send(root, peer, count);
  }
  for (int k = 1; k < n; ++k) R.recv(to_root ? root : R.rel(root, k), out[static_cast<size_t>(k)]);
}

// ring.cc chain_broadcast / chain_reduce: chunk by chunk along
// root -> root+1 -> ... (broadcast) or root+n-1 -> ... -> root (reduce).
void chain(Replay& R, size_t count, int elem_size, int root, bool to_root) {
  const int n = R.n(), k = detail::chain_chunks(count, elem_size);
  for (int i = 0; i < k; ++i) {
    const size_t size = chunk(count, k, i);
    Posted up{};  // the message the current position receives
    for (int step = 0; step < n; ++step) {
      const int pos = to_root ? n - 1 - step : step;
      const int me = R.rel(root, pos);
      if (step > 0) R.recv(me, up);
      if (step < n - 1) up = R.send(me, R.rel(root, to_root ? pos - 1 : pos + 1), size);
    }
  }
}

// tree.cc binomial_broadcast: relative rank v receives from v - lowbit(v),
// then sends to v + 2^j for 2^j below lowbit(v), largest first. Parents
// have smaller v, so ascending v meets every message after its send.
void binomial_broadcast(Replay& R, size_t count, int root) {
  const int n = R.n();
  std::vector<Posted> from_parent(static_cast<size_t>(n));
  for (int v = 0; v < n; ++v) {
    int mask = 1;
    while (mask < n && !(v & mask)) mask <<= 1;
    if (v > 0) R.recv(R.rel(root, v), from_parent[static_cast<size_t>(v)]);
    for (mask >>= 1; mask > 0; mask >>= 1)
      if (v + mask < n)
        from_parent[static_cast<size_t>(v + mask)] =
            R.send(R.rel(root, v), R.rel(root, v + mask), count);
  }
}

// tree.cc binomial_reduce: v receives from v+1, v+2, v+4, ... then sends to
// v - lowbit(v). Children have larger v: descending v.
void binomial_reduce(Replay& R, size_t count, int root) {
  const int n = R.n();
  std::vector<Posted> to_parent(static_cast<size_t>(n));
  for (int v = n - 1; v >= 0; --v) {
    for (int mask = 1; mask < n; mask <<= 1) {
      if (v & mask) {
        to_parent[static_cast<size_t>(v)] = R.send(R.rel(root, v), R.rel(root, v - mask), count);
        break;
      }
      if (v + mask < n) R.recv(R.rel(root, v), to_parent[static_cast<size_t>(v + mask)]);
    }
  }
}

// all_to_all.cc bruck_all_to_all: round dist moves the blocks whose slot
// index has bit dist set.
void bruck(Replay& R, size_t block) {
  const int n = R.n();
  std::vector<Posted> out(static_cast<size_t>(n));
  for (int dist = 1; dist < n; dist <<= 1) {
    size_t slots = 0;
    for (int i = 0; i < n; ++i) slots += (i & dist) ? 1 : 0;
    shift_round(
        R, dist, [&](int) { return slots * block; }, out);
  }
}

// Every member's steps (detail::TreeOp lists: the dbtree's, the channel
// chains'), replayed in each member's program order. Such a program is not
// lock-step, so the members advance as an event loop: a member runs its
// steps until a receive whose message its peer has not sent yet, and
// resumes when that send is replayed. Messages between two members on one
// channel keep their order (FIFO per sender, receiver and channel, as the
// fabric's tags do). Each message is charged `charged` elements (0: its
// range's size).
void play_ops(Replay& R, int C, const std::vector<std::vector<detail::TreeOp>>& ops, size_t charged) {
  const int n = R.n();
  // In flight from (sender, channel) to a receiver: keyed by receiver, then
  // (sender * C + channel); each a FIFO with a read cursor.
  struct Queue {
    std::vector<Posted> q;
    size_t head = 0;
  };
  std::vector<std::map<int, Queue>> inbox(static_cast<size_t>(n));
  std::vector<size_t> next(static_cast<size_t>(n), 0);
  std::vector<int> waiting(static_cast<size_t>(n), -1);  // the key a blocked member waits on
  std::vector<int> ready;
  ready.reserve(static_cast<size_t>(n));
  for (int r = n - 1; r >= 0; --r) ready.push_back(r);
  R.open_lanes(C);
  while (!ready.empty()) {
    const int r = ready.back();
    ready.pop_back();
    auto& mine = ops[size_t(r)];
    size_t& i = next[size_t(r)];
    for (; i < mine.size(); ++i) {
      const detail::TreeOp& o = mine[i];
      if (o.kind == detail::TreeOp::kFinalize) continue;
      if (o.kind == detail::TreeOp::kSend) {
        const int key = r * C + o.lane;
        inbox[size_t(o.peer)][key].q.push_back(R.send(r, o.peer, charged ? charged : size_t(o.range.size), o.lane));
        if (waiting[size_t(o.peer)] == key) {
          waiting[size_t(o.peer)] = -1;
          ready.push_back(o.peer);
        }
        continue;
      }
      const int key = o.peer * C + o.lane;
      Queue& in = inbox[size_t(r)][key];
      if (in.head == in.q.size()) {
        waiting[size_t(r)] = key;
        break;
      }
      R.recv(r, in.q[in.head++], o.lane);
    }
  }
  for (int r = 0; r < n; ++r) SHARDLAB_CHECK(next[size_t(r)] == ops[size_t(r)].size());
}

// dbtree.cc dbtree_all_reduce: every member's steps (detail::dbtree_ops).
void dbtree(Replay& R, const HardwareProfile& p, std::span<const int> members, const CollShape& s) {
  const TreePlan plan = tree_plan(p, members);
  SHARDLAB_CHECK(plan.applies());
  const int n = R.n(), C = plan.channels;
  const int chunks = dbtree_chunks(s.count, C, s.elem_size);
  std::vector<std::vector<detail::TreeOp>> ops(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) detail::dbtree_ops(plan, n, s.count, chunks, r, ops[size_t(r)]);
  play_ops(R, C, ops, detail::dbtree_charged(s.count, C, chunks));
}

// ring.cc channel_chain_broadcast / channel_chain_reduce: every member's
// steps (detail::chain_ops), each message charged its chunk's size.
void channel_chain(Replay& R, const RingPlan& plan, const CollShape& s, bool to_root) {
  const int n = R.n();
  std::vector<std::vector<detail::TreeOp>> ops(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) detail::chain_ops(plan, n, s.count, s.elem_size, s.root, to_root, r, ops[size_t(r)]);
  play_ops(R, plan.channels, ops, 0);
}

void replay_body(Replay& R, const HardwareProfile& p, std::span<const int> members, const RingPlan& plan,
                 const CollShape& s, Algo algo) {
  const int n = R.n();
  if (algo == Algo::kDbtree) return dbtree(R, p, members, s);
  const size_t count = s.count;
  auto rings = [&](int phase) { return plan.single() ? ring(R, count, phase) : channel_ring(R, plan, count); };
  switch (s.op) {
    case OpKind::kAllReduce:
      if (algo == Algo::kDirect) return direct_exchange(R, [&](int, int) { return count; });
      if (algo == Algo::kNvls) {
        // nvls.cc: a direct reduce_scatter, then a direct all_gather, at the switch's rate.
        const size_t x = detail::nvls_charged(count, n);
        R.set_rate_cap(detail::nvls_rate(p));
        direct_exchange(R, [&](int, int) { return x; });
        return direct_exchange(R, [&](int, int) { return x; });
      }
      if (algo == Algo::kRing) {
        rings(-1);  // reduce_scatter
        return rings(0);
      }
      halving(R, count);
      return doubling(R, count);
    case OpKind::kReduceScatter:
      if (algo == Algo::kDirect) return direct_exchange(R, [&](int, int) { return slice(count, n); });
      if (algo == Algo::kRing) return rings(-1);
      return halving(R, count);
    case OpKind::kAllGather:
      if (algo == Algo::kDirect) return direct_exchange(R, [&](int, int) { return slice(count, n); });
      if (algo == Algo::kRing) return rings(0);
      return doubling(R, count);
    case OpKind::kBroadcast:
      if (algo == Algo::kDirect) return direct_rooted(R, count, s.root, false);
      if (algo == Algo::kRing)
        return plan.single() ? chain(R, count, s.elem_size, s.root, false) : channel_chain(R, plan, s, false);
      return binomial_broadcast(R, count, s.root);
    case OpKind::kReduce:
      if (algo == Algo::kDirect) return direct_rooted(R, count, s.root, true);
      if (algo == Algo::kRing)
        return plan.single() ? chain(R, count, s.elem_size, s.root, true) : channel_chain(R, plan, s, true);
      return binomial_reduce(R, count, s.root);
    case OpKind::kAllToAll: {
      const size_t block = count / static_cast<size_t>(n);
      if (algo == Algo::kDirect) return direct_exchange(R, [&](int, int) { return block; }, true);
      if (algo == Algo::kTree) return bruck(R, block);
      std::vector<Posted> out(static_cast<size_t>(n));
      for (int k = 1; k < n; ++k)
        shift_round(
            R, k, [&](int) { return block; }, out);
      return;
    }
    case OpKind::kBarrier: {
      std::vector<Posted> out(static_cast<size_t>(n));
      for (int dist = 1; dist < n; dist <<= 1)
        shift_round(
            R, dist, [](int) { return size_t{0}; }, out);
      return;
    }
  }
}

void replay(Replay& R, const HardwareProfile& p, std::span<const int> members, const RingPlan& plan,
            const CollShape& s, Algo algo) {
  replay_body(R, p, members, plan, s, algo);
  R.close_lanes();
}

}  // namespace

namespace {
// The replays whose every round has each member send and receive alike
// (shift_round, ring, channel_ring, direct_exchange); trees and rooted
// algorithms are not.
bool lock_step(const CollShape& s, Algo algo) {
  switch (s.op) {
    case OpKind::kAllReduce:
    case OpKind::kReduceScatter:
    case OpKind::kAllGather:
      return algo == Algo::kRing || algo == Algo::kDirect || algo == Algo::kNvls;
    case OpKind::kAllToAll:
    case OpKind::kBarrier:
      return true;
    case OpKind::kBroadcast:
    case OpKind::kReduce:
      return false;
  }
  return false;
}

Time replay_time(const HardwareProfile& p, std::span<const int> members, const CollShape& s, Algo algo,
                 Proto proto) {
  Replay R(p, members, s.elem_size, proto);
  const RingPlan plan = algo == Algo::kRing ? ring_plan(p, members) : RingPlan{};
  const bool step = lock_step(s, algo);
  if (step && uniform_pairs(p, members)) {
    R.set_symmetric();
  } else if (const int m = step ? replay_period(p, members) : 0;
             m > 0 && plan_periodic(plan, R.n(), m)) {
    R.set_period(m);  // every member starts at the collective's start: alike by any period
  }
  replay(R, p, members, plan, s, algo);
  if (R.period() > 0) R.spread_period();
  return R.makespan();
}

bool group_spans_nodes(const HardwareProfile& p, std::span<const int> members) {
  return std::any_of(members.begin(), members.end(),
                     [&](int m) { return p.node_of(m) != p.node_of(members.front()); });
}
}  // namespace

Choice select(const HardwareProfile& p, std::span<const int> members, const CollShape& s, Algo algo) {
  const Algo only[] = {algo};
  const std::span<const Algo> algos = algo == Algo::kAuto ? candidate_algos(s.op) : std::span<const Algo>(only);
  const std::vector<Proto> protos = s.proto == Proto::kAuto ? candidate_protos(p, members) : std::vector<Proto>{s.proto};
  Choice best;
  if (algo == Algo::kDbtree && !dbtree_applies(p, members, s))
    throw ConfigError(fmt::format("`algo` dbtree: {} on these {} members: dbtree runs all_reduce on a group spanning "
                                  "2 or more nodes with the same number of members on each",
                                  op_kind_name(s.op), members.size()));
  if (algo == Algo::kNvls) require_nvls(p, members, s, fmt::format("these {} members", members.size()));
  // NCCL has no direct all_reduce (its tuner weighs ring and tree, src/graph/
  // tuning.cc): every all_reduce reduces, then spreads the result, two hops at
  // the least. Across nodes, where a hop is the network's, auto keeps to that.
  const bool no_direct = algo == Algo::kAuto && s.op == OpKind::kAllReduce && group_spans_nodes(p, members);
  for (Algo a : algos) {
    if (a == Algo::kDbtree && algo == Algo::kAuto && !(s.dbtree && dbtree_applies(p, members, s))) continue;
    if (a == Algo::kDirect && no_direct) continue;
    if (a == Algo::kNvls && !nvls_applies(p, members, s)) continue;
    for (Proto q : protos) {
      if (a == Algo::kNvls && q != Proto::kSimple && q != Proto::kPlain) continue;  // NCCL: NVLS on Simple only
      const Time t = replay_time(p, members, s, a, q);
      if (best.algo == Algo::kAuto || t < best.time) best = {a, q, t};
    }
  }
  return best;
}

Time predict_time(const HardwareProfile& p, std::span<const int> members, const CollShape& s,
                  Algo algo) {
  SHARDLAB_CHECK(algo != Algo::kAuto);
  return select(p, members, s, algo).time;
}

namespace {
// Whether member i starts as member i - m for every i >= m: the same
// clocks and, where the replay books on ports, the same spans and free
// times on every port (all that Port::book reads).
bool periodic_start(std::span<const MemberClock> clocks, const ReplayPorts* ports, int m) {
  for (size_t i = size_t(m); i < clocks.size(); ++i)
    if (!(clocks[i] == clocks[i - size_t(m)])) return false;
  if (!ports) return true;
  const size_t stride = size_t(m) * size_t(kReplayPorts);
  for (size_t q = stride; q < ports->ports.size(); ++q) {
    const Port &a = ports->ports[q], &b = ports->ports[q - stride];
    if (a.segments() != b.segments()) return false;
    for (int k = 0; k < Port::kStreams; ++k)
      if (a.free(k) != b.free(k)) return false;
  }
  return true;
}
}  // namespace

ReplayOutcome replay_outcome(const HardwareProfile& p, std::span<const int> members, const CollShape& s, Algo algo,
                             std::span<const MemberClock> clocks, std::span<const char> need,
                             const ReplayPorts* ports) {
  SHARDLAB_CHECK(algo != Algo::kAuto && s.proto != Proto::kAuto && clocks.size() == members.size());
  SHARDLAB_CHECK(need.size() == members.size());
  SHARDLAB_CHECK(!ports || ports->ports.size() == members.size() * size_t(kReplayPorts));
  Replay R(p, members, s.elem_size, s.proto, clocks);
  R.use_ports(ports);
  // Alike from the start (a group folded onto one representative) on
  // uniform pairs: member 0 stands for every member (uniform_pairs).
  const bool alike = std::all_of(clocks.begin(), clocks.end(), [&](const MemberClock& c) { return c == clocks[0]; });
  const bool symmetric = !ports && alike && lock_step(s, algo) && uniform_pairs(p, members);
  const RingPlan plan = algo == Algo::kRing ? ring_plan(p, members) : RingPlan{};
  if (symmetric) {
    R.set_symmetric();
  } else if (const int m = lock_step(s, algo) ? replay_period(p, members) : 0;
             m > 0 && plan_periodic(plan, R.n(), m) && periodic_start(clocks, ports, m)) {
    R.set_period(m);
  }
  R.keep(need);
  replay(R, p, members, plan, s, algo);
  if (symmetric) R.spread();
  if (R.period() > 0) R.spread_period();
  ReplayOutcome o;
  o.end = std::move(R.clocks());
  o.symmetric = symmetric;
  o.period = R.period();
  R.take_kept(o.marks, o.first);
  return o;
}

void replay_marks(const ReplayOutcome& o, std::span<const int> members, int me, std::vector<ReplayMark>* marks,
                  std::span<const char> watch, std::vector<ReplayMark>* watched) {
  const size_t n = members.size();
  // Member i's marks: its played member's, every peer moved as far on as i is from it.
  auto put = [&](int i, std::vector<ReplayMark>& out, bool named) {
    const size_t shift = size_t(i - o.played(i));
    for (ReplayMark m : o.marks_of(i)) {
      const size_t peer = size_t(m.peer) + shift;  // < 2n
      m.peer = members[peer < n ? peer : peer - n];
      if (named) {
        m.member = members[size_t(i)];
        m.index = i;
      }
      out.push_back(m);
    }
  };
  // Symmetric: member 0's marks stand for me's (me < 0: for member 0's).
  if (marks && (me >= 0 || o.symmetric)) put(std::max(me, 0), *marks, false);
  // Symmetric, every member books as me does: none watched. By period, me's
  // twins equal me by construction and are not listed (folded.cc compares
  // the lists).
  if (!watched || o.symmetric) return;
  for (size_t i = 0; i < n; ++i)
    if (watch[i] && (o.period == 0 || me < 0 || int(i) % o.period != me % o.period)) put(int(i), *watched, true);
}

std::vector<MemberClock> replay_collective(const HardwareProfile& p, std::span<const int> members,
                                           const CollShape& s, Algo algo,
                                           std::span<const MemberClock> clocks, int me,
                                           std::vector<ReplayMark>* marks, std::span<const char> watch,
                                           std::vector<ReplayMark>* watched, const ReplayPorts* ports) {
  SHARDLAB_CHECK(!watched || watch.size() == members.size());
  SHARDLAB_CHECK(clocks.size() == members.size());
  std::vector<char> need(members.size(), 0);
  if (marks) need[size_t(std::max(me, 0))] = 1;
  if (watched)
    for (size_t i = 0; i < need.size(); ++i) need[i] |= watch[i];
  ReplayOutcome o = replay_outcome(p, members, s, algo, clocks, need, ports);
  replay_marks(o, members, me, marks, watch, watched);
  return std::move(o.end);
}

std::vector<int> node_shifted(const HardwareProfile& p, std::span<const int> members) {
  std::vector<int> out(members.begin(), members.end());
  if (members.empty() || !p.pcie.empty()) return out;
  const int d = p.node_of(*std::min_element(members.begin(), members.end())) * p.devices_per_node;
  if (d == 0) return out;
  for (int& m : out) m -= d;
  const ProfileLinkModel links(p);
  for (size_t i = 0; i < members.size(); ++i)
    for (size_t j = 0; j < members.size(); ++j)
      if (i != j && !same_link(links.link(members[i], members[j]), links.link(out[i], out[j])))
        return {members.begin(), members.end()};
  return out;
}

Algo select_algo(const HardwareProfile& p, std::span<const int> members, const CollShape& s) {
  return select(p, members, s).algo;
}

}  // namespace shardlab::collectives
