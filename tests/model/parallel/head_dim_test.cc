// Qwen3's attention: heads of their own size (GPTConfig::head_dim,
// --head-dim; Megatron's --kv-channels): q_proj (n_head·head_dim, n_embd) and
// o_proj its transpose (32 heads of 128 on n_embd 2048), and QK-norm
// (GPTConfig::qk_norm, --qk-norm: an RMSNorm over each head of q and of k,
// weights shared by the heads and summed over TP). The unsharded forward is
// checked against Hugging Face's loops in gpt_forward_test.cc and its
// gradients in llama_gradcheck_test.cc; here every parallel layout that
// splits, gathers or rings the heads matches the unsharded model, the shapes
// and counts follow the heads' width, and bad values are one error line.
#include <cstdio>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "model/config.h"
#include "model/params.h"
#include "model/train/calibration.h"
#include "model/train/trainer.h"
#include "model/train/verify.h"
#include "runtime/errors.h"

namespace shardlab::train {
namespace {

// tiny-llama (4 layers, 4 heads over 2 K/V heads, n_embd 128) with heads of
// 48 (attention 192 wide) and QK-norm.
TrainOptions llama48() {
  TrainOptions o;
  o.model = model::preset("tiny-llama");
  o.model.head_dim = 48;
  o.model.qk_norm = true;
  o.model.block_size = 32;
  o.steps = 3;
  o.keep_step0_grads = true;
  return o;
}

TrainResult run(const TrainOptions& o) {
  ClusterOptions c;
  c.world_size = o.parallel.world();
  Cluster cluster(builtin_profiles().front(), c);
  return train(cluster, o);
}

TEST(HeadDim, EveryLayoutMatchesTheUnshardedModel) {
  struct Case {
    const char* name;
    TrainOptions o;
  };
  std::vector<Case> cases;
  {
    TrainOptions o = llama48();
    o.parallel.tp = 2, o.parallel.sp = true;  // heads and K/V heads split
    cases.push_back({"tp 2 with sp", o});
  }
  {
    TrainOptions o = llama48();
    o.parallel.tp = 4;  // 2 K/V heads on 4 ranks: held whole, gradients summed over TP
    cases.push_back({"tp 4 (K/V whole)", o});
  }
  {
    TrainOptions o = llama48();
    o.parallel.cp = 2, o.parallel.dp = 2;  // the ring passes K/V blocks of 48-wide heads
    cases.push_back({"cp 2 x dp 2", o});
  }
  {
    TrainOptions o = llama48();
    o.parallel.pp = 2, o.parallel.tp = 2, o.micro_batches = 2;
    o.parallel.recompute = parallel::Recompute::kFull;
    cases.push_back({"pp 2 x tp 2, full recompute", o});
  }
  {
    TrainOptions o = llama48();
    o.parallel.attention = parallel::AttentionKernel::kUnfused;
    o.parallel.tp = 2;
    cases.push_back({"tp 2, unfused core", o});
  }
  for (const Case& c : cases) {
    TrainOptions ref = c.o;
    ref.parallel = {};
    ref.micro_batches = c.o.micro_batches;
    const VerifyResult r = compare_runs(run(c.o), run(ref), model::ParamTable(c.o.model), {.grads = true});
    std::printf("head_dim 48, qk_norm, %s: loss rel diff %.2e, param rel L2 %.2e, grad rel L2 %.2e (bound 1e-5)\n", c.name,
                r.max_loss_rel_diff, r.param_rel_l2, r.grad_rel_l2);
    EXPECT_TRUE(r.passed) << c.name;
    EXPECT_LE(r.grad_rel_l2, 1e-5) << c.name;
  }
}

// The shapes and the counts follow the heads' width A = n_head·head_dim:
// q_proj (A, C), k_proj and v_proj (KV·head_dim, C), o_proj (C, A); the
// parameter count and Megatron's FLOPs per token by hand.
TEST(HeadDim, ShapesAndCountsFollowTheHeadsWidth) {
  model::GPTConfig c = llama48().model;
  const int64_t C = 128, A = 4 * 48, KVC = 2 * 48, F = c.ffn_hidden(), V = c.vocab_size, L = c.n_layer;
  const model::ParamTable t(c);
  EXPECT_EQ(t.at("model.layers.0.self_attn.q_proj.weight").shape, (Shape{A, C}));
  EXPECT_EQ(t.at("model.layers.0.self_attn.k_proj.weight").shape, (Shape{KVC, C}));
  EXPECT_EQ(t.at("model.layers.3.self_attn.o_proj.weight").shape, (Shape{C, A}));
  EXPECT_EQ(t.at("model.layers.2.self_attn.q_norm.weight").shape, (Shape{48}));
  EXPECT_EQ(t.at("model.layers.2.self_attn.k_norm.weight").shape, (Shape{48}));
  const int64_t per_block = 2 * A * C + 2 * KVC * C + 3 * C * F + 2 * C + 2 * 48;
  const int64_t total = V * C * 2 + C + L * per_block;  // untied head
  EXPECT_EQ(t.numel(), total);
  EXPECT_DOUBLE_EQ(model::count_params(c), double(total));
  const double s = c.block_size;
  const double flops = 6.0 * L * (2 * C * A + 2 * C * KVC + 3 * C * F) + 6.0 * V * C + 12.0 * L * A * s;
  EXPECT_DOUBLE_EQ(model_flops_per_token(c, false), flops);
  std::printf("tiny-llama, head_dim 48: %lld parameters, %.0f model FLOPs per token\n", (long long)total, flops);
}

TEST(HeadDim, RefusesWhatItCannotRun) {
  model::GPTConfig odd = llama48().model;
  odd.head_dim = 47;
  EXPECT_THROW(odd.validate(), ConfigError);  // RoPE rotates pairs
  model::GPTConfig qk = model::preset("tiny");
  qk.qk_norm = true;
  EXPECT_THROW(qk.validate(), ConfigError);  // the llama family's
  model::GPTConfig gpt = model::preset("tiny");
  gpt.head_dim = gpt.head_size() * 2;
  EXPECT_THROW(gpt.validate(), ConfigError);  // the gpt family's c_attn is 3 x n_embd
  gpt.head_dim = gpt.n_embd / gpt.n_head;     // the same size is fine
  EXPECT_NO_THROW(gpt.validate());
  TrainOptions o = llama48();
  o.model.head_dim = 0;
  o.model.n_embd = 130;  // 4 heads do not divide it without head_dim
  EXPECT_THROW(o.model.validate(), ConfigError);
  o.model.head_dim = 32;  // with it they need not
  EXPECT_NO_THROW(o.model.validate());
}

}  // namespace
}  // namespace shardlab::train
