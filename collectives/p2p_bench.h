// Point-to-point latency and bandwidth between two virtual GPUs, measured
// the way OSU's osu_latency / osu_bw / osu_bibw measure a real link, in
// virtual time (plus the host's copy rate through the channel). `shardlab
// p2p` prints these rows as a table or p2p_json; the Python bindings return
// the same.
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
//
// Thread safety: each call runs its own Cluster; calls do not share state.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "runtime/cluster.h"
#include "runtime/profile.h"

namespace shardlab::collectives {

struct P2pOptions {
  int src = 0, dst = 1;        // device ranks of the profile, distinct
  bool bidirectional = false;  // both send at once (osu_bibw)
  bool trace = false;          // keep the devices' traces
  double pace = 0;             // ClusterOptions::pace
};

struct P2pRow {
  uint64_t bytes = 0;
  double latency_us = 0;
  double bandwidth_GBps = 0;
  double host_GBps = 0;
};

struct P2pResult {
  std::vector<P2pRow> rows;  // one per size
  bool intra = true;         // src and dst on one node
  RunResult run;             // the traces, the wall time
};

// The largest message: each of the two devices holds a send and a receive
// buffer of it on the host.
inline constexpr uint64_t kMaxP2pMessageBytes = 1ull << 30;

// Every message size of `sizes` (each at most kMaxP2pMessageBytes) between
// options.src and options.dst.
P2pResult bench_p2p(const HardwareProfile& profile, const P2pOptions& options, const std::vector<uint64_t>& sizes);

// {"profile", "src", "dst", "link": intra|inter, "bidirectional", "rows":
// [{bytes, latency_us, bandwidth_GBps, host_GBps}]}.
nlohmann::json p2p_json(const P2pResult& result, const P2pOptions& options, const std::string& profile);

}  // namespace shardlab::collectives
