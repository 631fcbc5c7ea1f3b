// --fusions: each element-wise chain charged fused or unfused, on one layer
// against a hand count of its kernels (FLOPs, bytes, launches).
//
// One block (phantom, bf16 on a100-nvlink, one GPU), B = 2 sequences of
// T = 256, C = 512 (8 heads of 64), F = 4C (GPT) or the llama preset's
// SwiGLU width. n = B·T·C elements per activation; every op costs
// CostModel::duration of its (FLOPs, bytes): launch + max(compute, memory).
// The hand counts below give each op's FLOPs and bytes (2 B per element,
// 1 B per dropout mask element); only the op's time formula is the cost
// model's (tested in tests/runtime). Every other kernel must be the default
// run's to the picosecond, and real math the same bits.
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "model/fusions.h"
#include "tests/model/train/train_test_util.h"

namespace shardlab::train {
namespace {

constexpr int64_t kB = 2, kT = 256, kC = 512, kNH = 8;
constexpr double kN = double(kB * kT * kC);  // 262,144 elements
constexpr double kElem = 2;                  // bf16

struct Charged {
  std::map<std::string, double> ps;    // compute-stream time by kernel name
  std::map<std::string, int> launches;  // kernels by name
  Time step = 0;
};

TrainOptions layer(bool llama) {
  TrainOptions o;
  o.model = model::preset(llama ? "tiny-llama" : "tiny");
  o.model.n_layer = 1;
  o.model.n_embd = kC;
  o.model.n_head = kNH;
  if (llama) o.model.n_kv_head = kNH;
  o.model.block_size = kT;
  o.model.vocab_size = 1024;
  o.model.batch_size = kB;
  o.model.dropout = llama ? 0 : 0.1;
  o.steps = 1;
  o.phantom = true;
  o.parallel.attention = parallel::AttentionKernel::kUnfused;
  return o;
}

Charged run(TrainOptions o, const char* fusions) {
  std::string error;
  EXPECT_TRUE(model::parse_fusions(fusions, o.parallel.fusions, error)) << error;
  const TrainResult r = testing::run_one_gpu_bf16(o, "a100-nvlink");
  Charged out;
  for (const TraceEvent& e : r.run.traces.at(0).events)
    if (e.stream == StreamKind::kCompute) out.ps[e.name] += double(e.end - e.start), ++out.launches[e.name];
  out.step = r.steps.back().virtual_end;
  return out;
}

const CostModel& a100() {
  static const CostModel kModel(load_profile("a100-nvlink").device, Precision::kBf16);
  return kModel;
}
// The time of ops of (FLOPs, elements, extra bytes), as the device charges them.
double charged(const std::vector<std::array<double, 3>>& ops) {
  double ps = 0;
  for (const auto& [flops, elements, extra] : ops) ps += double(a100().duration(OpCost{flops, elements * kElem + extra}));
  return ps;
}

// Every kernel but `changed` takes the same time in both runs.
void expect_rest_equal(const Charged& a, const Charged& b, const std::vector<std::string>& changed) {
  auto rest = [&](std::map<std::string, double> m) {
    for (const std::string& name : changed) m.erase(name);
    return m;
  };
  EXPECT_EQ(rest(a.ps), rest(b.ps));
}

TEST(KernelFusions, ParseAppliesItemsInOrder) {
  model::KernelFusions f;
  EXPECT_EQ(model::to_string(f), "norm,swiglu,softmax,cross-entropy");
  std::string error;
  ASSERT_TRUE(model::parse_fusions("none,norm", f, error));
  EXPECT_EQ(model::to_string(f), "norm");
  ASSERT_TRUE(model::parse_fusions("all,no-softmax", f, error));
  EXPECT_EQ(model::to_string(f), "norm,swiglu,bias-dropout-add,cross-entropy");
  ASSERT_TRUE(model::parse_fusions("none", f, error));
  EXPECT_EQ(model::to_string(f), "none");
  const model::KernelFusions before = f;
  for (const char* bad : {"", "norm,", "no-all", "fused", "no-", "bias_dropout_add"}) {
    EXPECT_FALSE(model::parse_fusions(bad, f, error)) << bad;
    EXPECT_NE(error.find("unknown kernel fusion"), std::string::npos) << error;
    EXPECT_EQ(f, before) << bad << ": a bad list changes nothing";
  }
}

// Unfused (the default): the bias add (reads x and the bias, writes x: n FLOPs,
// 2n + C elements), the dropout (2n FLOPs, 2n elements and the n-byte mask),
// the residual add (n, 3n); after the attention and after the MLP. Fused:
// one kernel each, 4n FLOPs, 3n + C elements and the mask.
TEST(KernelFusions, BiasDropoutAddOneGptLayerByHand) {
  const Charged unfused = run(layer(false), "no-bias-dropout-add"), fused = run(layer(false), "bias-dropout-add");
  const double bias = charged({{kN, 2 * kN + kC, 0}}), dropout = charged({{2 * kN, 2 * kN, kN}}),
               residual = charged({{kN, 3 * kN, 0}}), bda = charged({{4 * kN, 3 * kN + kC, kN}});
  for (const char* where : {"attn", "mlp"}) {
    const std::string w = where;
    EXPECT_EQ(unfused.ps.at(w + ".c_proj.bias.fwd"), bias) << w;
    EXPECT_EQ(unfused.ps.at(w + ".hidden_dropout.fwd"), dropout) << w;
    EXPECT_EQ(fused.ps.at(w + ".bias_dropout_add.fwd"), bda) << w;
    EXPECT_EQ(fused.launches.at(w + ".bias_dropout_add.fwd"), 1) << w;
    EXPECT_EQ(fused.ps.count(w + ".c_proj.bias.fwd") + fused.ps.count(w + ".hidden_dropout.fwd"), 0u) << w;
  }
  EXPECT_EQ(unfused.ps.at("residual.fwd"), 2 * residual);
  EXPECT_EQ(fused.ps.count("residual.fwd"), 0u);
  expect_rest_equal(unfused, fused,
                    {"attn.c_proj.bias.fwd", "attn.hidden_dropout.fwd", "mlp.c_proj.bias.fwd",
                     "mlp.hidden_dropout.fwd", "residual.fwd", "attn.bias_dropout_add.fwd",
                     "mlp.bias_dropout_add.fwd"});
  const double saved = 2 * (bias + dropout + residual - bda);
  std::printf("bias-dropout-add fused saves %.0f ps a layer (%.3f%% of the step)\n", saved,
              100 * saved / double(unfused.step));
  EXPECT_EQ(double(unfused.step - fused.step), saved);  // one GPU: nothing else overlaps them
}

// Unfused softmax: masked_fill (1 op per score, reads and writes the B·NH·T·T
// scores) then the softmax without the mask's op (4 per score); in backward
// the mask's gradient, another such pass, after the softmax's.
TEST(KernelFusions, UnfusedSoftmaxAddsTheMaskPasses) {
  const Charged fused = run(layer(false), "softmax"), unfused = run(layer(false), "no-softmax");
  const double scores = double(kB) * kNH * kT * kT;
  const double mask = charged({{scores, 2 * scores, 0}});
  EXPECT_EQ(unfused.ps.at("attn.mask.fwd"), mask);
  EXPECT_EQ(unfused.ps.at("attn.mask.bwd"), mask);
  EXPECT_EQ(unfused.ps.at("attn.softmax.fwd"), charged({{4 * scores, 2 * scores, 0}}));
  EXPECT_EQ(fused.ps.at("attn.softmax.fwd"), charged({{5 * scores, 2 * scores, 0}}));
  EXPECT_EQ(fused.ps.count("attn.mask.fwd") + fused.ps.count("attn.mask.bwd"), 0u);
  expect_rest_equal(fused, unfused, {"attn.softmax.fwd", "attn.mask.fwd", "attn.mask.bwd"});
}

// Unfused RMSNorm, the ops of Llama's reference x · rsqrt(mean(x²) + eps) · w
// (R = B·T rows): x² (n, 2n), mean (n, n + R), + eps (R, 2R), rsqrt (2R,
// 2R), · r (n, 2n + R), · w (n, 2n + C); backward, as autograd runs them:
// dy · w (n, 2n + C), dy · x̂ (n, 3n) and its sum over rows (n, n + C),
// g · r (n, 2n + R), g · x (n, 3n) and its row sum (n, n + R), rsqrt's
// gradient (3R, 3R), the mean's expanded (n, R + n), x²'s 2 · x · g (2n, 3n),
// the two gradients of x added (n, 3n). Unfused SwiGLU over n_f = R·F:
// silu (5 n_f, 2 n_f), the product (n_f, 3 n_f); backward the product's two
// gradients (n_f, 3 n_f each), silu's (9 n_f, 3 n_f), the chunk's cat (0, 4 n_f).
TEST(KernelFusions, UnfusedRmsNormAndSwiGluAreTheirKernels) {
  const TrainOptions o = layer(true);
  const Charged fused = run(o, "norm,swiglu"), unfused = run(o, "no-norm,no-swiglu");
  const double n = kN, R = double(kB * kT), C = kC, nf = R * o.model.ffn_hidden();
  const double norm_fwd = charged({{n, 2 * n, 0}, {n, n + R, 0}, {R, 2 * R, 0}, {2 * R, 2 * R, 0},
                                   {n, 2 * n + R, 0}, {n, 2 * n + C, 0}});
  const double norm_bwd = charged({{n, 2 * n + C, 0}, {n, 3 * n, 0}, {n, n + C, 0}, {n, 2 * n + R, 0},
                                   {n, 3 * n, 0}, {n, n + R, 0}, {3 * R, 3 * R, 0}, {n, R + n, 0},
                                   {2 * n, 3 * n, 0}, {n, 3 * n, 0}});
  for (const char* name : {"ln_1.fwd", "ln_2.fwd", "ln_f.fwd"}) {
    EXPECT_EQ(unfused.launches.at(name), 6) << name;
    EXPECT_EQ(fused.launches.at(name), 1) << name;
    EXPECT_EQ(unfused.ps.at(name), norm_fwd) << name;
  }
  for (const char* name : {"ln_1.bwd", "ln_2.bwd", "ln_f.bwd"}) {
    EXPECT_EQ(unfused.launches.at(name), 10) << name;
    EXPECT_EQ(unfused.ps.at(name), norm_bwd) << name;
  }
  EXPECT_EQ(unfused.launches.at("mlp.swiglu.fwd"), 2);
  EXPECT_EQ(unfused.ps.at("mlp.swiglu.fwd"), charged({{5 * nf, 2 * nf, 0}, {nf, 3 * nf, 0}}));
  EXPECT_EQ(unfused.launches.at("mlp.swiglu.bwd"), 4);
  EXPECT_EQ(unfused.ps.at("mlp.swiglu.bwd"),
            charged({{nf, 3 * nf, 0}, {nf, 3 * nf, 0}, {9 * nf, 3 * nf, 0}, {0, 4 * nf, 0}}));
  EXPECT_EQ(fused.ps.at("mlp.swiglu.fwd"), charged({{6 * nf, 3 * nf, 0}}));
  expect_rest_equal(fused, unfused,
                    {"ln_1.fwd", "ln_2.fwd", "ln_f.fwd", "ln_1.bwd", "ln_2.bwd", "ln_f.bwd", "mlp.swiglu.fwd",
                     "mlp.swiglu.bwd"});
  // LayerNorm is one kernel in PyTorch too: the GPT layer's norms do not move.
  const Charged gpt_fused = run(layer(false), "norm"), gpt_unfused = run(layer(false), "no-norm");
  EXPECT_EQ(gpt_fused.ps, gpt_unfused.ps);
}

// Real math: every choice runs the same host kernels, so the losses are the
// default's to the bit (tp 2, three steps; GPT and llama).
TEST(KernelFusions, RealMathIsTheSameBits) {
  for (const char* preset : {"tiny", "tiny-llama"}) {
    TrainOptions o = testing::small_options();
    o.model = model::preset(preset);
    o.model.n_layer = 2;
    o.model.batch_size = 8;
    o.parallel.tp = 2;
    const TrainResult base = testing::run(o, nullptr, false, Precision::kBf16);
    for (const char* list : {"none", "all"}) {
      std::string error;
      TrainOptions v = o;
      ASSERT_TRUE(model::parse_fusions(list, v.parallel.fusions, error));
      const TrainResult r = testing::run(v, nullptr, false, Precision::kBf16);
      ASSERT_EQ(r.steps.size(), base.steps.size());
      for (size_t i = 0; i < r.steps.size(); ++i)
        EXPECT_EQ(r.steps[i].loss, base.steps[i].loss) << preset << " " << list << " step " << i;
      EXPECT_EQ(r.final_params, base.final_params) << preset << " " << list;
      if (std::string(list) == "none") {
        EXPECT_GT(r.steps.back().virtual_end, base.steps.back().virtual_end);
      }
    }
  }
}

}  // namespace
}  // namespace shardlab::train
