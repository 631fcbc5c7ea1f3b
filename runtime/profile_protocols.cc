// NCCL's protocols as its tuning model sees them, and their JSON form.
//
// The built-in values are NCCL's own (src/graph/tuning.cc, NVIDIA/nccl at
// commit 01afd20, the 2.9-2.10 model; the ring's rows, since every algorithm
// here moves one message per step, as NCCL's ring does):
//   baseLat (ring)           LL 3.6 us, LL128 10.0 us, Simple 8.4 us
//   hwLat per hop (ring)     NVLink .47 / 1.9 / 3.4 us, PCIe 1.0 / 2.5 / 5.7 us,
//                            network 2.7 / 4.0 / 9.6 us (LL / LL128 / Simple)
//   bandwidth                LL: busBw x 1/4 (ring, all_reduce or any
//                            multi-node collective); LL128: x 0.92 ("120/128",
//                            its 8 flag bytes per 128-byte line); Simple: the
//                            link's (here its packet model, link_model.h)
//   LL128 is enabled only where GPUs talk over NVLink (protoEnable, "Enable
//   LL128 by default only on Volta/Ampere+NVLink"), so on a PCIe node its
//   intra-node share is 0 (not used).
// Left out of NCCL's refinements: LL128's 0.7 with one GPU per node, its
// per-channel cap (ll128MaxBwPerCh), LL's intra-node latency x 1.8 across
// nodes, the 235 GB/s cap on compute capability 8.0, the ring's x 1.9
// "plateau" latency across nodes, the tree's correction factors.
#include "runtime/profile_protocols.h"

#include <array>
#include <cmath>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "runtime/errors.h"

namespace shardlab {
namespace {

constexpr std::array<const char*, kNumProtocols> kNames = {"LL", "LL128", "Simple"};
constexpr const char* kClasses[kNumLinkClasses] = {"intra", "inter"};

}  // namespace

const char* protocol_name(Protocol p) { return kNames[static_cast<size_t>(p)]; }

std::vector<ProtocolSpec> nccl_protocols(bool pcie_intra) {
  const double intra_lat[3] = {pcie_intra ? 1.0 : 0.47, pcie_intra ? 2.5 : 1.9, pcie_intra ? 5.7 : 3.4};
  const double net_lat[3] = {2.7, 4.0, 9.6};
  const double base[3] = {3.6, 10.0, 8.4};
  const double share[3] = {0.25, 0.92, 1.0};
  std::vector<ProtocolSpec> v(kNumProtocols);
  for (size_t q = 0; q < v.size(); ++q) {
    v[q].base_latency_us = base[q];
    v[q].hop_latency_us[0] = intra_lat[q];
    v[q].hop_latency_us[1] = net_lat[q];
    v[q].bw_share[0] = share[q];
    v[q].bw_share[1] = share[q];
  }
  if (pcie_intra) v[static_cast<size_t>(Protocol::kLL128)].bw_share[0] = 0;
  return v;
}

nlohmann::json protocols_to_json(const std::vector<ProtocolSpec>& protocols) {
  nlohmann::json j = nlohmann::json::object();
  for (size_t q = 0; q < protocols.size() && q < kNames.size(); ++q) {
    const ProtocolSpec& s = protocols[q];
    nlohmann::json one{{"base_latency_us", s.base_latency_us}};
    for (int c = 0; c < kNumLinkClasses; ++c)
      one[kClasses[c]] = {{"hop_latency_us", s.hop_latency_us[c]}, {"bw_share", s.bw_share[c]}};
    j[kNames[q]] = std::move(one);
  }
  return j;
}

namespace {

// A number at `path` under `j` in [0, hi].
double number(const nlohmann::json& j, const std::string& key, const std::string& path, double hi,
              std::string_view origin) {
  if (!j.is_object() || !j.contains(key))
    throw ConfigError(fmt::format("profile {}: missing field \"{}\"", origin, path));
  const auto& v = j[key];
  const double d = v.is_number() ? v.get<double>() : -1;
  if (!v.is_number() || !std::isfinite(d) || d < 0 || d > hi)
    throw ConfigError(fmt::format("profile {}: field \"{}\" must be a number in [0, {:g}]", origin, path, hi));
  return d;
}

}  // namespace

std::vector<ProtocolSpec> protocols_from_json(const nlohmann::json& j, std::string_view origin) {
  if (!j.is_object())
    throw ConfigError(fmt::format("profile {}: field \"protocols\" must be an object of LL, LL128 and Simple", origin));
  std::vector<ProtocolSpec> v(kNumProtocols);
  for (size_t q = 0; q < v.size(); ++q) {
    const std::string name = kNames[q];
    const std::string at = "protocols." + name;
    if (!j.contains(name)) throw ConfigError(fmt::format("profile {}: missing field \"{}\"", origin, at));
    const nlohmann::json& one = j[name];
    v[q].base_latency_us = number(one, "base_latency_us", at + ".base_latency_us", 1e6, origin);
    for (int c = 0; c < kNumLinkClasses; ++c) {
      const std::string cls = at + "." + kClasses[c];
      if (!one.is_object() || !one.contains(kClasses[c]))
        throw ConfigError(fmt::format("profile {}: missing field \"{}\"", origin, cls));
      v[q].hop_latency_us[c] = number(one[kClasses[c]], "hop_latency_us", cls + ".hop_latency_us", 1e6, origin);
      v[q].bw_share[c] = number(one[kClasses[c]], "bw_share", cls + ".bw_share", 1, origin);
    }
  }
  if (!v[static_cast<size_t>(Protocol::kSimple)].usable(LinkClass::kIntra) ||
      !v[static_cast<size_t>(Protocol::kSimple)].usable(LinkClass::kInter))
    throw ConfigError(fmt::format("profile {}: field \"protocols.Simple\": its bw_share must be > 0 on both "
                                  "link classes (every collective can fall back to Simple)",
                                  origin));
  return v;
}

bool known_protocol_field(std::string_view path) {
  if (path == "protocols") return true;
  for (const char* name : kNames) {
    const std::string at = std::string("protocols.") + name;
    if (path == at || path == at + ".base_latency_us") return true;
    for (const char* cls : kClasses) {
      const std::string c = at + "." + cls;
      if (path == c || path == c + ".hop_latency_us" || path == c + ".bw_share") return true;
    }
  }
  return false;
}

}  // namespace shardlab
