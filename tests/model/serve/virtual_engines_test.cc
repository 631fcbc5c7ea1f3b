// Virtual engines: a pipeline of 2 stages with up to 2 batches in flight.
// The executor below is such a pipeline: a stage takes a + b per token of
// the batch, an activation takes c from stage 0 to stage 1, each stage runs
// one batch at a time, a step starts at its engine's time (begin_step).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>

#include "model/serve/scheduler.h"
#include "runtime/errors.h"

namespace shardlab::serve {
namespace {

struct TwoStages final : StepExecutor {
  double a = 1.0, b = 0.01, c = 0.1;
  double start = 0, free0 = 0, free1 = 0;
  void begin_step(int, double now_s) override { start = now_s; }
  StepOutcome run_step(std::span<const BatchEntry> batch) override {
    int tokens = 0;
    for (const BatchEntry& e : batch) tokens += e.new_tokens;
    const double s = a + b * tokens;
    free0 = std::max(start, free0) + s;
    free1 = std::max(free0 + c, free1) + s;
    return {free1 - start, {}};
  }
};

SchedulerOptions engines(int v) {
  SchedulerOptions o;
  o.kv_blocks = 100;
  o.kv_block = 4;
  o.virtual_engines = v;
  return o;
}

// Two requests (prompt 4, output 3) at 0, one per engine. By hand (stage 0
// span, stage 1 span; a step's stage time 1 + 0.01 · tokens):
//   A1 prefill  [0, 1.04]     [1.14, 2.18]
//   B1 prefill  [1.04, 2.08]  [2.18, 3.22]   (stage 1 busy until 2.18)
//   A2 decode   [2.18, 3.19]  [3.29, 4.30]   (A's tokens back at 2.18)
//   B2 decode   [3.22, 4.23]  [4.33, 5.34]
//   A3 decode   [4.30, 5.31]  [5.41, 6.42]
//   B3 decode   [5.34, 6.35]  [6.45, 7.46]
// In steady decode each engine gets a token every 2 s + c = 2.12 (the
// pipeline's cycle: both stages and the hop), V = 2 tokens per cycle.
TEST(VirtualEngines, TwoBatchesInFlightThroughTwoStagesByHand) {
  const std::vector<Request> reqs = {{0, 0, 4, 3}, {1, 0, 4, 3}};
  TwoStages ex;
  const ReplicaResult r = simulate_replica(reqs, engines(2), ex);
  ASSERT_EQ(r.requests.size(), 2u);
  EXPECT_DOUBLE_EQ(r.requests[0].first_token_s, 2.18);
  EXPECT_DOUBLE_EQ(r.requests[1].first_token_s, 3.22);
  EXPECT_NEAR(r.requests[0].finish_s, 6.42, 1e-12);
  EXPECT_NEAR(r.requests[1].finish_s, 7.46, 1e-12);
  const double cycle = 2 * (ex.a + ex.b) + ex.c;
  EXPECT_NEAR((r.requests[0].finish_s - r.requests[0].first_token_s) / 2, cycle, 1e-12);
  EXPECT_EQ(r.steps, 6);
  ASSERT_EQ(r.usage.size(), 6u);
  EXPECT_EQ(r.usage[1].running, 2);  // the replica's: both engines'
}

// Compute-bound stages (0.01 + 1 per token): one engine batches both
// requests, each stage taking 2.01 a decode; two engines run one each
// through the stages in turn. In steady decode (20 more tokens each) a
// request gets a token every 2 · 2.01 + 0.1 with one engine, every
// 2 · 1.01 + 0.1 with two: twice the tokens per second, less 2%.
TEST(VirtualEngines, KeepingBothStagesBusyReachesThePipelineThroughput) {
  double rate[3] = {};
  for (int v : {1, 2}) {
    double finish[2] = {};
    for (int out : {20, 40}) {
      TwoStages ex;
      ex.a = 0.01;
      ex.b = 1;
      const ReplicaResult r = simulate_replica({{0, 0, 4, out}, {1, 0, 4, out}}, engines(v), ex);
      finish[out / 40] = r.requests[1].finish_s;
    }
    const double cycle = 2 * (0.01 + (v == 1 ? 2 : 1)) + 0.1;
    EXPECT_NEAR((finish[1] - finish[0]) / 20, cycle, 1e-9) << v << " engines";
    rate[v] = 2 * 20 / (finish[1] - finish[0]);
    std::printf("%d engine(s): %.4f decode tokens/s (formula 2 / %.2f = %.4f)\n", v, rate[v], cycle, 2 / cycle);
  }
  EXPECT_NEAR(rate[2] / rate[1], 4.12 / 2.12, 1e-9);
}

// Each engine has half the blocks: a request needing more than half is
// refused although the replica's cache would hold it.
TEST(VirtualEngines, EachEngineHasItsShareOfTheBlocks) {
  TwoStages ex;
  SchedulerOptions o = engines(2);
  o.kv_blocks = 6;
  EXPECT_THROW(simulate_replica({{0, 0, 12, 5}}, o, ex), ConfigError);
  o.virtual_engines = 1;
  EXPECT_NO_THROW(simulate_replica({{0, 0, 12, 5}}, o, ex));
}

// A request goes to the engine with the fewest unfinished when it arrives
// (vLLM's choice), not round-robin. The executor's sequence ids say the
// engine: local id i of engine v is 2i + v. A (output 20) and B (output 2)
// arrive at 0, one per engine; B ends at 5.34 (B2 in the table above), long
// before C arrives at 20, while A decodes until 2.18 + 19 · 2.12 = 42.46: C
// goes to B's engine (1), where round-robin would have dealt it to engine 0.
TEST(VirtualEngines, ARequestGoesToTheEngineWithTheFewestUnfinished) {
  struct Engines final : StepExecutor {
    TwoStages stages;
    std::vector<std::pair<int, int>> first_seen;  // (request, sequence id) of each request's first entry
    void begin_step(int r, double now_s) override { stages.begin_step(r, now_s); }
    StepOutcome run_step(std::span<const BatchEntry> batch) override {
      for (const BatchEntry& e : batch)
        if (std::none_of(first_seen.begin(), first_seen.end(), [&](auto p) { return p.first == e.request; }))
          first_seen.emplace_back(e.request, e.seq);
      return stages.run_step(batch);
    }
  } ex;
  const ReplicaResult r = simulate_replica({{0, 0, 4, 20}, {1, 0, 4, 2}, {2, 20, 4, 2}}, engines(2), ex);
  ASSERT_EQ(ex.first_seen.size(), 3u);
  EXPECT_LT(r.requests[1].finish_s, 20);
  EXPECT_GT(r.requests[0].finish_s, 20);
  for (const auto& [request, seq] : ex.first_seen) std::printf("request %d: sequence %d, engine %d\n", request, seq, seq % 2);
  EXPECT_EQ(ex.first_seen[0].second % 2, 0);  // A: both engines empty, the lowest
  EXPECT_EQ(ex.first_seen[1].second % 2, 1);  // B: engine 0 has A
  EXPECT_EQ(ex.first_seen[2].second % 2, 1);  // C: engine 1 has nothing unfinished
  EXPECT_EQ(ex.first_seen[2].second, 3);      // its second sequence
}

}  // namespace
}  // namespace shardlab::serve
