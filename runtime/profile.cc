#include "runtime/profile.h"
#include "runtime/profile_protocols.h"

#include <cmath>
#include <fstream>
#include <set>
#include <string_view>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "runtime/errors.h"
#include "runtime/input_file.h"

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

uint64_t HardwareProfile::memory_bytes() const {
  return static_cast<uint64_t>(std::llround(device.memory_GiB * 1024.0 * 1024.0 * 1024.0));
}

// Sources for the figures (all public; README "Cost model" has the table):
//  - Peak FLOP/s, HBM bandwidth and capacity: NVIDIA A100 and H100 SXM datasheets
//    (A100: 19.5 TFLOP/s fp32, 312 bf16 dense, 2.0 TB/s, 80 GB;
//     H100 SXM: 67 fp32, 989 bf16 dense, 3.35 TB/s, 80 GB).
//  - Link bandwidths per direction: NVLink3 300 GB/s (A100), NVLink4 450 GB/s (H100),
//    PCIe Gen4 x16 ~32 GB/s, InfiniBand HDR 200 Gb/s = 25 GB/s and NDR 400 Gb/s = 50 GB/s
//    per NIC. DGX A100 / DGX H100: one NIC per GPU (8 rails); the 4-NIC A100 nodes of
//    NVIDIA/nccl#1048 ("A100 * 8, IB 200Gb * 4"): a NIC per two GPUs.
//  - Per-hop latencies sit between NCCL's own LL and Simple-protocol figures in its
//    tuning model (src/graph/tuning.cc, hwLat: NVLink 0.5-3.4 us, PCIe 1.0-5.7 us,
//    network 2.7-14 us) and OSU osu_latency device-to-device results with GPUDirect RDMA.
//  - Kernel launch overhead ~4 us (a CUDA launch as seen on a timeline: 3-5 us).
//  - compute_efficiency 0.7: non-GEMM flops (elementwise math); those ops are memory-bound.
//  - mem_efficiency 0.90: STREAM-like kernels (BabelStream triad, nvbandwidth) reach
//    85-92% of the HBM datasheet bandwidth on A100 and H100 (0.90 assumed for both).
//  - GEMM: sm_count 108 (A100) / 132 (H100 SXM) from the datasheets; output tiles
//    256x128, 128x128, 128x64 and 64x64, the cuBLAS tile shapes NVIDIA's "Matrix
//    Multiplication Background User's Guide" discusses (one 256x128 tile per SM: a
//    wave of 108 tiles on A100); max efficiency of bf16 GEMMs on A100: 0.70 (218.4
//    of 312 TFLOP/s), the one end-to-end calibration of the model: fitted once to
//    Narayanan et al. 2021 Table 1 as the 2021 code ran it (ten runs, 32 to 3,072
//    A100s, no SP, scatter/gather between stages, dropout, unfused fp32 gradient
//    accumulation; least mean |error|; README "Scale"; 0.665 before that
//    accumulation and SM contention were modeled, 0.64 before the scatter/gather,
//    dropout and the channels over every rail), where it also
//    absorbs what the model leaves out (clocks below boost under sustained
//    tensor-core load, host gaps between kernels). cuBLAS alone
//    reaches 75-85% of peak in short benchmarks. H100 0.75 (~740 of 989: an
//    assumption of the same order, not calibrated); fp32 SGEMM 0.97 (cuBLAS 18.88 of 19.49 TFLOP/s on an A100 80GB,
//    M=5120 N=K=4096, Yinghan-Li/YHs_Sample#4).
//  - Hopper and Blackwell (HGX/DGX datasheets; README "Scale" has the table): H100 SXM
//    1,979 TFLOP/s dense FP8, 132 SMs, 80 GB HBM3 at 3.35 TB/s; H200 SXM the same
//    GH100 compute with 141 GB HBM3e at 4.8 TB/s; HGX B200 (1,000 W): 80 fp32, 2,250
//    bf16 and 4,500 FP8 dense TFLOP/s, 148 SMs, 8 TB/s HBM3e, 180 GB enabled per GPU
//    (DGX B200: 1,440 GB for eight; 192 GB on the package), NVLink5 900 GB/s per
//    direction. The FP8 GEMM maximum (kH100Fp8GemmMax) is the one number for FP8;
//    B200's GEMM maxima are H100's, uncalibrated.
//  - NVLink packets: an NVLink3/4 packet carries at most 128 B of payload when the SMs
//    store (NCCL's kernels) and 256 B from the copy engines (cudaMemcpy), with ~32 B
//    of header and CRC: a 25 GB/s NVLink3 link gives ~20 GB/s to NCCL, 12 links
//    240 GB/s (S. Jeaugey, NVIDIA/nccl-tests#149), ~267 GB/s to cudaMemcpy. PCIe Gen4
//    TLPs: 24 B of header, framing and LCRC per 128 B (SM) / 256 B (max payload) TLP.
//    InfiniBand: 4096 B MTU, 42 B of LRH+BTH+RETH+ICRC+VCRC headers.
//  - collective_launch_us 8: nccl-tests all_reduce on 2 A100 SXM4 over NVLink takes
//    10.1 us at 32 B (NVIDIA/nccl#583); the modeled one hop is 2 us, the rest is the
//    collective's fixed start (NCCL's own tuning model has 6.6-8.4 us of base latency).
//    The built-in profiles carry no "protocols" yet (plain sends); a profile with
//    nccl_protocols (profile_protocols.cc) runs NCCL's LL, LL128 and Simple, with
//    collective_launch_us then the kernel launch alone (4 us, launch_overhead_us).
// FP8 GEMM maximum of the Hopper and Blackwell profiles: the achieved share
// of the FP8 peak of a GEMM that fills whole tiles and waves. An assumption
// of cuBLASLt's order (large FP8 GEMMs reach 65-75% of 1,979 TFLOP/s).
constexpr double kH100Fp8GemmMax = 0.70;

