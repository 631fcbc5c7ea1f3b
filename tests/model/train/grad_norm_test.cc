// The global gradient norm and clipping (optimizer_step.h) through the
// trainer: the step-0 norm a sharded run reports is the norm of the whole
// model's gradient (every parameter counted once over tp, pp, dp, ep and
// ZeRO-2's chunks), computed here in double from the unsharded run's
// gathered gradients; a clipped first step is AdamW on the clipped gradients,
// computed here by hand; a clipped sharded run matches the clipped unsharded run.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include <gtest/gtest.h>

#include "model/params.h"
#include "model/train/verify.h"
#include "support/compare.h"
#include "tests/model/train/train_test_util.h"

namespace shardlab::train {
namespace {

using testing::l2_norm;
using testing::run;
using testing::small_options;
using testing::unsharded;

// Sharded gradients differ from the reference's by fp32 reduction order
// (~1e-6 relative); the norm's partial sums travel as one fp32 all-reduce.
constexpr double kNormRelTol = 1e-5;

void expect_step0_norm_matches(TrainOptions o, const char* what) {
  o.steps = 1;
  o.keep_step0_grads = true;
  const TrainResult sharded = run(o), reference = run(unsharded(o));
  ASSERT_EQ(sharded.steps.size(), 1u);
  ASSERT_EQ(reference.steps.size(), 1u);
  const double want = l2_norm(reference.step0_grads);
  ASSERT_GT(want, 0);
  const std::vector<double> got{sharded.steps[0].grad_norm, reference.steps[0].grad_norm,
                                l2_norm(sharded.step0_grads)};
  const std::vector<double> wants(got.size(), want);
  const ::testing::AssertionResult close = shardlab::testing::all_close_rel(got, wants, kNormRelTol, 0);
  std::printf("%s: step-0 grad norm reported %.9g (sharded), %.9g (unsharded); from the unsharded gradients "
              "%.9g; of the gathered sharded gradients %.9g: %s\n",
              what, got[0], got[1], want, got[2], close.message());
  EXPECT_TRUE(close) << what << " (elements: sharded report, unsharded report, sharded gathered grads)";
}

TEST(GradNorm, TpPpDpReportsTheUnshardedNorm) {
  TrainOptions o = small_options(0);
  o.parallel.tp = 2, o.parallel.pp = 2, o.parallel.dp = 2;
  o.micro_batches = 2;
  expect_step0_norm_matches(o, "tp 2 x pp 2 x dp 2");
}

TEST(GradNorm, TpPpDpEpWithZero2ReportsTheUnshardedNorm) {
  // Expert tensors counted once per ep rank, the rest once over ZeRO-2's
  // chunks, the tied wte once over the two stages, replicated tensors once over tp.
  TrainOptions o = small_options(4);
  o.parallel.tp = 2, o.parallel.pp = 2, o.parallel.dp = 2, o.parallel.ep = 2, o.parallel.zero = 2;
  o.micro_batches = 2;
  o.parallel.bucket_mb = 0.05;  // several buckets of each kind
  expect_step0_norm_matches(o, "tp 2 x pp 2 x dp 2 x ep 2, ZeRO-2");
}

// The first AdamW step from zero moments (bias-corrected) moves each element
// by lr · g / (|g| + eps); clipping scales g by c = max_norm / (norm + 1e-6)
// first (torch's clip_grad_norm_), which shows where |c g| is near eps.
std::vector<float> first_adamw_step(const TrainOptions& o, const std::vector<float>& grads, double c) {
  const model::ParamTable table(o.model);
  std::vector<float> p(size_t(table.numel()));
  table.init_all(o.seed, p.data());
  const double lr = o.adam.lr, eps = o.adam.eps;
  for (const model::ParamSpec& s : table.specs()) {
    const double decay = s.decay() ? 1.0 - lr * o.adam.weight_decay : 1.0;
    for (int64_t i = s.offset; i < s.offset + s.numel; ++i) {
      const double g = c * double(grads[size_t(i)]);
      p[size_t(i)] = float(double(p[size_t(i)]) * decay - lr * g / (std::abs(g) + eps));
    }
  }
  return p;
}

TEST(GradClip, TheFirstClippedUpdateIsAdamWOnTheClippedGradients) {
  TrainOptions o = small_options(0);
  o.steps = 1;
  o.keep_step0_grads = true;
  o.grad_clip = 1e-3;
  const TrainResult r = run(o);
  const double norm = l2_norm(r.step0_grads);
  const double c = o.grad_clip / (norm + 1e-6);
  ASSERT_LT(c, 1.0) << "the clip must be active";
  // Tolerance: fp32 rounding of p·decay and of the update, a few ulps of |p| <= ~1.
  constexpr double kTol = 1e-6;
  const ::testing::AssertionResult clipped = shardlab::testing::all_close(r.final_params, first_adamw_step(o, r.step0_grads, c), kTol);
  const shardlab::testing::Diff unclipped = shardlab::testing::diff(r.final_params, first_adamw_step(o, r.step0_grads, 1.0));
  std::printf("grad norm %.6g, clip factor %.3g: params vs AdamW on clipped grads: %s; vs AdamW on unclipped "
              "grads: max abs diff %.3g (lr %g)\n",
              norm, c, clipped.message(), unclipped.max_abs, o.adam.lr);
  EXPECT_TRUE(clipped);
  // The check can tell: without the clip the hand-made step is far off.
  EXPECT_TRUE(unclipped.finite());
  EXPECT_GT(unclipped.max_abs, 100 * kTol);
}

TEST(GradClip, AClippedShardedRunMatchesTheClippedUnshardedRun) {
  TrainOptions o = small_options(0);
  o.parallel.tp = 2, o.parallel.pp = 2, o.parallel.dp = 2;
  o.micro_batches = 2;
  o.grad_clip = 1e-3;
  const TrainResult clipped = run(o), reference = run(unsharded(o));
  TrainOptions off = unsharded(o);
  off.grad_clip = 0;
  const TrainResult unclipped = run(off);
  const model::ParamTable table(o.model);
  const VerifyResult match = compare_runs(clipped, reference, table, {});
  const VerifyResult differ = compare_runs(unclipped, reference, table, {});
  std::printf("clip 1e-3, tp 2 x pp 2 x dp 2 vs unsharded: loss rel diff %.2e, param rel L2 %.2e (tol 1e-5); "
              "unclipped vs clipped unsharded: param rel L2 %.2e, last loss %.7f vs %.7f\n",
              match.max_loss_rel_diff, match.param_rel_l2, differ.param_rel_l2, unclipped.steps.back().loss,
              reference.steps.back().loss);
  ASSERT_EQ(clipped.steps.size(), reference.steps.size());
  EXPECT_TRUE(match.passed) << (match.first_mismatch ? match.first_mismatch->kind + " " + match.first_mismatch->name : "");
  EXPECT_LE(match.param_rel_l2, 1e-5);
  // Clipping changes the run, far beyond the tolerance; the pre-clip norm of
  // step 0 is the same number (same gradients).
  EXPECT_FALSE(differ.passed);
  EXPECT_GT(differ.param_rel_l2, 100 * 1e-5);
  EXPECT_EQ(unclipped.steps[0].grad_norm, reference.steps[0].grad_norm);
}

}  // namespace
}  // namespace shardlab::train
