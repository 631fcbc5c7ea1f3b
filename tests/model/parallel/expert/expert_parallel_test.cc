// Expert parallelism against the unsharded model on the concatenated global
// batch: the MoE layer's output and input gradient, and a whole model's loss
// and every gradient after DataParallel's reduction (experts over edp, SUM /
// dp), for ep in {2, 4}, dp in {2, 4}, top-k in {1, 2}, capacity off and on
// (1.0 really drops), with TP; and the routing-driven all-to-all in virtual
// time with a biased router against a balanced one.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ostream>
#include <random>
#include <string>

#include "model/gpt.h"
#include "model/parallel/expert/ep_dispatch.h"
#include "model/parallel/config_check.h"
#include "model/parallel/sharded_gpt.h"
#include "runtime/cluster.h"
#include "runtime/errors.h"
#include "support/compare.h"
#include "tests/model/parallel/expert/ep_layer_util.h"
#include "tests/model/test_models.h"
#include "tests/model/parallel/tensor/tp_test_util.h"

namespace shardlab::parallel {
namespace {

// Tolerances: relative to the reference's largest magnitude (per tensor for
// gradients). The sharded run sums the same fp32 terms in another order
// (per-rank partial sums, then the dp reduction); measured values are printed.
constexpr double kLossRelTol = 1e-5, kGradRelTol = 1e-5;
constexpr int kB = 8, kT = 16;  // global batch: dp=4 gives each rank 2 rows (N = 32)

struct Case {
  int dp, ep, tp, top_k;
  double capacity;
  bool sp = false;
  int zero = 0;
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return "dp" + std::to_string(c.dp) + "_ep" + std::to_string(c.ep) + "_tp" +
         std::to_string(c.tp) + (c.sp ? "_sp" : "") + "_k" + std::to_string(c.top_k) +
         (c.capacity > 0 ? "_cap" + std::to_string(int(c.capacity * 10)) : "_nocap") +
         (c.zero > 0 ? "_zero" + std::to_string(c.zero) : "");
}

void PrintTo(const Case& c, std::ostream* os) { *os << case_name({c, 0}); }

model::GPTConfig moe_config(const Case& c) {
  model::GPTConfig config = testing::small_config(true);  // 4 experts in layer 0
  config.top_k = c.top_k;
  config.capacity_factor = c.capacity;
  return config;
}

// max |got - want| <= tol · max |want| (tolerance relative to the data's
// scale), NaN- and Inf-safe through compare.h; the message has the max diff.
::testing::AssertionResult close_to_scale(const std::vector<float>& got, const std::vector<float>& want,
                                          double tol) {
  return shardlab::testing::all_close(got, want, tol * shardlab::testing::max_abs_finite(want));
}

// ---- The MoE layer alone --------------------------------------------------------

class ExpertParallelLayer : public ::testing::TestWithParam<Case> {};

TEST_P(ExpertParallelLayer, OutputAndInputGradientMatchUnsharded) {
  const Case c = GetParam();
  const model::GPTConfig config = moe_config(c);
  model::GPT<float> ref(config, 1234);
  model::testing::randomize_params(ref, 99, 0.05);
  testing::LayerRun run;
  run.dp = c.dp;
  run.ep = c.ep;
  run.B = kB;
  run.T = kT;
  run.params.assign(ref.params().begin(), ref.params().end());
  std::mt19937_64 rng(17);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (int i = 0; i < kB * kT * config.n_embd; ++i) {
    run.x.push_back(dist(rng));
    run.dout.push_back(dist(rng));
  }
  const testing::LayerResult got = testing::run_moe_layer(config, run);
  const testing::LayerResult want = testing::reference_moe_layer(config, run);
  const ::testing::AssertionResult out = close_to_scale(got.out, want.out, kGradRelTol);
  const ::testing::AssertionResult din = close_to_scale(got.dinp, want.dinp, kGradRelTol);
  int64_t dropped = 0;
  for (const MoeStats& s : got.stats) dropped += s.dropped;
  std::printf("  %s: out %s (max |out| %.3g); dinp %s (max |dinp| %.3g); aux %.7f vs %.7f, "
              "%lld assignments dropped\n",
              case_name({c, 0}).c_str(), out.message(), shardlab::testing::max_abs_finite(want.out),
              din.message(), shardlab::testing::max_abs_finite(want.dinp), got.aux, want.aux,
              static_cast<long long>(dropped));
  EXPECT_TRUE(out) << "layer output";
  EXPECT_TRUE(din) << "input gradient";
  EXPECT_NEAR(got.aux, want.aux, 1e-5 * std::max(1.0f, std::abs(want.aux)));
  if (c.capacity > 0) {
    EXPECT_GT(dropped, 0) << "capacity 1.0 should drop some assignments";
  }
}

INSTANTIATE_TEST_SUITE_P(Grid, ExpertParallelLayer,
                         ::testing::Values(Case{2, 2, 1, 1, 0}, Case{2, 2, 1, 2, 1.0},
                                           Case{4, 4, 1, 2, 0}, Case{4, 4, 1, 1, 1.0},
                                           Case{4, 2, 1, 2, 1.0}, Case{2, 1, 1, 2, 1.0},
                                           Case{4, 1, 1, 1, 1.0}),
                         case_name);

// ---- A whole model: loss and every gradient after the DP/EP reduction ----------

class ExpertParallelModel : public ::testing::TestWithParam<Case> {};

TEST_P(ExpertParallelModel, LossAndGradientsMatchUnsharded) {
  const Case c = GetParam();
  const model::GPTConfig config = moe_config(c);
  const testing::Batch batch = testing::make_batch(config, kB, kT, 7);
  testing::RunSpec spec = testing::run_spec(c.tp, c.sp);
  spec.dp = c.dp;
  spec.ep = c.ep;
  spec.global_routing = true;
  spec.zero = c.zero;
  const testing::Match m = testing::match_reference(config, batch, spec);
  int64_t dropped = 0;
  for (const testing::RankResult& r : m.all) dropped += r.moe[0].dropped;
  dropped /= c.tp;  // every TP rank routes the same rows
  EXPECT_EQ(m.mismatch, "") << "replicated gradients must be bit-identical across ranks";
  std::printf("  %s: loss %.7f vs %.7f (rel %.2e), worst grad %s rel %.2e (abs %.2e), "
              "%lld assignments dropped\n",
              case_name({c, 0}).c_str(), m.holders[0].losses[0], m.ref_loss, m.loss_rel,
              m.grad.tensor.c_str(), m.grad.rel, m.grad.abs, static_cast<long long>(dropped));
  EXPECT_LE(m.loss_rel, kLossRelTol);
  EXPECT_LE(m.grad.rel, kGradRelTol) << "worst tensor " << m.grad.tensor;
  if (c.capacity > 0) {
    EXPECT_GT(dropped, 0) << "capacity 1.0 should drop some assignments";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Grid, ExpertParallelModel,
    ::testing::Values(Case{2, 2, 1, 1, 0}, Case{2, 2, 1, 2, 0}, Case{2, 2, 1, 1, 1.0},
                      Case{2, 2, 1, 2, 1.0}, Case{4, 2, 1, 1, 0}, Case{4, 2, 1, 2, 1.0},
                      Case{4, 4, 1, 1, 1.0}, Case{4, 4, 1, 2, 0}, Case{4, 4, 1, 2, 1.0},
                      Case{2, 2, 2, 2, 0}, Case{2, 2, 2, 2, 1.0}, Case{2, 2, 2, 1, 1.0, true},
                      // TP-only MoE with global routing: capacity under plain DP is exact
                      Case{2, 1, 1, 2, 1.0}, Case{4, 1, 2, 1, 1.0},
                      // ZeRO: expert buckets owned and reduce-scattered over edp
                      Case{4, 2, 1, 2, 1.0, false, 1}, Case{4, 2, 1, 2, 1.0, false, 2},
                      Case{4, 4, 1, 1, 0, false, 2}),
    case_name);

// ---- Routing-driven all-to-all in virtual time ------------------------------------

// dp = ep = 4 ranks of 16 tokens, 4 experts (one per rank), top-1. Router
// weight row e = unit vector e; token rows are 4·(unit vector of the expert
// they should pick): either token n -> expert n % 4 (balanced) or every token
// -> expert 0 (biased).
testing::LayerResult run_routed(bool biased) {
  model::GPTConfig config = testing::small_config(true);
  config.top_k = 1;
  const int C = config.n_embd, E = config.n_expert;
  const model::GPT<float> ref(config, 1234);
  testing::LayerRun run;
  run.dp = run.ep = 4;
  run.B = 4;
  run.T = 16;
  run.params.assign(ref.params().begin(), ref.params().end());
  float* router = run.params.data() + ref.table().at(model::block_name(0, "mlp.router.weight")).offset;
  std::fill(router, router + E * C, 0.0f);
  for (int e = 0; e < E; ++e) router[e * C + e] = 1.0f;
  const int N = run.B * run.T;
  run.x.assign(size_t(N) * C, 0.0f);
  run.dout.assign(size_t(N) * C, 0.01f);
  for (int n = 0; n < N; ++n) run.x[size_t(n) * C + (biased ? 0 : n % E)] = 4.0f;
  return testing::run_moe_layer(config, run);
}

TEST(ExpertParallelTiming, BiasedRouterMakesTheOwnerTheBottleneck) {
  const testing::LayerResult balanced = run_routed(false), biased = run_routed(true);
  const int ep = 4;
  const int64_t Nl = 16, C = 32;
  const uint64_t row_bytes = C * 4;  // fp32
  for (int r = 0; r < ep; ++r) {
    std::printf("  rank %d: balanced received %lld rows, sent/recv %llu/%llu B, compute %.3f us; "
                "biased received %lld rows, sent/recv %llu/%llu B, compute %.3f us\n",
                r, static_cast<long long>(balanced.stats[r].received[0]),
                static_cast<unsigned long long>(balanced.stats[r].a2a_sent_bytes),
                static_cast<unsigned long long>(balanced.stats[r].a2a_recv_bytes),
                to_us(balanced.compute_busy[r]), static_cast<long long>(biased.stats[r].received[0]),
                static_cast<unsigned long long>(biased.stats[r].a2a_sent_bytes),
                static_cast<unsigned long long>(biased.stats[r].a2a_recv_bytes),
                to_us(biased.compute_busy[r]));
    // Balanced: each expert gets Nl tokens, a quarter from each rank.
    EXPECT_EQ(balanced.stats[r].received[0], Nl);
    EXPECT_EQ(balanced.stats[r].a2a_sent_bytes, 2 * (ep - 1) * (Nl / ep) * row_bytes);
    EXPECT_EQ(balanced.stats[r].a2a_recv_bytes, 2 * (ep - 1) * (Nl / ep) * row_bytes);
    EXPECT_EQ(balanced.compute_busy[r], balanced.compute_busy[0]) << "symmetric load, rank " << r;
    // Biased: rank 0 (expert 0) receives every token; the others send theirs and get them back.
    EXPECT_EQ(biased.stats[r].received[0], r == 0 ? ep * Nl : 0);
    const uint64_t moved = (r == 0 ? (ep - 1) : 1) * Nl * row_bytes;
    EXPECT_EQ(biased.stats[r].a2a_sent_bytes, moved);
    EXPECT_EQ(biased.stats[r].a2a_recv_bytes, moved);
    if (r > 0) {
      EXPECT_LT(biased.compute_busy[r], balanced.compute_busy[r]) << "rank " << r;
      EXPECT_LT(biased.compute_busy[r], biased.compute_busy[0]) << "rank " << r;
    }
  }
  EXPECT_GT(biased.compute_busy[0], balanced.compute_busy[0]);
  const Time biased_end = *std::max_element(biased.end_time.begin(), biased.end_time.end());
  const Time balanced_end = *std::max_element(balanced.end_time.begin(), balanced.end_time.end());
  std::printf("  layer fwd+bwd: balanced %.3f us, biased %.3f us\n", to_us(balanced_end),
              to_us(biased_end));
  EXPECT_GT(biased_end, balanced_end);
  // Every rank waits for the owner: all finish together, at the owner's pace.
  for (int r = 1; r < ep; ++r) EXPECT_GE(biased.end_time[r], biased.compute_busy[0]);
  // Deterministic: the same run gives the same virtual times.
  EXPECT_EQ(run_routed(true).end_time, biased.end_time);
}

// ---- Configuration errors -----------------------------------------------------

TEST(ExpertParallel, ConstraintErrors) {
  auto message = [](int experts, int ep, int dp) -> std::string {
    model::GPTConfig c = testing::small_config(experts > 0);
    c.n_expert = experts;
    try {
      check_expert_parallel(c, ep, dp);
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_EQ(message(8, 4, 8), "");
  EXPECT_EQ(message(8, 1, 3), "");
  EXPECT_EQ(message(8, 3, 3), "`ep` 3 must divide `n_expert` 8 (each rank holds experts/ep experts)");
  EXPECT_EQ(message(8, 4, 2),
            "`ep` 4 must divide `dp` 2 (expert-parallel ranks are data-parallel ranks)");
  EXPECT_EQ(message(0, 2, 2), "`ep` 2 needs an MoE model (`n_expert` > 0)");
  EXPECT_EQ(message(8, 0, 2), "`ep` 0 must be at least 1");
  // The model checks before any work; a run reports it as the user's error.
  ClusterOptions opts;
  opts.world_size = 3;
  Cluster cluster(testing::test_profile(3), opts);
  try {
    cluster.run([&](Device& dev) {
      const collectives::ProcessGroup world = collectives::ProcessGroup::world(dev);
      const collectives::ProcessGroup tp({dev.rank()}, dev.rank(), "tp");
      ShardedGPT m(testing::small_config(true), 1, dev, {&tp, &world, &world});
    });
    ADD_FAILURE() << "expected a ConfigError";
  } catch (const RunError& e) {
    EXPECT_TRUE(e.input_error());
    EXPECT_NE(std::string(e.what()).find("`ep` 3 must divide `n_expert` 4"), std::string::npos)
        << e.what();
  }
}

// A phantom run's local routing plan is kept per thread (expert/moe.h
// phantom_plan): asked again with the same arguments it is the same plan;
// with any argument changed it is that argument's plan, as computed afresh
// (plan_phantom_routing), not the kept one. Uniform over 8 experts, N 64,
// top-2: 16 assignments each, M = 128; capacity 1.0 keeps ceil(1.0 x 128/8)
// = 16 (nothing dropped); 0.5 keeps 8 each (M 64); Zipf s = 1 skews them.
TEST(PhantomPlan, KeptPerThreadAndRecomputedForOtherArguments) {
  struct Args {
    int64_t N;
    int E, K;
    double capacity, zipf;
  };
  const Args cases[] = {{64, 8, 2, 0, 0},   {64, 8, 2, 0, 0},   {32, 8, 2, 0, 0}, {64, 8, 2, 0.5, 0},
                        {64, 8, 2, 0, 1.0}, {64, 16, 2, 0, 0},  {64, 8, 1, 0, 0}, {64, 8, 2, 0, 0}};
  const PhantomPlan* first = nullptr;
  for (const Args& a : cases) {
    const PhantomPlan& kept = phantom_plan(a.N, a.E, a.K, a.capacity, a.zipf);
    const PhantomPlan fresh = plan_phantom_routing(a.N, a.E, a.K, a.capacity, a.zipf);
    EXPECT_EQ(kept.filled, fresh.filled);
    EXPECT_EQ(kept.offsets, fresh.offsets);
    EXPECT_EQ(kept.M, fresh.M);
    if (!first) first = &kept;
  }
  const PhantomPlan& uniform = phantom_plan(64, 8, 2, 0, 0);
  EXPECT_EQ(&uniform, first);  // one kept plan per thread
  EXPECT_EQ(uniform.M, 128);
  for (int e = 0; e < 8; ++e) EXPECT_EQ(uniform.offsets[size_t(e) + 1] - uniform.offsets[size_t(e)], 16);
  EXPECT_EQ(phantom_plan(64, 8, 2, 0.5, 0).M, 64);
  const PhantomPlan& zipf = phantom_plan(64, 8, 2, 0, 1.0);
  EXPECT_EQ(zipf.M, 128);
  EXPECT_GT(zipf.offsets[1] - zipf.offsets[0], zipf.offsets[8] - zipf.offsets[7]);
}

}  // namespace
}  // namespace shardlab::parallel
