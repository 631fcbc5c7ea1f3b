// HardwareProfile and its parts: the derived figures (profile.h). The
// JSON form is profile_json.cc; the built-ins, profile_builtin.cc.
#include "runtime/profile.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "runtime/errors.h"


namespace shardlab {

uint64_t LinkSpec::bytes_per_second() const {
  return static_cast<uint64_t>(std::llround(bandwidth_GBps * 1e9));
}

int HardwareProfile::nic_of(int rank) const {
  const int local = rank % devices_per_node;
  for (size_t n = 0; n < nics.size(); ++n)
    for (int g : nics[n])
      if (g == local) return static_cast<int>(n);
  return local;
}

int HardwareProfile::nic_sharers(int rank) const {
  return nics.empty() ? 1 : static_cast<int>(nics[static_cast<size_t>(nic_of(rank))].size());
}

int PcieTopology::switch_of(int local_gpu) const {
  for (size_t s = 0; s < switches.size(); ++s)
    for (int g : switches[s])
      if (g == local_gpu) return static_cast<int>(s);
  return -1;
}

int PcieTopology::socket_of_switch(int sw) const {
  for (size_t k = 0; k < sockets.size(); ++k)
    for (int s : sockets[k])
      if (s == sw) return static_cast<int>(k);
  return -1;
}

namespace {
// rates[i] at seq[i]; linear in log2(s) between two lengths, the nearest
// length's rate outside them.
double interpolate(const std::vector<double>& seq, const std::vector<double>& rates, double s) {
  if (s <= seq.front()) return rates.front();
  if (s >= seq.back()) return rates.back();
  size_t i = 1;
  while (seq[i] < s) ++i;
  const double x = std::log2(s / seq[i - 1]) / std::log2(seq[i] / seq[i - 1]);
  return rates[i - 1] + x * (rates[i] - rates[i - 1]);
}
}  // namespace

double AttentionSpec::forward_tflops(double s, bool causal) const {
  return interpolate(seq, causal ? fwd_causal : fwd, s);
}

double AttentionSpec::backward_tflops(double s, bool causal) const {
  const double full = interpolate(seq, bwd, s);
  return causal ? full * interpolate(seq, fwd_causal, s) / interpolate(seq, fwd, s) : full;
}

std::vector<std::string> DeviceSpec::attention_kernel_names() const {
  std::vector<std::string> names;
  for (const AttentionSpec& k : attention_kernels) names.push_back(k.kernel);
  std::sort(names.begin(), names.end());
  if (!attention.kernel.empty()) names.insert(names.begin(), attention.kernel);
  return names;
}

void select_attention_kernel(HardwareProfile& p, std::string_view kernel) {
  DeviceSpec& d = p.device;
  if (kernel.empty() || kernel == d.attention.kernel) return;
  for (AttentionSpec& k : d.attention_kernels)
    if (k.kernel == kernel) {
      std::swap(k, d.attention);
      return;
    }
  const std::string have = fmt::format("{}", fmt::join(d.attention_kernel_names(), ", "));
  throw ConfigError(fmt::format(
      "attention kernel \"{}\": profile {} has {}", kernel, p.name,
      have.empty() ? "no named fused attention kernel (its fused attention runs at the GEMM model)"
                   : "the fused attention kernels " + have));
}

int ClusterFabric::common_tier(int node_a, int node_b) const {
  for (size_t t = 0; t + 1 < tiers.size(); ++t)
    if (node_a / tiers[t].nodes == node_b / tiers[t].nodes) return static_cast<int>(t);
  return tiers.empty() ? 0 : static_cast<int>(tiers.size()) - 1;
}

Time ClusterFabric::extra_latency(int tier) const {
  if (tier <= 0) return 0;
  Time t = us_to_time(tiers[0].hop_latency_us) + us_to_time(tiers[static_cast<size_t>(tier)].hop_latency_us);
  for (int j = 1; j < tier; ++j) t += 2 * us_to_time(tiers[static_cast<size_t>(j)].hop_latency_us);
  return t;
}

double ClusterFabric::oversubscription_below(int tier) const {
  double r = 1;
  for (int j = 0; j < tier; ++j) r *= tiers[static_cast<size_t>(j)].oversubscription;
  return r;
}

std::string ClusterFabric::tier_name(int tier) const {
  const std::string& n = tiers[static_cast<size_t>(tier)].name;
  return n.empty() ? fmt::format("tier {}", tier) : n;
}

std::string ClusterFabric::describe() const {
  std::string out;
  for (size_t t = 0; t < tiers.size(); ++t) {
    const FabricTier& f = tiers[t];
    out += fmt::format("{}{} (", t ? " / " : "", tier_name(static_cast<int>(t)));
    if (f.nodes > 0) out += fmt::format("{} nodes, ", f.nodes);
    out += fmt::format("{:g} us/hop", f.hop_latency_us);
    if (f.oversubscription > 1) out += fmt::format(", {:g}:1 up", f.oversubscription);
    out += ")";
  }
  return out;
}

uint64_t HardwareProfile::memory_bytes() const {
  return static_cast<uint64_t>(std::llround(device.memory_GiB * 1024.0 * 1024.0 * 1024.0));
}

}  // namespace shardlab
