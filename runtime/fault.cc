#include "runtime/fault.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "runtime/errors.h"
#include "runtime/input_file.h"
#include "runtime/parse_number.h"
#include "runtime/profile.h"
#include "runtime/text.h"
#include "runtime/units.h"

namespace shardlab {
namespace {

constexpr const char* kKindNames[] = {"slow-link", "slow-nic", "link-down", "straggler", "dead", "memory"};
constexpr int kMaxStep = 1'000'000;  // as --steps
constexpr double kMaxLatencyUs = 1e6;
constexpr double kMinBandwidth = 1e-6;
constexpr double kMaxCompute = 1000;

[[noreturn]] void fail(std::string_view spec, const std::string& why) {
  throw ConfigError(fmt::format("`faults` {}: {} (e.g. slow-nic:3:bw=0.25, straggler:1:compute=2, dead:2:step=3)",
                                spec, why));
}

// A whole-text integer in [lo, hi] (parse_number.h's rule), or the error naming `what`.
int int_in(std::string_view spec, std::string_view text, const char* what, int lo, int hi) {
  const std::optional<int> v = parse_number<int>(text);
  if (!v || *v < lo || *v > hi) fail(spec, fmt::format("{} \"{}\" is not an integer in [{}, {}]", what, text, lo, hi));
  return *v;
}

// A whole-text finite number in [lo, hi].
double real_in(std::string_view spec, std::string_view text, const char* what, double lo, double hi) {
  const std::optional<double> v = parse_number<double>(text);
  if (!v || *v < lo || *v > hi) fail(spec, fmt::format("{} \"{}\" is not a number in [{}, {}]", what, text, lo, hi));
  return *v;
}

FaultKind parse_kind(std::string_view spec, std::string_view name) {
  for (size_t i = 0; i < std::size(kKindNames); ++i)
    if (name == kKindNames[i]) return static_cast<FaultKind>(i);
  fail(spec, fmt::format("unknown fault \"{}\" (slow-link, slow-nic, link-down, straggler, dead, memory)", name));
}

bool is_link(FaultKind k) { return k == FaultKind::kSlowLink || k == FaultKind::kLinkDown; }

// "A-B" for a link, "D" for a device.
void parse_target(std::string_view spec, std::string_view target, Fault& f) {
  const int max_rank = int(kMaxDevices) - 1;
  if (!is_link(f.kind)) {
    f.device = int_in(spec, target, "device", 0, max_rank);
    return;
  }
  const auto ends = split(target, '-');
  if (ends.size() != 2) fail(spec, fmt::format("link \"{}\" is not A-B (two device numbers)", target));
  f.device = int_in(spec, ends[0], "device", 0, max_rank);
  f.peer = int_in(spec, ends[1], "device", 0, max_rank);
  if (f.device == f.peer) fail(spec, fmt::format("link {}-{} joins a device to itself", f.device, f.peer));
}

// memory's capacity: a number with a decimal point and no unit is a
// fraction of the device's capacity, anything else a size (parse_bytes).
void parse_capacity(std::string_view spec, std::string_view value, Fault& f) {
  const bool fraction = value.find('.') != std::string_view::npos &&
                        value.find_first_not_of("0123456789.") == std::string_view::npos;
  if (fraction) {
    f.capacity_fraction = real_in(spec, value, "capacity fraction", 0, 1);
    if (f.capacity_fraction <= 0) fail(spec, "capacity fraction must be above 0");
    return;
  }
  try {
    f.capacity_bytes = parse_bytes(value, "capacity");
  } catch (const ConfigError& e) {
    fail(spec, std::string(e.what()) + " or a fraction such as 0.5");
  }
  if (f.capacity_bytes == 0) fail(spec, "capacity 0: a device needs some memory");
}

// One key=value of the kind's parameters.
void parse_param(std::string_view spec, std::string_view key, std::string_view value, Fault& f) {
  const bool slow = f.kind == FaultKind::kSlowLink || f.kind == FaultKind::kSlowNic;
  const bool at_step = f.kind == FaultKind::kLinkDown || f.kind == FaultKind::kDead;
  if (slow && key == "bw") {
    f.bandwidth = real_in(spec, value, "bw", kMinBandwidth, 1);
  } else if (slow && key == "lat_us") {
    f.latency_us = real_in(spec, value.starts_with('+') ? value.substr(1) : value, "lat_us", 0, kMaxLatencyUs);
  } else if (f.kind == FaultKind::kStraggler && key == "compute") {
    f.compute = real_in(spec, value, "compute", 1, kMaxCompute);
  } else if ((slow || f.kind == FaultKind::kStraggler) && key == "from_step") {
    f.step = int_in(spec, value, "from_step", 0, kMaxStep);
  } else if (at_step && key == "step") {
    f.step = int_in(spec, value, "step", 0, kMaxStep);
  } else if (f.kind == FaultKind::kMemory && key == "capacity") {
    parse_capacity(spec, value, f);
  } else {
    fail(spec, fmt::format("{} has no parameter \"{}\"", fault_kind_name(f.kind), key));
  }
}

// The parameters each kind must have.
void check_required(std::string_view spec, const std::vector<std::string_view>& keys, const Fault& f) {
  auto has = [&](std::string_view k) { return std::find(keys.begin(), keys.end(), k) != keys.end(); };
  switch (f.kind) {
    case FaultKind::kSlowLink:
    case FaultKind::kSlowNic:
      if (!has("bw") && !has("lat_us")) fail(spec, "a slow link needs bw=F or lat_us=+X");
      if (f.bandwidth == 1 && f.latency_us == 0) fail(spec, "bw=1 and lat_us=0 change nothing");
      break;
    case FaultKind::kLinkDown:
    case FaultKind::kDead:
      if (!has("step")) fail(spec, "needs step=S (the step it happens at)");
      break;
    case FaultKind::kStraggler:
      if (!has("compute")) fail(spec, "needs compute=F (kernels take F times as long)");
      break;
    case FaultKind::kMemory:
      if (!has("capacity")) fail(spec, "needs capacity=SIZE or a fraction");
      break;
  }
}

}  // namespace

const char* fault_kind_name(FaultKind k) { return kKindNames[static_cast<int>(k)]; }

Fault parse_fault(std::string_view spec) {
  const auto parts = split(spec, ':');
  if (parts.size() != 3) fail(spec, "expected KIND:TARGET:KEY=VALUE[,KEY=VALUE]");
  Fault f;
  f.spec = std::string(spec);
  f.kind = parse_kind(spec, parts[0]);
  parse_target(spec, parts[1], f);
  std::vector<std::string_view> keys;
  for (std::string_view item : split(parts[2], ',')) {
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos || eq == 0) fail(spec, fmt::format("\"{}\" is not KEY=VALUE", item));
    const std::string_view key = item.substr(0, eq);
    if (std::find(keys.begin(), keys.end(), key) != keys.end()) fail(spec, fmt::format("{} given twice", key));
    keys.push_back(key);
    parse_param(spec, key, item.substr(eq + 1), f);
  }
  check_required(spec, keys, f);
  return f;
}

