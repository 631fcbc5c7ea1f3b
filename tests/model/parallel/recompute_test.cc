// Activation recomputation: selective and full give the same bits as none,
// keep less in the arena, and put the re-run kernels on the timeline.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "model/config.h"
#include "model/parallel/pipeline/schedule.h"
#include "model/train/trainer.h"
#include "model/train/verify.h"
#include "tests/model/train/train_test_util.h"
#include "runtime/profile.h"

namespace shardlab::train {
namespace {

using parallel::Recompute;

TrainOptions small(int experts) {
  TrainOptions o = testing::small_options(experts);
  o.keep_step0_grads = true;
  return o;
}

TrainResult run(const TrainOptions& o, bool trace = false) {
  validate_parallel(o);
  return testing::run(o, nullptr, trace);
}

uint64_t activation_peak(const TrainResult& r, size_t rank) {
  return r.run.devices[rank].peak_by_kind[static_cast<size_t>(MemKind::kActivation)];
}

// `o` under none, selective and full: identical losses and parameters, a
// strictly smaller activation peak on every device from none to selective
// to full, and verify against the unsharded model passes for each.
void expect_recompute_exact(TrainOptions o, const char* what) {
  std::vector<TrainResult> runs;
  for (Recompute r : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
    o.parallel.recompute = r;
    runs.push_back(run(o));
  }
  TrainOptions ref = o;
  ref.parallel = {};
  ref.micro_batches = o.micro_batches;
  const TrainResult unsharded = run(ref);
  for (size_t i = 1; i < runs.size(); ++i) {
    ASSERT_EQ(runs[i].steps.size(), runs[0].steps.size());
    for (size_t s = 0; s < runs[0].steps.size(); ++s) EXPECT_EQ(runs[i].steps[s].loss, runs[0].steps[s].loss);
    ASSERT_EQ(runs[i].final_params.size(), runs[0].final_params.size());
    EXPECT_EQ(std::memcmp(runs[i].final_params.data(), runs[0].final_params.data(),
                          runs[0].final_params.size() * sizeof(float)), 0)
        << what << ": parameters differ with recompute " << i;
  }
  for (size_t rank = 0; rank < runs[0].run.devices.size(); ++rank) {
    const uint64_t none = activation_peak(runs[0], rank), sel = activation_peak(runs[1], rank),
                   full = activation_peak(runs[2], rank);
    if (rank == 0) std::printf("%s: activation peak none %llu, selective %llu, full %llu bytes\n", what,
                               (unsigned long long)none, (unsigned long long)sel, (unsigned long long)full);
    EXPECT_LT(sel, none) << "rank " << rank;
    EXPECT_LT(full, sel) << "rank " << rank;
  }
  for (size_t i = 0; i < runs.size(); ++i) {
    const VerifyResult v = compare_runs(runs[i], unsharded, model::ParamTable(o.model), {.grads = true});
    std::printf("%s recompute %s vs unsharded: param rel L2 %.2e, grad rel L2 %.2e (tol 1e-5)\n", what,
                parallel::recompute_name(static_cast<Recompute>(i)), v.param_rel_l2, v.grad_rel_l2);
    EXPECT_TRUE(v.passed);
    EXPECT_LE(v.grad_rel_l2, 1e-5);
  }
}

TEST(Recompute, TensorSequenceParallelIsExact) {
  TrainOptions o = small(0);
  o.parallel.tp = 2, o.parallel.sp = true;
  expect_recompute_exact(o, "tp 2 sp");
}

TEST(Recompute, PipelineWithMoEIsExact) {
  TrainOptions o = small(4);
  o.parallel.pp = 2, o.micro_batches = 4;
  expect_recompute_exact(o, "pp 2 1f1b M 4 MoE");
}

TEST(Recompute, ExpertParallelWithCapacityIsExact) {
  TrainOptions o = small(4);
  o.model.capacity_factor = 1.0;
  o.parallel.dp = 2, o.parallel.ep = 2, o.parallel.zero = 1;
  expect_recompute_exact(o, "dp 2 ep 2 capacity 1.0");
}

TEST(Recompute, OneDeviceUsesTheShardedModelAndIsExact) {
  expect_recompute_exact(small(0), "1 GPU");
}

TEST(Recompute, TheReRunKernelsAreOnTheTimeline) {
  TrainOptions o = small(0);
  o.steps = 1;
  o.parallel.tp = 2;
  for (Recompute r : {Recompute::kSelective, Recompute::kFull}) {
    o.parallel.recompute = r;
    const TrainResult t = run(o, true);
    int softmax = 0, linear = 0;
    for (const TraceEvent& e : t.run.traces[0].events) {
      softmax += std::strcmp(e.name, "attn.softmax.fwd.recompute") == 0;
      linear += std::strcmp(e.name, "attn.c_attn.fwd.recompute") == 0;
    }
    // Once per block per micro-batch; selective re-runs the attention core only.
    EXPECT_EQ(softmax, o.model.n_layer);
    EXPECT_EQ(linear, r == Recompute::kFull ? o.model.n_layer : 0);
  }
}

}  // namespace
}  // namespace shardlab::train
