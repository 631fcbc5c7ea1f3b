// Multi-head latent attention (DeepSeek-V3; GPTConfig::is_mla) under every
// parallel layout that touches attention: its unsharded forward is checked
// against Hugging Face's DeepseekV3Attention in plain loops
// (gpt_forward_test.cc) and its gradients against central differences
// (llama_gradcheck_test.cc); here each layout matches the unsharded model
// (tensor parallelism splits the up-projections by heads and runs the
// down-projections on every rank's own rows, sequence parallelism gathers
// the latents, pipelines and recomputation re-run them, expert parallelism
// and ZeRO around them), the shapes and counts follow MLA's, and what is not
// modeled is one error line.
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "model/config.h"
#include "model/params.h"
#include "model/train/calibration.h"
#include "model/train/trainer.h"
#include "model/train/verify.h"
#include "runtime/errors.h"
#include "tests/model/parallel/recompute_test_util.h"
#include "tests/model/train/train_test_util.h"

namespace shardlab::train {
namespace {

// tiny-moe (4 layers, n_embd 128, 4 heads, block 0 dense, 8 routed + 1
// shared experts) with DeepSeek-V3's attention at 1/32 of its width: q's
// latent 48, k/v's 32, scores over 16 + 8 features a head, values 16.
model::GPTConfig mla_model() {
  model::GPTConfig c = model::preset("tiny-moe");
  c.n_kv_head = 0;
  c.head_dim = 16, c.q_lora_rank = 48, c.kv_lora_rank = 32, c.qk_rope_head_dim = 8, c.v_head_dim = 16;
  c.block_size = 32;
  return c;
}

TrainOptions mla_run() {
  TrainOptions o;
  o.model = mla_model();
  o.steps = 3;
  o.keep_step0_grads = true;
  return o;
}

using testing::run;

struct Case {
  const char* name;
  TrainOptions o;
};

void expect_matches_unsharded(const std::vector<Case>& cases) {
  for (const Case& c : cases) {
    TrainOptions ref = c.o;
    ref.parallel = {};
    ref.micro_batches = c.o.micro_batches;
    // AdamW's flips set aside as `shardlab verify` sets them (verify.h adam_flip_bounds).
    const TrainResult reference = run(ref);
    const VerifyResult r = compare_runs(run(c.o), reference, model::ParamTable(c.o.model),
                                        {.grads = true, .flips = adam_flip_bounds(reference, ref.adam)});
    std::printf("mla, %s: loss rel diff %.2e, param rel L2 %.2e (%.2e less %zu AdamW flips), grad rel L2 %.2e "
                "(bound 1e-5)\n",
                c.name, r.max_loss_rel_diff, r.param_rel_l2, r.param_rel_l2_held, r.flips.size(), r.grad_rel_l2);
    if (r.first_mismatch)
      std::printf("  first mismatch: %s %s %.3e (max abs %.3e), flips %zu, tp drift '%s'\n",
                  r.first_mismatch->kind.c_str(), r.first_mismatch->name.c_str(), r.first_mismatch->value,
                  r.first_mismatch->max_abs, r.flips.size(), r.tp_drift.c_str());
    EXPECT_TRUE(r.passed) << c.name;
    EXPECT_LE(r.grad_rel_l2, 1e-5) << c.name;
  }
}

TEST(Mla, TensorParallelMatchesTheUnshardedModel) {
  std::vector<Case> cases;
  {
    TrainOptions o = mla_run();
    o.parallel.tp = 2;  // latents' gradients all-reduced before their norms
    cases.push_back({"tp 2", o});
  }
  {
    TrainOptions o = mla_run();
    o.parallel.tp = 4, o.parallel.sp = true;  // one head a rank; latents gathered, row-sum gradients staged
    cases.push_back({"tp 4 with sp", o});
  }
  {
    TrainOptions o = mla_run();
    o.model.q_lora_rank = 0;  // q_proj from the gathered hidden state
    o.parallel.tp = 2, o.parallel.sp = true;
    cases.push_back({"tp 2 with sp, q_proj", o});
  }
  {
    TrainOptions o = mla_run();
    o.parallel.tp = 2, o.parallel.sp = true;
    o.parallel.attention = parallel::AttentionKernel::kUnfused;
    cases.push_back({"tp 2 with sp, unfused core", o});
  }
  expect_matches_unsharded(cases);
}

// Context parallelism: the ring (or the all-gather) carries k at the scores'
// head size and v at the values' (narrower), RoPE turns each token at its
// global position, the chunks' partial outputs merge at the values' width.
TEST(Mla, ContextParallelMatchesTheUnshardedModel) {
  std::vector<Case> cases;
  {
    TrainOptions o = mla_run();
    o.parallel.cp = 2;
    cases.push_back({"cp 2 (ring)", o});
  }
  {
    TrainOptions o = mla_run();
    o.parallel.cp = 2, o.parallel.tp = 2, o.parallel.sp = true;
    o.parallel.cp_comm = parallel::CpComm::kAllGather;
    // Two steps: over a third AdamW turns this layout's fp32 summation order
    // into a parameter drift of 1.3e-5 (grad rel L2 5.7e-7 at step 0, the
    // same loss to 5e-7); `verify` holds it to its measured noise floor.
    o.steps = 2;
    cases.push_back({"cp 2 (all-gather) x tp 2 with sp", o});
  }
  {
    TrainOptions o = mla_run();
    o.parallel.cp = 2, o.parallel.dp = 2;
    o.parallel.attention = parallel::AttentionKernel::kUnfused;
    o.parallel.recompute = parallel::Recompute::kSelective;
    o.parallel.recompute_modules = parallel::kRecomputeMlaUpProj | parallel::kRecomputeCoreAttn;
    cases.push_back({"cp 2 x dp 2, unfused chunks, mla_up_proj and core_attn", o});
  }
  expect_matches_unsharded(cases);
}

// What the cp ring carries a hop: this rank's tokens' k at the scores' head
// size and v at the values' (4 heads of 24 and 16: 128 tokens x 160 fp32
// values = 81,920 B), not v padded to 24 (98,304 B).
TEST(Mla, TheRingCarriesTheValuesAtTheirOwnWidth) {
  TrainOptions o = mla_run();
  o.parallel.cp = 2;
  o.steps = 1;
  const TrainResult r = testing::run(o, nullptr, /*trace=*/true);
  const int64_t tokens = int64_t{o.model.batch_size} * o.model.block_size / 2, NH = 4, HS = 16 + 8, HV = 16;
  const uint64_t hop = uint64_t(tokens * NH * (HS + HV) * 4);
  int hops = 0;
  for (const TraceEvent& e : r.run.traces.at(0).events) {
    if (e.stream != StreamKind::kCpComm || e.bytes == 0) continue;
    EXPECT_EQ(e.bytes, hop) << e.name;
    ++hops;
  }
  std::printf("cp 2 ring: %d transfers of %llu bytes on device 0's cp stream (by hand %llu)\n", hops,
              (unsigned long long)hop, (unsigned long long)hop);
  EXPECT_GT(hops, 0);
}

TEST(Mla, PipelinesRecomputationAndDataParallelismMatchTheUnshardedModel) {
  std::vector<Case> cases;
  {
    TrainOptions o = mla_run();
    o.parallel.pp = 2, o.parallel.tp = 2, o.parallel.sp = true, o.micro_batches = 2;
    o.parallel.recompute = parallel::Recompute::kFull;
    cases.push_back({"pp 2 x tp 2 with sp, full recompute", o});
  }
  {
    TrainOptions o = mla_run();
    o.parallel.tp = 2, o.parallel.sp = true;
    o.parallel.recompute = parallel::Recompute::kSelective;  // core_attn
    cases.push_back({"tp 2 with sp, selective (core_attn)", o});
  }
  {
    TrainOptions o = mla_run();
    o.parallel.pp = 2, o.parallel.tp = 2, o.parallel.sp = true, o.micro_batches = 4;
    o.parallel.schedule = parallel::ScheduleKind::kZbH1;  // deferred weight gradients
    cases.push_back({"pp 2 x tp 2 with sp, zb-h1", o});
  }
  {
    TrainOptions o = mla_run();
    o.parallel.dp = 2, o.parallel.tp = 2, o.parallel.sp = true, o.parallel.ep = 2, o.parallel.zero = 1;
    cases.push_back({"dp 2 x tp 2 with sp, ep 2, zero 1", o});
  }
  {
    TrainOptions o = mla_run();
    o.parallel.dp = 2, o.parallel.tp = 2, o.parallel.zero = 3;
    cases.push_back({"dp 2 x tp 2, zero 3", o});
  }
  expect_matches_unsharded(cases);
}

// Megatron's mla_up_proj (the DeepSeek-V3 recipes'): the core's q, k and v
// are not kept; backward re-runs the up-projections and RoPE from the kept
// latents (gathered again under SP). The bits of no recomputation, the
// unsharded model's gradients, exactly those kernels again (each as long as
// its forward run), and the bytes by hand.
TEST(Mla, RecomputesTheUpProjectionsFromTheLatents) {
  TrainOptions o = mla_run();
  o.parallel.tp = 2, o.parallel.sp = true;
  const TrainResult none = testing::run(o);
  const TrainResult unsharded = testing::run(testing::unsharded(o));
  for (const unsigned m : {unsigned(parallel::kRecomputeMlaUpProj),
                           unsigned(parallel::kRecomputeMlaUpProj | parallel::kRecomputeCoreAttn)}) {
    TrainOptions r = o;
    r.parallel.recompute = parallel::Recompute::kSelective;
    r.parallel.recompute_modules = m;
    const std::string what = "mla, tp 2 with sp, " + parallel::recompute_modules_name(m);
    const TrainResult t = testing::run(r);
    testing::expect_same_bits(t, none, what);
    testing::expect_like_unsharded(t, unsharded, r.model, what);
  }
  // The kernels on device 0 over one step of one micro-batch: 4 blocks.
  TrainOptions r = o;
  r.steps = 1;
  r.parallel.recompute = parallel::Recompute::kSelective;
  r.parallel.recompute_modules = parallel::kRecomputeMlaUpProj;
  const TrainResult t = testing::run(r, nullptr, /*trace=*/true);
  std::map<std::string, int> again;
  std::map<std::string, std::vector<Time>> fwd, rec;
  const std::string suffix = ".recompute";
  for (const TraceEvent& e : t.run.traces[0].events) {
    std::string name = e.name;
    const bool re = name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
    if (re) name.resize(name.size() - suffix.size());
    (re ? rec : fwd)[name].push_back(e.end - e.start);
    again[name] += re;
  }
  const int L = r.model.n_layer;
  for (const auto& [kernel, n] : std::map<std::string, int>{{"attn.q_up.fwd", L},
                                                            {"attn.kv_up.fwd", L},
                                                            {"attn.mla_rope.fwd", L},
                                                            {"attn.q_down.fwd", 0},
                                                            {"attn.kv_down.fwd", 0},
                                                            {"attn.flash.fwd", 0}}) {
    EXPECT_EQ(again[kernel], n) << kernel;
    for (Time d : rec[kernel]) {
      bool seen = false;
      for (Time f : fwd[kernel]) seen |= f == d;
      EXPECT_TRUE(seen) << kernel << " re-run for " << d << " ps, no forward run that long";
    }
  }
  // Memory: two MLA blocks on one device, vocab 1,024 (the head's backward
  // is the peak, both blocks' kept activations resident): each keeps q and k
  // (N, NH·(Dn + Dr)) and v (N, NH·Dv) less, in fp32 real math.
  TrainOptions one = mla_run();
  one.model.n_expert = 0, one.model.n_moe_ffn = 0, one.model.n_shared_expert = 0, one.model.moe_first_dense = 0;
  one.model.n_layer = 2, one.model.vocab_size = 1024;
  one.steps = 1;
  const int64_t N = int64_t{one.model.batch_size} * one.model.block_size, NH = 4, HS = 16 + 8, Dv = 16;
  TrainOptions rec1 = one;
  rec1.parallel.recompute = parallel::Recompute::kSelective;
  rec1.parallel.recompute_modules = parallel::kRecomputeMlaUpProj;
  const uint64_t kept = testing::activation_peak(testing::run(one), 0);
  const uint64_t less = testing::activation_peak(testing::run(rec1), 0);
  const uint64_t by_hand = uint64_t(2 * N * NH * (2 * HS + Dv) * 4);
  std::printf("mla_up_proj: %llu bytes saved, by hand %llu\n", (unsigned long long)(kept - less),
              (unsigned long long)by_hand);
  EXPECT_EQ(kept - less, by_hand);
}

// One MLA block on one H100 (bf16, phantom, fused core), the FLOPs each
// kernel is charged, by hand: DeepSeek-V3's attention at its own widths
// (C 7168, 128 heads, q rank 1536, kv rank 512, 128 + 64 rope, v 128) on one
// sequence of 4,096 tokens. The core's q·kᵀ runs over 192 features a head
// and P·V over 128, each over the T(T+1)/2 causal pairs.
TEST(Mla, OneBlockChargesItsKernelsByHand) {
  TrainOptions o;
  o.model = model::preset("deepseek-v3");
  o.model.n_layer = 1, o.model.n_expert = 0, o.model.n_moe_ffn = 0, o.model.n_shared_expert = 0;
  o.model.moe_first_dense = 0, o.model.moe_groups = o.model.moe_group_top_k = 1, o.model.router_bias_rate = 0;
  o.model.n_ffn = 1024, o.model.vocab_size = 1024, o.model.batch_size = 1, o.model.block_size = 4096;
  o.steps = 1;
  o.phantom = true;
  const TrainResult r = testing::run_one_gpu_bf16(o, "h100-nvlink");
  std::map<std::string, double> flops;
  for (const TraceEvent& e : r.run.traces.at(0).events) flops[e.name] += e.flops;
  const double N = 4096, C = 7168, NH = 128, Lq = 1536, Lkv = 512, Dn = 128, Dr = 64, Dv = 128, Dq = Dn + Dr;
  const double pairs = NH * N * (N + 1) / 2;
  const std::map<std::string, double> want = {
      {"attn.q_down.fwd", 2 * N * C * Lq},
      {"attn.q_up.fwd", 2 * N * Lq * NH * Dq},
      {"attn.kv_down.fwd", 2 * N * C * (Lkv + Dr)},
      {"attn.kv_up.fwd", 2 * N * Lkv * NH * (Dn + Dv)},
      {"attn.c_proj.fwd", 2 * N * NH * Dv * C},
      {"attn.q_norm.fwd", 4 * N * Lq + 4 * N},
      {"attn.kv_norm.fwd", 4 * N * Lkv + 4 * N},
      {"attn.mla_rope.fwd", 3 * N * (NH + 1) * Dr},
      {"attn.flash.fwd", 2 * pairs * (Dq + Dv) + 5 * pairs},
      {"attn.flash.bwd", 2 * pairs * (3 * Dq + 2 * Dv) + 6 * pairs},
      // dgrad and wgrad: each 2·N·in·out
      {"attn.kv_up.dgrad", 2 * N * Lkv * NH * (Dn + Dv)},
      {"attn.kv_up.wgrad", 2 * N * Lkv * NH * (Dn + Dv)},
      {"attn.q_down.wgrad", 2 * N * C * Lq},
  };
  for (const auto& [kernel, f] : want) {
    std::printf("%-20s %.6e FLOPs charged, by hand %.6e\n", kernel.c_str(), flops[kernel], f);
    EXPECT_DOUBLE_EQ(flops[kernel], f) << kernel;
  }
}

// The tensors and counts by hand: q_a_proj (Lq, C), q_a_layernorm (Lq),
// q_b_proj (NH·(Dn + Dr), Lq), kv_a_proj_with_mqa (Lkv + Dr, C),
// kv_a_layernorm (Lkv), kv_b_proj (NH·(Dn + Dv), Lkv), o_proj (C, NH·Dv);
// Megatron's FLOPs per token (training.py's MLA terms).
TEST(Mla, ShapesAndCountsFollowTheLatents) {
  const model::GPTConfig c = mla_model();
  const int64_t C = 128, NH = 4, Lq = 48, Lkv = 32, Dn = 16, Dr = 8, Dv = 16;
  const model::ParamTable t(c);
  const auto shape = [&](const char* name) { return t.at(std::string("model.layers.1.self_attn.") + name).shape; };
  EXPECT_EQ(shape("q_a_proj.weight"), (Shape{Lq, C}));
  EXPECT_EQ(shape("q_a_layernorm.weight"), (Shape{Lq}));
  EXPECT_EQ(shape("q_b_proj.weight"), (Shape{NH * (Dn + Dr), Lq}));
  EXPECT_EQ(shape("kv_a_proj_with_mqa.weight"), (Shape{Lkv + Dr, C}));
  EXPECT_EQ(shape("kv_a_layernorm.weight"), (Shape{Lkv}));
  EXPECT_EQ(shape("kv_b_proj.weight"), (Shape{NH * (Dn + Dv), Lkv}));
  EXPECT_EQ(shape("o_proj.weight"), (Shape{C, NH * Dv}));
  EXPECT_EQ(t.find("model.layers.1.self_attn.k_proj.weight"), nullptr);
  const int64_t attn = Lq * C + Lq + NH * (Dn + Dr) * Lq + (Lkv + Dr) * C + Lkv + NH * (Dn + Dv) * Lkv + C * NH * Dv;
  model::GPTConfig dense = c;
  dense.n_kv_head = dense.head_dim = dense.q_lora_rank = dense.kv_lora_rank = 0;
  dense.qk_rope_head_dim = dense.v_head_dim = 0;  // the same model with tiny-llama's MHA of 4 x 32
  const int64_t mha = 4 * C * C;
  EXPECT_EQ(t.numel(), model::ParamTable(dense).numel() - 4 * mha + 4 * attn);
  EXPECT_DOUBLE_EQ(model::count_params(c), double(t.numel()));
  // Megatron: 6 x (q_term + kv terms + o_proj) per block, the core at Dqk + Dv a head, not halved here.
  const double q_term = Lq * (C + NH * (Dn + Dr) + 1.0), kv_term = Lkv * (C + NH * (Dn + Dv) + 1.0) + C * Dr;
  const double s = c.block_size;
  const double mla_dense = model_flops_per_token(c, false) - model_flops_per_token(dense, false);
  const double want = 6.0 * 4 * (q_term + kv_term + NH * Dv * C - 4.0 * C * C) +
                      6.0 * 4 * NH * ((Dn + Dr + Dv) - 2.0 * 32) * s;
  EXPECT_DOUBLE_EQ(mla_dense, want);
  std::printf("tiny-moe with MLA: %lld parameters (%lld a block's attention), %.0f model FLOPs per token\n",
              (long long)t.numel(), (long long)attn, model_flops_per_token(c, false));
}

TEST(Mla, RefusesWhatItCannotRun) {
  const auto refused = [](model::GPTConfig c) { EXPECT_THROW(c.validate(), ConfigError); };
  model::GPTConfig c = mla_model();
  c.qk_rope_head_dim = 7;  // RoPE rotates pairs
  refused(c);
  c = mla_model();
  c.v_head_dim = 32;  // wider than the scores' 24
  refused(c);
  c = mla_model();
  c.n_kv_head = 2;  // no GQA under MLA
  refused(c);
  c = mla_model();
  c.kv_lora_rank = 0;  // the other MLA fields alone
  refused(c);
  c = model::preset("tiny");
  c.kv_lora_rank = 8, c.qk_rope_head_dim = 4;  // the gpt family
  refused(c);
}

}  // namespace
}  // namespace shardlab::train
