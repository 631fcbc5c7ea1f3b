// The tuner's cost model: each algorithm's message schedule replayed on the
// link model's port clocks (see tuner.h for the rules and the closed forms;
// replay.h holds the clocks, replay_algos.cc the schedules), and the choice
// of the algorithm and protocol of least time.
#include "collectives/tuner.h"

#include <algorithm>
#include <map>
#include <vector>

#include "collectives/detail.h"
#include "collectives/replay.h"
#include "runtime/errors.h"
#include "runtime/link_model.h"

namespace shardlab::collectives {
namespace {

using replay::Replay;

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
  replay::play(R, p, members, plan, s, algo);
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
  replay::play(R, p, members, plan, s, algo);
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
