#include "model/serve/kv_transfer.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include <fmt/format.h>

#include "runtime/errors.h"

namespace shardlab::serve {

KvTransfer::KvTransfer(const HardwareProfile& profile, int prefill_replicas, int decode_replicas,
                       std::vector<double> kv_bytes_per_token)
    : profile_(profile),
      links_(profile_),
      prefill_replicas_(prefill_replicas),
      per_token_(std::move(kv_bytes_per_token)),
      egress_free_(size_t(prefill_replicas), 0),
      ingress_free_(size_t(decode_replicas), 0) {
  SHARDLAB_CHECK(prefill_replicas > 0 && decode_replicas > 0 && !per_token_.empty(),
                 "a KV transfer needs replicas of each kind and their devices");
  const int64_t devices = int64_t(prefill_replicas + decode_replicas) * int64_t(per_token_.size());
  if (devices > profile_.total_devices())
    throw ConfigError(fmt::format("{} prefill and {} decode replicas of {} devices need {} devices, the profile has {}",
                                  prefill_replicas, decode_replicas, per_token_.size(), devices,
                                  profile_.total_devices()));
}

int KvTransfer::device(bool decode, int replica, int rank) const {
  return ((decode ? prefill_replicas_ : 0) + replica) * int(per_token_.size()) + rank;
}

bool KvTransfer::same_node(int prefill, int decode) const {
  return profile_.node_of(device(false, prefill, 0)) == profile_.node_of(device(true, decode, 0));
}

Handoff KvTransfer::send(int prefill, int decode, int64_t tokens, double ready_s) {
  Handoff h{prefill, decode, 0, ready_s};
  const Time ready = Time(std::llround(ready_s * double(kPicosPerSecond)));
  Time& out = egress_free_[size_t(prefill)];
  Time& in = ingress_free_[size_t(decode)];
  const Time start = std::max({ready, out, in});
  Time wire = 0, whole = 0;  // the slowest rank's wire time and latency + wire time
  for (size_t rank = 0; rank < per_token_.size(); ++rank) {
    const auto bytes = uint64_t(std::llround(per_token_[rank] * double(tokens)));
    const Link l = links_.link(device(false, prefill, int(rank)), device(true, decode, int(rank)));
    const Time w = l.wire_time(bytes, Engine::kCopy);
    wire = std::max(wire, w);
    whole = std::max(whole, l.latency_of(Engine::kCopy) + w);
    h.bytes += bytes;
  }
  out = in = start + wire;
  h.start_s = to_seconds(start);
  h.arrive_s = to_seconds(start + whole);
  h.transfer_s = to_seconds(whole);
  return h;
}

}  // namespace shardlab::serve
