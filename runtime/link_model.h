// The link model: which port and link parameters a message between two
// devices uses. An interface so tests and fault injection (FaultLinkModel,
// fault.h) can wrap it to slow a link down or fail it (LevelDB's EnvWrapper
// pattern).
//
// Thread safety: const after construction; one instance serves every device
// thread of a run (link/link_at are const and touch no shared state).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "runtime/profile.h"
#include "runtime/time.h"

namespace shardlab {

struct Link {
  LinkClass port = LinkClass::kIntra;  // which egress/ingress port pair it occupies
  Time latency = 0;                    // ps, first byte
  uint64_t bytes_per_second = 1;       // per direction
  uint32_t header_bytes = 0;           // per packet
  uint32_t payload_bytes[2] = {0, 0};  // per packet: SM stores (every engine but kCopy), copy engines
  // A collective's protocol (Engine::kLL, kLL128, kSimple; profile "protocols"):
  // its hop latency as an offset from `latency` (so a fault's added latency
  // adds to it too) and its share of the rate in millionths.
  static constexpr uint32_t kPpm = 1'000'000;
  int64_t proto_latency_delta[kNumProtocols] = {0, 0, 0};
  uint32_t proto_share_ppm[kNumProtocols] = {kPpm, kPpm, kPpm};

  bool operator==(const Link&) const = default;  // every field: two equal links time a message alike

