// --init into sharded runs: a checkpoint saved by an unsharded run is loaded
// by every rank as its slices (shard_io.h), and the sharded run then trains
// exactly like the unsharded model initialised from the same file.
#include <cstdio>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "model/io/safetensors.h"
#include "model/params.h"
#include "model/train/verify.h"
#include "support/compare.h"
#include "tests/model/train/train_test_util.h"

namespace shardlab::train {
namespace {

using testing::run;
using testing::small_options;
using testing::unsharded;

// Two unsharded steps saved to a file; returns its path and the saved params.
std::string save_checkpoint(std::vector<float>* saved) {
  TrainOptions o = small_options(0);
  o.steps = 2;
  o.save_path = ::testing::TempDir() + "init_test_checkpoint.safetensors";
  *saved = run(o).final_params;
  return o.save_path;
}

TEST(InitFromCheckpoint, TheFileHoldsTheSavedParametersBitForBit) {
  std::vector<float> saved;
  const std::string path = save_checkpoint(&saved);
  const model::SafetensorsFile f = model::load_safetensors(path);
  const model::ParamTable table(small_options(0).model);
  std::vector<float> loaded;
  for (const model::ParamSpec& s : table.specs()) {
    const std::span<const float> t = f.get(s.name, s.shape);
    loaded.insert(loaded.end(), t.begin(), t.end());
  }
  const ::testing::AssertionResult same = shardlab::testing::all_close(loaded, saved, 0.0);
  std::printf("checkpoint vs saved params: %s\n", same.message());
  EXPECT_TRUE(same);
}

TEST(InitFromCheckpoint, ShardedRunsFromTheFileMatchTheUnshardedRunFromIt) {
  std::vector<float> saved;
  const std::string path = save_checkpoint(&saved);
  TrainOptions base = small_options(0);
  base.steps = 2;
  base.micro_batches = 2;
  base.keep_step0_grads = true;
  base.init_path = path;
  const TrainResult reference = run(unsharded(base));
  // The file took effect: step 0 of a fresh init has another loss.
  TrainOptions fresh = unsharded(base);
  fresh.init_path.clear();
  const double fresh_loss = run(fresh).steps[0].loss;
  std::printf("unsharded step-0 loss: from the checkpoint %.7f, fresh init %.7f\n", reference.steps[0].loss,
              fresh_loss);
  EXPECT_LT(reference.steps[0].loss, fresh_loss);
  for (int dp : {1, 2}) {
    TrainOptions o = base;
    o.parallel.tp = 2, o.parallel.pp = 2, o.parallel.dp = dp;
    const TrainResult sharded = run(o);
    const VerifyResult r = compare_runs(sharded, reference, model::ParamTable(o.model), {.grads = true});
    std::printf("--init into tp 2 x pp 2 x dp %d: loss rel diff %.2e, step-0 grad rel L2 %.2e, param rel L2 %.2e "
                "(tol 1e-5)\n",
                dp, r.max_loss_rel_diff, r.grad_rel_l2, r.param_rel_l2);
    ASSERT_EQ(sharded.steps.size(), reference.steps.size());
    EXPECT_TRUE(r.passed) << "dp " << dp << ": "
                          << (r.first_mismatch ? r.first_mismatch->kind + " " + r.first_mismatch->name : "");
    EXPECT_LE(r.grad_rel_l2, 1e-5);
    EXPECT_LE(r.param_rel_l2, 1e-5);
  }
}

}  // namespace
}  // namespace shardlab::train
