// Backward split into B (input gradient) and W (weight gradient): a schedule
// that runs every W at the end of the step trains exactly the fused model,
// and the receive buffers a schedule names are checked before it runs.
#include <cstdio>
#include <cstring>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "model/config.h"
#include "model/parallel/pipeline/schedule.h"
#include "model/train/trainer.h"
#include "model/train/verify.h"
#include "tests/model/train/train_test_util.h"
#include "runtime/errors.h"
#include "runtime/profile.h"

namespace shardlab::train {
namespace {

using parallel::Action;
using parallel::ActionKind;
using parallel::Schedule;
using ::testing::HasSubstr;

TrainOptions small(int experts, int pp, int M) {
  TrainOptions o = testing::small_options(experts);
  o.keep_step0_grads = true;
  o.micro_batches = M;
  o.parallel.pp = pp;
  return o;
}

TrainResult run(const TrainOptions& o) {
  validate_parallel(o);
  return testing::run(o);
}

// The largest |a - b| over two parameter vectors (NaN counts as infinite).
double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = a.size() == b.size() ? 0 : INFINITY;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    const double d = std::abs(double(a[i]) - double(b[i]));
    worst = std::isnan(d) ? INFINITY : std::max(worst, d);
  }
  return worst;
}

// Trains `o` with its schedule's backwards split (W deferred to the end of
// each rank's list, or right after each B), the fused schedule, and the
// unsharded model; the split run must equal the fused one bit for bit and
// match the unsharded one within fp32 noise. ZeRO-2 with several
// micro-batches reduces each micro-batch's buckets once their last
// gradient is in (DataParallel::grads_partial): with W at the end a
// bucket's gradients computed in B (LayerNorm, biases) of later
// micro-batches are already in it when an earlier W completes it, so the
// same sum is split differently between the partial reductions and the
// split run may differ from the fused one in rounding only: `exact` false
// bounds that by 1e-5 (absolute, on parameters of order 0.1-1).
void expect_split_matches(TrainOptions o, bool defer, bool exact = true) {
  const Schedule fused = step_schedule(o);
  const TrainResult a = run(o);
  o.parallel.custom_schedule = parallel::split_backward(fused, defer);
  const TrainResult split = run(o);
  TrainOptions ref = o;
  ref.parallel = {};
  const TrainResult unsharded = run(ref);
  const VerifyResult r = compare_runs(split, unsharded, model::ParamTable(o.model), {.grads = true});
  const double bits = max_abs_diff(split.final_params, a.final_params);
  std::printf("pp %d tp %d dp %d M %d experts %d W %s: vs fused max |diff| %.3g (must be %s); vs unsharded "
              "loss rel %.2e param rel L2 %.2e grad rel L2 %.2e (tol 1e-5)\n",
              o.parallel.pp, o.parallel.tp, o.parallel.dp, o.micro_batches, o.model.n_expert,
              defer ? "at the end" : "after each B", bits, exact ? "0" : "<= 1e-5", r.max_loss_rel_diff, r.param_rel_l2,
              r.grad_rel_l2);
  ASSERT_EQ(split.steps.size(), a.steps.size());
  if (exact) {
    EXPECT_EQ(bits, 0.0);
    for (size_t i = 0; i < a.steps.size(); ++i) EXPECT_EQ(split.steps[i].loss, a.steps[i].loss) << "step " << i;
  } else {
    EXPECT_LE(bits, 1e-5);
    EXPECT_EQ(split.steps[0].loss, a.steps[0].loss);  // before any update
  }
  EXPECT_TRUE(r.passed);
  EXPECT_LE(r.param_rel_l2, 1e-5);
  EXPECT_LE(r.grad_rel_l2, 1e-5);
}

TEST(SplitBackward, OneFOneBWithEveryWeightGradientAtTheEndMatches) {
  for (int experts : {0, 4}) expect_split_matches(small(experts, 2, 4), /*defer=*/true);
}

TEST(SplitBackward, WeightGradientRightAfterItsInputGradientMatches) {
  expect_split_matches(small(0, 2, 4), /*defer=*/false);
}

TEST(SplitBackward, WithTensorSequenceAndDataParallelism) {
  TrainOptions o = small(4, 2, 4);
  o.parallel.tp = 2, o.parallel.sp = true, o.parallel.dp = 2, o.parallel.zero = 1;
  expect_split_matches(o, true);
  TrainOptions e = small(4, 2, 2);
  e.parallel.dp = 2, e.parallel.ep = 2, e.parallel.zero = 2;
  expect_split_matches(e, true, /*exact=*/false);  // ZeRO-2 reduces each micro-batch
  e.parallel.overlap = false;                       // ... unless it reduces once, after backward
  expect_split_matches(e, true);
}

TEST(SplitBackward, DeferredWeightGradientsHoldTheirStashAndRunLast) {
  TrainOptions o = small(0, 2, 4);
  o.steps = 1;
  const TrainResult fused = run(o);
  o.parallel.custom_schedule = parallel::split_backward(step_schedule(o), true);
  const TrainResult split = run(o);
  for (size_t rank = 0; rank < 2; ++rank) {
    const auto act = static_cast<size_t>(MemKind::kActivation);
    const uint64_t f = fused.run.devices[rank].peak_by_kind[act], s = split.run.devices[rank].peak_by_kind[act];
    std::printf("rank %zu activation peak: fused %llu B, W at the end %llu B\n", rank, (unsigned long long)f,
                (unsigned long long)s);
    EXPECT_GT(s, f);  // the W stash of the micro-batches whose W waits
    const auto& spans = split.first_step_spans[rank];
    ASSERT_EQ(spans.size(), 12u);  // 4 F, 4 B, 4 W
    for (size_t i = 8; i < 12; ++i) EXPECT_EQ(spans[i].kind, ActionKind::kBackwardWeight);
    for (size_t i = 9; i < 12; ++i) EXPECT_EQ(spans[i].micro_batch, spans[i - 1].micro_batch + 1);
  }
}