namespace {

std::vector<Fault> faults_from_file(const std::string& path) {
  const std::string text = read_input(fmt::format("`faults` @{}", path), path, "a JSON file", size_t(16) << 20);
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) throw ConfigError(fmt::format("`faults` @{}: not JSON", path));
  if (!j.is_array())
    throw ConfigError(fmt::format("`faults` @{}: expected a JSON list of fault specs, e.g. [\"dead:1:step=2\"]", path));
  std::vector<Fault> faults;
  for (const auto& item : j) {
    if (!item.is_string())
      throw ConfigError(fmt::format("`faults` @{}: item {} is not a string (a fault spec)", path, item.dump()));
    faults.push_back(parse_fault(item.get<std::string>()));
  }
  return faults;
}

}  // namespace

std::vector<Fault> parse_faults(const std::vector<std::string>& args) {
  std::vector<Fault> faults;
  for (const std::string& a : args) {
    if (a.starts_with('@')) {
      for (Fault& f : faults_from_file(a.substr(1))) faults.push_back(std::move(f));
    } else {
      faults.push_back(parse_fault(a));
    }
  }
  return faults;
}

FaultPlan::FaultPlan(std::vector<Fault> faults, int world_size, int steps) : faults_(std::move(faults)) {
  const Fault* fatal = nullptr;
  for (const Fault& f : faults_) {
    for (int d : {f.device, f.peer})
      if (d >= world_size)
        throw ConfigError(fmt::format("`faults` {}: device {} is not one of the {} devices of this run (0 to {})",
                                      f.spec, d, world_size, world_size - 1));
    if (f.step >= steps)
      throw ConfigError(fmt::format("`faults` {}: step {} is not below `steps` {} (it would never happen)", f.spec,
                                    f.step, steps));
    if (!f.fatal()) continue;
    if (world_size < 2)
      throw ConfigError(fmt::format("`faults` {}: a run on one device has no peer to lose", f.spec));
    if (fatal)
      throw ConfigError(fmt::format("`faults` {}: only one dead device or downed link per run (already {})", f.spec,
                                    fatal->spec));
    fatal = &f;
  }
}

Link FaultPlan::apply(Link link, int src, int dst, int step) const {
  for (const Fault& f : faults_) {
    if (step < f.step) continue;
    const bool hits = (f.kind == FaultKind::kSlowLink && f.on_link(src, dst)) ||
                      (f.kind == FaultKind::kSlowNic && (f.device == src || f.device == dst));
    if (!hits) continue;
    // At least 1 B/s: the wire time stays finite (bw >= 1e-6 of a real link).
    link.bytes_per_second =
        std::max<uint64_t>(1, static_cast<uint64_t>(std::llround(double(link.bytes_per_second) * f.bandwidth)));
    link.latency += us_to_time(f.latency_us);
  }
  return link;
}

double FaultPlan::compute_scale(int rank, int step) const {
  double scale = 1;
  for (const Fault& f : faults_)
    if (f.kind == FaultKind::kStraggler && f.device == rank && step >= f.step) scale *= f.compute;
  return scale;
}

uint64_t FaultPlan::capacity(int rank, uint64_t normal) const {
  uint64_t c = normal;
  for (const Fault& f : faults_) {
    if (f.kind != FaultKind::kMemory || f.device != rank) continue;
    const uint64_t mine = f.capacity_bytes ? f.capacity_bytes
                                           : static_cast<uint64_t>(std::floor(double(normal) * f.capacity_fraction));
    c = std::min(c, mine);
  }
  return c;
}

const Fault* FaultPlan::fatal_for(int rank, int peer, int step) const {
  for (const Fault& f : faults_) {
    if (!f.fatal() || step < f.step) continue;
    if (f.kind == FaultKind::kDead && f.device == rank) return &f;
    if (f.kind == FaultKind::kLinkDown && f.on_link(rank, peer) && rank < peer) return &f;
  }
  return nullptr;
}

}  // namespace shardlab
