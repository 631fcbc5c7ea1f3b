// hello_cluster: a few virtual GPUs send each other messages, and every
// virtual time is checked against the alpha-beta link model of the profile.
//
//   build/bin/hello_cluster [PROFILE]      (default a100-nvlink; a name or a .json file)
//
// Devices 0 and 1 share a node; device D (D = devices per node) sits on the
// next node. A message of S bytes is W = S + ceil(S/P)·H bytes on the wire
// (packets of P payload bytes with H header bytes each) and arrives
// α + W/β after it departs (α the link latency, β its bandwidth); a sender's
// egress port and a receiver's ingress port carry one message at a time.
// So, with w = W/β:
//   0 -> 1            arrives at α + w
//   0 -> 1 again      queued on 0's egress port behind the first: α + 2w
//   0 -> D            another port (inter-node link): α' + w'
//   1 -> 0 reply      sent when the second message is in: (α + 2w) + (α + w)
// The closed forms are computed from the profile's numbers in integer
// picoseconds (alpha_beta.h) and must match exactly. The payload bytes really
// move too: each receiver checks them.
//
// Exit code: 0 when every check passes, 1 when one fails, 2 on bad input.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <vector>

#include "alpha_beta.h"
#include "profile_main.h"
#include "runtime/cluster.h"
#include "runtime/errors.h"

using namespace shardlab;

namespace {

constexpr uint64_t kIntraBytes = 1 << 20;  // 1 MiB
constexpr uint64_t kInterBytes = 1 << 16;  // 64 KiB

using hello::alpha_beta;
using hello::AlphaBeta;

// A message's bytes, a pattern of its tag: the receiver checks they arrived intact.
std::vector<std::byte> pattern(uint64_t bytes, int seed) {
  std::vector<std::byte> v(bytes);
  for (uint64_t i = 0; i < bytes; ++i) v[i] = std::byte((i * 31 + uint64_t(seed)) & 0xff);
  return v;
}

// What each device saw, written by its own thread, read after the join.
struct Seen {
  Time first = 0, second = 0, inter = 0, reply = 0;
  bool payload_ok = true;
};

void receive(Device& dev, int src, Tag tag, uint64_t bytes, Time& at, Seen& seen) {
  const Message m = dev.recv(dev.compute(), src, tag);  // the stream waits for the arrival
  at = m.arrival;
  const std::vector<std::byte> want = pattern(bytes, int(tag));
  seen.payload_ok = seen.payload_ok && m.bytes().size() == want.size() &&
                    std::equal(want.begin(), want.end(), m.bytes().begin());
}

void program(Device& dev, int far, Seen& seen) {
  Stream& s = dev.compute();
  if (dev.rank() == 0) {
    // Eager sends: each departs when the stream (at 0) and its egress port are free.
    dev.isend(s, 1, 1, pattern(kIntraBytes, 1), kIntraBytes);
    dev.isend(s, 1, 2, pattern(kIntraBytes, 2), kIntraBytes);
    if (far > 0) dev.isend(s, far, 3, pattern(kInterBytes, 3), kInterBytes);
    receive(dev, 1, 4, kIntraBytes, seen.reply, seen);
  } else if (dev.rank() == 1) {
    receive(dev, 0, 1, kIntraBytes, seen.first, seen);
    receive(dev, 0, 2, kIntraBytes, seen.second, seen);
    dev.send(s, 0, 4, pattern(kIntraBytes, 4), kIntraBytes);
  } else if (dev.rank() == far) {
    receive(dev, 0, 3, kInterBytes, seen.inter, seen);
  }
}

bool check(const char* what, uint64_t bytes, Time got, Time want) {
  const bool ok = got == want;
  std::printf("%-28s %9llu %14.6f %14.6f  %s\n", what, static_cast<unsigned long long>(bytes),
              to_us(got), to_us(want), ok ? "ok" : "MISMATCH");
  return ok;
}

int run(const HardwareProfile& p) {
  if (p.devices_per_node < 2) throw ConfigError("profile " + p.name + ": needs 2 devices per node");
  const int far = p.nodes > 1 ? p.devices_per_node : -1;  // the first device of node 1
  Cluster cluster(p, {.world_size = far > 0 ? far + 1 : 2});
  std::vector<Seen> seen(size_t(cluster.world_size()));
  const RunResult r =
      cluster.run([&](Device& dev) { program(dev, far, seen[size_t(dev.rank())]); });

  const AlphaBeta in = alpha_beta(p.intra, kIntraBytes);
  std::printf("# hello_cluster: profile %s, %d virtual devices (devices 0, 1 on node 0%s)\n",
              p.name.c_str(), cluster.world_size(), far > 0 ? ", the last on node 1" : "");
  std::printf(
      "# intra-node link: alpha %.3f us, beta %.1f GB/s; a %llu-byte message: w = %.6f us\n",
      p.intra.latency_us, p.intra.bandwidth_GBps, static_cast<unsigned long long>(kIntraBytes),
      to_us(in.w));
  std::printf("%-28s %9s %14s %14s\n", "message", "bytes", "virtual(us)", "alpha-beta(us)");
  bool ok = check("0 -> 1", kIntraBytes, seen[1].first, in.alpha + in.w);
  ok &= check("0 -> 1 queued behind it", kIntraBytes, seen[1].second, in.alpha + 2 * in.w);
  Time last = 2 * in.alpha + 3 * in.w;  // the reply's arrival ends device 0's program
  if (far > 0) {
    const AlphaBeta out = alpha_beta(p.inter, kInterBytes);
    ok &=
        check("0 -> node 1 (inter-node)", kInterBytes, seen[size_t(far)].inter, out.alpha + out.w);
    last = std::max(last, out.alpha + out.w);
  }
  ok &= check("1 -> 0 reply", kIntraBytes, seen[0].reply, 2 * in.alpha + 3 * in.w);
  ok &= check("makespan (latest device end)", 0, r.makespan(), last);
  for (const Seen& s : seen) ok &= s.payload_ok;
  if (!ok) {
    std::printf(
        "FAIL: a virtual time differs from the alpha-beta model, or a payload arrived changed\n");
    return 1;
  }
  std::printf(
      "PASS: every virtual time equals the alpha-beta model to the picosecond; every payload "
      "arrived intact\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return hello::profile_main("hello_cluster", argc, argv, run); }
