// Megatron's combined 1F1B (--overlap-moe-expert-parallel-comm,
// ParallelOptions::overlap_moe_comm): a backward and the next micro-batch's
// forward run as one step, interleaved at every token exchange, the
// exchanges on the EP communication stream. It moves no number: the same
// kernels run on the same rows in the same order within each micro-batch,
// so losses and parameters are bit-identical to the run without it, under
// both dispatchers, on nodes of 2 devices (so the EP group spans nodes).
// It moves the clock only by hiding exchanges: the step gets shorter, by at
// most the time the compute stream waited for them without it.
#include <cstdio>

#include <gtest/gtest.h>

#include "moe_test_util.h"

#include "model/train/trainer.h"
#include "runtime/errors.h"
#include "runtime/fiber.h"

namespace shardlab::train {
namespace {

using parallel::MoeDispatcher;

TrainOptions overlap_options(MoeDispatcher d, bool phantom) {
  TrainOptions o = testing::tiny_moe_options(4, 4);
  o.model.batch_size = 32;  // 4 micro-batches of 2 sequences a replica
  o.micro_batches = 4;
  o.parallel.moe_dispatcher = d;
  o.phantom = phantom;
  if (phantom) o.keep_step0_grads = false;
  return o;
}

Time step_time(const TrainResult& r) { return r.steps.back().virtual_end - r.steps[r.steps.size() - 2].virtual_end; }

TEST(MoeCommOverlap, SameBitsAndAShorterStepUnderBothDispatchers) {
  for (MoeDispatcher d : {MoeDispatcher::kAllToAll, MoeDispatcher::kDeepEp}) {
    const char* name = parallel::moe_dispatcher_name(d);
    TrainOptions o = overlap_options(d, false);
    const uint64_t switches = fiber_switches();
    const TrainResult plain = testing::run_moe(o, 2);
    o.parallel.overlap_moe_comm = true;
    const TrainResult overlapped = testing::run_moe(o, 2);
    EXPECT_GT(fiber_switches(), switches) << name;  // the programs did interleave
    ASSERT_EQ(overlapped.steps.size(), plain.steps.size());
    for (size_t k = 0; k < plain.steps.size(); ++k) EXPECT_EQ(overlapped.steps[k].loss, plain.steps[k].loss) << name;
    EXPECT_EQ(overlapped.step0_grads, plain.step0_grads) << name;
    EXPECT_EQ(overlapped.final_params, plain.final_params) << name;
    EXPECT_FALSE(plain.final_params.empty());
    const Time before = step_time(plain), after = step_time(overlapped);
    std::printf("%s: step %.3f -> %.3f us, device 0's compute stream waited %.3f -> %.3f us for exchanges "
                "(3 steps)\n",
                name, to_seconds(before) * 1e6, to_seconds(after) * 1e6, to_seconds(plain.a2a_time[0]) * 1e6,
                to_seconds(overlapped.a2a_time[0]) * 1e6);
    EXPECT_LT(after, before) << name;
    EXPECT_LT(overlapped.a2a_time[0], plain.a2a_time[0]) << name;
    // It hides at most what the compute stream waited for, a step's share.
    EXPECT_LE(before - after, plain.a2a_time[0] / Time(o.steps)) << name;
  }
}

// Shapes only (uniform phantom routing): deterministic, and shorter than
// the same phantom step without the overlap.
TEST(MoeCommOverlap, PhantomStepsAreDeterministicAndShorter) {
  TrainOptions o = overlap_options(MoeDispatcher::kAllToAll, true);
  o.model.aux_coef = 0;
  const TrainResult plain = testing::run_moe(o, 2);
  o.parallel.overlap_moe_comm = true;
  const TrainResult a = testing::run_moe(o, 2), b = testing::run_moe(o, 2);
  EXPECT_EQ(step_time(a), step_time(b));
  EXPECT_LT(step_time(a), step_time(plain));
}

TEST(MoeCommOverlap, RefusedWhereNotModeled) {
  const auto refused = [](auto edit) {
    TrainOptions o = overlap_options(MoeDispatcher::kAllToAll, true);
    o.parallel.overlap_moe_comm = true;
    edit(o);
    EXPECT_THROW(testing::run_moe(o, 2), ConfigError);
  };
  refused([](TrainOptions& o) { o.parallel.ep = 1; });
  refused([](TrainOptions& o) { o.parallel.pp = 2, o.parallel.dp = 2, o.parallel.ep = 2; });
  refused([](TrainOptions& o) { o.parallel.recompute = parallel::Recompute::kFull; });
  refused([](TrainOptions& o) { o.parallel.zero = 3; });
}

}  // namespace
}  // namespace shardlab::train