const std::vector<HardwareProfile>& builtin_profiles() {
  static const std::vector<HardwareProfile> kProfiles = [] {
    auto device = [](double fp32, double bf16, double hbm, int sms, double eff_bf16) {
      DeviceSpec d{fp32, bf16, hbm, 80.0, 4.0, 0.7};
      d.mem_efficiency = 0.90;
      d.collective_launch_us = 8.0;
      d.gemm = {sms, {{256, 128}, {128, 128}, {128, 64}, {64, 64}}, 0.97, eff_bf16};
      return d;
    };
    auto link = [](double lat, double bw, int header, int sm_payload, int copy_payload) {
      return LinkSpec{lat, bw, header, sm_payload, copy_payload};
    };
    const DeviceSpec a100 = device(19.5, 312.0, 2039.0, 108, 0.70);
    // The H100 family (sources: README "Scale", the Hopper/Blackwell notes above).
    auto fp8 = [](DeviceSpec d, double fp8_tflops, double eff_fp8, double memory_gib) {
      d.peak_tflops_fp8 = fp8_tflops;
      d.gemm.max_efficiency_fp8 = eff_fp8;
      d.memory_GiB = memory_gib;
      return d;
    };
    const DeviceSpec h100 = fp8(device(67.0, 989.0, 3350.0, 132, 0.75), 1979.0, kH100Fp8GemmMax, 80.0);
    const DeviceSpec h200 = fp8(device(67.0, 989.0, 4800.0, 132, 0.75), 1979.0, kH100Fp8GemmMax, 141.0);
    const DeviceSpec b200 = fp8(device(80.0, 2250.0, 8000.0, 148, 0.75), 4500.0, kH100Fp8GemmMax, 180.0);
    const LinkSpec nvlink4 = link(1.5, 450.0, 32, 128, 256), ndr = link(4.0, 50.0, 42, 4096, 4096);
    const LinkSpec hdr = link(5.0, 25.0, 42, 4096, 4096);
    // NICs: DGX A100 and DGX H100 have eight compute NICs, one per GPU (a
    // rail each: the default, "nics" absent); the 4-NIC A100 servers of
    // NVIDIA/nccl#1048 share one between two GPUs.
    const std::vector<std::vector<int>> one_per_gpu;
    const std::vector<std::vector<int>> one_per_pair = {{0, 1}, {2, 3}, {4, 5}, {6, 7}};
    // An 8x A100 PCIe server (a100-pcie-8): GPU pairs behind four PCIe Gen4
    // switches, two switches on each of two CPU sockets; a switch's uplink
    // is a Gen4 x16 link like a GPU's (32 GB/s per direction), the sockets
    // are joined at NCCL's figure for AMD's inter-socket link, AMD_BW = 16
    // GB/s (src/graph/topo.h), the link that NCCL's ring 0..7 crosses
    // twice (3 -> 4 and 7 -> 0). One HDR NIC per switch, shared by its pair.
    PcieTopology pcie_box{{{0, 1}, {2, 3}, {4, 5}, {6, 7}}, {{0, 1}, {2, 3}}, 32.0, 16.0};
    const DeviceSpec a100_pcie = device(19.5, 312.0, 1935.0, 108, 0.665);  // 80GB PCIe: 1,935 GB/s HBM
    std::vector<HardwareProfile> v;
    v.push_back({"a100-nvlink",
                 "DGX A100 nodes (as Selene's): NVLink3 over NVSwitch inside a node, one "
                 "InfiniBand HDR NIC per GPU between",
                 4, 8, a100, link(2.0, 300.0, 32, 128, 256), hdr, one_per_gpu});
    v.push_back({"a100-nvlink-4nic",
                 "A100 SXM nodes with four InfiniBand HDR NICs, each shared by two GPUs "
                 "(NVIDIA/nccl#1048): NVLink3 over NVSwitch inside a node",
                 4, 8, a100, link(2.0, 300.0, 32, 128, 256), hdr, one_per_pair});
    v.push_back({"a100-pcie",
                 "A100 PCIe servers: PCIe Gen4 x16 inside a node, InfiniBand HDR between", 4, 8,
                 a100, link(3.0, 32.0, 24, 128, 256), hdr});
    v.push_back({"a100-pcie-8",
                 "8x A100 80GB PCIe server: GPU pairs behind four PCIe Gen4 switches, two "
                 "switches per CPU socket, the sockets joined by a 16 GB/s link; one InfiniBand "
                 "HDR NIC per switch",
                 4, 8, a100_pcie, link(3.0, 32.0, 24, 128, 256), hdr, one_per_pair, pcie_box});
    v.push_back({"h100-nvlink",
                 "DGX H100 nodes: NVLink4 inside a node, one InfiniBand NDR 400G NIC per GPU between",
                 4, 8, h100, nvlink4, ndr, one_per_gpu});
    v.push_back({"h200-nvlink",
                 "DGX H200 nodes: H100's compute with 141 GB of HBM3e at 4.8 TB/s; NVLink4 inside a node, "
                 "one InfiniBand NDR 400G NIC per GPU between",
                 4, 8, h200, nvlink4, ndr, one_per_gpu});
    v.push_back({"b200-nvlink",
                 "DGX B200 nodes: NVLink5 (1.8 TB/s per GPU, both directions) inside a node, one "
                 "ConnectX-7 400G NIC per GPU between",
                 4, 8, b200, link(1.5, 900.0, 32, 128, 256), ndr, one_per_gpu});
    return v;
  }();
  return kProfiles;
}

