// Activation recomputation: selective and full give the same bits as none,
// keep less in the arena, and put the re-run kernels on the timeline; full
// recomputation of some blocks only (Megatron's --recompute-method block and
// uniform groups of --recompute-num-layers) too.
#include <cstdio>
#include <cstring>
#include <tuple>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "model/config.h"
#include "model/parallel/pipeline/schedule.h"
#include "model/train/trainer.h"
#include "model/train/verify.h"
#include "tests/model/parallel/recompute_test_util.h"
#include "tests/model/train/train_test_util.h"
#include "runtime/errors.h"
#include "runtime/profile.h"

namespace shardlab::train {
namespace {

using parallel::Recompute;
using testing::activation_peak;

TrainOptions small(int experts) {
  TrainOptions o = testing::small_options(experts);
  o.keep_step0_grads = true;
  return o;
}

TrainResult run(const TrainOptions& o, bool trace = false) {
  validate_parallel(o);
  return testing::run(o, nullptr, trace);
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
  for (size_t i = 1; i < runs.size(); ++i)
    testing::expect_same_bits(runs[i], runs[0], std::string(what) + " recompute " + std::to_string(i));
  for (size_t rank = 0; rank < runs[0].run.devices.size(); ++rank) {
    const uint64_t none = activation_peak(runs[0], rank), sel = activation_peak(runs[1], rank),
                   full = activation_peak(runs[2], rank);
    if (rank == 0) std::printf("%s: activation peak none %llu, selective %llu, full %llu bytes\n", what,
                               (unsigned long long)none, (unsigned long long)sel, (unsigned long long)full);
    EXPECT_LT(sel, none) << "rank " << rank;
    EXPECT_LT(full, sel) << "rank " << rank;
  }
  for (size_t i = 0; i < runs.size(); ++i)
    testing::expect_like_unsharded(runs[i], unsharded, o.model,
                                   std::string(what) + " recompute " + parallel::recompute_name(Recompute(i)));
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

// Full recomputation by block or uniform groups: the bits of none, and the
// unsharded model's gradients (within 1e-5).
void expect_layers_exact(TrainOptions o, const char* what) {
  o.parallel.recompute = Recompute::kNone;
  const TrainResult none = run(o);
  TrainOptions ref = o;
  ref.parallel = {};
  const TrainResult unsharded = run(ref);
  struct Way {
    parallel::RecomputeMethod method;
    int layers;
  };
  for (const Way w : {Way{parallel::RecomputeMethod::kBlock, 1}, Way{parallel::RecomputeMethod::kUniform, 2},
                      Way{parallel::RecomputeMethod::kBlock, 2}}) {
    o.parallel.recompute = Recompute::kFull;
    o.parallel.recompute_method = w.method;
    o.parallel.recompute_num_layers = w.layers;
    const TrainResult r = run(o);
    const std::string name = std::string(what) + " recompute full " + parallel::recompute_method_name(w.method) +
                             " " + std::to_string(w.layers);
    testing::expect_same_bits(r, none, name);
    testing::expect_like_unsharded(r, unsharded, o.model, name);
  }
}

TEST(RecomputeLayers, TensorSequenceParallelIsExact) {
  TrainOptions o = small(0);
  o.parallel.tp = 2, o.parallel.sp = true;
  expect_layers_exact(o, "tp 2 sp");
}

TEST(RecomputeLayers, PipelineWithMoEIsExact) {
  TrainOptions o = small(4);
  o.parallel.pp = 2, o.micro_batches = 4;
  expect_layers_exact(o, "pp 2 1f1b M 4 MoE");
}

// Block N re-runs the first N blocks of each stage, uniform every block:
// per micro-batch and stage, attn.c_attn.fwd runs again N times or once per
// block (pp 2: 2 blocks a stage, 4 micro-batches).
TEST(RecomputeLayers, BlockReRunsTheFirstBlocksOfEachStage) {
  TrainOptions o = small(0);
  o.steps = 1;
  o.parallel.pp = 2, o.micro_batches = 4;
  o.parallel.recompute = Recompute::kFull;
  for (const auto& [method, layers, want] :
       {std::tuple{parallel::RecomputeMethod::kBlock, 1, 4}, std::tuple{parallel::RecomputeMethod::kUniform, 2, 8},
        std::tuple{parallel::RecomputeMethod::kUniform, 1, 8}}) {
    o.parallel.recompute_method = method;
    o.parallel.recompute_num_layers = layers;
    const TrainResult t = run(o, true);
    for (size_t rank = 0; rank < 2; ++rank) {
      int again = 0;
      for (const TraceEvent& e : t.run.traces[rank].events) again += std::strcmp(e.name, "attn.c_attn.fwd.recompute") == 0;
      EXPECT_EQ(again, want) << parallel::recompute_method_name(method) << " " << layers << " rank " << rank;
    }
  }
}

// The memory, by hand: four llama blocks on one device, a vocabulary of
// 1,024 so the activation peak falls at the head's backward with every
// block's kept activations resident. Uniform groups of 2 keep 2 block
// outputs (N·C elements each) where groups of 1 keep 4: 2·N·C x 4 B less;
// block N keeps everything of the 4 - N blocks it does not re-run, so it
// saves N/4 of what full recomputation of every block saves.
TEST(RecomputeLayers, TheKeptMemoryByHand) {
  TrainOptions o = small(0);
  o.model.family = model::Family::kLlama;
  o.model.vocab_size = 1024;
  o.steps = 1;
  const int64_t N = int64_t{o.model.batch_size} * o.model.block_size, C = o.model.n_embd;
  const auto peak = [&](Recompute r, parallel::RecomputeMethod m, int layers) {
    TrainOptions x = o;
    x.parallel.recompute = r, x.parallel.recompute_method = m, x.parallel.recompute_num_layers = layers;
    return activation_peak(run(x), 0);
  };
  const auto U = parallel::RecomputeMethod::kUniform, B = parallel::RecomputeMethod::kBlock;
  const uint64_t none = peak(Recompute::kNone, U, 0), full = peak(Recompute::kFull, U, 1),
                 uniform2 = peak(Recompute::kFull, U, 2), block1 = peak(Recompute::kFull, B, 1),
                 block3 = peak(Recompute::kFull, B, 3);
  std::printf("activation peaks: none %llu, full %llu, uniform 2 %llu (by hand %llu less than full), block 1 %llu, "
              "block 3 %llu bytes\n",
              (unsigned long long)none, (unsigned long long)full, (unsigned long long)uniform2,
              (unsigned long long)(2 * N * C * 4), (unsigned long long)block1, (unsigned long long)block3);
  EXPECT_EQ(full - uniform2, uint64_t(2 * N * C * 4));
  EXPECT_EQ(4 * (none - block1), none - full);
  EXPECT_EQ(4 * (none - block3), 3 * (none - full));
}

TEST(RecomputeLayers, RefusesWhatDoesNotApply) {
  const auto refused = [](TrainOptions o, const char* needle) {
    try {
      validate_parallel(o);
      ADD_FAILURE() << "accepted: " << needle;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  TrainOptions o = small(0);
  o.parallel.recompute = Recompute::kSelective;
  o.parallel.recompute_num_layers = 2;
  refused(o, "need `recompute` full (got selective)");
  o.parallel.recompute = Recompute::kFull;
  o.parallel.recompute_num_layers = 0;
  o.parallel.recompute_method = parallel::RecomputeMethod::kBlock;
  refused(o, "give `recompute_num_layers`");
  o.parallel.recompute_num_layers = 5;
  refused(o, "must be between 1 and the blocks of a pipeline rank, `n_layer` 4 / `pp` 1 = 4");
  o.parallel.recompute_method = parallel::RecomputeMethod::kUniform;
  o.parallel.recompute_num_layers = 2;
  o.parallel.dp = 2, o.parallel.zero = 3;
  refused(o, "not supported with `zero` 3");
  EXPECT_THROW(parallel::parse_recompute_method("blocks"), ConfigError);
}

}  // namespace
}  // namespace shardlab::train
