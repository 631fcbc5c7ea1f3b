// Megatron's combined 1F1B (--overlap-moe-expert-parallel-comm,
// ParallelOptions::overlap_moe_comm): a forward and another micro-batch's
// backward run as one step, interleaved at every token exchange, the
// exchanges on the EP communication stream. It moves no number: the same
// kernels run on the same rows in the same order within each micro-batch,
// so losses and parameters are bit-identical to the run without it, under
// both dispatchers, on nodes of 2 devices (so the EP group spans nodes).
// It moves the clock only by hiding exchanges: the step gets shorter, by at
// most the time the compute stream waited for them without it.
#include <algorithm>
#include <cstdio>
#include <utility>
#include <vector>

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

// Runs `o` without and with the overlap under both dispatchers: the same
// losses, step-0 gradients and final parameters, an interleaving that did
// happen, a shorter step and less waited for the exchanges (printed).
// Returns, per dispatcher, the step time gained and what device 0's compute
// stream waited for exchanges in all steps without it.
std::vector<std::pair<Time, Time>> expect_same_bits_and_a_shorter_step(TrainOptions o, const char* layout) {
  std::vector<std::pair<Time, Time>> out;
  for (MoeDispatcher d : {MoeDispatcher::kAllToAll, MoeDispatcher::kDeepEp}) {
    const char* name = parallel::moe_dispatcher_name(d);
    o.parallel.moe_dispatcher = d;
    o.parallel.overlap_moe_comm = false;
    const uint64_t switches = fiber_switches();
    const TrainResult plain = testing::run_moe(o, 2);
    o.parallel.overlap_moe_comm = true;
    const TrainResult overlapped = testing::run_moe(o, 2);
    EXPECT_GT(fiber_switches(), switches) << name;  // the programs did interleave
    EXPECT_EQ(overlapped.steps.size(), plain.steps.size());
    for (size_t k = 0; k < std::min(plain.steps.size(), overlapped.steps.size()); ++k)
      EXPECT_EQ(overlapped.steps[k].loss, plain.steps[k].loss) << name;
    EXPECT_EQ(overlapped.step0_grads, plain.step0_grads) << name;
    EXPECT_EQ(overlapped.final_params, plain.final_params) << name;
    EXPECT_FALSE(plain.final_params.empty());
    const Time before = step_time(plain), after = step_time(overlapped);
    std::printf("%s, %s: step %.3f -> %.3f us, device 0's compute stream waited %.3f -> %.3f us for exchanges "
                "(3 steps)\n",
                layout, name, to_seconds(before) * 1e6, to_seconds(after) * 1e6, to_seconds(plain.a2a_time[0]) * 1e6,
                to_seconds(overlapped.a2a_time[0]) * 1e6);
    EXPECT_LT(after, before) << name;
    EXPECT_LT(overlapped.a2a_time[0], plain.a2a_time[0]) << name;
    out.emplace_back(before - after, plain.a2a_time[0]);
  }
  return out;
}

TEST(MoeCommOverlap, SameBitsAndAShorterStepUnderBothDispatchers) {
  const TrainOptions o = overlap_options(MoeDispatcher::kAllToAll, false);
  // It hides at most what the compute stream waited for, a step's share.
  for (const auto& [gain, waited] : expect_same_bits_and_a_shorter_step(o, "pp 1"))
    EXPECT_LE(gain, waited / Time(o.steps));
}

// With a pipeline: Megatron's combined interleaved schedule (pp 2 x vpp 2,
// one block a virtual stage, dp 4 x ep 4 on nodes of 2). Each chunk's
// backwards run in the same order, so the gradients accumulate alike: the
// same bits; the pairs hide exchanges, so a shorter step.
TEST(MoeCommOverlap, InterleavedPipelineKeepsTheBitsAndShortensTheStep) {
  TrainOptions o = overlap_options(MoeDispatcher::kAllToAll, false);
  o.parallel.pp = 2;
  o.parallel.vpp = 2;
  o.parallel.schedule = parallel::ScheduleKind::kInterleaved;
  EXPECT_EQ(expect_same_bits_and_a_shorter_step(o, "pp 2 x vpp 2").size(), 2u);
}

// Megatron's delay_wgrad_compute on top: the experts' weight gradients of
// each backward run once its dispatch exchange is posted, beside it, so the
// exchange leaves earlier by their time. The same kernels on the same
// operands (copied, then run in recording order): the same bits; a shorter
// step, and less waited for the exchanges, with and without a pipeline.
TEST(MoeCommOverlap, DelayedWeightGradientsKeepTheBitsAndShortenTheStep) {
  for (const int pp : {1, 2}) {
    for (MoeDispatcher d : {MoeDispatcher::kAllToAll, MoeDispatcher::kDeepEp}) {
      const char* name = parallel::moe_dispatcher_name(d);
      TrainOptions o = overlap_options(d, false);
      if (pp == 2) o.parallel.pp = 2, o.parallel.vpp = 2, o.parallel.schedule = parallel::ScheduleKind::kInterleaved;
      o.parallel.overlap_moe_comm = true;
      const TrainResult overlapped = testing::run_moe(o, 2);
      o.parallel.delay_wgrad = true;
      const TrainResult delayed = testing::run_moe(o, 2);
      ASSERT_EQ(delayed.steps.size(), overlapped.steps.size());
      for (size_t k = 0; k < delayed.steps.size(); ++k) EXPECT_EQ(delayed.steps[k].loss, overlapped.steps[k].loss);
      EXPECT_EQ(delayed.step0_grads, overlapped.step0_grads) << name;
      EXPECT_EQ(delayed.final_params, overlapped.final_params) << name;
      const Time before = step_time(overlapped), after = step_time(delayed);
      std::printf("pp %d, %s: step %.3f -> %.3f us with the experts' weight gradients delayed, waited %.3f -> %.3f "
                  "us\n",
                  pp, name, to_seconds(before) * 1e6, to_seconds(after) * 1e6,
                  to_seconds(overlapped.a2a_time[0]) * 1e6, to_seconds(delayed.a2a_time[0]) * 1e6);
      EXPECT_LT(after, before) << name << " pp " << pp;
      EXPECT_LT(delayed.a2a_time[0], overlapped.a2a_time[0]) << name << " pp " << pp;
    }
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
  refused([](TrainOptions& o) { o.parallel.pp = 2, o.parallel.dp = 2, o.parallel.ep = 2; });  // 1f1b
  refused([](TrainOptions& o) {  // pp 1 with chunks
    o.parallel.vpp = 2, o.parallel.schedule = parallel::ScheduleKind::kInterleaved;
  });
  refused([](TrainOptions& o) { o.parallel.recompute = parallel::Recompute::kFull; });
  refused([](TrainOptions& o) { o.parallel.zero = 3; });
  refused([](TrainOptions& o) { o.parallel.overlap_moe_comm = false, o.parallel.delay_wgrad = true; });
}

}  // namespace
}  // namespace shardlab::train
