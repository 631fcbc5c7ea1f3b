#include "model/serve/cluster_step.h"

#include <cmath>
#include <cstdio>

#include <gtest/gtest.h>

#include "model/infer/generate.h"
#include "model/serve/serving.h"
#include "runtime/profile.h"

namespace shardlab::serve {
namespace {

model::GPTConfig small_model() {
  model::GPTConfig c;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_embd = 64;
  c.block_size = 64;
  c.vocab_size = 128;
  return c;
}

Cluster cluster_of(int world) {
  ClusterOptions o;
  o.world_size = world;
  return Cluster(builtin_profiles().front(), o);
}

// generate (model/infer) runs the same engine for one sequence: its TTFT is
// the prefill step plus the sampling, its decode gaps one decode step each.
// On one device (no broadcast) the serving step must be exactly that.
TEST(ServeClusterStep, OneSequenceTakesGeneratesTimes) {
  const model::GPTConfig m = small_model();
  Cluster g = cluster_of(1);
  infer::GenerateOptions o;
  o.model = m;
  o.prompt = std::vector<model::Token>(10, 1);
  o.max_new_tokens = 3;
  o.phantom = true;
  const infer::GenerateResult r = infer::generate(g, o);
  Cluster c = cluster_of(1);
  ClusterStepExecutor ex(c, {m, 1, 1, 1});
  const BatchEntry prefill{0, 10, 0}, decode1{0, 1, 10}, decode2{0, 1, 11};
  ex.begin_step(0, 0);
  const double t0 = ex.run_step({&prefill, 1}).seconds;
  ex.begin_step(0, t0);
  const double t1 = ex.run_step({&decode1, 1}).seconds;
  ex.begin_step(0, t0 + t1);
  const double t2 = ex.run_step({&decode2, 1}).seconds;
  ex.finish();
  std::printf("prefill %.9f s (generate %.9f), decodes %.9f %.9f (generate %.9f %.9f)\n", t0, to_seconds(r.ttft), t1,
              t2, to_seconds(r.decode_steps[0]), to_seconds(r.decode_steps[1]));
  EXPECT_EQ(t0, to_seconds(r.ttft));
  EXPECT_EQ(t1, to_seconds(r.decode_steps[0]));
  EXPECT_EQ(t2, to_seconds(r.decode_steps[1]));
  EXPECT_GT(t2, t1);  // one more cached token to attend
}

// The devices keep the sequences between steps: the cache must hold what
// the scheduler says (the engine checks), a released sequence starts anew,
// and the same steps give the same times however they are interleaved
// with idle time.
TEST(ServeClusterStep, SequencesLiveAcrossStepsAndTimesRepeat) {
  const model::GPTConfig m = small_model();
  auto run = [&](double idle) {
    Cluster c = cluster_of(2);
    ClusterStepExecutor ex(c, {m, 2, 1, 1});
    std::vector<double> t;
    double now = 0;
    const std::vector<std::vector<BatchEntry>> steps = {
        {{0, 8, 0}, {1, 5, 0}}, {{0, 1, 8}, {1, 1, 5}}, {{0, 1, 9}}, {{1, 6, 0}}};
    for (size_t i = 0; i < steps.size(); ++i) {
      if (i == 3) ex.release(1);  // preempted: recomputed from nothing
      ex.begin_step(0, now);
      t.push_back(ex.run_step(steps[i]).seconds);
      now += t.back() + idle;
    }
    ex.finish();
    return t;
  };
  const std::vector<double> a = run(0), b = run(0.5);
  ASSERT_EQ(a.size(), 4u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], b[i]) << "step " << i;
  EXPECT_GT(a[0], a[1]);  // 13 tokens of prefill against 2 of decode
}

// Folded (tp rank 0 plays its tp peers, one thread per stage), the same
// steps take the same times and the plan measures the same bytes.
TEST(ServeClusterStep, FoldedTpPeersGiveTheUnfoldedTimes) {
  const model::GPTConfig m = small_model();
  for (const auto& [tp, pp] : {std::pair{4, 1}, std::pair{2, 2}}) {
    auto run = [&](bool fold, int* threads) {
      Cluster c = cluster_of(tp * pp);
      ReplicaShape shape{m, tp, pp, 1};
      shape.fold = fold;
      ClusterStepExecutor ex(c, shape);
      const ReplicaPlan p = ex.plan(32);
      std::vector<double> t = {p.kv_bytes_per_token.back(), double(p.activation_bytes.back())};
      const std::vector<std::vector<BatchEntry>> steps = {{{0, 8, 0}, {1, 5, 0}}, {{0, 1, 8}, {1, 1, 5}}, {{0, 1, 9}}};
      double now = 0;
      for (const auto& batch : steps) {
        ex.begin_step(0, now);
        t.push_back(ex.run_step(batch).seconds);
        now += t.back();
      }
      *threads = ex.running_devices();
      ex.finish();
      return t;
    };
    int folded_threads = 0, threads = 0;
    const std::vector<double> a = run(true, &folded_threads), b = run(false, &threads);
    EXPECT_EQ(folded_threads, pp) << "tp " << tp << " pp " << pp;
    EXPECT_EQ(threads, tp * pp);
    EXPECT_EQ(a, b) << "tp " << tp << " pp " << pp;
  }
}

TEST(ServeClusterStep, PlanMeasuresWeightsActivationsAndKvPerToken) {
  const model::GPTConfig m = small_model();
  Cluster c = cluster_of(2);
  ClusterStepExecutor ex(c, {m, 2, 1, 1});
  const ReplicaPlan p = ex.plan(32);
  ASSERT_EQ(p.weight_bytes.size(), 2u);
  // K and V of 2 layers x 2 local heads x head size 16, fp32: 2·2·32·4 bytes a token.
  EXPECT_EQ(p.kv_bytes_per_token[0], 2.0 * 2 * 32 * 4);
  EXPECT_GT(p.weight_bytes[0], 0u);
  EXPECT_GT(p.activation_bytes[0], 0u);
  const int64_t blocks = p.kv_blocks(0.5, 16);
  const double room = 0.5 * double(p.capacity_bytes[0]) - double(p.weight_bytes[0]) - double(p.activation_bytes[0]);
  EXPECT_EQ(blocks, int64_t(std::floor(room / (2.0 * 2 * 32 * 4 * 16))));
}

}  // namespace
}  // namespace shardlab::serve
