// custom_collective: a user-written all-reduce on the public point-to-point
// API (Device::isend / Device::recv), checked for exact results and for its
// virtual time against the closed form, next to the library's ring all-reduce
// (checked against its own closed form too).
//
//   build/bin/custom_collective [PROFILE]    (default a100-nvlink)
//
// Recursive doubling over n = 2^k devices of one node: in step j every rank
// swaps its whole buffer with rank ^ 2^j and adds what it received, so after
// log2(n) steps every rank holds the sum. Both partners of a step add the same
// two numbers, and float addition is commutative, so every rank ends with the
// same bits. The additions are not charged to the clock (as in the library's
// collectives: NCCL overlaps them with the transfers), so with a message of S
// bytes taking α + w(S) (latency, then its wire bytes over the bandwidth):
//
//   recursive doubling   log2(n) · (α + w(S))             few steps, the whole buffer
//   ring (the library)   launch + 2(n-1) · (α + w(S/n))   many steps, 1/n of it each
//
// The library's ring runs here on plain sends (Proto::kPlain: the links' own
// latency and rate, as the custom collective's isend), not under one of NCCL's
// protocols (LL, LL128, Simple: their own hop latency, rate share and start),
// so both sides move bytes alike.
//
// so recursive doubling wins on latency at small sizes and the ring on
// bandwidth at large ones. Exit code: 0 when every result is exact and every
// time equals its closed form to the picosecond, 1 otherwise, 2 on bad input.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <vector>

#include "../hello_cluster/alpha_beta.h"
#include "../hello_cluster/profile_main.h"
#include "collectives/collectives.h"
#include "runtime/cluster.h"
#include "runtime/errors.h"

using namespace shardlab;
namespace coll = shardlab::collectives;

namespace {

// The user's collective: in-place sum over every device of the cluster
// (a power of two of them), on the device's compute stream.
void recursive_doubling_all_reduce(Device& dev, std::vector<float>& data) {
  const int n = dev.world_size(), me = dev.rank();
  const uint64_t bytes = data.size() * sizeof(float);  // fp32 on the wire
  std::vector<float> incoming(data.size());
  for (int mask = 1, step = 0; mask < n; mask <<= 1, ++step) {
    const int partner = me ^ mask;
    const auto tag = Tag(step);  // user tags stay below 2^63 (collectives use the upper half)
    // isend copies the payload at once, so `data` may change before it arrives.
    dev.isend(dev.compute(), partner, tag, std::as_bytes(std::span(data)), bytes);
    const Message m = dev.recv(dev.compute(), partner, tag);  // the stream waits for its arrival
    std::copy_n(m.bytes().data(), bytes, reinterpret_cast<std::byte*>(incoming.data()));
    for (size_t i = 0; i < data.size(); ++i) data[i] += incoming[i];
  }
}

// Rank r contributes (r + 1) · (i mod 251) at element i: small integers, so
// every sum is exact in fp32 whatever the order, n(n+1)/2 · (i mod 251).
float contribution(int rank, size_t i) { return float((rank + 1) * int(i % 251)); }

struct Outcome {
  std::vector<Time> elapsed;  // (n) each rank's time in the collective
  bool exact = true;          // every rank's every element equals the closed form
};

// Runs `all_reduce` on a fresh cluster of n devices over `count` floats.
template <typename AllReduce>
Outcome run_on_cluster(const HardwareProfile& p, int n, size_t count, AllReduce all_reduce) {
  Outcome out;
  out.elapsed.resize(size_t(n));
  std::vector<char> exact(size_t(n), 1);  // one slot per device thread
  Cluster cluster(p, {.world_size = n});
  cluster.run([&](Device& dev) {
    std::vector<float> data(count);
    for (size_t i = 0; i < count; ++i) data[i] = contribution(dev.rank(), i);
    const Time start = dev.compute().now();
    all_reduce(dev, data);
    out.elapsed[size_t(dev.rank())] = dev.compute().now() - start;
    const float scale = float(n * (n + 1) / 2);
    for (size_t i = 0; i < count; ++i)
      exact[size_t(dev.rank())] &= data[i] == scale * float(i % 251);
  });
  for (char e : exact) out.exact = out.exact && e;
  return out;
}

bool same_everywhere(const std::vector<Time>& t, Time want) {
  for (Time x : t)
    if (x != want) return false;
  return true;
}

int run(const HardwareProfile& p) {
  int n = 1;
  while (n * 2 <= std::min(p.devices_per_node, 8)) n *= 2;  // one node: uniform links
  if (n < 2) throw ConfigError("profile " + p.name + ": needs 2 devices per node");
  const int steps = int(std::log2(n));
  std::printf(
      "# custom_collective: recursive-doubling all-reduce on %d devices of %s (one node), fp32\n",
      n, p.name.c_str());
  std::printf("%10s %16s %16s %16s %16s  %s\n", "bytes", "rd virtual(us)", "rd closed(us)",
              "ring virtual(us)", "ring closed(us)", "check");
  bool ok = true;
  for (const uint64_t bytes : {uint64_t(4) << 10, uint64_t(256) << 10, uint64_t(4) << 20}) {
    const size_t count = bytes / sizeof(float);
    const Outcome rd = run_on_cluster(p, n, count, recursive_doubling_all_reduce);
    const Outcome ring = run_on_cluster(p, n, count, [](Device& dev, std::vector<float>& d) {
      coll::all_reduce(dev, coll::ProcessGroup::world(dev), coll::Buffer(d), coll::ReduceOp::kSum,
                       {.algo = coll::Algo::kRing, .proto = coll::Proto::kPlain});
    });
    const Time want = steps * hello::alpha_beta(p.intra, bytes).total();
    const Time ring_want = std::llround(p.device.collective_launch_us * 1e6) +
                           2 * (n - 1) * hello::alpha_beta(p.intra, bytes / n).total();
    const bool row_ok = rd.exact && ring.exact && same_everywhere(rd.elapsed, want) &&
                        same_everywhere(ring.elapsed, ring_want);
    std::printf("%10llu %16.6f %16.6f %16.6f %16.6f  %s\n", static_cast<unsigned long long>(bytes),
                to_us(rd.elapsed[0]), to_us(want), to_us(ring.elapsed[0]), to_us(ring_want),
                row_ok ? "ok" : "MISMATCH");
    ok = ok && row_ok;
  }
  std::printf("(rd: log2(n)(a + w(S)); ring: the launch, %.1f us, + 2(n-1)(a + w(S/n)))\n",
              p.device.collective_launch_us);
  if (!ok) {
    std::printf("FAIL: a sum is not exact or a virtual time differs from its closed form\n");
    return 1;
  }
  std::printf(
      "PASS: every rank holds the exact sum; both times equal their closed forms to the "
      "picosecond\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return hello::profile_main("custom_collective", argc, argv, run); }