  uint64_t payload(Engine e) const { return payload_bytes[e == Engine::kCopy ? 1 : 0]; }
  // Bytes on the wire for `bytes` of payload: bytes + ceil(bytes / payload) * header.
  uint64_t wire_bytes(uint64_t bytes, Engine e) const {
    const uint64_t p = payload(e);
    return p == 0 ? bytes : bytes + (bytes + p - 1) / p * header_bytes;
  }
  // The latency of a message moved by `e`: the protocol's hop latency, else the link's.
  Time latency_of(Engine e) const {
    const int q = engine_protocol(e);
    return q < 0 ? latency : std::max<Time>(0, latency + proto_latency_delta[q]);
  }
  // The time the message holds a port: ceil(wire_bytes * 1e12 / (bytes_per_second * share)) ps,
  // exact in 128-bit integers (share 1: transfer_time itself).
  Time wire_time(uint64_t bytes, Engine e) const {
    const int q = engine_protocol(e);
    const uint64_t w = wire_bytes(bytes, e);
    if (q < 0 || proto_share_ppm[q] == kPpm) return transfer_time(w, bytes_per_second);
    __extension__ using u128 = unsigned __int128;
    const u128 num = static_cast<u128>(w) * 1'000'000'000'000ULL * kPpm;
    const u128 den = static_cast<u128>(bytes_per_second) * std::max<uint32_t>(1, proto_share_ppm[q]);
    return static_cast<Time>((num + den - 1) / den);
  }
};

// The network proxy's part of a protocol's node-crossing hop (LinkSpec::
// proxy_us): NCCL's proxy thread posts every network send (NVIDIA/nccl#376,
// one such thread per GPU, #1459), which its tuning model prices at
// getNetOverhead per post, three posts' worth under Simple (src/graph/
// tuning.cc: "netOverhead *= 3"; the receiver's side and the flush of a
// GPUDirect RDMA write). 0 inside a node (NCCL's p2p transport has no proxy).
inline Time proxy_latency(LinkClass port, const LinkSpec& s, int protocol) {
  if (port != LinkClass::kInter || s.proxy_us <= 0) return 0;
  return us_to_time(s.proxy_us) * (protocol == static_cast<int>(Protocol::kSimple) ? 3 : 1);
}

// The link of class `port` with the profile's protocols (none: plain sends only).
inline Link make_link(LinkClass port, const LinkSpec& s, const std::vector<ProtocolSpec>& protocols = {}) {
  Link l{port,
         s.latency(),
         s.bytes_per_second(),
         static_cast<uint32_t>(s.packet_header_bytes),
         {static_cast<uint32_t>(s.sm_payload_bytes), static_cast<uint32_t>(s.copy_payload_bytes)}};
  for (size_t q = 0; q < protocols.size() && q < size_t{kNumProtocols}; ++q) {
    const int c = static_cast<int>(port);
    l.proto_latency_delta[q] = us_to_time(protocols[q].hop_latency_us[c]) +
                               proxy_latency(port, s, static_cast<int>(q)) - l.latency;
    l.proto_share_ppm[q] = static_cast<uint32_t>(std::llround(protocols[q].bw_share[c] * Link::kPpm));
  }
  return l;
}

class LinkModel {
 public:
  virtual ~LinkModel() = default;
  virtual Link link(int src, int dst) const = 0;
  // The link at training step `step` (Device::set_step): what a decorator
  // that changes links over time (FaultLinkModel, fault.h) overrides.
  virtual Link link_at(int src, int dst, int step) const {
    (void)step;
    return link(src, dst);
  }
};

// Devices on one node talk over the intra-node link, others over the
// inter-node one: through the NIC (rail) each device is near (profile
// "nics"). A device's inter-node ports are its share of that NIC: a NIC
// near k GPUs gives each of them 1/k of its rate, so the node's GPUs
// together never move more than its NICs do (a static share; concurrent
// flows sharing a NIC's bandwidth dynamically is not modeled). A message
// runs at the lesser share of its two ends.
//
// A cluster fabric (profile "fabric", a fat-tree or Clos of tiers): a
// message between nodes that first share tier t > 0 adds the latency of the
// switches it passes beyond one leaf's (ClusterFabric::extra_latency) and
// runs at most at its NIC share divided by the oversubscription of the
// tiers below t: the fair share of the oversubscribed uplinks when every
// host below them sends through at once (a worst-case static share, as the
// NIC's; the ports stay the devices' own, no switch queue is shared).
//
// A node with a PCIe tree (profile "pcie"): a message between two of its
// GPUs holds their intra-node ports (each GPU's own x16 link) at the rate
// of the slowest link on its path: the GPU links alone behind one switch;
// also both switches' uplinks through the root complex; also the
// inter-socket link across sockets (link()). Inside a collective step,
// where every member sends at once, a shared link splits its rate equally
// between the step's flows that cross it in the same direction
// (shared_rate(): a static share, as the NICs' is).
class ProfileLinkModel final : public LinkModel {
 public:
  explicit ProfileLinkModel(const HardwareProfile& p)
      : devices_per_node_(p.devices_per_node),
        intra_(make_link(LinkClass::kIntra, p.intra, p.protocols)),
        inter_(make_link(LinkClass::kInter, p.inter, p.protocols)) {
    for (size_t t = 0; t < p.fabric.tiers.size(); ++t) {
      const int tier = static_cast<int>(t);
      tier_latency_.push_back(p.fabric.extra_latency(tier));
      tier_over_.push_back(p.fabric.oversubscription_below(tier));
    }
    fabric_ = p.fabric;
    share_.reserve(static_cast<size_t>(p.devices_per_node));
    for (int g = 0; g < p.devices_per_node; ++g) share_.push_back(p.nic_sharers(g));
    if (!p.pcie.empty()) {
      for (int g = 0; g < p.devices_per_node; ++g) {
        switch_.push_back(p.pcie.switch_of(g));
        socket_.push_back(p.pcie.socket_of_switch(switch_.back()));
      }
      uplink_bps_ = LinkSpec{0, p.pcie.uplink_GBps}.bytes_per_second();
      socket_bps_ = LinkSpec{0, p.pcie.inter_socket_GBps}.bytes_per_second();
    }
  }
  Link link(int src, int dst) const override {
    if (src / devices_per_node_ == dst / devices_per_node_) {
      if (switch_.empty()) return intra_;
      Link l = intra_;
      const Path q = path(src, dst);
      if (q.up >= 0) l.bytes_per_second = std::min(l.bytes_per_second, uplink_bps_);
      if (q.socket_from >= 0) l.bytes_per_second = std::min(l.bytes_per_second, socket_bps_);
      return l;
    }
    const int k = std::max(share_[static_cast<size_t>(src % devices_per_node_)],
                           share_[static_cast<size_t>(dst % devices_per_node_)]);
    const int tier = fabric_.empty() ? 0 : fabric_.common_tier(src / devices_per_node_, dst / devices_per_node_);
    if (k == 1 && tier == 0) return inter_;
    Link l = inter_;
    l.bytes_per_second = std::max<uint64_t>(1, inter_.bytes_per_second / static_cast<uint64_t>(k));
    if (tier > 0) {
      // latency_of adds each protocol's delta to `latency`: the switches add to every protocol's hop.
      l.latency += tier_latency_[static_cast<size_t>(tier)];
      const double r = tier_over_[static_cast<size_t>(tier)];
      if (r > 1)
        l.bytes_per_second =
            std::max<uint64_t>(1, static_cast<uint64_t>(std::floor(static_cast<double>(l.bytes_per_second) / r)));
    }
    return l;
  }
  // Whether messages inside a node cross shared PCIe links (shared_rate may cap them).
  bool shares_intra() const { return !switch_.empty(); }
  // The rate (bytes per second) of the message src -> dst while every
  // member i of `members` (global ranks, group order) sends to member
  // i + dist (mod n) at once: on each shared link of its path (a switch's
  // uplink, up or down; the inter-socket link, in its direction) it gets
  // 1/k of the rate, k the flows of the pattern on that node crossing it
  // the same way; at most its GPUs' link. 0: no cap (no PCIe tree, or src
  // and dst on different nodes).
  uint64_t shared_rate(int src, int dst, std::span<const int> members, int dist) const {
    if (switch_.empty()) return 0;
    return shared_rate(src, dst, members, local_members(members, src / devices_per_node_), dist);
  }
  // The same, given `local`: the group indices of the members on src's node
  // (local_members; a collective builds it once per call, so a message costs
  // O(members per node), not O(members)).
  uint64_t shared_rate(int src, int dst, std::span<const int> members, std::span<const int> local, int dist) const {
    if (switch_.empty() || src / devices_per_node_ != dst / devices_per_node_) return 0;
    const Path q = path(src, dst);
    if (q.up < 0) return 0;
    const int node = src / devices_per_node_;
    const int n = static_cast<int>(members.size());
    uint64_t up = 0, down = 0, across = 0;
    for (int i : local) {
      const int a = members[static_cast<size_t>(i)], b = members[static_cast<size_t>(((i + dist) % n + n) % n)];
      if (a == b || a / devices_per_node_ != node || b / devices_per_node_ != node) continue;
      const Path f = path(a, b);
      up += f.up == q.up ? 1 : 0;
      down += f.down == q.down ? 1 : 0;
      across += (q.socket_from >= 0 && f.socket_from == q.socket_from && f.socket_to == q.socket_to) ? 1 : 0;
    }
    uint64_t rate = std::min(intra_.bytes_per_second, std::max<uint64_t>(1, uplink_bps_ / std::max<uint64_t>(1, up)));
    rate = std::min(rate, std::max<uint64_t>(1, uplink_bps_ / std::max<uint64_t>(1, down)));
    if (q.socket_from >= 0) rate = std::min(rate, std::max<uint64_t>(1, socket_bps_ / std::max<uint64_t>(1, across)));
    return rate;
  }
  // The group indices of the members on `node`, in group order.
  std::vector<int> local_members(std::span<const int> members, int node) const {
    std::vector<int> local;
    for (size_t i = 0; i < members.size(); ++i)
      if (members[i] / devices_per_node_ == node) local.push_back(static_cast<int>(i));
    return local;
  }

