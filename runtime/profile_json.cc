// A profile's JSON form: profile_to_json, the field-checked reader
// profile_from_json (every field known, every value in range: one
// ConfigError line otherwise) and load_profile (a built-in's name or a file).
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

namespace {
nlohmann::json tiles_to_json(const std::vector<GemmTile>& tiles) {
  nlohmann::json j = nlohmann::json::array();
  for (const GemmTile& t : tiles) j.push_back({t.m, t.n});
  return j;
}
nlohmann::json attention_to_json(const AttentionSpec& a) {
  nlohmann::json j{{"seq", a.seq}, {"fwd_causal_tflops", a.fwd_causal}, {"fwd_tflops", a.fwd}, {"bwd_tflops", a.bwd}};
  if (!a.kernel.empty()) j["kernel"] = a.kernel;
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
    if (l.proxy_us > 0) j["proxy_us"] = l.proxy_us;
    if (l.nvls_efficiency > 0) j["nvls_efficiency"] = l.nvls_efficiency;
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
  if (d.layernorm_fwd_rate != 1.0 || d.layernorm_bwd_rate != 1.0)
    device["layernorm_rate"] = {{"fwd", d.layernorm_fwd_rate}, {"bwd", d.layernorm_bwd_rate}};
  if (d.gemm.sm_count > 0)
    device["gemm"] = {
        {"sm_count", d.gemm.sm_count},
        {"tiles", tiles_to_json(d.gemm.tiles)},
        {"max_efficiency",
         {{"fp32", d.gemm.max_efficiency_fp32}, {"bf16", d.gemm.max_efficiency_bf16}}}};
  if (d.gemm.sm_count > 0 && d.peak_tflops_fp8 > 0)
    device["gemm"]["max_efficiency"]["fp8"] = d.gemm.max_efficiency_fp8;
  if (!d.attention.empty()) device["attention"] = attention_to_json(d.attention);
  if (!d.attention_kernels.empty()) {
    device["attention_kernels"] = nlohmann::json::array();
    for (const AttentionSpec& a : d.attention_kernels) device["attention_kernels"].push_back(attention_to_json(a));
  }
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
  if (!p.fabric.empty()) {
    nlohmann::json tiers = nlohmann::json::array();
    for (size_t t = 0; t < p.fabric.tiers.size(); ++t) {
      const FabricTier& f = p.fabric.tiers[t];
      nlohmann::json k{{"name", f.name}, {"hop_latency_us", f.hop_latency_us}};
      if (t + 1 < p.fabric.tiers.size()) k["nodes"] = f.nodes, k["oversubscription"] = f.oversubscription;
      tiers.push_back(std::move(k));
    }
    j["fabric"] = {{"tiers", tiers}};
  }
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
      // A list's element by its index ("fabric.tiers.0.nodes").
      if (cur->is_array() && !key.empty() && key.find_first_not_of("0123456789") == std::string::npos &&
          key.size() < 9 && std::stoul(key) < cur->size()) {
        cur = &(*cur)[std::stoul(key)];
      } else {
        if (!cur->is_object() || !cur->contains(key)) fail(fmt::format("missing field \"{}\"", path));
        cur = &(*cur)[key];
      }
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
  if (r.has(j, "device.layernorm_rate")) {
    d.layernorm_fwd_rate = r.fraction(j, "device.layernorm_rate.fwd");
    d.layernorm_bwd_rate = r.fraction(j, "device.layernorm_rate.bwd");
  }
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
    d.gemm.tiles.push_back({r.count(j, path + ".0"), r.count(j, path + ".1")});
  }
  d.gemm.max_efficiency_fp32 = r.fraction(j, "device.gemm.max_efficiency.fp32");
  d.gemm.max_efficiency_bf16 = r.fraction(j, "device.gemm.max_efficiency.bf16");
  if (r.has(j, "device.gemm.max_efficiency.fp8"))
    d.gemm.max_efficiency_fp8 = r.fraction(j, "device.gemm.max_efficiency.fp8");
}

