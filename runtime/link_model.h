// The link model: which port and link parameters a message between two
// devices uses. An interface so tests and fault injection (FaultLinkModel,
// fault.h) can wrap it to slow a link down or fail it (LevelDB's EnvWrapper
// pattern).
//
// Thread safety: const after construction; one instance serves every device
// thread of a run (link/link_at are const and touch no shared state).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "runtime/profile.h"
#include "runtime/time.h"

namespace shardlab {

struct Link {
  LinkClass port = LinkClass::kIntra;  // which egress/ingress port pair it occupies
  Time latency = 0;                    // ps, first byte
  uint64_t bytes_per_second = 1;       // per direction
  uint32_t header_bytes = 0;           // per packet
  uint32_t payload_bytes[2] = {0, 0};  // per packet, by Engine; 0: no packet overhead

  // Bytes on the wire for `bytes` of payload: bytes + ceil(bytes / payload) * header.
  uint64_t wire_bytes(uint64_t bytes, Engine e) const {
    const uint64_t payload = payload_bytes[static_cast<int>(e)];
    return payload == 0 ? bytes : bytes + (bytes + payload - 1) / payload * header_bytes;
  }
  // The time the message holds a port: ceil(wire_bytes * 1e12 / bytes_per_second) ps.
  Time wire_time(uint64_t bytes, Engine e) const {
    return transfer_time(wire_bytes(bytes, e), bytes_per_second);
  }
};

inline Link make_link(LinkClass port, const LinkSpec& s) {
  return {port,
          s.latency(),
          s.bytes_per_second(),
          static_cast<uint32_t>(s.packet_header_bytes),
          {static_cast<uint32_t>(s.sm_payload_bytes), static_cast<uint32_t>(s.copy_payload_bytes)}};
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
class ProfileLinkModel final : public LinkModel {
 public:
  explicit ProfileLinkModel(const HardwareProfile& p)
      : devices_per_node_(p.devices_per_node),
        intra_(make_link(LinkClass::kIntra, p.intra)),
        inter_(make_link(LinkClass::kInter, p.inter)) {
    share_.reserve(static_cast<size_t>(p.devices_per_node));
    for (int g = 0; g < p.devices_per_node; ++g) share_.push_back(p.nic_sharers(g));
  }
  Link link(int src, int dst) const override {
    if (src / devices_per_node_ == dst / devices_per_node_) return intra_;
    const int k = std::max(share_[static_cast<size_t>(src % devices_per_node_)],
                           share_[static_cast<size_t>(dst % devices_per_node_)]);
    if (k == 1) return inter_;
    Link l = inter_;
    l.bytes_per_second = std::max<uint64_t>(1, inter_.bytes_per_second / static_cast<uint64_t>(k));
    return l;
  }

 private:
  int devices_per_node_;
  Link intra_;
  Link inter_;
  std::vector<int> share_;  // GPUs sharing each local GPU's NIC
};

}  // namespace shardlab
