// --attention fused against unfused on one GPT layer on an H100 (bf16), by hand.
//
// The layer: one sequence of T = 2816 tokens, 12 heads of HS = 128, no
// dropout, phantom. The causal fused kernel does T(T+1)/2 (query, key) pairs
// per head; its GEMMs are modeled over the causal half of the keys,
// 1408 = T/2 (the scores GEMM 2816 x 1408 and P·V 2816 x 128, 12 heads;
// backward's two and three GEMMs x 24 and x 36 heads): 4·HS·NH·T·T/2 FLOPs
// forward and 10·HS·NH·T·T/2 backward. h100-nvlink carries cuDNN's
// published rates (Shah et al. 2024, FlashAttention-3, Figures 5 and 6, H100
// SXM5, head dim 128, BF16), and T = 2816 lies between the 2k and 4k points,
// x = log2(2816/2048) of the way: causal forward 484 -> 518 TFLOP/s, forward
// without a mask 617 -> 609, backward without a mask 465 -> 499; the causal
// backward is that backward times the forward's causal/non-causal ratio.
//   forward   those FLOPs at the causal forward rate; reads Q, K, V, writes O, lse
//   preprocess D = rowsum(dO ⊙ O): 2 FLOPs per element of O; reads dO, O
//   backward  those FLOPs at the causal backward rate
// Memory: the unfused core keeps the B·NH·T·T probabilities, the fused one
// the log-sum-exp, B·NH·T (at 2 B per modeled element). Every other kernel
// is the unfused run's to the picosecond, and real math gives the same bits.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <utility>

#include <gtest/gtest.h>

#include "tests/model/train/train_test_util.h"