// A fused attention kernel's published rates at `path` ("device.attention"
// or "device.attention_kernels.N"): four lists of one length (at least one
// point), lengths strictly increasing, and the kernel's name ("kernel",
// optional for device.attention alone).
AttentionSpec read_attention_at(const Reader& r, const nlohmann::json& j, const std::string& path, bool named) {
  AttentionSpec a;
  if (!r.at(j, path).is_object()) r.fail(fmt::format("field \"{}\" must be an object", path));
  auto list = [&](const std::string& field, std::vector<double>& out) {
    const std::string at = path + "." + field;
    const auto& v = r.at(j, at);
    if (!v.is_array() || v.empty()) r.fail(fmt::format("field \"{}\" must be a non-empty list of numbers", at));
    for (size_t i = 0; i < v.size(); ++i) {
      const double d = v[i].is_number() ? v[i].get<double>() : -1;
      if (!std::isfinite(d) || d < 1e-3 || d > 1e9)
        r.fail(fmt::format("field \"{}.{}\" must be a number in [0.001, 1e9]", at, i));
      out.push_back(d);
    }
  };
  if (named || r.has(j, path + ".kernel")) {
    const auto& k = r.at(j, path + ".kernel");
    if (!k.is_string() || k.get<std::string>().empty() || k.get<std::string>().size() > 64)
      r.fail(fmt::format("field \"{}.kernel\" must be a name (1 to 64 characters)", path));
    a.kernel = k.get<std::string>();
  }
  list("seq", a.seq);
  list("fwd_causal_tflops", a.fwd_causal);
  list("fwd_tflops", a.fwd);
  list("bwd_tflops", a.bwd);
  for (const auto* v : {&a.fwd_causal, &a.fwd, &a.bwd})
    if (v->size() != a.seq.size())
      r.fail(fmt::format("field \"{}\": every list must have as many numbers as \"seq\" ({})", path, a.seq.size()));
  for (size_t i = 1; i < a.seq.size(); ++i)
    if (!(a.seq[i] > a.seq[i - 1])) r.fail(fmt::format("field \"{}.seq\" must be strictly increasing", path));
  return a;
}

// "device.attention" (the kernel runs charge) and "device.attention_kernels"
// (the others, each named, names distinct; they need device.attention).
void read_attention(const Reader& r, const nlohmann::json& j, DeviceSpec& d) {
  if (r.has(j, "device.attention")) d.attention = read_attention_at(r, j, "device.attention", false);
  if (!r.has(j, "device.attention_kernels")) return;
  const auto& v = r.at(j, "device.attention_kernels");
  if (!v.is_array() || v.empty())
    r.fail("field \"device.attention_kernels\" must be a non-empty list of kernels, each like \"device.attention\" "
           "with a \"kernel\" name");
  if (d.attention.empty() || d.attention.kernel.empty())
    r.fail("field \"device.attention_kernels\" needs \"device.attention\" with a \"kernel\" name");
  std::set<std::string> names{d.attention.kernel};
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string path = fmt::format("device.attention_kernels.{}", i);
    AttentionSpec a = read_attention_at(r, j, path, true);
    if (!names.insert(a.kernel).second)
      r.fail(fmt::format("field \"{}.kernel\": \"{}\" is named twice", path, a.kernel));
    for (const auto& [key, value] : v[i].items())
      if (key != "kernel" && key != "seq" && key != "fwd_causal_tflops" && key != "fwd_tflops" && key != "bwd_tflops")
        r.fail(fmt::format("unknown field \"{}.{}\" (a misspelt field would be ignored)", path, key));
    d.attention_kernels.push_back(std::move(a));
  }
}