 private:
  // The shared links a message inside a node crosses: the source switch's
  // uplink (up), the destination switch's (down), the inter-socket link
  // (socket_from -> socket_to); -1: not crossed (one switch: none).
  struct Path {
    int up = -1, down = -1, socket_from = -1, socket_to = -1;
  };
  Path path(int src, int dst) const {
    const int a = src % devices_per_node_, b = dst % devices_per_node_;
    const int sa = switch_[static_cast<size_t>(a)], sb = switch_[static_cast<size_t>(b)];
    if (sa == sb) return {};
    Path q{sa, sb, -1, -1};
    const int ka = socket_[static_cast<size_t>(a)], kb = socket_[static_cast<size_t>(b)];
    if (ka != kb) q.socket_from = ka, q.socket_to = kb;
    return q;
  }

  int devices_per_node_;
  Link intra_;
  Link inter_;
  ClusterFabric fabric_;              // empty: one leaf
  std::vector<Time> tier_latency_;    // per tier t: ClusterFabric::extra_latency(t)
  std::vector<double> tier_over_;     // per tier t: ClusterFabric::oversubscription_below(t)
  std::vector<int> share_;   // GPUs sharing each local GPU's NIC
  std::vector<int> switch_;  // PCIe switch of each local GPU (empty: no tree)
  std::vector<int> socket_;  // CPU socket of each local GPU
  uint64_t uplink_bps_ = 0;
  uint64_t socket_bps_ = 0;
};

}  // namespace shardlab