namespace shardlab::train {
namespace {

constexpr int64_t kT = 2816, kNH = 12, kHS = 128;
constexpr double kLaunchPs = 4e6, kBw = 3350e9 * 0.90, kOther = 989e12 * 0.7;

struct Charged {
  std::map<std::string, double> ps;
  DeviceStats stats;
};

Charged run(parallel::AttentionKernel attention, const char* kernel = "") {
  TrainOptions o;
  o.model = model::preset("tiny");
  o.model.n_layer = 1;
  o.model.n_embd = kNH * kHS;
  o.model.n_head = kNH;
  o.model.block_size = kT;
  o.model.vocab_size = 1536;
  o.model.batch_size = 1;
  o.model.dropout = 0;
  o.steps = 1;
  o.phantom = true;
  o.parallel.attention = attention;
  const TrainResult r = testing::run_one_gpu_bf16(o, "h100-nvlink", kernel);
  Charged out;
  for (const TraceEvent& e : r.run.traces.at(0).events)
    if (e.stream == StreamKind::kCompute) out.ps[e.name] += double(e.end - e.start);
  out.stats = r.run.devices.at(0);
  return out;
}

double ps(double seconds) { return std::ceil(seconds * 1e12); }

TEST(FusedAttention, OneLayerAgainstAHandCount) {
  const Charged unfused = run(parallel::AttentionKernel::kUnfused), fused = run(parallel::AttentionKernel::kFused);
  const double tiled = double(kNH) * kT * (kT / 2);  // 47,579,136 (query, key) pairs: what the GEMMs cover
  const double rows = double(kNH) * kT, NC = rows * kHS;
  const double x = std::log2(double(kT) / 2048);
  const double fwd_causal = 484 + x * (518 - 484), fwd_full = 617 + x * (609 - 617), bwd_full = 465 + x * (499 - 465);
  const double bwd_causal = bwd_full * fwd_causal / fwd_full;
  std::printf("cuDNN at T = %lld: causal forward %.2f TFLOP/s, causal backward %.2f\n", (long long)kT, fwd_causal,
              bwd_causal);
  const double fwd = kLaunchPs + std::max(std::ceil(4 * kHS * tiled / fwd_causal),  // TFLOP/s = FLOP/ps
                                           ps((4 * NC * 2 + 4 * rows) / kBw));
  const double pre = kLaunchPs + std::max(ps(2 * NC / kOther), ps((2 * NC * 2 + 4 * rows) / kBw));
  const double bwd = kLaunchPs + std::max(std::ceil(10 * kHS * tiled / bwd_causal),
                                           ps((7 * NC * 2 + 8 * rows) / kBw));
  EXPECT_EQ(fused.ps.at("attn.flash.fwd"), fwd);
  EXPECT_EQ(fused.ps.at("attn.flash.bwd_preprocess"), pre);
  EXPECT_EQ(fused.ps.at("attn.flash.bwd"), bwd);
  double unfused_core = 0;
  for (const auto& [name, t] : unfused.ps) {
    if (name.starts_with("attn.scores.") || name.starts_with("attn.softmax.") || name.starts_with("attn.context.")) {
      unfused_core += t;
      continue;
    }
    EXPECT_EQ(fused.ps.at(name), t) << name << " is outside the attention core";
  }
  // The probabilities (B·NH·T·T) against the log-sum-exp (B·NH·T), 2 B each.
  const auto act = [](const Charged& r) { return double(r.stats.peak_by_kind[int(MemKind::kActivation)]); };
  EXPECT_EQ(act(unfused) - act(fused), 2.0 * (rows * kT - rows));
  std::printf("attention core of one layer, fwd+bwd: unfused %.3f us, fused %.3f us (%.2fx); activations %.1f -> %.1f MiB\n",
              unfused_core / 1e6, (fwd + pre + bwd) / 1e6, unfused_core / (fwd + pre + bwd), act(unfused) / 1048576,
              act(fused) / 1048576);
}

// --attention-kernel fa2: the same layer's two flash kernels at
// FlashAttention-2's published rates (the same figures' 2k and 4k points:
// causal forward 298 -> 319, forward without a mask 362 -> 368, backward
// 291 -> 310), the preprocessing kernel and everything else unchanged.
TEST(FusedAttention, FlashAttention2KernelAgainstAHandCount) {
  const Charged cudnn = run(parallel::AttentionKernel::kFused), fa2 = run(parallel::AttentionKernel::kFused, "fa2");
  const double tiled = double(kNH) * kT * (kT / 2);
  const double rows = double(kNH) * kT, NC = rows * kHS;
  const double x = std::log2(double(kT) / 2048);
  const double fwd_causal = 298 + x * (319 - 298), fwd_full = 362 + x * (368 - 362), bwd_full = 291 + x * (310 - 291);
  const double bwd_causal = bwd_full * fwd_causal / fwd_full;
  std::printf("FlashAttention-2 at T = %lld: causal forward %.2f TFLOP/s, causal backward %.2f\n", (long long)kT,
              fwd_causal, bwd_causal);
  const double fwd = kLaunchPs + std::max(std::ceil(4 * kHS * tiled / fwd_causal), ps((4 * NC * 2 + 4 * rows) / kBw));
  const double bwd = kLaunchPs + std::max(std::ceil(10 * kHS * tiled / bwd_causal), ps((7 * NC * 2 + 8 * rows) / kBw));
  EXPECT_EQ(fa2.ps.at("attn.flash.fwd"), fwd);
  EXPECT_EQ(fa2.ps.at("attn.flash.bwd"), bwd);
  for (const auto& [name, t] : cudnn.ps) {
    if (name != "attn.flash.fwd" && name != "attn.flash.bwd") {
      EXPECT_EQ(fa2.ps.at(name), t) << name;
    }
  }
  std::printf("flash forward + backward: cuDNN %.3f us, FlashAttention-2 %.3f us (%.2fx)\n",
              (cudnn.ps.at("attn.flash.fwd") + cudnn.ps.at("attn.flash.bwd")) / 1e6, (fwd + bwd) / 1e6,
              (fwd + bwd) / (cudnn.ps.at("attn.flash.fwd") + cudnn.ps.at("attn.flash.bwd")));
}

// Real math: the fused core runs the host kernels of the unfused one, so
// every loss is the same to the bit (tp 2, three steps).
// `o` at tp 2 with the unfused and the fused core: every loss the same bits.
std::pair<TrainResult, TrainResult> unfused_and_fused(TrainOptions o) {
  o.parallel.tp = 2;
  o.parallel.attention = parallel::AttentionKernel::kUnfused;
  TrainResult a = testing::run(o);
  o.parallel.attention = parallel::AttentionKernel::kFused;
  TrainResult b = testing::run(o);
  EXPECT_EQ(a.steps.size(), b.steps.size());
  for (size_t i = 0; i < std::min(a.steps.size(), b.steps.size()); ++i)
    EXPECT_EQ(a.steps[i].loss, b.steps[i].loss) << "step " << i;
  return {std::move(a), std::move(b)};
}

TEST(FusedAttention, RealMathIsTheUnfusedBits) {
  const auto [a, b] = unfused_and_fused(testing::small_options());
  EXPECT_LT(b.steps.back().virtual_end, a.steps.back().virtual_end);
}

// GQA (8 query heads sharing 2 K/V heads of 64, tiny-llama's block, B 2 x
// T 256, bf16 on an A100): the unfused core runs repeat_kv, a copy of N =
// 512 rows, reading (8 + 2·2)·64 = 768 and writing 3·8·64 = 1536 elements
// each, 512 x 2304 x 2 B = 2,359,296 B (forward, the backward's
// re-expansion for the core, and the backward's sum of each group's
// gradients into its K/V head); the fused core reads the K/V heads in place
// (Transformer Engine passes num_gqa_groups to cuDNN's and FlashAttention's
// kernels): no repeat_kv kernel, and every other kernel outside the core
// as the unfused run's. Real math: the same bits at tp 2.
TrainOptions gqa_layer(parallel::AttentionKernel attention) {
  TrainOptions o;
  o.model = model::preset("tiny-llama");
  o.model.n_layer = 1;
  o.model.n_embd = 512;
  o.model.n_head = 8;
  o.model.n_kv_head = 2;
  o.model.block_size = 256;
  o.model.vocab_size = 1024;
  o.model.batch_size = 2;
  o.model.dropout = 0;
  o.steps = 1;
  o.phantom = true;
  o.parallel.attention = attention;
  return o;
}

TEST(FusedAttention, GqaKvHeadsReadInPlaceNoRepeatKv) {
  std::map<std::string, std::pair<double, int>> by[2];  // [fused] kernel name -> (ps, launches)
  for (int fused = 0; fused < 2; ++fused) {
    const TrainResult r = testing::run_one_gpu_bf16(
        gqa_layer(fused ? parallel::AttentionKernel::kFused : parallel::AttentionKernel::kUnfused), "a100-nvlink");
    for (const TraceEvent& e : r.run.traces.at(0).events)
      if (e.stream == StreamKind::kCompute) by[fused][e.name].first += double(e.end - e.start), ++by[fused][e.name].second;
  }
  const CostModel a100(load_profile("a100-nvlink").device, Precision::kBf16);
  const double copy = double(a100.duration(OpCost{0, 512.0 * (768 + 1536) * 2}));
  EXPECT_EQ(by[0].at("attn.repeat_kv.fwd"), std::make_pair(2 * copy, 2));
  EXPECT_EQ(by[0].at("attn.repeat_kv.bwd"), std::make_pair(copy, 1));
  for (const auto& [name, t] : by[1]) EXPECT_FALSE(name.starts_with("attn.repeat_kv")) << name;
  for (const auto& [name, t] : by[0]) {
    if (name.starts_with("attn.scores.") || name.starts_with("attn.softmax.") || name.starts_with("attn.context.") ||
        name.starts_with("attn.repeat_kv."))
      continue;
    EXPECT_EQ(by[1].at(name), t) << name << " is outside the attention core";
  }
  std::printf("repeat_kv of one GQA layer (unfused core): %.3f us a copy, %.3f us a step; fused: none\n", copy / 1e6,
              3 * copy / 1e6);
  TrainOptions o = testing::small_options();
  const model::GPTConfig small = o.model;
  o.model = model::preset("tiny-llama");
  for (auto f : {&model::GPTConfig::n_layer, &model::GPTConfig::n_embd, &model::GPTConfig::n_head,
                 &model::GPTConfig::block_size, &model::GPTConfig::vocab_size, &model::GPTConfig::batch_size})
    o.model.*f = small.*f;
  o.model.n_kv_head = 2;
  unfused_and_fused(o);
}

TEST(FusedAttention, DefaultsByFamily) {
  EXPECT_FALSE(parallel::fused_attention(parallel::AttentionKernel::kAuto, /*llama=*/false));
  EXPECT_TRUE(parallel::fused_attention(parallel::AttentionKernel::kAuto, /*llama=*/true));
  EXPECT_TRUE(parallel::fused_attention(parallel::AttentionKernel::kFused, false));
  EXPECT_FALSE(parallel::fused_attention(parallel::AttentionKernel::kUnfused, true));
  EXPECT_THROW(parallel::parse_attention_kernel("flash"), ConfigError);
}

}  // namespace
}  // namespace shardlab::train