namespace {
nlohmann::json tiles_to_json(const std::vector<GemmTile>& tiles) {
  nlohmann::json j = nlohmann::json::array();
  for (const GemmTile& t : tiles) j.push_back({t.m, t.n});
  return j;
}
}  // namespace

nlohmann::json profile_to_json(const HardwareProfile& p) {
  auto link = [](const LinkSpec& l) {
    nlohmann::json j{{"latency_us", l.latency_us}, {"bandwidth_GBps", l.bandwidth_GBps}};
    if (l.sm_payload_bytes > 0 || l.copy_payload_bytes > 0)
      j["packet"] = {{"header_bytes", l.packet_header_bytes},
                     {"sm_payload_bytes", l.sm_payload_bytes},
                     {"copy_payload_bytes", l.copy_payload_bytes}};
    return j;
  };
  const DeviceSpec& d = p.device;
  nlohmann::json device{
      {"peak_tflops", {{"fp32", d.peak_tflops_fp32}, {"bf16", d.peak_tflops_bf16}}},
      {"mem_bandwidth_GBps", d.mem_bandwidth_GBps},
      {"memory_GiB", d.memory_GiB},
      {"launch_overhead_us", d.launch_overhead_us},
      {"compute_efficiency", d.compute_efficiency},
      {"mem_efficiency", d.mem_efficiency},
      {"collective_launch_us", d.collective_launch_us}};
  if (d.peak_tflops_fp8 > 0) device["peak_tflops"]["fp8"] = d.peak_tflops_fp8;
  if (d.gemm.sm_count > 0)
    device["gemm"] = {
        {"sm_count", d.gemm.sm_count},
        {"tiles", tiles_to_json(d.gemm.tiles)},
        {"max_efficiency",
         {{"fp32", d.gemm.max_efficiency_fp32}, {"bf16", d.gemm.max_efficiency_bf16}}}};
  if (d.gemm.sm_count > 0 && d.peak_tflops_fp8 > 0)
    device["gemm"]["max_efficiency"]["fp8"] = d.gemm.max_efficiency_fp8;
  nlohmann::json j{{"name", p.name},   {"description", p.description},
                   {"nodes", p.nodes}, {"devices_per_node", p.devices_per_node},
                   {"device", device}, {"links", {{"intra", link(p.intra)}, {"inter", link(p.inter)}}}};
  if (!p.nics.empty()) j["nics"] = p.nics;
  if (!p.pcie.empty())
    j["pcie"] = {{"switches", p.pcie.switches},
                 {"sockets", p.pcie.sockets},
                 {"uplink_GBps", p.pcie.uplink_GBps},
                 {"inter_socket_GBps", p.pcie.inter_socket_GBps}};
  if (!p.protocols.empty()) j["protocols"] = protocols_to_json(p.protocols);
  return j;
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
  // A number in (0, hi], or [0, hi] with allow_zero. The upper bounds keep
  // the integer picosecond and byte-rate arithmetic of the time model finite.
  double positive(const nlohmann::json& j, const std::string& path, bool allow_zero,
                  double hi) const {
    const auto& v = at(j, path);
    if (!v.is_number()) fail(fmt::format("field \"{}\" must be a number", path));
    double d = v.get<double>();
    if (!std::isfinite(d) || d < 0 || (!allow_zero && d == 0))
      fail(fmt::format("field \"{}\" must be {} (got {})", path, allow_zero ? ">= 0" : "> 0", d));
    if (d > hi) fail(fmt::format("field \"{}\" must be at most {:g} (got {:g})", path, hi, d));
    return d;
  }
  // Rates (TFLOP/s, GB/s): at least a thousandth, at most 1e9; sizes (GiB)
  // at most 1e6; durations (us) at most a second.
  double rate(const nlohmann::json& j, const std::string& path) const {
    const double d = positive(j, path, false, 1e9);
    if (d < 1e-3) fail(fmt::format("field \"{}\" must be at least 0.001 (got {:g})", path, d));
    return d;
  }
  double duration_us(const nlohmann::json& j, const std::string& path) const {
    return positive(j, path, /*allow_zero=*/true, 1e6);
  }
  int count(const nlohmann::json& j, const std::string& path, bool allow_zero = false) const {
    const auto& v = at(j, path);
    const int64_t lo = allow_zero ? 0 : 1;
    if (!v.is_number_integer() || v.get<int64_t>() < lo || v.get<int64_t>() > 1'000'000)
      fail(fmt::format("field \"{}\" must be a {} integer", path,
                       allow_zero ? "non-negative" : "positive"));
    return v.get<int>();
  }
  // An efficiency: a number in (0, 1].
  double fraction(const nlohmann::json& j, const std::string& path) const {
    const double d = positive(j, path, /*allow_zero=*/false, 1e300);
    if (d > 1) fail(fmt::format("field \"{}\" must be in (0, 1]", path));
    return d;
  }
  bool has(const nlohmann::json& j, const std::string& path) const {
    const size_t dot = path.rfind('.');
    const nlohmann::json& parent = dot == std::string::npos ? j : at(j, path.substr(0, dot));
    return parent.is_object() &&
           parent.contains(path.substr(dot == std::string::npos ? 0 : dot + 1));
  }
  [[noreturn]] void fail(const std::string& what) const {
    throw ConfigError(fmt::format("profile {}: {}", origin_, what));
  }

 private:
  std::string origin_;
};

