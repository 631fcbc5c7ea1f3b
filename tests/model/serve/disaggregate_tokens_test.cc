// Disaggregated serving on the model's values: the prefill replicas' K and V
// rows travel to the decode replicas (cluster_step.h's hand-off), and every
// request's tokens equal those `generate` produces for its prompt alone,
// greedy and sampled, with one executor for the replicas in turn
// (round-robin) and one per replica side by side (least-loaded); at pp 1 on
// replicas small enough to preempt and recompute.
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>

#include <fmt/format.h>

#include "model/serve/cluster_step.h"
#include "model/serve/serving.h"
#include "tests/model/serve/serve_values.h"

namespace shardlab::serve {
namespace {

struct Case {
  int tp = 1, pp = 1;
  Routing router = Routing::kRoundRobin;
  infer::SamplingOptions sampling;
  int prefill = 2, decode = 2;
};

void expect_generates_tokens(const Case& k) {
  const Tiny t = tiny(false);
  const std::vector<Request> reqs = workload(t.c.token_vocab());
  ServeOptions o;
  o.disaggregate = {k.prefill, k.decode};
  o.router = k.router;
  o.scheduler.kv_blocks = 5;  // 20 tokens a replica against the 79 the requests hold at their end
  o.scheduler.kv_block = 4;
  o.scheduler.chunked_prefill = 6;
  o.scheduler.virtual_engines = k.pp;
  o.scheduler.kv_blocks *= k.pp;  // each engine its 5 blocks
  ClusterOptions co;
  co.world_size = k.tp * k.pp;
  ReplicaShape shape{t.c, k.tp, k.pp, 1, /*phantom=*/false, 1, &t.init};
  shape.sampling = k.sampling;
  shape.virtual_engines = k.pp;
  const int executors = k.router == Routing::kRoundRobin ? 1 : k.prefill + k.decode;  // side by side: a cluster each
  std::vector<std::unique_ptr<Cluster>> clusters;
  std::vector<std::unique_ptr<ClusterStepExecutor>> owned;
  std::vector<StepExecutor*> steps;
  for (int i = 0; i < executors; ++i) {
    clusters.push_back(std::make_unique<Cluster>(load_profile("a100-nvlink"), co));
    owned.push_back(std::make_unique<ClusterStepExecutor>(*clusters.back(), shape));
    steps.push_back(owned.back().get());
  }
  KvTransfer transfer(load_profile("a100-nvlink"), k.prefill, k.decode,
                      std::vector<double>(size_t(co.world_size), 1000));
  const ServeResult r = simulate_serving(reqs, o, steps, &transfer);
  for (const auto& e : owned) e->finish();
  const std::string name = fmt::format("tp {} pp {} {}{}", k.tp, k.pp, routing_name(k.router),
                                       k.sampling.temperature > 0 ? " sampled" : "");
  std::printf("%s: %lld preemptions, %lld transfers, %llu bytes\n", name.c_str(), (long long)r.summary.preemptions,
              (long long)r.phases.transfers, (unsigned long long)r.phases.kv_bytes);
  if (k.pp == 1) {  // at pp 2 each engine's 5 blocks hold its share
    EXPECT_GT(r.summary.preemptions, 0) << name;
  }
  EXPECT_EQ(r.phases.transfers, int64_t(reqs.size())) << name;
  ASSERT_EQ(r.requests.size(), reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(r.requests[i].tokens, alone(t.c, t.init, reqs[i], k.sampling)) << name << ", request " << i;
    EXPECT_GE(r.requests[i].replica, k.prefill) << "decoded on a decode replica";
  }
}

TEST(DisaggregatedTokens, GreedyTokensAreGeneratesAcrossTheHandOff) {
  expect_generates_tokens({2, 1, Routing::kRoundRobin, {}});
  expect_generates_tokens({1, 2, Routing::kLeastLoaded, {}, 2, 1});  // one decode replica of 2 engines
}

TEST(DisaggregatedTokens, SampledTokensAreGeneratesWithSeedPlusId) {
  expect_generates_tokens({1, 1, Routing::kLeastLoaded, {1.5, 40, 500, 0.95}});
}

}  // namespace
}  // namespace shardlab::serve
