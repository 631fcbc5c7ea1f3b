#include "runtime/profile.h"

#include <cmath>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "runtime/errors.h"

namespace shardlab {

const char* link_class_name(LinkClass c) { return c == LinkClass::kIntra ? "intra" : "inter"; }

uint64_t LinkSpec::bytes_per_second() const {
  return static_cast<uint64_t>(std::llround(bandwidth_GBps * 1e9));
}

uint64_t HardwareProfile::memory_bytes() const {
  return static_cast<uint64_t>(std::llround(device.memory_GiB * 1024.0 * 1024.0 * 1024.0));
}

// Sources for the figures (all public):
//  - Peak FLOP/s, HBM bandwidth and capacity: NVIDIA A100 and H100 SXM datasheets
//    (A100: 19.5 TFLOP/s fp32, 312 bf16 dense, 2.0 TB/s, 80 GB;
//     H100 SXM: 67 fp32, 989 bf16 dense, 3.35 TB/s, 80 GB).
//  - Link bandwidths per direction: NVLink3 300 GB/s (A100), NVLink4 450 GB/s (H100),
//    PCIe Gen4 x16 ~32 GB/s, InfiniBand HDR 200 Gb/s = 25 GB/s and NDR 400 Gb/s = 50 GB/s
//    per GPU (one NIC per GPU, as in DGX A100 / DGX H100).
//  - Per-hop latencies sit between NCCL's own LL and Simple-protocol figures in its
//    tuning model (src/graph/tuning.cc, hwLat: NVLink 0.5-3.4 us, PCIe 1.0-5.7 us,
//    network 2.7-14 us) and OSU osu_latency device-to-device results with GPUDirect RDMA.
//  - Kernel launch overhead ~4 us (a CUDA launch as seen on a timeline: 3-5 us).
//  - compute_efficiency 0.7: a well-tuned large GEMM reaches 70-80% of peak.
const std::vector<HardwareProfile>& builtin_profiles() {
  static const std::vector<HardwareProfile> kProfiles = [] {
    std::vector<HardwareProfile> v;
    DeviceSpec a100{19.5, 312.0, 2039.0, 80.0, 4.0, 0.7};
    DeviceSpec h100{67.0, 989.0, 3350.0, 80.0, 4.0, 0.7};
    v.push_back({"a100-nvlink", "DGX A100 nodes: NVLink3 inside a node, InfiniBand HDR between",
                 4, 8, a100, {2.0, 300.0}, {5.0, 25.0}});
    v.push_back({"a100-pcie", "A100 PCIe servers: PCIe Gen4 x16 inside a node, InfiniBand HDR between",
                 4, 8, a100, {3.0, 32.0}, {5.0, 25.0}});
    v.push_back({"h100-nvlink", "DGX H100 nodes: NVLink4 inside a node, InfiniBand NDR between",
                 4, 8, h100, {1.5, 450.0}, {4.0, 50.0}});
    return v;
  }();
  return kProfiles;
}

nlohmann::json profile_to_json(const HardwareProfile& p) {
  auto link = [](const LinkSpec& l) {
    return nlohmann::json{{"latency_us", l.latency_us}, {"bandwidth_GBps", l.bandwidth_GBps}};
  };
  return {{"name", p.name},
          {"description", p.description},
          {"nodes", p.nodes},
          {"devices_per_node", p.devices_per_node},
          {"device",
           {{"peak_tflops", {{"fp32", p.device.peak_tflops_fp32}, {"bf16", p.device.peak_tflops_bf16}}},
            {"mem_bandwidth_GBps", p.device.mem_bandwidth_GBps},
            {"memory_GiB", p.device.memory_GiB},
            {"launch_overhead_us", p.device.launch_overhead_us},
            {"compute_efficiency", p.device.compute_efficiency}}},
          {"links", {{"intra", link(p.intra)}, {"inter", link(p.inter)}}}};
}

namespace {

// Walks a JSON object by a dotted path, naming the path in every error.
class Reader {
 public:
  explicit Reader(std::string_view origin) : origin_(origin) {}

