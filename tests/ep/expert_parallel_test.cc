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
#include <random>
#include <string>

#include "model/gpt.h"
#include "model/parallel/ep_moe.h"
#include "model/parallel/tensor_parallel.h"
#include "runtime/cluster.h"
#include "runtime/errors.h"
#include "tests/ep/ep_layer_util.h"
#include "tests/model/test_models.h"
#include "tests/parallel/tp_test_util.h"

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
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return "dp" + std::to_string(c.dp) + "_ep" + std::to_string(c.ep) + "_tp" +
         std::to_string(c.tp) + (c.sp ? "_sp" : "") + "_k" + std::to_string(c.top_k) +
         (c.capacity > 0 ? "_cap" + std::to_string(int(c.capacity * 10)) : "_nocap");
}

model::GPTConfig moe_config(const Case& c) {
  model::GPTConfig config = testing::small_config(true);  // 4 experts in layer 0
  config.top_k = c.top_k;
  config.capacity_factor = c.capacity;
  return config;
}

double max_rel(const std::vector<float>& a, const std::vector<float>& b, double* abs_out) {
  double dmax = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    dmax = std::max(dmax, std::abs(double(a[i]) - double(b[i])));
    scale = std::max(scale, std::abs(double(b[i])));
  }
  *abs_out = dmax;
  return scale > 0 ? dmax / scale : dmax;
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
  double out_abs = 0, din_abs = 0;
  const double out_rel = max_rel(got.out, want.out, &out_abs);
  const double din_rel = max_rel(got.dinp, want.dinp, &din_abs);
  int64_t dropped = 0;
  for (const MoeStats& s : got.stats) dropped += s.dropped;
  std::printf("  %s: out rel %.2e (abs %.2e), dinp rel %.2e (abs %.2e), aux %.7f vs %.7f, "
              "%lld assignments dropped\n",
              case_name({c, 0}).c_str(), out_rel, out_abs, din_rel, din_abs, got.aux, want.aux,
              static_cast<long long>(dropped));
  EXPECT_LE(out_rel, kGradRelTol);
  EXPECT_LE(din_rel, kGradRelTol);
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
                      Case{2, 1, 1, 2, 1.0}, Case{4, 1, 2, 1, 1.0}),
    case_name);

}  // namespace
}  // namespace shardlab::parallel
