// `shardlab p2p`: point-to-point latency and bandwidth between two virtual
// GPUs, measured the way OSU's osu_latency / osu_bw / osu_bibw measure a real
// link, in virtual time (plus the host's copy rate through the channel).
//
//  latency:   one ping-pong; one-way latency = round trip / 2.
//  bandwidth: a window of W back-to-back messages, then a 4-byte ack; GB/s =
//             W * size / (window start .. ack received), all on the source.
//             W = 64, fewer for large messages (W * size <= 128 MiB) to bound
//             host memory traffic; the ack's latency is included, as in OSU.
//             The window runs twice (a warm-up pass, like OSU's skipped
//             iterations); both passes take the same virtual time.
//  host_GBps: payload bytes moved through the channel per wall second during
//             the window (sender's copy in, receiver's copy out).
#include <chrono>
#include <cstring>
#include <memory>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/cli.h"
#include "cli/flag_table.h"
#include "runtime/cluster.h"
#include "runtime/errors.h"
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

struct Row {
  uint64_t bytes = 0;
  double latency_us = 0;
  double bandwidth_GBps = 0;
  double host_GBps = 0;
};

constexpr Tag kPing = 1, kPong = 2, kData = 3, kAck = 4, kGo = 5;
// OSU's osu_latency / osu_bw move device buffers with cudaMemcpy (copy engines).
constexpr Engine kEngine = Engine::kCopy;
constexpr uint64_t kWindowBytes = 128ull << 20;
constexpr int kMaxWindow = 64;
constexpr uint64_t kMaxMessageBytes = 1ull << 30;

int window_for(uint64_t bytes) {
  return static_cast<int>(std::clamp<uint64_t>(kWindowBytes / bytes, 1, kMaxWindow));
}

// Runs the OSU-style sequence for one size. `me` is src or dst; `peer` the other.
void measure(Device& dev, int peer, bool is_src, uint64_t size, bool bidir,
             std::vector<std::byte>& out_buf, std::vector<std::byte>& in_buf, Row* row) {
  Stream& s = dev.comm();
  std::span<const std::byte> payload(out_buf.data(), size);
  auto receive = [&](Tag tag) {
    Message m = dev.recv(s, peer, tag);
    std::memcpy(in_buf.data(), m.bytes().data(), m.bytes().size());
  };
  // Latency: ping-pong.
  const Time t0 = s.now();
  if (is_src) {
    dev.send(s, peer, kPing, payload, size, kEngine);
    receive(kPong);
    row->latency_us = to_us(s.now() - t0) / 2;
  } else {
    receive(kPing);
    dev.send(s, peer, kPong, payload, size, kEngine);
  }
  // Bandwidth: a window of back-to-back messages, then an ack. Run twice, as
  // OSU skips warm-up iterations: the virtual figures are identical, the host
  // figure is taken from the second pass (channel buffers already pooled).
  const int window = window_for(size);
  const std::byte ack[4] = {};
  for (int pass = 0; pass < 2; ++pass) {
    if (bidir && !is_src) receive(kGo);
    if (bidir && is_src) dev.send(s, peer, kGo, {ack, 1}, 1, kEngine);
    const Time w0 = s.now();
    const auto wall0 = std::chrono::steady_clock::now();
    if (is_src || bidir) {
      for (int i = 0; i < window; ++i) dev.isend(s, peer, kData, payload, size, kEngine);
    }
    if (!is_src || bidir) {
      for (int i = 0; i < window; ++i) receive(kData);
      dev.send(s, peer, kAck, {ack, 4}, 4, kEngine);
    }
    if (is_src) {
      receive(kAck);
      const double secs = to_seconds(s.now() - w0);
      const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
      const double moved = static_cast<double>(size) * window * (bidir ? 2 : 1);
      row->bandwidth_GBps = moved / secs / 1e9;
      row->host_GBps = moved / wall / 1e9;
    }
  }
}

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
  if (hi > kMaxMessageBytes)
    throw ConfigError(fmt::format("--max-bytes {}: at most 1GiB for p2p (each device holds a send and a receive "
                                  "buffer of the largest message)", hi));
  check_outputs({{"--trace", f.common.trace}});

  std::vector<uint64_t> sizes;
  for (uint64_t b = lo; b <= hi; b *= 2) sizes.push_back(b);
  std::vector<Row> rows(sizes.size());

  ClusterOptions opts;
  opts.world_size = std::max(f.src, f.dst) + 1;
  opts.trace = !f.common.trace.empty();
  opts.pace = f.common.pace;
  Cluster cluster(profile, opts);
  RunResult result = cluster.run([&](Device& dev) {
    if (dev.rank() != f.src && dev.rank() != f.dst) return;
    const bool is_src = dev.rank() == f.src;
    std::vector<std::byte> out(hi), in(hi);
    for (size_t i = 0; i < hi; ++i) out[i] = static_cast<std::byte>(i * 31 + dev.rank());
    for (size_t i = 0; i < sizes.size(); ++i)
      measure(dev, is_src ? f.dst : f.src, is_src, sizes[i], f.bidirectional, out, in, &rows[i]);
  });
  merge_disjoint(rows);  // under mpirun the source's process wrote them (runtime/transport.h)

  const bool intra = profile.node_of(f.src) == profile.node_of(f.dst);
  const LinkSpec& link = intra ? profile.intra : profile.inter;
  if (!f.common.trace.empty() && leader_process())
    write_chrome_trace(f.common.trace, result.traces, fmt::format("shardlab p2p {} {}->{}", profile.name, f.src, f.dst));
  if (f.common.json) {
    nlohmann::json j{{"profile", profile.name}, {"src", f.src}, {"dst", f.dst},
                     {"link", intra ? "intra" : "inter"}, {"bidirectional", f.bidirectional},
                     {"rows", nlohmann::json::array()}};
    for (const auto& r : rows)
      j["rows"].push_back({{"bytes", r.bytes ? r.bytes : 0}, {"latency_us", r.latency_us},
                           {"bandwidth_GBps", r.bandwidth_GBps}, {"host_GBps", r.host_GBps}});
    for (size_t i = 0; i < rows.size(); ++i) j["rows"][i]["bytes"] = sizes[i];
    fmt::print("{}\n", j.dump(2));
    return 0;
  }
  fmt::print("# shardlab p2p: profile {}, device {} (node {}) -> device {} (node {})\n", profile.name,
             f.src, profile.node_of(f.src), f.dst, profile.node_of(f.dst));
  fmt::print("# {}-node link: latency {:.2f} us, {:.1f} GB/s per direction{}\n", intra ? "intra" : "inter",
             link.latency_us, link.bandwidth_GBps, f.bidirectional ? "; bandwidth is both directions summed" : "");
  fmt::print("# {:>12} {:>14} {:>17} {:>12}\n", "bytes", "latency(us)", "bandwidth(GB/s)", "host(GB/s)");
  for (size_t i = 0; i < rows.size(); ++i)
    fmt::print("  {:>12} {:>14.3f} {:>17.3f} {:>12.2f}\n", sizes[i], rows[i].latency_us,
               rows[i].bandwidth_GBps, rows[i].host_GBps);
  fmt::print("# virtual time; host figures are this machine's wall clock ({:.2f} s)\n", result.wall_seconds);
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
