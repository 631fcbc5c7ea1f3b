// The profile loader (runtime/profile.h): load_profile on a JSON file
// holding the input, as --profile FILE.json uses it. An accepted profile
// must keep the time model's arithmetic finite and survive the JSON round
// trip of `shardlab profiles --json` unchanged.
#include <climits>
#include <cmath>

#include <nlohmann/json.hpp>

#include "fuzz/fuzz_util.h"
#include "runtime/errors.h"
#include "runtime/profile.h"

namespace {

using shardlab::HardwareProfile;
using shardlab::fuzz::finding;

// What the cluster and the link model compute from a profile without
// checking again: a device count, byte rates and latencies.
void check_accepted(const HardwareProfile& p) {
  if (p.nodes < 1 || p.devices_per_node < 1) finding("a profile without devices was accepted");
  if (int64_t{p.nodes} * p.devices_per_node > INT_MAX)
    finding("nodes x devices_per_node overflows int (total_devices)");
  for (const shardlab::LinkSpec* l : {&p.intra, &p.inter}) {
    if (l->bytes_per_second() == 0) finding("a link of 0 bytes per second was accepted");
    if (!std::isfinite(l->latency_us) || l->latency_us < 0) finding("a bad link latency was accepted");
  }
  if (!(p.device.memory_GiB > 0) || p.memory_bytes() == 0) finding("a device without memory was accepted");
}

bool same_link(const shardlab::LinkSpec& a, const shardlab::LinkSpec& b) {
  return a.latency_us == b.latency_us && a.bandwidth_GBps == b.bandwidth_GBps &&
         a.packet_header_bytes == b.packet_header_bytes && a.sm_payload_bytes == b.sm_payload_bytes &&
         a.copy_payload_bytes == b.copy_payload_bytes;
}

// profile_to_json, read back, gives the same profile.
void check_round_trip(const HardwareProfile& p) {
  HardwareProfile q;
  try {
    q = shardlab::profile_from_json(shardlab::profile_to_json(p), "round trip");
  } catch (const shardlab::ConfigError& e) {
    finding(std::string("the loader refuses what profile_to_json wrote: ") + e.what());
  }
  const shardlab::DeviceSpec &a = p.device, &b = q.device;
  const bool same_device =
      a.peak_tflops_fp32 == b.peak_tflops_fp32 && a.peak_tflops_bf16 == b.peak_tflops_bf16 &&
      a.mem_bandwidth_GBps == b.mem_bandwidth_GBps && a.memory_GiB == b.memory_GiB &&
      a.launch_overhead_us == b.launch_overhead_us && a.compute_efficiency == b.compute_efficiency &&
      a.mem_efficiency == b.mem_efficiency && a.collective_launch_us == b.collective_launch_us &&
      a.layernorm_fwd_rate == b.layernorm_fwd_rate && a.layernorm_bwd_rate == b.layernorm_bwd_rate &&
      a.gemm.sm_count == b.gemm.sm_count && a.gemm.tiles == b.gemm.tiles &&
      a.gemm.max_efficiency_fp32 == b.gemm.max_efficiency_fp32 &&
      a.gemm.max_efficiency_bf16 == b.gemm.max_efficiency_bf16;
  if (q.name != p.name || q.description != p.description || q.nodes != p.nodes ||
      q.devices_per_node != p.devices_per_node || !same_device || !same_link(p.intra, q.intra) ||
      !same_link(p.inter, q.inter))
    finding("the JSON round trip changed the profile");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static shardlab::fuzz::MemFile file;
  try {
    const HardwareProfile p = shardlab::load_profile(file.write(data, size));
    check_accepted(p);
    check_round_trip(p);
  } catch (const shardlab::ConfigError&) {
    // Not a valid profile: the expected outcome, one line naming the problem.
  }
  return 0;
}
