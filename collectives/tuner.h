// The tuner: the cost model behind Algo::kAuto.
//
// For one collective call (its op, the group's members, the element count
// and the modeled element size) predict_time gives the virtual time each
// algorithm will take, and select_algo picks the least, like NCCL's tuner
// picks from its cost model. The prediction uses the same link model the
// fabric charges (runtime/link_model.h over the profile): a message of x
// bytes on a link of latency a and bandwidth B leaves the sender's egress
// port at depart = max(sender's stream, egress free) and holds that port for
// w(x) = ceil(x·1e12/B) ps; it lands at max(depart + a, receiver's ingress
// free) + w(x), ingress ports being booked in the receiver's program order.
// Each device has one egress and one ingress port per link class (intra-,
// inter-node), so intra- and inter-node sends overlap.
//
// w(x) counts the packet headers of the link (Link::wire_time, Engine::kSm:
// NCCL's kernels store from the SMs). On a node with a PCIe tree (profile
// "pcie") B is the message's share of its path (ProfileLinkModel::
// shared_rate over the step's pattern, member i to i + d), as Ctx::send
// caps it. Every member starts the collective
// L = collective_start after the call (the launch and the protocol's start).
//
// Protocols (NCCL's tuning model, graph/tuning.cc; the profile's
// "protocols"): under LL, LL128 or Simple every message's latency a is the
// protocol's hop latency on its link class and its wire time w(x) runs at
// the protocol's share of the link's rate (LL 1/4, LL128 0.92, Simple 1 on
// the built-in profiles), and L adds the protocol's base latency. auto picks
// the algorithm and the protocol together, by these same replays.
//
// Writing a = latency, w(x) = wire time, S = modeled bytes of the full
// buffer, on uniform links (a group inside one node), each time below plus L:
//
//   all_reduce     ring    2(n-1)·(a + w(S/n))
//                  tree    2·Σ_k (a + w(m_k·S/n))   halving, then doubling;
//                          m_k = min(2^k, n-2^k), k < ceil(log2 n)
//                  direct  a + (n-1)·w(S)
//                  dbtree  across nodes only (TreePlan below); hand-derived
//                          cases in tests/collectives/dbtree_test.cc
//   reduce_scatter ring    (n-1)·(a + w(S/n))        all_gather likewise
//                  tree    Σ_k (a + w(m_k·S/n))
//                  direct  a + (n-1)·w(S/n)
//   broadcast      ring    (n-1)·a + (n+c-2)·w(S/c)  pipelined chain, c chunks
//                          (across nodes: a chain on every channel, below)
//                  tree    ceil(log2 n)·(a + w(S))   binomial (power-of-two n)
//                  direct  a + (n-1)·w(S)            reduce likewise
//   all_to_all     ring    (n-1)·(a + w(S/n))        pairwise rounds
//                  tree    Σ_k (a + w(h_k·S/n))      Bruck, h_k = #{i < n: i & 2^k}
//                  direct  a + (n-1)·w(S/n)
//
// With uneven chunks, wrapped tree pieces, empty messages and, above all,
// groups whose links differ (a ring crossing nodes twice, a reduce whose
// root's inter-node ingress serializes) the critical path is a maximum over
// paths that these sums no longer describe. So predict_time evaluates the
// same per-step recurrences the fabric applies — each member's stream time
// and four port clocks, advanced by the algorithm's own send/receive order,
// lock-step where the algorithm is; a channel algorithm (ring_plan.h) keeps
// a cursor per channel, a "lane", as Ctx::open_lanes does, so a channel's
// step waits only for its own previous step — which reduce to the sums above on
// uniform links and are exact everywhere: the prediction equals the virtual
// time of running the algorithm alone, every member starting at the same
// time on idle ports (tests/collectives/tuner_test.cc checks equality). A
// call costs O(messages) integer arithmetic and a few small vectors.
//
// Not modeled (the choice may then not be the least): ports still busy with
// earlier traffic, members starting at different times, a LinkModel other
// than the profile's (a test's wrapper).
//
// Determinism: the choice depends only on the profile, the member list, the
// count, the element size and the root, which every member of the group
// shares, so every member picks the same algorithm. Ties go to the earlier
// algorithm in candidate_algos order.
#pragma once

#include <cstddef>
#include <span>
#include <string_view>
#include <vector>

#include "collectives/collectives.h"
#include "runtime/port.h"
#include "runtime/profile.h"
#include "runtime/time.h"