// The optional calibration fields of "device"; absent, they keep the plain
// roofline (efficiencies 1 or compute_efficiency, no GEMM model, no collective start).
void read_device_model(const Reader& r, const nlohmann::json& j, DeviceSpec& d) {
  if (r.has(j, "device.compute_efficiency"))
    d.compute_efficiency = r.fraction(j, "device.compute_efficiency");
  if (r.has(j, "device.mem_efficiency")) d.mem_efficiency = r.fraction(j, "device.mem_efficiency");
  if (r.has(j, "device.collective_launch_us"))
    d.collective_launch_us = r.duration_us(j, "device.collective_launch_us");
  if (!r.has(j, "device.gemm")) return;
  d.gemm.sm_count = r.count(j, "device.gemm.sm_count");
  const auto& tiles = r.at(j, "device.gemm.tiles");
  if (!tiles.is_array() || tiles.empty())
    r.fail("field \"device.gemm.tiles\" must be a list of [m, n]");
  for (size_t i = 0; i < tiles.size(); ++i) {
    const std::string path = fmt::format("device.gemm.tiles.{}", i);
    if (!tiles[i].is_array() || tiles[i].size() != 2)
      r.fail(fmt::format("field \"{}\" must be [m, n]", path));
    nlohmann::json t{{"m", tiles[i][0]}, {"n", tiles[i][1]}};
    d.gemm.tiles.push_back({r.count(t, "m"), r.count(t, "n")});
  }
  d.gemm.max_efficiency_fp32 = r.fraction(j, "device.gemm.max_efficiency.fp32");
  d.gemm.max_efficiency_bf16 = r.fraction(j, "device.gemm.max_efficiency.bf16");
  if (r.has(j, "device.gemm.max_efficiency.fp8"))
    d.gemm.max_efficiency_fp8 = r.fraction(j, "device.gemm.max_efficiency.fp8");
}

