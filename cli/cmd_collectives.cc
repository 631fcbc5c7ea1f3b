// `shardlab collectives`: an nccl-tests style table of one collective over N
// virtual GPUs, one row per size (powers of two from --min-bytes to
// --max-bytes), in virtual time and in host wall time. The measurement and
// its JSON are the library's (collectives/bench.h, where the columns are
// defined); this file maps the flags and prints.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/cli.h"
#include "cli/flag_table.h"
#include "collectives/bench.h"
#include "collectives/tuner.h"
#include "runtime/cluster.h"
#include "runtime/errors.h"
#include "runtime/parse_number.h"
#include "runtime/transport.h"
#include "runtime/units.h"

namespace shardlab::cli {
namespace {

namespace coll = shardlab::collectives;
using coll::OpKind;

struct CollFlags {
  CommonFlags common;
  std::string op = "all_reduce";
  int ranks = 8;
  std::string algo = "auto";
  std::string proto = "auto";
  std::string redop;  // empty: sum (given with an op that reduces nothing, an error)
  std::string min_bytes = "8";
  std::string max_bytes = "256MiB";
  bool check = false;
  std::string corrupt;  // hidden: --check's can-it-fail test (a value for rank 0's first result)
};

coll::BenchOptions parse_setup(const CollFlags& f, const HardwareProfile& profile) {
  coll::BenchOptions s;
  // The library's parse errors name the value; prefix the flag.
  auto flag = [](const char* name, auto parse) {
    try {
      return parse();
    } catch (const ConfigError& e) {
      throw ConfigError(fmt::format("{}: {}", name, e.what()));
    }
  };
  if (f.op == "barrier")
    throw ConfigError("--op barrier: not measured here (it moves no bytes); use all_reduce, reduce_scatter, "
                      "all_gather, broadcast, reduce or all_to_all");
  s.op = flag("--op", [&] { return coll::parse_op_kind(f.op); });
  s.algo = flag("--algo", [&] { return coll::parse_algo(f.algo); });
  s.proto = flag("--proto", [&] { return coll::parse_proto(f.proto); });
  s.redop = flag("--redop", [&] { return coll::parse_reduce_op(f.redop.empty() ? "sum" : f.redop); });
  if (!f.redop.empty() && !coll::reduces(s.op))
    throw ConfigError(fmt::format("--redop {}: --op {} reduces nothing (--redop is for all_reduce, reduce_scatter "
                                  "and reduce)", f.redop, f.op));
  if (f.ranks < 1 || f.ranks > profile.total_devices())
    throw ConfigError(fmt::format("--ranks {}: must be between 1 and {} (profile {}: {} node{} x {})", f.ranks,
                                  profile.total_devices(), profile.name, profile.nodes, profile.nodes == 1 ? "" : "s",
                                  profile.devices_per_node));
  s.ranks = f.ranks;
  if (s.proto != coll::Proto::kAuto) {
    std::vector<int> world(static_cast<size_t>(s.ranks));
    std::iota(world.begin(), world.end(), 0);
    const std::vector<coll::Proto> ok = coll::candidate_protos(profile, world);
    if (std::find(ok.begin(), ok.end(), s.proto) == ok.end())
      throw ConfigError(fmt::format("--proto {}: not used on profile {}'s links of {} ranks (one of: auto{})", f.proto,
                                    profile.name, s.ranks, [&] {
                                      std::string names;
                                      for (coll::Proto q : ok) names += fmt::format(", {}", coll::proto_name(q));
                                      return names;
                                    }()));
  }
  s.check = f.check;
  if (!f.corrupt.empty()) {
    const std::optional<float> corrupt = parse_whole<float>(f.corrupt);  // nan too: the check must catch it
    if (!corrupt) throw ConfigError(fmt::format("--corrupt-result {}: not a number", f.corrupt));
    s.corrupt = *corrupt;
  }
  s.trace = !f.common.trace.empty();
  s.pace = f.common.pace;
  return s;
}

std::vector<uint64_t> parse_sizes(const CollFlags& f) {
  const auto [lo, hi] = parse_size_range(f.min_bytes, f.max_bytes);
  std::vector<uint64_t> sizes;
  for (uint64_t b = lo; b <= hi; b *= 2) sizes.push_back(b);
  return sizes;
}

void print_table(const std::vector<coll::BenchRow>& rows, const coll::BenchOptions& s, const HardwareProfile& p, double wall) {
  fmt::print("# shardlab collectives: {} over {} ranks ({} node{}), algo {}, profile {}\n", coll::op_kind_name(s.op),
             s.ranks, p.node_of(s.ranks - 1) + 1, p.node_of(s.ranks - 1) > 0 ? "s" : "", coll::algo_name(s.algo), p.name);
  fmt::print("# links: intra {:.2f} us {:.1f} GB/s, inter {:.2f} us {:.1f} GB/s per direction per NIC, {} NIC{} "
             "per node\n",
             p.intra.latency_us, p.intra.bandwidth_GBps, p.inter.latency_us, p.inter.bandwidth_GBps, p.nic_count(),
             p.nic_count() > 1 ? "s" : "");
  if (p.inter.proxy_us > 0)
    fmt::print("# network proxy: {:.2f} us per post, a post per node-crossing message (3 under Simple)\n",
               p.inter.proxy_us);
  if (!p.fabric.empty()) fmt::print("# fabric: {}\n", p.fabric.describe());
  fmt::print("# {:>10} {:>10} {:>6} {:>5} {:>6} {:>6} {:>4} {:>11} {:>8} {:>8} {:>11} {:>9} {:>9}\n", "size(B)",
             "count", "type", "redop", "algo", "proto", "ch", "time(us)", "algbw", "busbw", "host(us)", "host_bus",
             "max_err");
  const char* redop = coll::reduces(s.op) ? coll::reduce_op_name(s.redop) : "none";
  for (const coll::BenchRow& r : rows) {
    const coll::Bandwidth d = coll::bandwidth(r, s);
    fmt::print("  {:>10} {:>10} {:>6} {:>5} {:>6} {:>6} {:>4} {:>11.2f} {:>8.2f} {:>8.2f} {:>11} {:>9} {:>9}\n",
               r.bytes, r.count, "float", redop, coll::algo_name(r.algo), coll::proto_name(r.proto), r.channels,
               to_us(r.time), d.algbw, d.busbw,
               r.host_s ? fmt::format("{:.1f}", *r.host_s * 1e6) : "-",
               d.host_busbw ? fmt::format("{:.2f}", *d.host_busbw) : "-",
               r.max_error ? fmt::format("{:.0e}", *r.max_error) : "-");
  }
  fmt::print("# proto: NCCL's protocol (LL, LL128, Simple: its tuning model's latencies and bandwidth shares; plain "
             "on a profile without protocols); ch: channels (rings, each leaving a node through another NIC; 1 for "
             "other algorithms)\n");
  fmt::print("# time, algbw, busbw (GB/s): virtual; host: this machine's wall clock per collective ({:.2f} s total)\n",
             wall);
}

int run_collectives(const CollFlags& f) {
  const HardwareProfile profile = apply_common(f.common);
  const coll::BenchOptions s = parse_setup(f, profile);
  const std::vector<uint64_t> sizes = parse_sizes(f);
  check_outputs({{"--trace", f.common.trace}});
  const auto wall0 = std::chrono::steady_clock::now();
  std::vector<coll::BenchRow> rows;
  std::vector<DeviceTrace> traces;
  Time offset = 0;
  for (uint64_t b : sizes) rows.push_back(coll::bench_collective(profile, s, b, traces, offset));
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  if (s.trace && leader_process())
    write_chrome_trace(f.common.trace, traces, fmt::format("shardlab collectives {} x{}", f.op, s.ranks));
  if (f.common.json) {
    print_json(coll::bench_json(rows, s, profile.name));
  } else {
    print_table(rows, s, profile, wall);
  }
  bool ok = true;
  for (const coll::BenchRow& r : rows) ok = ok && (!r.max_error || *r.max_error == 0);
  return ok ? 0 : 1;
}

#define FIELD(path) FLAG_FIELD(CollFlags, path)

FlagTable<CollFlags> collectives_flags() {
  return {
      {"--op", FIELD(op), "all_reduce|reduce_scatter|all_gather|broadcast|reduce|all_to_all", {}, kShowDefault},
      {"--ranks", FIELD(ranks), "Number of virtual GPUs (placed on the profile's nodes in order)", {}, kShowDefault},
      {"--algo", FIELD(algo), "ring|tree|direct|dbtree|nvls|auto (dbtree: all_reduce across nodes; nvls: all_reduce inside an NVLink SHARP node)", {}, kShowDefault},
      {"--proto", FIELD(proto), "LL|LL128|Simple|auto (NCCL's protocols; auto: chosen with the algorithm)", {},
       kShowDefault},
      {"--redop", FIELD(redop), "sum|avg|max (all_reduce, reduce_scatter, reduce; default sum)"},
      {"--min-bytes", FIELD(min_bytes), "Smallest buffer", {}, kShowDefault},
      {"--max-bytes", FIELD(max_bytes), "Largest buffer (powers of two in between)", {}, kShowDefault},
      {"--check", FIELD(check), "Compare every result with a serial reference (max_error column; exit 1 if nonzero)"},
      {"--corrupt-result", FIELD(corrupt), "VALUE (testing --check)", {}, false, /*hidden=*/true},
  };
}

#undef FIELD

}  // namespace

void add_collectives_command(CLI::App& app) {
  auto* sub = app.add_subcommand("collectives", "Collective time and bandwidth over N virtual GPUs (nccl-tests style)");
  auto f = std::make_shared<CollFlags>();
  add_common_flags(sub, f->common);
  add_flags(sub, *f, collectives_flags());
  set_action(sub, [f] { return run_collectives(*f); });
}

}  // namespace shardlab::cli