  const nlohmann::json& at(const nlohmann::json& j, const std::string& path) const {
    const nlohmann::json* cur = &j;
    size_t start = 0;
    while (true) {
      size_t dot = path.find('.', start);
      std::string key = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
      if (!cur->is_object() || !cur->contains(key)) fail(fmt::format("missing field \"{}\"", path));
      cur = &(*cur)[key];
      if (dot == std::string::npos) return *cur;
      start = dot + 1;
    }
  }
  double positive(const nlohmann::json& j, const std::string& path, bool allow_zero = false) const {
    const auto& v = at(j, path);
    if (!v.is_number()) fail(fmt::format("field \"{}\" must be a number", path));
    double d = v.get<double>();
    if (!std::isfinite(d) || d < 0 || (!allow_zero && d == 0))
      fail(fmt::format("field \"{}\" must be {} (got {})", path, allow_zero ? ">= 0" : "> 0", d));
    return d;
  }
  int count(const nlohmann::json& j, const std::string& path) const {
    const auto& v = at(j, path);
    if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > 1'000'000)
      fail(fmt::format("field \"{}\" must be a positive integer", path));
    return v.get<int>();
  }
  [[noreturn]] void fail(const std::string& what) const {
    throw ConfigError(fmt::format("profile {}: {}", origin_, what));
  }

 private:
  std::string origin_;
};

}  // namespace

HardwareProfile profile_from_json(const nlohmann::json& j, std::string_view origin) {
  Reader r(origin);
  if (!j.is_object()) r.fail("expected a JSON object");
  HardwareProfile p;
  const auto& name = r.at(j, "name");
  if (!name.is_string() || name.get<std::string>().empty()) r.fail("field \"name\" must be a non-empty string");
  p.name = name.get<std::string>();
  if (j.contains("description") && j["description"].is_string()) p.description = j["description"];
  p.nodes = r.count(j, "nodes");
  p.devices_per_node = r.count(j, "devices_per_node");
  p.device.peak_tflops_fp32 = r.positive(j, "device.peak_tflops.fp32");
  p.device.peak_tflops_bf16 = r.positive(j, "device.peak_tflops.bf16");
  p.device.mem_bandwidth_GBps = r.positive(j, "device.mem_bandwidth_GBps");
  p.device.memory_GiB = r.positive(j, "device.memory_GiB");
  p.device.launch_overhead_us = r.positive(j, "device.launch_overhead_us", /*allow_zero=*/true);
  if (j["device"].contains("compute_efficiency")) {
    p.device.compute_efficiency = r.positive(j, "device.compute_efficiency");
    if (p.device.compute_efficiency > 1) r.fail("field \"device.compute_efficiency\" must be in (0, 1]");
  }
  for (auto [cls, spec] : {std::pair{"intra", &p.intra}, std::pair{"inter", &p.inter}}) {
    std::string base = std::string("links.") + cls;
    spec->latency_us = r.positive(j, base + ".latency_us", /*allow_zero=*/true);
    spec->bandwidth_GBps = r.positive(j, base + ".bandwidth_GBps");
    if (spec->bytes_per_second() == 0) r.fail(fmt::format("field \"{}.bandwidth_GBps\" is too small", base));
  }
  return p;
}

HardwareProfile load_profile(std::string_view name_or_path) {
  for (const auto& p : builtin_profiles())
    if (p.name == name_or_path) return p;
  const bool looks_like_file = name_or_path.ends_with(".json") ||
                               name_or_path.find('/') != std::string_view::npos;
  if (!looks_like_file) {
    std::string names;
    for (const auto& p : builtin_profiles()) names += (names.empty() ? "" : ", ") + p.name;
    throw ConfigError(fmt::format("unknown profile \"{}\" (built in: {}; or give a FILE.json)",
                                  name_or_path, names));
  }
  std::string path(name_or_path);
  std::ifstream in(path);
  if (!in) throw ConfigError(fmt::format("profile {}: cannot open file", path));
  nlohmann::json j;
  try {
    in >> j;
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError(fmt::format("profile {}: not valid JSON ({})", path, e.what()));
  }
  return profile_from_json(j, path);
}

}  // namespace shardlab