// Every field a profile may have. An optional one misspelt
// ("compute_eficiency") would otherwise be skipped and the run would use
// the default without a word: a field not here is an error.
bool known_field(std::string_view path) {
  static const std::set<std::string_view> kFields = {
      "name", "description", "nodes", "devices_per_node", "device", "links", "nics", "pcie",
      "pcie.switches", "pcie.sockets", "pcie.uplink_GBps", "pcie.inter_socket_GBps",
      "device.peak_tflops", "device.peak_tflops.fp32", "device.peak_tflops.bf16", "device.peak_tflops.fp8", "device.mem_bandwidth_GBps",
      "device.memory_GiB", "device.launch_overhead_us", "device.compute_efficiency", "device.mem_efficiency",
      "device.collective_launch_us", "device.gemm", "device.gemm.sm_count", "device.gemm.tiles",
      "device.gemm.max_efficiency", "device.gemm.max_efficiency.fp32", "device.gemm.max_efficiency.bf16", "device.gemm.max_efficiency.fp8",
      "links.intra", "links.inter"};
  static const std::set<std::string_view> kLinkFields = {
      "latency_us", "bandwidth_GBps", "packet", "packet.header_bytes", "packet.sm_payload_bytes",
      "packet.copy_payload_bytes"};
  if (path.starts_with("protocols")) return known_protocol_field(path);
  for (std::string_view cls : {"links.intra.", "links.inter."})
    if (path.starts_with(cls)) return kLinkFields.contains(path.substr(cls.size()));
  return kFields.contains(path);
}

