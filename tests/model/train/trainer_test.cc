#include <cmath>
#include <cstdio>
#include <vector>

#include <gtest/gtest.h>

#include "model/config.h"
#include "model/train/trainer.h"
#include "runtime/errors.h"
#include "runtime/progress.h"
#include "tests/model/train/train_test_util.h"

namespace shardlab::train {
namespace {

TEST(LearningRate, WarmupThenConstantOrCosineAsNanoGPT) {
  TrainOptions o;
  o.steps = 11;
  o.adam.lr = 1e-3;
  o.warmup_steps = 4;
  // Warm-up: lr * (step + 1) / (warmup + 1).
  EXPECT_DOUBLE_EQ(learning_rate(o, 0), 1e-3 * 1 / 5);
  EXPECT_DOUBLE_EQ(learning_rate(o, 3), 1e-3 * 4 / 5);
  EXPECT_DOUBLE_EQ(learning_rate(o, 4), 1e-3);
  EXPECT_DOUBLE_EQ(learning_rate(o, 10), 1e-3);
  o.lr_schedule = LrSchedule::kCosine;
  // Cosine from lr at the end of warm-up to lr/10 at the last step.
  EXPECT_DOUBLE_EQ(learning_rate(o, 4), 1e-3);
  EXPECT_NEAR(learning_rate(o, 7), 1e-4 + 0.5 * (1 + std::cos(M_PI * 0.5)) * 9e-4, 1e-15);
  EXPECT_NEAR(learning_rate(o, 10), 1e-4, 1e-15);
}

// A run stopped early on a longer run's schedule (verify's re-run to a
// routing divergence) takes that run's first steps bit for bit; on its own
// schedule it decays sooner and does not.
TEST(LearningRate, ARunStoppedEarlyOnALongerSchedule) {
  TrainOptions o = testing::small_options();
  o.steps = 6;
  o.lr_schedule = LrSchedule::kCosine;
  o.warmup_steps = 1;
  const TrainResult full = testing::run(o);
  TrainOptions early = o;
  early.steps = 4;
  early.schedule_steps = 6;
  EXPECT_DOUBLE_EQ(learning_rate(early, 3), learning_rate(o, 3));
  const TrainResult stopped = testing::run(early);
  ASSERT_EQ(stopped.steps.size(), 4u);
  for (int s = 0; s < 4; ++s) EXPECT_EQ(stopped.steps[size_t(s)].loss, full.steps[size_t(s)].loss) << "step " << s;
  early.schedule_steps = 0;
  EXPECT_LT(learning_rate(early, 3), learning_rate(o, 3));
  const TrainResult own = testing::run(early);
  EXPECT_NE(own.steps[3].loss, full.steps[3].loss);
  early.schedule_steps = 3;
  EXPECT_THROW(early.validate(), ConfigError);
}

TEST(Parallel, ConstraintsAreCheckedWithClearMessages) {
  TrainOptions o;
  o.model = model::preset("tiny");
  auto message = [&](auto edit) {
    TrainOptions x = o;
    edit(x);
    try {
      validate_parallel(x);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(message([](TrainOptions&) {}), "");
  EXPECT_NE(message([](TrainOptions& x) { x.parallel.dp = 3; }).find("`batch_size` 8 is not divisible by `dp` 3"), std::string::npos);
  EXPECT_NE(message([](TrainOptions& x) { x.parallel.tp = 3; }).find("`tp` 3"), std::string::npos);
  EXPECT_NE(message([](TrainOptions& x) { x.model.vocab_size = 510; x.parallel.tp = 4; }).find("`vocab_size` 510"), std::string::npos);
  EXPECT_NE(message([](TrainOptions& x) { x.parallel.sp = true; x.parallel.tp = 1; }).find("`sp` needs `tp`"), std::string::npos);
  EXPECT_NE(message([](TrainOptions& x) { x.parallel.tp = 2; x.parallel.sp = true; x.model.block_size = 63; }).find("`block_size` 63"),
            std::string::npos);
  EXPECT_NE(message([](TrainOptions& x) { x.parallel.zero = 4; }).find("`zero`"), std::string::npos);
  EXPECT_NE(message([](TrainOptions& x) { x.parallel.hsdp = 2; }).find("`hsdp` needs `zero` 3"), std::string::npos);
  // Capacity drops under dp follow the global token order: accepted now.
  EXPECT_EQ(message([](TrainOptions& x) { x.parallel.dp = 2; x.model.n_expert = 4; x.model.capacity_factor = 1.0; }), "");
  EXPECT_NE(message([](TrainOptions& x) { x.parallel.dp = 4; x.parallel.ep = 3; x.model.n_expert = 6; }).find("`ep` 3"),
            std::string::npos);
  EXPECT_NE(message([](TrainOptions& x) { x.parallel.dp = 2; x.parallel.ep = 4; x.model.n_expert = 8; }).find("`ep` 4"),
            std::string::npos);
  EXPECT_NE(message([](TrainOptions& x) { x.parallel.pp = 8; }).find("`pp` 8 is more than `n_layer` 4"), std::string::npos);
}

// A V schedule (zb-v, dualpipev) places two model chunks per rank: the
// library's default when vpp is not given, so a C++ user who picks one needs
// nothing else; an explicit vpp is still checked.
TEST(Parallel, VSchedulesTakeTwoChunksUnlessVppIsGiven) {
  TrainOptions o;
  o.model = model::preset("tiny");
  o.parallel.pp = 2;
  o.micro_batches = 4;
  EXPECT_EQ(o.parallel.vpp, 0);
  EXPECT_EQ(o.parallel.chunks(), 1);  // 1f1b
  for (parallel::ScheduleKind kind : {parallel::ScheduleKind::kZbV, parallel::ScheduleKind::kDualPipeV}) {
    TrainOptions v = o;
    v.parallel.schedule = kind;
    EXPECT_EQ(v.parallel.chunks(), 2);
    EXPECT_NO_THROW(validate_parallel(v));
    EXPECT_EQ(step_schedule(v).size(), 2u);
    EXPECT_EQ(v.parallel.last_stage_rank(), 0);  // the V ends where it starts
    v.parallel.vpp = 1;
    try {
      validate_parallel(v);
      ADD_FAILURE() << "vpp 1 accepted for " << parallel::schedule_name(kind);
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("`vpp` 1: `schedule` "), std::string::npos) << e.what();
    }
  }
  o.parallel.schedule = parallel::ScheduleKind::kInterleaved;  // the user chooses its chunks
  EXPECT_THROW(validate_parallel(o), ConfigError);
  o.parallel.vpp = 2;
  EXPECT_NO_THROW(validate_parallel(o));
}

}  // namespace
}  // namespace shardlab::train

namespace shardlab::train {
namespace {

// The first and the last pipeline stage hold the two copies of the tied
// embedding; each is reduced over its data-parallel group (where the order
// of a ring's sums depends on the element's chunk) and then the two are
// summed over the embedding group, as Megatron does. Both copies must come
// out bit for bit equal, which train() checks (replica_mismatch).
//  - Reduced inside buckets of different neighbours (wte with wpe and block
//    0 on the first stage, alone on the last) they differed in the last
//    bits; reduced in a bucket of their own (ParallelPlan::tied_bucket) they
//    do not.
//  - Summed before the data-parallel reduction (until session 33), they
//    differed where the two stages' dp groups sit differently on the nodes:
//    pp 3 x dp 3 on 8-GPU nodes puts the first stage's group {0,1,2} inside
//    node 0 and the last stage's {6,7,8} across nodes 0 and 1, so each group
//    ran another algorithm (another order of sums): 3.7e-09 apart. A sum of
//    two after the reduction is the same bits on both ranks.
TEST(TiedEmbedding, BothPipelineCopiesStayBitIdenticalUnderDataParallelism) {
  struct Case {
    int tp, cp, dp, pp, zero;
    bool sp, distributed_optimizer, llama = false;
  };
  for (const Case c : {Case{2, 1, 4, 2, 0, false, false}, Case{2, 2, 2, 2, 0, true, false},
                       Case{1, 1, 3, 3, 0, false, false}, Case{1, 1, 3, 3, 1, false, true},
                       Case{1, 1, 3, 3, 2, false, false}, Case{1, 1, 3, 3, 3, false, false},
                       Case{1, 1, 3, 3, 2, false, false, true}}) {
    TrainOptions o;
    o.model = model::preset("tiny");  // 4 blocks of 128, vocab 512, batch 8
    o.model.batch_size = 16;
    if (c.pp == 3) {  // 5 blocks of 48, vocab 75: a 14 KiB wte, reduced by another algorithm on each stage
      o.model.n_layer = 5, o.model.n_head = 6, o.model.n_embd = 48;
      o.model.block_size = 12, o.model.vocab_size = 75, o.model.batch_size = 6;
    }
    if (c.llama) {  // a tied llama: its copy is model.embed_tokens, in a bucket of its own too
      o.model.family = model::Family::kLlama;
      o.model.tie_embeddings = true;
    }
    o.parallel.tp = c.tp;
    o.parallel.cp = c.cp;
    o.parallel.dp = c.dp;
    o.parallel.sp = c.sp;
    o.parallel.pp = c.pp;
    o.parallel.zero = c.zero;
    o.parallel.distributed_optimizer = c.distributed_optimizer;
    o.micro_batches = c.pp == 3 ? 1 : 2;
    o.steps = 2;
    const TrainResult r = train::testing::run(o);
    EXPECT_EQ(r.replica_mismatch, "") << "tp " << c.tp << " cp " << c.cp << " dp " << c.dp << " pp " << c.pp
                                      << " zero " << c.zero;
    std::printf("%s tp %d cp %d dp %d pp %d zero %d%s: tied copies max |diff| %.3e (tolerance 0: bit-identical)\n",
                c.llama ? "llama" : "gpt", c.tp, c.cp, c.dp, c.pp, c.zero, c.distributed_optimizer ? " (distributed optimizer)" : "",
                r.replica_max_diff);
  }
}

// Every tp rank holds its own copy of the tp-replicated tensors (norms,
// row-parallel biases, wpe), reduced over its own dp group. Where those
// groups sit alike on the nodes the copies stay bit-identical; tp 3 x dp 3
// on 8-GPU nodes puts tp rank 0's group {0,3,6} inside node 0 and tp rank
// 2's {2,5,8} over two nodes, so their reductions run other algorithms and
// the copies drift by rounding, as NCCL's per-communicator choices would:
// train() reports it (tp_drift), not as a replica mismatch. A copy
// perturbed on one tp rank is named.
TEST(TensorParallelReplicas, DriftIsReportedNotAnError) {
  struct Case {
    int tp, dp;
    std::string corrupt;
    std::string drift;  // the first drifting tensor expected ("": none)
  };
  for (const Case& c : {Case{2, 2, "", ""}, Case{3, 3, "", "transformer.wpe.weight on tp rank 2"},
                        Case{2, 2, "transformer.ln_f.weight:1", "transformer.ln_f.weight on tp rank 1"}}) {
    TrainOptions o;
    o.model = model::preset("tiny");
    o.model.n_head = 6, o.model.n_embd = 48, o.model.n_layer = 2;
    o.model.block_size = 12, o.model.vocab_size = 48, o.model.batch_size = 6 * c.dp;
    o.parallel.tp = c.tp;
    o.parallel.dp = c.dp;
    o.steps = 3;
    o.corrupt_shard = c.corrupt;
    const TrainResult r = train::testing::run(o);
    SCOPED_TRACE(::testing::Message() << "tp " << c.tp << " dp " << c.dp << " " << c.corrupt);
    EXPECT_FALSE(r.tp_replicated.empty());
    EXPECT_EQ(r.replica_mismatch, "");
    if (c.drift.empty()) {
      EXPECT_EQ(r.tp_drift, "");
      EXPECT_EQ(r.tp_drift_max, 0.0);
    } else if (c.corrupt.empty()) {  // rounding: one float ulp of wpe's values (README's figure)
      EXPECT_EQ(r.tp_drift, c.drift);
      EXPECT_EQ(r.tp_drift_max, std::ldexp(1.0, -29));
    } else {
      EXPECT_EQ(r.tp_drift, c.drift);
      EXPECT_GT(r.tp_drift_max, 1e-3);  // the 1e-2 (1 + |x|) perturbation
    }
    std::printf("tp %d dp %d%s: tp-replicated copies max |diff| %.3e (%s)\n", c.tp, c.dp,
                c.corrupt.empty() ? "" : (" corrupt " + c.corrupt).c_str(), r.tp_drift_max,
                r.tp_drift.empty() ? "bit-identical" : r.tp_drift.c_str());
  }
}

// The step observer (runtime/progress.h, the Python progress bar's source):
// a run of N steps reports steps 0..N-1 once each, in order, from device 0,
// each with that step's record; with the observer removed, nothing more.
TEST(StepObserver, ARunOfNStepsReportsEachStepOnceInOrder) {
  std::vector<StepDone> seen;  // written on device 0's thread only, read after the run
  set_step_observer([&seen](const StepDone& s) { seen.push_back(s); });
  TrainOptions o = train::testing::small_options();
  o.steps = 4;
  o.parallel.pp = 2;  // device 0 is not the only thread
  o.micro_batches = 2;
  const TrainResult r = train::testing::run(o);
  set_step_observer({});
  ASSERT_EQ(seen.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    const StepDone& s = seen[size_t(i)];
    EXPECT_EQ(s.step, i);
    EXPECT_EQ(s.steps, 4);
    EXPECT_EQ(s.virtual_time, r.steps[size_t(i)].virtual_end);
    EXPECT_EQ(s.loss, r.steps[size_t(i)].loss);
  }
  EXPECT_LT(seen[0].virtual_time, seen[3].virtual_time);
  train::testing::run(o);
  EXPECT_EQ(seen.size(), 4u);
}

}  // namespace
}  // namespace shardlab::train
