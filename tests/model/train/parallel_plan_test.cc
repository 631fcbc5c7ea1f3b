// ParallelPlan (model/train/parallel_plan.h): the facts derived once from a
// run's layout are the ones the options imply, and a bad layout fails its
// checks before any fact is derived.
#include "model/train/parallel_plan.h"

#include <gtest/gtest.h>

#include "runtime/errors.h"
#include "tests/model/train/train_test_util.h"

namespace shardlab::train {
namespace {

using testing::small_options;

TEST(ParallelPlan, DerivesTheLayoutsFacts) {
  TrainOptions o = small_options();
  o.parallel.tp = 2;
  o.parallel.pp = 2;
  o.parallel.dp = 2;
  o.micro_batches = 2;
  const ParallelPlan plan(o);
  EXPECT_EQ(plan.world, 8);
  EXPECT_EQ(plan.world, o.parallel.world());
  EXPECT_EQ(plan.mesh.describe(5), collectives::DeviceMesh(o.parallel.mesh_shape()).describe(5));
  EXPECT_TRUE(plan.sharded);
  EXPECT_FALSE(plan.global_routing);
  EXPECT_EQ(plan.schedule.size(), 2u);
  EXPECT_FALSE(plan.folds);  // a real run
  // The placement is the one ShardedGPT resolves: 4 blocks over 2 stages.
  for (int r = 0; r < 2; ++r) {
    const parallel::StagePlacement p = plan.placement(r);
    const parallel::StagePlacement want =
        parallel::StagePlacement{2, 1, r, {}, o.parallel.stage_order()}.resolved(o.model);
    EXPECT_EQ(p.rank, r);
    EXPECT_EQ(p.stage_layers, want.stage_layers);
    EXPECT_EQ(p.first_layer(0), want.first_layer(0));
    EXPECT_EQ(p.end_layer(0), want.end_layer(0));
  }
}

TEST(ParallelPlan, RoutingAndFoldingFacts) {
  TrainOptions o = small_options(/*experts=*/4);
  o.parallel.dp = 2;
  o.parallel.ep = 2;
  o.parallel.zero = 1;
  o.phantom = true;
  const ParallelPlan plan(o);
  EXPECT_TRUE(plan.global_routing);  // ep with a load-balancing loss: f_i of the global micro-batch
  TrainOptions aux_free = o;
  aux_free.model.aux_coef = 0;  // dropless and aux-loss-free (DeepSeek-V3): no counts from other replicas
  EXPECT_FALSE(ParallelPlan(aux_free).global_routing);
  aux_free.model.capacity_factor = 1.0;  // drops follow the global token order
  EXPECT_TRUE(ParallelPlan(aux_free).global_routing);
  EXPECT_TRUE(plan.sharded);
  EXPECT_TRUE(plan.folds);
  EXPECT_TRUE(plan.fold.moe);
  // ZeRO-1 over dp 2: every bucket of the tiny model has an even size.
  EXPECT_FALSE(plan.fold.uneven_chunks);
  // Uniform phantom routing: 4 rows x 32 tokens x top-2 over 4 experts, 64 rows each.
  EXPECT_TRUE(plan.fold.routes_alike);
  TrainOptions skewed = o;
  skewed.phantom_zipf = 1.2;  // the low experts get more rows: ep ranks differ
  EXPECT_FALSE(ParallelPlan(skewed).fold.routes_alike);
  TrainOptions odd = o;
  odd.model.n_expert = 6;  // 256 assignments over 6 experts: 43 and 42 rows
  EXPECT_FALSE(ParallelPlan(odd).fold.routes_alike);
  odd.parallel.ep = 1;  // every rank holds every expert: uneven rows, but alike on every rank
  EXPECT_TRUE(ParallelPlan(odd).fold.routes_alike);
  odd.model.capacity_factor = 1.0;  // drops follow the global token order: each rank drops others
  EXPECT_FALSE(ParallelPlan(odd).fold.routes_alike);
  EXPECT_TRUE(ParallelPlan(small_options()).fold.routes_alike);  // dense: nothing to route
  EXPECT_EQ(plan.fold.mesh.ep, 2);
  o.parallel.ep = 1;  // MoE over dp without a capacity factor: each replica routes its own tokens
  o.parallel.zero = 0;
  EXPECT_FALSE(ParallelPlan(o).global_routing);
  EXPECT_FALSE(ParallelPlan(small_options()).sharded);  // one device: the unsharded reference
}

TEST(ParallelPlan, ABadLayoutFailsItsChecks) {
  TrainOptions o = small_options();
  o.parallel.pp = 8;  // more stages than the 4 blocks
  EXPECT_THROW(ParallelPlan{o}, ConfigError);
  o.parallel.pp = 1;
  o.parallel.tp = 0;
  EXPECT_THROW(ParallelPlan{o}, ConfigError);
}

}  // namespace
}  // namespace shardlab::train