// Refuses any field of an object below `j` that known_field does not list
// (arrays, the GEMM tiles, are checked where they are read).
void check_fields(const Reader& r, const nlohmann::json& j, const std::string& prefix = "") {
  for (const auto& [key, value] : j.items()) {
    const std::string path = prefix.empty() ? key : prefix + "." + key;
    if (!known_field(path)) r.fail(fmt::format("unknown field \"{}\" (a misspelt field would be ignored)", path));
    if (value.is_object()) check_fields(r, value, path);
  }
}

// "nics": a non-empty list of NICs, each a non-empty list of local GPU
// indices; every GPU of a node near exactly one NIC.
void read_nics(const Reader& r, const nlohmann::json& nics, HardwareProfile& p) {
  if (!nics.is_array() || nics.empty())
    r.fail("field \"nics\" must be a list of NICs, each the list of the local GPUs near it ([[0, 1], [2, 3]])");
  std::vector<int> owner(static_cast<size_t>(p.devices_per_node), -1);
  for (size_t n = 0; n < nics.size(); ++n) {
    const std::string path = fmt::format("nics.{}", n);
    if (!nics[n].is_array() || nics[n].empty()) r.fail(fmt::format("field \"{}\" must be a non-empty list of GPUs", path));
    std::vector<int> gpus;
    for (size_t i = 0; i < nics[n].size(); ++i) {
      const auto& g = nics[n][i];
      if (!g.is_number_integer() || g.get<int64_t>() < 0 || g.get<int64_t>() >= p.devices_per_node)
        r.fail(fmt::format("field \"{}.{}\" must be a local GPU index in [0, {})", path, i, p.devices_per_node));
      const int gpu = g.get<int>();
      if (owner[static_cast<size_t>(gpu)] >= 0)
        r.fail(fmt::format("field \"{}\": GPU {} is already near NIC {} (each GPU is near one NIC)", path, gpu,
                           owner[static_cast<size_t>(gpu)]));
      owner[static_cast<size_t>(gpu)] = static_cast<int>(n);
      gpus.push_back(gpu);
    }
    p.nics.push_back(std::move(gpus));
  }
  for (size_t g = 0; g < owner.size(); ++g)
    if (owner[g] < 0) r.fail(fmt::format("field \"nics\": GPU {} is near no NIC (each GPU is near one)", g));
}

// A list of disjoint non-empty lists of indices in [0, n) covering all of
// them: "pcie.switches" (GPUs) and "pcie.sockets" (switches).
std::vector<std::vector<int>> read_partition(const Reader& r, const nlohmann::json& j, const std::string& path,
                                             int n, const char* what) {
  if (!j.is_array() || j.empty())
    r.fail(fmt::format("field \"{}\" must be a non-empty list of lists of {} indices", path, what));
  std::vector<int> owner(static_cast<size_t>(n), -1);
  std::vector<std::vector<int>> out;
  for (size_t k = 0; k < j.size(); ++k) {
    if (!j[k].is_array() || j[k].empty())
      r.fail(fmt::format("field \"{}.{}\" must be a non-empty list of {} indices", path, k, what));
    std::vector<int> part;
    for (size_t i = 0; i < j[k].size(); ++i) {
      const auto& g = j[k][i];
      if (!g.is_number_integer() || g.get<int64_t>() < 0 || g.get<int64_t>() >= n)
        r.fail(fmt::format("field \"{}.{}.{}\" must be a {} index in [0, {})", path, k, i, what, n));
      const int x = g.get<int>();
      if (owner[static_cast<size_t>(x)] >= 0)
        r.fail(fmt::format("field \"{}.{}\": {} {} is already in {}.{}", path, k, what, x, path,
                           owner[static_cast<size_t>(x)]));
      owner[static_cast<size_t>(x)] = static_cast<int>(k);
      part.push_back(x);
    }
    out.push_back(std::move(part));
  }
  for (size_t x = 0; x < owner.size(); ++x)
    if (owner[x] < 0) r.fail(fmt::format("field \"{}\": {} {} is in none of them", path, what, x));
  return out;
}