// Rank 0 (the first stage) of GPipe on 2 ranks and 4 micro-batches, with
// every gradient receive posted before the first backward: `buffer(mb)`
// names the buffer each gradient lands in and its backward reads.
Schedule eager_gpipe(int (*buffer)(int mb), bool interleave_receives) {
  Schedule s = parallel::gpipe(2, 4);
  std::vector<Action> r0;
  for (const Action& a : s[0])
    if (a.kind == ActionKind::kForward || a.kind == ActionKind::kSendActivation) r0.push_back(a);
  auto recv = [&](int mb) { r0.push_back({ActionKind::kRecvGrad, mb, 0, 1, buffer(mb)}); };
  auto back = [&](int mb) { r0.push_back({ActionKind::kBackward, mb, 0, -1, buffer(mb)}); };
  if (interleave_receives) {  // double-buffered: receive mb + 1 while mb waits for its backward
    recv(0), recv(1), back(0), recv(2), back(1), recv(3), back(2), back(3);
  } else {
    for (int mb = 0; mb < 4; ++mb) recv(mb);
    for (int mb = 0; mb < 4; ++mb) back(mb);
  }
  s[0] = r0;
  return s;
}

int own_buffer(int mb) { return mb; }
int two_buffers(int mb) { return mb % 2; }

TEST(ScheduleBuffers, AnEagerReceiveThatOverwritesAnUnconsumedBufferIsRejected) {
  const Schedule bad = eager_gpipe(two_buffers, false);
  EXPECT_THAT(parallel::validate_schedule(bad, 4),
              HasSubstr("rank 0 action 10 (rG2<1): overwrites gradient buffer 0 while it still holds "
                        "micro-batch 0"));
  TrainOptions o = small(0, 2, 4);
  o.parallel.custom_schedule = bad;
  try {
    validate_parallel(o);
    ADD_FAILURE() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_THAT(e.what(), HasSubstr("invalid custom schedule"));
  }
  // A backward that reads the buffer of another micro-batch is rejected too.
  Schedule wrong = eager_gpipe(own_buffer, false);
  for (Action& a : wrong[0])
    if (a.kind == ActionKind::kBackward && a.micro_batch == 0) a.buffer = 1;
  EXPECT_THAT(parallel::validate_schedule(wrong, 4),
              HasSubstr("(B0): backward reads gradient buffer 1, which holds micro-batch 1"));
}

TEST(ScheduleBuffers, CorrectEagerReceivesRunAndMatchTheUnshardedModel) {
  using BufferOf = int (*)(int);
  for (auto [buffers, interleave] : {std::pair<BufferOf, bool>{own_buffer, false}, std::pair<BufferOf, bool>{two_buffers, true}}) {
    const Schedule s = eager_gpipe(buffers, interleave);
    ASSERT_EQ(parallel::validate_schedule(s, 4), "");
    TrainOptions o = small(0, 2, 4);
    const TrainResult fused = run(o);  // 1F1B
    o.parallel.custom_schedule = s;
    const TrainResult eager = run(o);
    TrainOptions ref = o;
    ref.parallel = {};
    const VerifyResult r = compare_runs(eager, run(ref), model::ParamTable(o.model), {.grads = true});
    std::printf("eager receives (%s): param rel L2 %.2e grad rel L2 %.2e (tol 1e-5); vs 1F1B max |diff| %.3g\n",
                interleave ? "two buffers" : "one per micro-batch", r.param_rel_l2, r.grad_rel_l2,
                max_abs_diff(eager.final_params, fused.final_params));
    EXPECT_TRUE(r.passed);
    EXPECT_LE(r.grad_rel_l2, 1e-5);
    // Same micro-batches, same accumulation order: the same bits as 1F1B.
    EXPECT_EQ(max_abs_diff(eager.final_params, fused.final_params), 0.0);
  }
}

TEST(ScheduleBuffers, SplitScheduleFaultsAreNamed) {
  Schedule s = parallel::split_backward(parallel::one_f_one_b(2, 2), true);
  EXPECT_EQ(parallel::validate_schedule(s, 2), "");
  // Drop rank 1's last W: a B without its W.
  s[1].pop_back();
  EXPECT_THAT(parallel::validate_schedule(s, 2), HasSubstr("never runs the weight gradient of micro-batch 1"));
  // A W before its B.
  Schedule early = parallel::split_backward(parallel::one_f_one_b(2, 2), false);
  auto& r1 = early[1];
  const auto w = std::find_if(r1.begin(), r1.end(), [](const Action& a) { return a.kind == ActionKind::kBackwardWeight; });
  std::rotate(r1.begin(), w, w + 1);
  EXPECT_THAT(parallel::validate_schedule(early, 2), HasSubstr("weight gradient before its input gradient"));
  // An input gradient sent twice.
  Schedule twice = parallel::one_f_one_b(2, 2);
  auto& r1b = twice[1];
  const auto sg = std::find_if(r1b.begin(), r1b.end(), [](const Action& a) { return a.kind == ActionKind::kSendGrad; });
  r1b.insert(sg + 1, *sg);
  EXPECT_THAT(parallel::validate_schedule(twice, 2), HasSubstr("sends the input gradient twice"));
}

}  // namespace
}  // namespace shardlab::train
