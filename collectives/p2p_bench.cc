#include "collectives/p2p_bench.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include <nlohmann/json.hpp>

#include "runtime/transport.h"

namespace shardlab::collectives {
namespace {

constexpr Tag kPing = 1, kPong = 2, kData = 3, kAck = 4, kGo = 5;
// OSU's osu_latency / osu_bw move device buffers with cudaMemcpy (copy engines).
constexpr Engine kEngine = Engine::kCopy;
constexpr uint64_t kWindowBytes = 128ull << 20;
constexpr int kMaxWindow = 64;

int window_for(uint64_t bytes) {
  return static_cast<int>(std::clamp<uint64_t>(kWindowBytes / bytes, 1, kMaxWindow));
}

// Runs the OSU-style sequence for one size. `me` is src or dst; `peer` the other.
void measure(Device& dev, int peer, bool is_src, uint64_t size, bool bidir,
             std::vector<std::byte>& out_buf, std::vector<std::byte>& in_buf, P2pRow* row) {
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

}  // namespace

P2pResult bench_p2p(const HardwareProfile& profile, const P2pOptions& o, const std::vector<uint64_t>& sizes) {
  const uint64_t hi = sizes.empty() ? 0 : *std::max_element(sizes.begin(), sizes.end());
  P2pResult out;
  out.rows.resize(sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) out.rows[i].bytes = sizes[i];
  ClusterOptions opts;
  opts.world_size = std::max(o.src, o.dst) + 1;
  opts.trace = o.trace;
  opts.pace = o.pace;
  Cluster cluster(profile, opts);
  std::vector<P2pRow> rows(sizes.size());
  out.run = cluster.run([&](Device& dev) {
    if (dev.rank() != o.src && dev.rank() != o.dst) return;
    const bool is_src = dev.rank() == o.src;
    std::vector<std::byte> send(hi), recv(hi);
    for (size_t i = 0; i < hi; ++i) send[i] = static_cast<std::byte>(i * 31 + dev.rank());
    for (size_t i = 0; i < sizes.size(); ++i)
      measure(dev, is_src ? o.dst : o.src, is_src, sizes[i], o.bidirectional, send, recv, &rows[i]);
  });
  merge_disjoint(rows);  // under mpirun the source's process wrote them (runtime/transport.h)
  for (size_t i = 0; i < sizes.size(); ++i) {
    out.rows[i].latency_us = rows[i].latency_us;
    out.rows[i].bandwidth_GBps = rows[i].bandwidth_GBps;
    out.rows[i].host_GBps = rows[i].host_GBps;
  }
  out.intra = profile.node_of(o.src) == profile.node_of(o.dst);
  return out;
}

nlohmann::json p2p_json(const P2pResult& r, const P2pOptions& o, const std::string& profile) {
  nlohmann::json j{{"profile", profile}, {"src", o.src}, {"dst", o.dst}, {"link", r.intra ? "intra" : "inter"},
                   {"bidirectional", o.bidirectional}, {"rows", nlohmann::json::array()}};
  for (const P2pRow& row : r.rows)
    j["rows"].push_back({{"bytes", row.bytes}, {"latency_us", row.latency_us},
                         {"bandwidth_GBps", row.bandwidth_GBps}, {"host_GBps", row.host_GBps}});
  return j;
}

}  // namespace shardlab::collectives
