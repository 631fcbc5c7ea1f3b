// `shardlab p2p`: point-to-point latency and bandwidth between two virtual
// GPUs, OSU style, one row per message size (powers of two from --min-bytes
// to --max-bytes). The measurement and its JSON are the library's
// (collectives/p2p_bench.h, where the columns are defined); this file checks
// the flags and prints.
#include <memory>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/cli.h"
#include "cli/flag_table.h"
#include "collectives/p2p_bench.h"
#include "runtime/cluster.h"
#include "runtime/errors.h"
#include "runtime/link_model.h"
#include "runtime/transport.h"
#include "runtime/units.h"

namespace shardlab::cli {
namespace {

struct P2pFlags {
  CommonFlags common;
  int src = 0;
  int dst = 1;
  std::string min_bytes = "1";
  std::string max_bytes = "256MiB";
  bool bidirectional = false;
};

int run_p2p(const P2pFlags& f) {
  HardwareProfile profile = apply_common(f.common);
  const int total = profile.total_devices();
  for (auto [flag, v] : {std::pair{"--src", f.src}, std::pair{"--dst", f.dst}}) {
    if (v < 0 || v >= total)
      throw ConfigError(fmt::format("{} {}: out of range (profile {} has devices 0..{})", flag, v,
                                    profile.name, total - 1));
  }
  if (f.src == f.dst) throw ConfigError(fmt::format("--src and --dst are both {}: need two devices", f.src));
  const auto [lo, hi] = parse_size_range(f.min_bytes, f.max_bytes);
  // Each of the two devices holds a send and a receive buffer of the largest
  // message: 4 x --max-bytes of host memory.
  if (hi > collectives::kMaxP2pMessageBytes)
    throw ConfigError(fmt::format("--max-bytes {}: at most 1GiB for p2p (each device holds a send and a receive "
                                  "buffer of the largest message)", hi));
  check_outputs({{"--trace", f.common.trace}});

  std::vector<uint64_t> sizes;
  for (uint64_t b = lo; b <= hi; b *= 2) sizes.push_back(b);
  const collectives::P2pOptions o{f.src, f.dst, f.bidirectional, !f.common.trace.empty(), f.common.pace};
  const collectives::P2pResult r = collectives::bench_p2p(profile, o, sizes);
  const LinkSpec& link = r.intra ? profile.intra : profile.inter;
  if (!f.common.trace.empty() && leader_process())
    write_chrome_trace(f.common.trace, r.run.traces, fmt::format("shardlab p2p {} {}->{}", profile.name, f.src, f.dst));
  if (f.common.json) {
    print_json(collectives::p2p_json(r, o, profile.name));
    return 0;
  }
  fmt::print("# shardlab p2p: profile {}, device {} (node {}) -> device {} (node {})\n", profile.name,
             f.src, profile.node_of(f.src), f.dst, profile.node_of(f.dst));
  fmt::print("# {}-node link: latency {:.2f} us, {:.1f} GB/s per direction{}\n", r.intra ? "intra" : "inter",
             link.latency_us, link.bandwidth_GBps, f.bidirectional ? "; bandwidth is both directions summed" : "");
  if (!r.intra && !profile.fabric.empty()) {
    // The fabric's tiers above the leaf add switches and may cap the rate (runtime/link_model.h).
    const int tier = profile.fabric.common_tier(profile.node_of(f.src), profile.node_of(f.dst));
    const Link l = ProfileLinkModel(profile).link(f.src, f.dst);
    fmt::print("# fabric: the nodes first share tier {} ({}): latency {:.2f} us, {:.1f} GB/s per direction\n", tier,
               profile.fabric.tier_name(tier), to_us(l.latency), static_cast<double>(l.bytes_per_second) / 1e9);
  }
  fmt::print("# {:>12} {:>14} {:>17} {:>12}\n", "bytes", "latency(us)", "bandwidth(GB/s)", "host(GB/s)");
  for (const collectives::P2pRow& row : r.rows)
    fmt::print("  {:>12} {:>14.3f} {:>17.3f} {:>12.2f}\n", row.bytes, row.latency_us, row.bandwidth_GBps,
               row.host_GBps);
  fmt::print("# virtual time; host figures are this machine's wall clock ({:.2f} s)\n", r.run.wall_seconds);
  return 0;
}

#define FIELD(path) FLAG_FIELD(P2pFlags, path)

FlagTable<P2pFlags> p2p_flags() {
  return {
      {"--src", FIELD(src), "Sending device rank", {}, kShowDefault},
      {"--dst", FIELD(dst), "Receiving device rank", {}, kShowDefault},
      {"--min-bytes", FIELD(min_bytes), "Smallest message size", {}, kShowDefault},
      {"--max-bytes", FIELD(max_bytes), "Largest message size (powers of two in between)", {}, kShowDefault},
      {"--bidirectional", FIELD(bidirectional), "Both devices send at once (osu_bibw)"},
  };
}

#undef FIELD

}  // namespace

void add_p2p_command(CLI::App& app) {
  auto* sub = app.add_subcommand("p2p", "Point-to-point latency and bandwidth between two virtual GPUs (OSU style)");
  auto f = std::make_shared<P2pFlags>();
  add_common_flags(sub, f->common);
  add_flags(sub, *f, p2p_flags());
  set_action(sub, [f] { return run_p2p(*f); });
}

}  // namespace shardlab::cli
