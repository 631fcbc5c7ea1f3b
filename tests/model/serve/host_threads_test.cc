// Serving on values at tp 8 with the replica's devices as fibers on fewer
// host threads (ReplicaShape::host_threads, runtime/fiber.h) against a
// thread per device: every request's tokens and times, every step's time,
// every device's stream ends and busy times and every trace event must be
// equal, with the collectives meeting (rendezvous.h) and with their
// messages under random host sleeps at every send and receive (so the
// fibers of 3 host threads wake each other in any order). The tokens are
// also generate's for each request alone.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "model/serve/cluster_step.h"
#include "model/serve/serving.h"
#include "runtime/fiber.h"
#include "tests/collectives/test_util.h"
#include "tests/model/serve/serve_values.h"

namespace shardlab::serve {
namespace {

struct Variant {
  int host_threads = 0;
  bool rendezvous = true;
  uint64_t sleeps = 0;  // seed of random host sleeps at sends and receives (messages only); 0: none
  std::string name() const {
    const std::string threads = host_threads == 0    ? std::string("a thread per device")
                                : host_threads == -1 ? std::string("a host thread per usable core")
                                : host_threads == 1  ? std::string("1 host thread")
                                                     : fmt::format("{} host threads", host_threads);
    return fmt::format("{}, {}{}", threads, rendezvous && !sleeps ? "meetings" : "messages",
                       sleeps ? ", random sleeps" : "");
  }
};

struct Served {
  ReplicaResult result;
  RunResult run;
};

Served serve_tp8(const Tiny& t, const std::vector<Request>& reqs, const Variant& v) {
  collectives::testing::RandomSleeps sleeps(v.sleeps);
  ClusterOptions co;
  co.world_size = 8;
  co.trace = true;
  co.rendezvous = v.rendezvous;
  co.hooks = v.sleeps ? &sleeps : nullptr;
  Cluster cluster(load_profile("a100-nvlink"), co);
  ReplicaShape shape{t.c, 8, 1, 1, /*phantom=*/false, 1, &t.init};
  shape.host_threads = v.host_threads;
  ClusterStepExecutor ex(cluster, shape);
  SchedulerOptions o;  // small enough to preempt: 8 blocks of 4 tokens, 6 prefill tokens a step
  o.kv_blocks = 8;
  o.kv_block = 4;
  o.chunked_prefill = 6;
  Served s{simulate_replica(reqs, o, ex), {}};
  s.run = ex.finish();
  return s;
}

void expect_same(const Served& a, const Served& b, const std::string& what) {
  ASSERT_EQ(a.result.requests.size(), b.result.requests.size()) << what;
  for (size_t i = 0; i < a.result.requests.size(); ++i) {
    const RequestRecord &x = a.result.requests[i], &y = b.result.requests[i];
    EXPECT_EQ(x.tokens, y.tokens) << what << ", request " << i;
    // Times are whole picoseconds of the virtual clock in seconds: equal bits.
    EXPECT_EQ(x.first_token_s, y.first_token_s) << what << ", request " << i;
    EXPECT_EQ(x.finish_s, y.finish_s) << what << ", request " << i;
    EXPECT_EQ(x.preemptions, y.preemptions) << what << ", request " << i;
  }
  ASSERT_EQ(a.result.usage.size(), b.result.usage.size()) << what;
  for (size_t i = 0; i < a.result.usage.size(); ++i) {
    EXPECT_EQ(a.result.usage[i].t, b.result.usage[i].t) << what << ", step " << i;
    EXPECT_EQ(a.result.usage[i].step_s, b.result.usage[i].step_s) << what << ", step " << i;
  }
  ASSERT_EQ(a.run.devices.size(), b.run.devices.size()) << what;
  Time max_diff = 0;
  for (size_t r = 0; r < a.run.devices.size(); ++r) {
    const DeviceStats &x = a.run.devices[r], &y = b.run.devices[r];
    for (auto [p, q] : {std::pair{x.compute_end, y.compute_end},
                        {x.comm_end, y.comm_end},
                        {x.compute_busy, y.compute_busy},
                        {x.comm_busy, y.comm_busy},
                        {x.comm_exposed, y.comm_exposed}})
      max_diff = std::max(max_diff, p > q ? p - q : q - p);
  }
  std::printf(
      "[host threads] %s: max difference of stream ends and busy times %lld ps (tolerance 0)\n",
      what.c_str(), static_cast<long long>(max_diff));
  EXPECT_EQ(max_diff, 0) << what;
  ASSERT_EQ(a.run.traces.size(), b.run.traces.size()) << what;
  size_t events = 0;
  for (size_t d = 0; d < a.run.traces.size(); ++d) {
    const auto &x = a.run.traces[d].events, &y = b.run.traces[d].events;
    ASSERT_EQ(x.size(), y.size()) << what << ": device " << d << "'s trace";
    for (size_t i = 0; i < x.size(); ++i, ++events) {
      const bool same = std::strcmp(x[i].name, y[i].name) == 0 && x[i].stream == y[i].stream &&
                        x[i].start == y[i].start && x[i].end == y[i].end &&
                        x[i].bytes == y[i].bytes && x[i].peer == y[i].peer;
      ASSERT_TRUE(same) << what << ": device " << d << " event " << i << ": " << x[i].name << " ["
                        << x[i].start << ", " << x[i].end << ") against " << y[i].name << " ["
                        << y[i].start << ", " << y[i].end << ")";
    }
  }
  std::printf(
      "[host threads] %s: %zu requests' tokens and times, %zu steps, %zu trace events equal\n",
      what.c_str(), a.result.requests.size(), a.result.usage.size(), events);
}

TEST(ServeHostThreads, FibersGiveTheThreadsTokensTimesAndTraceAtTp8) {
  Tiny t = tiny(false);
  t.c.n_head = 8;  // tp 8 splits the heads
  model::GPT<float> ref(t.c, 7);
  infer::testing::perturb(ref);
  t.init = infer::testing::as_checkpoint(ref);
  const std::vector<Request> reqs = workload(t.c.token_vocab());

  // The path every release before fibers took: a thread per device, messages.
  const Served base = serve_tp8(t, reqs, {0, false, 0});
  EXPECT_GT(base.result.preemptions, 0);
  for (size_t i = 0; i < reqs.size(); ++i)
    EXPECT_EQ(base.result.requests[i].tokens, alone(t.c, t.init, reqs[i])) << "request " << i;

  const uint64_t switches = fiber_switches();
  for (const Variant& v :
       {Variant{0, true, 0}, Variant{1, true, 0}, Variant{3, true, 0}, Variant{-1, true, 0},
        Variant{1, false, 0}, Variant{3, false, 11}, Variant{8, false, 12}, Variant{2, false, 13}})
    expect_same(serve_tp8(t, reqs, v), base, v.name());
  // The fibers ran: each of them gave its host thread away many times.
  std::printf("[host threads] %llu fiber switches\n",
              static_cast<unsigned long long>(fiber_switches() - switches));
  EXPECT_GT(fiber_switches() - switches, 1000u);
}

}  // namespace
}  // namespace shardlab::serve