// Every field a profile may have. An optional one misspelt
// ("compute_eficiency") would otherwise be skipped and the run would use
// the default without a word: a field not here is an error.
bool known_field(std::string_view path) {
  static const std::set<std::string_view> kFields = {
      "name", "description", "nodes", "devices_per_node", "device", "links", "nics", "pcie", "fabric",
      "fabric.tiers",
      "pcie.switches", "pcie.sockets", "pcie.uplink_GBps", "pcie.inter_socket_GBps",
      "device.peak_tflops", "device.peak_tflops.fp32", "device.peak_tflops.bf16", "device.peak_tflops.fp8", "device.mem_bandwidth_GBps",
      "device.memory_GiB", "device.launch_overhead_us", "device.compute_efficiency", "device.mem_efficiency",
      "device.layernorm_rate", "device.layernorm_rate.fwd", "device.layernorm_rate.bwd",
      "device.collective_launch_us", "device.gemm", "device.gemm.sm_count", "device.gemm.tiles",
      "device.gemm.max_efficiency", "device.gemm.max_efficiency.fp32", "device.gemm.max_efficiency.bf16", "device.gemm.max_efficiency.fp8",
      "device.attention", "device.attention.kernel", "device.attention.seq", "device.attention.fwd_causal_tflops",
      "device.attention.fwd_tflops", "device.attention.bwd_tflops", "device.attention_kernels",
      "links.intra", "links.inter"};
  static const std::set<std::string_view> kLinkFields = {
      "latency_us", "bandwidth_GBps", "packet", "packet.header_bytes", "packet.sm_payload_bytes",
      "packet.copy_payload_bytes"};
  if (path.starts_with("protocols")) return known_protocol_field(path);
  if (path == "links.inter.proxy_us" || path == "links.intra.nvls_efficiency") return true;
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

// "fabric": {"tiers": [...]}, bottom up. Every tier but the top names the
// nodes below one of its switch groups, more than the tier below and a
// multiple of it (domains nest); the top spans the cluster and has no
// uplinks (no "nodes", oversubscription 1).
void read_fabric(const Reader& r, const nlohmann::json& j, HardwareProfile& p) {
  if (!j.at("fabric").is_object()) r.fail("field \"fabric\" must be an object");
  const auto& tiers = r.at(j, "fabric.tiers");
  if (!tiers.is_array() || tiers.empty())
    r.fail("field \"fabric.tiers\" must be a non-empty list of tiers, bottom up");
  static const std::set<std::string_view> kTierFields = {"name", "nodes", "hop_latency_us", "oversubscription"};
  for (size_t t = 0; t < tiers.size(); ++t) {
    const std::string path = fmt::format("fabric.tiers.{}", t);
    const nlohmann::json& k = tiers[t];
    if (!k.is_object()) r.fail(fmt::format("field \"{}\" must be an object", path));
    for (const auto& [key, value] : k.items())
      if (!kTierFields.contains(key))
        r.fail(fmt::format("unknown field \"{}.{}\" (a misspelt field would be ignored)", path, key));
    auto field = [&](const char* f) { return fmt::format("{}.{}", path, f); };
    FabricTier tier;
    if (k.contains("name")) {
      if (!k["name"].is_string()) r.fail(fmt::format("field \"{}\" must be a string", field("name")));
      tier.name = k["name"];
    }
    tier.hop_latency_us = r.duration_us(j, field("hop_latency_us"));
    const bool top = t + 1 == tiers.size();
    if (top && k.contains("nodes"))
      r.fail(fmt::format("field \"{}\": the top tier spans the cluster (no \"nodes\")", field("nodes")));
    if (!top) tier.nodes = r.count(j, field("nodes"));
    if (k.contains("oversubscription")) {
      tier.oversubscription = r.positive(j, field("oversubscription"), false, 1e6);
      if (tier.oversubscription < 1)
        r.fail(fmt::format("field \"{}\" must be >= 1 (downlink : uplink; an undersubscribed tier is 1)",
                           field("oversubscription")));
      if (top && tier.oversubscription != 1)
        r.fail(fmt::format("field \"{}\": the top tier has no uplinks (must be 1)", field("oversubscription")));
    }
    if (!p.fabric.tiers.empty() && tier.nodes > 0) {
      const int below = p.fabric.tiers.back().nodes;
      if (tier.nodes <= below || tier.nodes % below != 0)
        r.fail(fmt::format("field \"{}\" must be a multiple of {} (tier {}'s nodes) above it: domains nest",
                           field("nodes"), below, t - 1));
    }
    p.fabric.tiers.push_back(std::move(tier));
  }
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
  read_attention(r, j, p.device);
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
  if (r.has(j, "links.inter.proxy_us")) p.inter.proxy_us = r.duration_us(j, "links.inter.proxy_us");
  if (r.has(j, "links.intra.nvls_efficiency"))
    p.intra.nvls_efficiency = r.fraction(j, "links.intra.nvls_efficiency");
  if (j.contains("nics")) read_nics(r, j["nics"], p);
  if (j.contains("pcie")) read_pcie(r, j, p);
  if (j.contains("protocols")) p.protocols = protocols_from_json(j.at("protocols"), origin);
  if (j.contains("fabric")) read_fabric(r, j, p);
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
