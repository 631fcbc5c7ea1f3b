// Lab 2 grader: runs your ring_all_reduce on 2, 3, 4 and 8 virtual GPUs and
// checks (1) the result against a serial sum, exactly (the inputs are small
// integers, so every order of addition gives the same floats), on every
// member; (2) the virtual time against the closed form 2(n-1)(a + S/(nB)) on
// plain links (latency a, bandwidth B, no packet headers), exactly to the
// picosecond; (3) on a100-nvlink, the time of the library's ring all_reduce
// on plain sends (Proto::kPlain: the links' own latency and rate, as your
// isend; not one of NCCL's protocols) minus its fixed start
// (collective_launch_us, the kernel launch). The same checks grade the
// C++ exercise (grader_main.cc) and the notebook's Python function
// (python/lab_graders.cc).
#include "labs/02-ring-allreduce/grader.h"

#include <fmt/format.h>

#include "collectives/collectives.h"
#include "collectives/tuner.h"
#include "labs/common/grade.h"
#include "runtime/cluster.h"

namespace shardlab::labs {
namespace {

constexpr double kLatencyUs = 2.0;
constexpr double kGBps = 300.0;

// One node of n GPUs on plain links: the closed form alone.
HardwareProfile plain_links(int n) {
  HardwareProfile p = load_profile("a100-nvlink");
  p.name = "plain";
  p.nodes = 1;
  p.devices_per_node = n;
  p.intra = {kLatencyUs, kGBps};
  p.device.collective_launch_us = 0;
  return p;
}

// Member r's element i: a small integer (sums exact in any order).
float input(int r, size_t i) {
  return static_cast<float>(static_cast<int>((r * 7 + i * 13) % 17) - 8);
}

// Runs ring_all_reduce of `count` floats on n GPUs; checks every member's
// result; returns the latest virtual end over the members (-1: the run failed).
Time run_ring(Grade& g, const RingAllReduce& ring_all_reduce, const HardwareProfile& p, int n, size_t count) {
  Findings wrong;
  Cluster cluster(p, {.world_size = n});
  const std::string what = fmt::format("n={} count={}: every member holds the exact sum", n, count);
  const auto r = run_program(g, what, cluster, [&](Device& dev) {
    const auto group = collectives::ProcessGroup::world(dev);
    std::vector<float> data(count);
    for (size_t i = 0; i < count; ++i) data[i] = input(dev.rank(), i);
    ring_all_reduce(dev, group, data);
    for (size_t i = 0; i < count; ++i) {
      float want = 0;
      for (int m = 0; m < n; ++m) want += input(m, i);
      if (data[i] != want) {
        wrong.add(
            fmt::format("rank {} element {} is {}, want {} (the sum over the {} members){}",
                        dev.rank(), i, data[i], want, n,
                        data[i] == input(dev.rank(), i) ? ": it still holds its own input" : ""));
        return;
      }
    }
  });
  if (!r) return -1;
  wrong.record(g, what);
  return r->makespan();
}

void grade_time(Grade& g, const RingAllReduce& fn, int n) {
  const size_t count = static_cast<size_t>(n) * 3000;  // S/n = 12000 bytes
  const HardwareProfile p = plain_links(n);
  const Time got = run_ring(g, fn, p, n, count);
  if (got < 0) return;  // the run failed: already reported
  const Time step = p.intra.latency() + transfer_time(count * 4 / n, p.intra.bytes_per_second());
  const Time want = 2 * (n - 1) * step;
  g.check(got == want,
          fmt::format("n={}: time is 2(n-1)(a + S/(nB)) = {:.3f} us", n, to_seconds(want) * 1e6),
          fmt::format("took {:.3f} us ({} steps' worth of a + S/(nB) = {:.3f} us each){}",
                      to_seconds(got) * 1e6, static_cast<double>(got) / static_cast<double>(step),
                      to_seconds(step) * 1e6, got == 0 ? ": nothing was sent" : ""));
}

void grade_against_library(Grade& g, const RingAllReduce& fn) {
  const int n = 8;
  const size_t count = 1 << 20;  // 4 MiB
  const HardwareProfile p = load_profile("a100-nvlink");
  const Time got = run_ring(g, fn, p, n, count);
  if (got < 0) return;  // the run failed: already reported
  std::vector<int> members(n);
  for (int i = 0; i < n; ++i) members[static_cast<size_t>(i)] = i;
  const Time want =
      collectives::predict_time(
          p, members, {.op = collectives::OpKind::kAllReduce, .count = count, .proto = collectives::Proto::kPlain},
          collectives::Algo::kRing) -
      collectives::collective_launch(p, n);
  g.check(got == want,
          fmt::format(
              "a100-nvlink, 8 GPUs, 4 MiB: the library's ring time without its start, {:.3f} us",
              to_seconds(want) * 1e6),
          fmt::format("took {:.3f} us", to_seconds(got) * 1e6));
}

}  // namespace

int grade_ring_all_reduce(const RingAllReduce& fn, std::string* out) {
  Grade g(2, "ring all-reduce on point-to-point sends and receives", out);
  for (int n : {2, 3, 4, 8}) run_ring(g, fn, plain_links(n), n, 1001);  // uneven chunks
  for (int n : {2, 4, 8}) grade_time(g, fn, n);
  grade_against_library(g, fn);
  return g.finish();
}

}  // namespace shardlab::labs
