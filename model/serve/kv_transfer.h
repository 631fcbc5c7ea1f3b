// Disaggregated serving's K and V on the network (Splitwise, DistServe): when
// a prefill replica ends a request's prefill, every device of it sends its
// share of the request's K and V (its layers', its heads') to the device of
// the same rank in the chosen decode replica — the two replicas have the
// same split, so rank i holds the same share on both — all ranks at once,
// each pair over the link between its two devices (runtime/link_model.h:
// the intra-node link, NVLink, inside a node; the NIC across nodes). A
// pair's transfer of B bytes takes the link's latency plus its wire time (B
// over the link's rate, with the profile's packet overhead for a copy
// engine, as NIXL's RDMA moves it); the request's transfer is its slowest
// rank's. Transfers from one replica, or to one, take turns: a transfer
// starts when its K and V are ready and both replicas' ports are free, and
// holds them for its wire time (the latency overlaps the next one's).
//
// Placement: the replicas take consecutive devices, prefill replicas first:
// rank i of prefill replica p is device p·W + i, of decode replica d device
// (P + d)·W + i (W devices a replica; nodes of devices_per_node in order).
// So with W = 4 on 8-GPU nodes, prefill=1,decode=1 hands over on NVLink;
// with W = 8 every transfer crosses the NICs.
//
// Thread safety: one instance per run, used by the serving loop only.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/link_model.h"
#include "runtime/profile.h"

namespace shardlab::serve {

struct Handoff {
  int prefill = 0, decode = 0;  // replicas, each counted in its kind
  uint64_t bytes = 0;           // over every rank
  double ready_s = 0;           // the prefill's end
  double start_s = 0, arrive_s = 0;
  double transfer_s = 0;  // on the links: the slowest rank's latency + wire time
};

class KvTransfer {
 public:
  // `kv_bytes_per_token`: each rank's K and V of one token (ReplicaPlan).
  // ConfigError when the profile has fewer devices than the replicas.
  KvTransfer(const HardwareProfile& profile, int prefill_replicas, int decode_replicas,
             std::vector<double> kv_bytes_per_token);
  // The K and V of `tokens` tokens, ready at `ready_s` on prefill replica
  // `prefill`, to decode replica `decode`.
  Handoff send(int prefill, int decode, int64_t tokens, double ready_s);
  // Whether replica pair (prefill, decode)'s rank 0 talks inside a node.
  bool same_node(int prefill, int decode) const;

 private:
  int device(bool decode, int replica, int rank) const;

  HardwareProfile profile_;
  ProfileLinkModel links_;
  int prefill_replicas_;
  std::vector<double> per_token_;           // bytes, per rank
  std::vector<Time> egress_free_, ingress_free_;  // per prefill, per decode replica
};

}  // namespace shardlab::serve
