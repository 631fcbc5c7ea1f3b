// A non-default MLP width and a padded vocabulary keep the sharded model
// equal to the unsharded one: verify (compare_runs, tolerance 1e-5 on the
// per-step loss and the parameter-vector rel L2) for tp 2, tp 2 x pp 2 and an
// MoE under tp, against the reference built with the same width and rows.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "model/params.h"
#include "model/train/verify.h"
#include "tests/model/train/train_test_util.h"

namespace shardlab::train {
namespace {

using testing::run;
using testing::unsharded;

TrainOptions tiny(int ffn) {
  TrainOptions o;
  o.model = model::preset("tiny");
  o.model.n_ffn = ffn;
  o.steps = 3;
  o.keep_step0_grads = true;  // compare_runs with grads
  return o;
}

VerifyResult expect_verify(const TrainOptions& o, const char* what) {
  validate_parallel(o);
  const TrainResult sharded = run(o), reference = run(unsharded(o));
  const VerifyResult r =
      compare_runs(sharded, reference, model::ParamTable(o.model), {.grads = true});
  std::printf(
      "%s (tp %d pp %d experts %d ffn %d vocab %d): loss rel diff %.2e, param rel L2 %.2e, grad "
      "rel L2 "
      "%.2e (tolerance 1e-5)\n",
      what, o.parallel.tp, o.parallel.pp, o.model.n_expert, o.model.ffn_hidden(),
      o.model.vocab_size, r.max_loss_rel_diff, r.param_rel_l2, r.grad_rel_l2);
  EXPECT_TRUE(r.passed) << what;
  EXPECT_EQ(sharded.n_params, int64_t(model::count_params(o.model)));
  return r;
}

TEST(FfnWidth, ShardedRunsMatchTheUnshardedModel) {
  TrainOptions o = tiny(384);
  // 4 blocks lose 2 x 128 x 128 + 128 MLP parameters each against the default 512.
  EXPECT_EQ(model::count_params(o.model), 867072.0 - 4 * (2 * 128 * 128 + 128));
  o.parallel.tp = 2;
  expect_verify(o, "ffn 384, tp 2");
  o.parallel.pp = 2;
  o.micro_batches = 2;
  expect_verify(o, "ffn 384, tp 2 x pp 2");
  TrainOptions moe = tiny(192);
  moe.model.n_expert = 4, moe.model.aux_coef = 0.01;
  moe.parallel.tp = 2;
  expect_verify(moe, "MoE ffn 192, tp 2");
}

TEST(FfnWidth, TensorParallelMustDivideTheWidth) {
  TrainOptions o = tiny(383);
  o.parallel.tp = 2;
  try {
    validate_parallel(o);
    ADD_FAILURE() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("`n_ffn` = 383"), std::string::npos) << e.what();
  }
}

// tiny's data over 500 tokens, the table padded to 512 (multiple 128 x tp 2):
// the 12 extra rows are real rows no token uses, in the sharded model and in
// the reference alike.
TEST(VocabPadding, PaddedRunsMatchTheUnshardedModel) {
  TrainOptions o = tiny(0);
  o.model.vocab_size = 500;
  const TrainResult plain = run(o);
  o.model = model::with_padded_vocab(o.model, 128, 2);
  ASSERT_EQ(o.model.vocab_size, 512);
  o.parallel.tp = 2;
  expect_verify(o, "vocab 500 padded to 512, tp 2");
  // The data is the 500-token source either way: the same entropy rate.
  const TrainResult padded = run(unsharded(o));
  ASSERT_TRUE(plain.best_loss && padded.best_loss);
  EXPECT_EQ(*plain.best_loss, *padded.best_loss);
  EXPECT_EQ(padded.n_params, plain.n_params + 12 * 128);  // 12 more rows of wte
}

}  // namespace
}  // namespace shardlab::train