namespace shardlab::collectives {

// One collective call as the tuner sees it; identical on every member.
struct CollShape {
  OpKind op = OpKind::kAllReduce;
  // Elements of the full buffer: all_reduce's vector, reduce_scatter's input,
  // all_gather's output, broadcast/reduce's data, all_to_all's whole send
  // buffer (n equal blocks). Ignored by barrier.
  size_t count = 0;
  int elem_size = 4;  // modeled bytes per element (element_size(precision))
  int root = 0;       // broadcast and reduce
  // The protocol; kAuto in predict_time: the least time over the group's protocols.
  Proto proto = Proto::kAuto;
  // auto also weighs Algo::kDbtree (where dbtree_applies). Off by default:
  // a folded run (runtime/fold.h) replays a collective only where folded
  // members end as their representatives, which a tree's members do not;
  // with dbtree in auto a folded training run would fail where the unfolded
  // one picks it. Callers that never fold may opt in (shardlab collectives
  // does not: its auto chooses as training does).
  bool dbtree = false;
  bool operator==(const CollShape&) const = default;
};

// The fixed start of a plain collective on a group of `group_size`: the
// profile's device.collective_launch_us (the kernel launch), charged on the
// collective's stream before its first send. 0 for a group of one. What a
// custom collective built on plain sends charges (python/, examples/).
inline Time collective_launch(const HardwareProfile& p, int group_size) {
  return group_size > 1 ? us_to_time(p.device.collective_launch_us) : 0;
}
// The start of a collective running `proto`: the launch, then the protocol's
// own start (NCCL's baseLat: its kernel's setup and first synchronization).
inline Time collective_start(const HardwareProfile& p, int group_size, Proto proto) {
  const int q = static_cast<int>(proto) - 1;
  Time t = collective_launch(p, group_size);
  if (group_size > 1 && q >= 0 && q < static_cast<int>(p.protocols.size()))
    t += us_to_time(p.protocols[static_cast<size_t>(q)].base_latency_us);
  return t;
}

// The protocols a group may run on `p`, in tie-break order: kPlain alone on
// a profile without protocols; else LL, LL128, Simple where each is used on
// every link class the group's members talk over (LL128 is not on PCIe).
std::vector<Proto> candidate_protos(const HardwareProfile& p, std::span<const int> members);

// ---- Channels: rings across nodes over every rail ---------------------------
// NCCL runs a collective on several channels, each a ring over the group
// with its own order, the buffer split between them. Its topology search
// (graph/search.cc) finds one ring per NIC the node's GPUs reach, each at
// that NIC's speed, and graph/connect.cc then duplicates every ring
// (nChannels * 2, at most MAXCHANNELS = 32); tuning.cc models the ring's
// bus bandwidth as nChannels x the per-channel speed. Here, for a group
// that spans nodes with k >= 2 members on every node:
//   rails R    = the distinct NICs (profile "nics") near one node's members
//   channels C = min(2R, 32), rounded up to a multiple of k (every member
//                then leaves its node on as many channels as any other, so
//                symmetric members stay symmetric)
//   channel c's ring takes the nodes in order of first appearance and, on
//                each node, its members (in group order) L[0..k) starting
//                at L[(c+1) mod k]: L[c+1], L[c+2], ..., L[c]. So on channel
//                c every node is left from L[c mod k] (through its NIC) and
//                entered at L[(c+1) mod k]: the node-crossing hops of
//                channels c mod k != c' mod k leave from different GPUs,
//                hence different NICs when the node has one per GPU.
// Member i owns chunk_range(count, n, i) of the buffer, as with one ring;
// channel c moves sub-chunk c of every member's chunk (chunk_range of the
// chunk over C), each message charged ceil(ceil(count/n)/C) elements.
// A group inside one node, with uneven members per node, or one member per
// node keeps the single ring in group order (channels 1): with k = 1 the
// duplicated rings would share the one NIC and take the same time.
// Ring broadcast and reduce run the same channels: channel c moves piece c
// of the buffer (chunk_range over C) as a pipelined chain along its ring
// from (to) the root, as NCCL's ring broadcast and reduce; each member takes
// its steps in pipeline-slot order (ring.cc detail::chain_ops), so the
// node-crossing hops of all rails carry the buffer at once.
struct RingPlan {
  int channels = 1;
  int rails = 1;
  std::vector<int> order;  // channels x n: group index at ring position p of channel c
  std::vector<int> pos;    // channels x n: ring position of group index i on channel c
  bool single() const { return channels == 1 && order.empty(); }
  int next(int c, int i, int n) const;  // group index after i on channel c
  int prev(int c, int i, int n) const;
  int at(int c, int p, int n) const { return order[static_cast<size_t>(c * n + ((p % n) + n) % n)]; }
  int position(int c, int i, int n) const { return pos[static_cast<size_t>(c * n + i)]; }
};
inline constexpr int kMaxChannels = 32;  // NCCL's MAXCHANNELS
RingPlan ring_plan(const HardwareProfile& p, std::span<const int> members);

// ---- NCCL's double binary tree across nodes (Algo::kDbtree, dbtree.cc) -----
// NCCL's tree all_reduce (src/graph/trees.cc, connect.cc, search.cc), for a
// group that spans N >= 2 nodes with the same k >= 1 members on each:
//   node trees  two binary trees over the N nodes (in order of first
//               appearance): tree 0 is NCCL's btree (root node 0, which has
//               one child); tree 1 is its mirror (node v plays N-1-v) when N
//               is even, its shift by one (v plays v-1) when N is odd, so a
//               node is interior in at most one of the two.
//   channels    C = 2h: h = min(2R, 32)/2 rounded up to a multiple of k (R:
//               the rails, as RingPlan), channels [0, h) on tree 0 and
//               [h, 2h) on tree 1, as NCCL duplicates its tree channels;
//               at most 32 (kMaxChannels), else the plan does not apply.
//   chain       on channel c every node's members (group order) form the
//               chain L[s], L[s+1], ..., L[s+k-1] (mod k), s = c mod h:
//               each member's parent is the one before it, its child the
//               one after. The chain's head L[s] talks to the parent node;
//               the child nodes are NCCL's "balanced tree" pattern (its
//               first choice): child 0 of the node tree enters at the
//               chain's second member L[s+1], child 1 at the head (k = 1:
//               everything at the one member). So the node-crossing hops of
//               channel c use the NICs of L[s] and L[s+1], and over the h
//               channels of a tree every GPU is a head once per k.
// Every member's children, in reduction order: its chain child, then the
// head of child node 0 (if it enters here), then of child node 1.
struct TreePlan {
  static constexpr int kArity = 3;  // NCCL_MAX_TREE_ARITY
  int channels = 0;                 // 0: dbtree does not apply to the group
  int nodes = 0, per_node = 0;
  std::vector<int> up;    // channels x n: member i's parent on channel c (-1: the root)
  std::vector<int> down;  // channels x n x kArity: its children, -1 padded
  // channels x n: member i's height on channel c (hops to its deepest
  // descendant; leaves 0) and depth (hops from the root); the program's
  // pipeline steps (detail::dbtree_ops).
  std::vector<int> height, depth;
  std::vector<int> root_height;  // per channel: the tree's height
  bool applies() const { return channels > 0; }
  int parent(int c, int i, int n) const { return up[static_cast<size_t>(c * n + i)]; }
  std::span<const int> children(int c, int i, int n) const {
    return {down.data() + static_cast<size_t>((c * n + i) * kArity), static_cast<size_t>(kArity)};
  }
};
TreePlan tree_plan(const HardwareProfile& p, std::span<const int> members);
// NCCL's btree over `nranks` (trees.cc): rank's parent (-1: root), children
// d0 and d1 (-1: none), and which child of its parent it is (0 or 1).
struct BtreeNode {
  int up = -1, d0 = -1, d1 = -1, child_type = 0;
};
BtreeNode btree(int nranks, int rank);
// Tree `t` (0 or 1) of the double binary tree over `nranks`.
BtreeNode dtree(int nranks, int rank, int t);
// Pipeline chunks per channel of a dbtree all_reduce of `count` elements of
// `elem_size` bytes on `channels` channels: about 512 KiB each, at most 64.
int dbtree_chunks(size_t count, int channels, int elem_size);
// Whether dbtree can run `s` on `members`: an all_reduce, and tree_plan applies.
bool dbtree_applies(const HardwareProfile& p, std::span<const int> members, const CollShape& s);

// ---- NVLink SHARP inside one node (Algo::kNvls, nvls.cc) ---------------------
// NCCL's NVLS all_reduce (src/device/all_reduce.h, runAllReduce with
// NCCL_ALGO_NVLS) on the GPUs of one NVSwitch domain: member j owns slice j
// of the buffer; it reads the slice through the switch with
// multimem.ld_reduce (the switch fetches slice j from every member, its own
// included, and returns the sum), then writes the sum with multimem.st (the
// switch copies it to every member). Per member each direction carries S +
// S/n bytes: out, its whole buffer (read for every owner's slice) and its
// slice's store; in, its reduced slice and the n stored slices. The reduce
// (mostly out) and the multicast (mostly in) pipeline, so the call moves
// S(n+1)/n per direction at the switch's rate, `links.intra.nvls_efficiency`
// of the link's (NCCL's nvlsEfficiency: Hopper 0.85, Blackwell 0.74).
// Here it runs as a direct reduce_scatter, then a direct all_gather, each
// of the 2(n-1) messages a member sends (and receives) charged
// nvls_charged(count, n) = ceil(count(n+1) / (2n(n-1))) elements, at most at
// that rate: on a node's uniform links L + 2(a + (n-1)·w(x)), ~ w(S(n+1)/n).
// The data: member j reduces slice j in member order and sends the sum to
// every member, so all end with the same bits (real math as the direct
// algorithms). It applies to an all_reduce of 2 or more members, all on one
// node of a profile with nvls_efficiency > 0 and no PCIe tree, under Simple
// (NCCL runs NVLS only on Simple) or plain. Not modeled: NVLS across nodes
// (NCCL's NVLSTree and CollNet), NVLS reduce_scatter and all_gather.
bool nvls_applies(const HardwareProfile& p, std::span<const int> members, const CollShape& s);
// An explicit nvls: throws ConfigError naming `group` unless it applies and
// s.proto is auto, Simple or plain.
void require_nvls(const HardwareProfile& p, std::span<const int> members, const CollShape& s, std::string_view group);

// The algorithms auto chooses among for `op`, in tie-break order.
std::span<const Algo> candidate_algos(OpKind op);

// Virtual time of `algo` (not kAuto) running `s` on the group `members`
// (global ranks, in group order) of profile `p`, from idle ports; with
// s.proto kAuto, under the protocol of least time.
Time predict_time(const HardwareProfile& p, std::span<const int> members, const CollShape& s,
                  Algo algo);

// The algorithm and protocol of least predicted time: over candidate_algos
// unless `algo` is given, over candidate_protos unless s.proto is. Ties go
// to the earlier algorithm, then the earlier protocol.
struct Choice {
  Algo algo = Algo::kAuto;
  Proto proto = Proto::kAuto;
  Time time = 0;
};
Choice select(const HardwareProfile& p, std::span<const int> members, const CollShape& s, Algo algo = Algo::kAuto);
// The group moved by whole nodes onto the first ones (every rank less d,
// d its lowest node's first rank) when every pair of members keeps its link
// there (compared pair by pair, no PCIe tree); else the group itself.
// select() and every replay read a group only through its pairs' links, its
// members' nodes relative to each other and their local GPUs, so they give
// the same on both: the stages of a pipeline, whose dp and ep groups differ
// by whole nodes, share one tuner choice (api.cc).
std::vector<int> node_shifted(const HardwareProfile& p, std::span<const int> members);
// NCCL's peer order for point-to-point exchanges (the direct all_to_all):
// its p2p schedule (src/init.cc, the p2pSchedule loop, NCCL 2.19 on), rounds
// by node delta (0, 1, 3, 6, ...: the quadratic sequence mod the next power
// of two, values past the node count skipped) and, inside one, by local delta
// 0..L-1: in round (gd, d) member (g, l) sends to (g+gd, l+d) and receives
// from (g-gd, l-d), so every round is a permutation and no member's ingress
// takes two senders at once (no incast). It applies when the members form
// whole blocks of L > 1 on two or more distinct nodes (group order; L the
// first node's count); otherwise (one node, one member a node, or uneven
// nodes) the flat order, send to me+k and receive from me-k, whose rounds
// are shifts (NCCL's order is then a permutation of the same shifts).
// send[k], recv[k]: the group indices of round k (k = 0 is me).
void p2p_order(const HardwareProfile& p, std::span<const int> members, int me, std::vector<int>& send,
               std::vector<int>& recv);
// select(...).algo.
Algo select_algo(const HardwareProfile& p, std::span<const int> members, const CollShape& s);

// ---- Replay from given clocks (folded phantom runs, runtime/fold.h) --------
// The same recurrences from any starting state: each member's stream time
// and port clocks when it enters the call. Exact as above (every member's
// sends and receives in its algorithm's order), for any starting clocks.
struct MemberClock {
  Time now = 0;  // the stream's time when the member enters the call
  Time egress[kNumLinkClasses] = {0, 0};
  Time ingress[kNumLinkClasses] = {0, 0};
  Time last_send = 0;  // when its last send leaves the egress port (out only)
  bool operator==(const MemberClock&) const = default;
};
// What one member's stream marks during the call, in its program order:
// sends [depart, sent), receives [stream time, arrival); and the port
// booking behind it (Port::book's arguments and result).
struct ReplayMark {
  bool send = false;
  int peer = -1;  // global rank
  Time start = 0, end = 0;
  uint64_t bytes = 0;
  int member = -1;  // whose mark it is (global rank; set in `watched`)
  int index = -1;   // and its group index (set in `watched`)
  int port = 0;     // the link class: its egress port for a send, ingress for a receive
  Time ready = 0;   // the send's stream time, the receive's first byte
  Time work = 0;    // the wire time
  Time booked_start = 0, booked_end = 0;  // the port's booking
  bool operator==(const ReplayMark&) const = default;
};
// The ports of every member during a replay (folded.cc): member i's
// egress port of link class p at ports[i * kReplayPorts + p], its ingress
// port at ports[i * kReplayPorts + kNumLinkClasses + p]. With ports the
// replay books every transfer with Port::book on stream `stream`, sharing
// the port with the other streams' spans as the device would; without,
// plain FIFO port clocks (MemberClock), which is the same where no other
// stream moves data after the call's start.
inline constexpr int kReplayPorts = 2 * kNumLinkClasses;
struct ReplayPorts {
  std::span<Port> ports;
  int stream = 0;
};
// The replay split in two, so that one replay serves every member that asks
// (folded.cc, replay_share.h): replay_outcome replays `algo` (not kAuto)
// under s.proto (not kAuto) over `members` from `clocks` (in group order),
// booking on `ports` if given, and keeps every member's end and the marks
// of the members it plays that stand for a member i with need[i] != 0 (all
// of them in a full replay, member 0 alone when symmetric, members 0..m-1
// by period m), each peer a group index as its played member sees it.
struct ReplayOutcome {
  std::vector<MemberClock> end;  // every member's clocks after the call
  bool symmetric = false;        // member 0 stood for every member
  int period = 0;                // members i + k·period were replayed as member i (0: not by period)
  // The kept marks by played member r, at [first[r], first[r + 1]).
  std::vector<ReplayMark> marks;
  std::vector<size_t> first;
  // The member the replay played for member i, and its kept marks (its
  // peers as seen from there: member i's are as many places further on).
  int played(int i) const { return symmetric ? 0 : period > 0 ? i % period : i; }
  std::span<const ReplayMark> marks_of(int i) const {
    const auto r = size_t(played(i));
    return std::span<const ReplayMark>(marks).subspan(first[r], first[r + 1] - first[r]);
  }
};
ReplayOutcome replay_outcome(const HardwareProfile& p, std::span<const int> members, const CollShape& s, Algo algo,
                             std::span<const MemberClock> clocks, std::span<const char> need,
                             const ReplayPorts* ports = nullptr);
// What replay_collective gives `marks` and `watched` for member `me`, from an
// outcome that kept them (need: me, or member 0 for me < 0, and the watched).
void replay_marks(const ReplayOutcome& o, std::span<const int> members, int me, std::vector<ReplayMark>* marks,
                  std::span<const char> watch = {}, std::vector<ReplayMark>* watched = nullptr);
// Replays `algo` (not kAuto) under s.proto (not kAuto) over `members` from `clocks` (in group order);
// returns every member's clocks after the call and appends member `me`'s
// marks to `marks`, and the marks of every member i with watch[i] != 0 to
// `watched` (if given; by member, each in program order; a replay by period
// leaves out me's twins and a symmetric one every member, which equal me by
// construction).
std::vector<MemberClock> replay_collective(const HardwareProfile& p, std::span<const int> members,
                                           const CollShape& s, Algo algo,
                                           std::span<const MemberClock> clocks, int me,
                                           std::vector<ReplayMark>* marks,
                                           std::span<const char> watch = {},
                                           std::vector<ReplayMark>* watched = nullptr,
                                           const ReplayPorts* ports = nullptr);

}  // namespace shardlab::collectives
