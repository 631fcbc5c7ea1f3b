// The link model: which port and link parameters a message between two
// devices uses. An interface so tests (and later fault injection) can wrap it
// to slow a link down or fail it (LevelDB's EnvWrapper pattern).
#pragma once

#include <cstdint>

#include "runtime/profile.h"
#include "runtime/time.h"

namespace shardlab {

struct Link {
  LinkClass port = LinkClass::kIntra;  // which egress/ingress port pair it occupies
  Time latency = 0;                    // ps, first byte
  uint64_t bytes_per_second = 1;       // per direction
};

class LinkModel {
 public:
  virtual ~LinkModel() = default;
  virtual Link link(int src, int dst) const = 0;
};

// Devices on one node talk over the intra-node link, others over the inter-node one.
class ProfileLinkModel final : public LinkModel {
 public:
  explicit ProfileLinkModel(const HardwareProfile& p)
      : devices_per_node_(p.devices_per_node),
        intra_{LinkClass::kIntra, p.intra.latency(), p.intra.bytes_per_second()},
        inter_{LinkClass::kInter, p.inter.latency(), p.inter.bytes_per_second()} {}
  Link link(int src, int dst) const override {
    return src / devices_per_node_ == dst / devices_per_node_ ? intra_ : inter_;
  }

 private:
  int devices_per_node_;
  Link intra_;
  Link inter_;
};

}  // namespace shardlab