void read_pcie(const Reader& r, const nlohmann::json& j, HardwareProfile& p) {
  if (!j.at("pcie").is_object()) r.fail("field \"pcie\" must be an object");
  p.pcie.switches = read_partition(r, r.at(j, "pcie.switches"), "pcie.switches", p.devices_per_node, "GPU");
  p.pcie.sockets = read_partition(r, r.at(j, "pcie.sockets"), "pcie.sockets",
                                  static_cast<int>(p.pcie.switches.size()), "switch");
  p.pcie.uplink_GBps = r.rate(j, "pcie.uplink_GBps");
  p.pcie.inter_socket_GBps = r.rate(j, "pcie.inter_socket_GBps");
}

}  // namespace

HardwareProfile profile_from_json(const nlohmann::json& j, std::string_view origin) {
  Reader r(origin);
  if (!j.is_object()) r.fail("expected a JSON object");
  check_fields(r, j);
  HardwareProfile p;
  const auto& name = r.at(j, "name");
  if (!name.is_string() || name.get<std::string>().empty()) r.fail("field \"name\" must be a non-empty string");
  p.name = name.get<std::string>();
  if (j.contains("description")) {
    if (!j["description"].is_string()) r.fail("field \"description\" must be a string");
    p.description = j["description"];
  }
  p.nodes = r.count(j, "nodes");
  p.devices_per_node = r.count(j, "devices_per_node");
  if (int64_t{p.nodes} * p.devices_per_node > kMaxDevices)
    r.fail(fmt::format("nodes {} x devices_per_node {} = {} devices: at most {}", p.nodes, p.devices_per_node,
                       int64_t{p.nodes} * p.devices_per_node, kMaxDevices));
  p.device.peak_tflops_fp32 = r.rate(j, "device.peak_tflops.fp32");
  p.device.peak_tflops_bf16 = r.rate(j, "device.peak_tflops.bf16");
  if (r.has(j, "device.peak_tflops.fp8")) p.device.peak_tflops_fp8 = r.rate(j, "device.peak_tflops.fp8");
  p.device.mem_bandwidth_GBps = r.rate(j, "device.mem_bandwidth_GBps");
  p.device.memory_GiB = r.positive(j, "device.memory_GiB", false, 1e6);
  p.device.launch_overhead_us = r.duration_us(j, "device.launch_overhead_us");
  read_device_model(r, j, p.device);
  for (auto [cls, spec] : {std::pair{"intra", &p.intra}, std::pair{"inter", &p.inter}}) {
    std::string base = std::string("links.") + cls;
    spec->latency_us = r.duration_us(j, base + ".latency_us");
    spec->bandwidth_GBps = r.rate(j, base + ".bandwidth_GBps");
    if (spec->bytes_per_second() == 0) r.fail(fmt::format("field \"{}.bandwidth_GBps\" is too small", base));
    if (r.has(j, base + ".packet")) {
      spec->packet_header_bytes = r.count(j, base + ".packet.header_bytes", /*allow_zero=*/true);
      spec->sm_payload_bytes = r.count(j, base + ".packet.sm_payload_bytes");
      spec->copy_payload_bytes = r.count(j, base + ".packet.copy_payload_bytes");
    }
  }
  if (j.contains("nics")) read_nics(r, j["nics"], p);
  if (j.contains("pcie")) read_pcie(r, j, p);
  if (j.contains("protocols")) p.protocols = protocols_from_json(j.at("protocols"), origin);
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
  std::ifstream in = open_input(fmt::format("profile {}", path), path, "a JSON file");
  nlohmann::json j;
  try {
    in >> j;
  } catch (const std::exception& e) {  // nlohmann's parse errors, and a read error of the stream
    // nlohmann's text starts with its exception id, "[json.exception.parse_error.101] ": not for users.
    const std::string_view what = e.what();
    const size_t id_end = what.starts_with("[json.exception.") ? what.find("] ") : std::string_view::npos;
    throw ConfigError(fmt::format("profile {}: not valid JSON ({})", path,
                                  id_end == std::string_view::npos ? what : what.substr(id_end + 2)));
  }
  return profile_from_json(j, path);
}

}  // namespace shardlab
