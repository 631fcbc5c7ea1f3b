// The llama family's kernels and layers against hand values and fp64 central
// finite differences: RMSNorm, SwiGLU, RoPE (rotate-half), repeat_kv (GQA),
// the attention and MLP layers and the whole unsharded model, tied and
// untied. Each check prints its max relative error next to its tolerance.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <string>

#include "gradcheck.h"
#include "model/gpt.h"
#include "model/kernels_llama.h"
#include "model/kernels_mla.h"
#include "test_models.h"

namespace shardlab::model {
namespace {

using testing::Accum;
using testing::check_gradients;
using testing::dot;
using testing::kKernelTol;
using testing::random_vector;

// Hand values: x = (3, 4), w = (1, 2), eps 0: mean x² = 12.5, y = x·w/√12.5.
TEST(LlamaKernels, RmsNormHandValue) {
  const double x[2] = {3, 4}, w[2] = {1, 2};
  double y[2], rstd;
  rmsnorm_forward(y, &rstd, x, w, 1, 2, 0.0);
  const double r = 1 / std::sqrt(12.5);
  std::printf("rmsnorm: |diff| %.1e %.1e (tol 1e-15)\n", std::abs(y[0] - 3 * r), std::abs(y[1] - 8 * r));
  EXPECT_NEAR(y[0], 3 * r, 1e-15);
  EXPECT_NEAR(y[1], 8 * r, 1e-15);
}

// Rotate-half at position 1, HS 4, theta 100: pair 0 turns by 1 rad, pair 1
// (features 1 and 3) by 100^(-2/4) = 0.1 rad.
TEST(LlamaKernels, RopeRotateHalfHandValue) {
  const double x[4] = {1, 2, 0, 0};
  double y[4];
  const int64_t pos[2] = {0, 1};
  double rows[8] = {9, 9, 9, 9, 1, 2, 0, 0};  // t 0 stays, t 1 rotates
  rope_forward(rows, rows, pos, 1, 2, 1, 4, 4, 100.0);
  std::copy_n(rows + 4, 4, y);
  const double want[4] = {std::cos(1.0), 2 * std::cos(0.1), std::sin(1.0), 2 * std::sin(0.1)};
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(y[i], want[i], 1e-15) << i;
  for (int i = 0; i < 4; ++i) EXPECT_EQ(rows[i], 9) << "position 0 is the identity";
  (void)x;
}

TEST(LlamaKernels, RmsNormGradcheck) {
  std::mt19937_64 rng(11);
  const int N = 5, C = 8;
  auto x = random_vector(rng, N * C, 2.0), weight = random_vector(rng, C), w = random_vector(rng, N * C);
  auto loss = [&] {
    std::vector<double> out(N * C), rstd(N);
    rmsnorm_forward(out.data(), rstd.data(), x.data(), weight.data(), N, C, 1e-5);
    return dot(out, w);
  };
  std::vector<double> out(N * C), rstd(N);
  rmsnorm_forward(out.data(), rstd.data(), x.data(), weight.data(), N, C, 1e-5);
  Accum dx(rng, N * C), dweight(rng, C);
  rmsnorm_backward(dx.data(), dweight.data(), w.data(), x.data(), weight.data(), rstd.data(), N, C);
  auto g1 = dx.delta(), g2 = dweight.delta();
  check_gradients("rmsnorm", {{"dinp", &x, &g1}, {"dweight", &weight, &g2}}, loss, kKernelTol);
}

TEST(LlamaKernels, SwigluGradcheck) {
  std::mt19937_64 rng(12);
  const int N = 4, F = 6;
  auto gu = random_vector(rng, N * 2 * F, 2.0), w = random_vector(rng, N * F);
  auto loss = [&] {
    std::vector<double> out(N * F);
    swiglu_forward(out.data(), gu.data(), N, F);
    return dot(out, w);
  };
  Accum dgu(rng, N * 2 * F);
  swiglu_backward(dgu.data(), w.data(), gu.data(), N, F);
  auto g = dgu.delta();
  check_gradients("swiglu", {{"dgate_up", &gu, &g}}, loss, kKernelTol);
}

// Rows of stride 20 with 3 rotated heads of 4 (features 12..19 untouched),
// positions as a context-parallel rank would pass them (not 0..T-1).
TEST(LlamaKernels, RopeGradcheckAtGivenPositions) {
  std::mt19937_64 rng(13);
  const int B = 2, T = 3, heads = 3, HS = 4, stride = 20;
  const int64_t pos[T] = {5, 6, 17};
  auto x = random_vector(rng, B * T * stride), w = random_vector(rng, B * T * stride);
  auto loss = [&] {
    std::vector<double> out = x;
    rope_forward(out.data(), x.data(), pos, B, T, heads, HS, stride, 500000.0);
    return dot(out, w);
  };
  // d(w · R x)/dx = Rᵀ w, and the untouched features pass w through.
  std::vector<double> g = w;
  rope_backward(g.data(), w.data(), pos, B, T, heads, HS, stride, 500000.0);
  check_gradients("rope", {{"dinp", &x, &g}}, loss, kKernelTol);
}

// 4 query heads over 2 K/V heads (G 2), and a TP rank's view: local query
// heads 2..3 (q0 2) of a rank holding every K/V head (kv0 0).
TEST(LlamaKernels, RepeatKvGradcheckAndMapping) {
  std::mt19937_64 rng(14);
  for (const GqaHeads g : {GqaHeads{4, 2, 3, 2, 0, 0}, GqaHeads{2, 2, 3, 2, 2, 0}}) {
    const int N = 3;
    auto x = random_vector(rng, N * g.in_width()), w = random_vector(rng, N * g.out_width());
    std::vector<double> out(N * g.out_width());
    repeat_kv_forward(out.data(), x.data(), N, g);
    // Query head h's k is K/V head (q0 + h)/G: row 1, head 1, feature 2.
    const int64_t Cq = int64_t{g.NHq} * g.HS;
    EXPECT_EQ(out[g.out_width() + Cq + 1 * g.HS + 2], x[g.in_width() + Cq + ((g.q0 + 1) / g.G) * g.HS + 2]);
    auto loss = [&] {
      repeat_kv_forward(out.data(), x.data(), N, g);
      return dot(out, w);
    };
    Accum dx(rng, N * g.in_width());
    repeat_kv_backward(dx.data(), w.data(), N, g);
    auto d = dx.delta();
    check_gradients("repeat_kv", {{"din", &x, &d}}, loss, kKernelTol);
  }
}

constexpr double kModelTol = 1e-5;

GPTConfig small_llama() {
  GPTConfig c;
  c.family = Family::kLlama;
  c.n_layer = 2, c.n_head = 4, c.n_kv_head = 2, c.n_embd = 16, c.block_size = 6, c.vocab_size = 11;
  c.n_ffn = 12;
  return c;
}

// Every tensor of the unsharded model (GQA attention with RoPE, SwiGLU,
// RMSNorms, embedding, head) against central differences of the loss.
void check_model(const GPTConfig& config, const char* what) {
  testing::check_model_gradients(config, what, 2, 5, kModelTol);
}

TEST(LlamaGradcheck, ModelGqaUntied) { check_model(small_llama(), "llama (4 heads, 2 kv, untied)"); }

TEST(LlamaGradcheck, ModelMqaTied) {
  GPTConfig c = small_llama();
  c.n_kv_head = 1, c.tie_embeddings = true, c.rope_theta = 50;
  check_model(c, "llama (MQA, tied, theta 50)");
}

// Heads of their own size (head_dim 6 on n_embd 16: q_proj 24 x 16, o_proj
// 16 x 24, k and v 12 x 16), as Qwen3 sets them apart.
TEST(LlamaGradcheck, ModelHeadDimApartFromEmbd) {
  GPTConfig c = small_llama();
  c.head_dim = 6;
  check_model(c, "llama (head_dim 6 on embd 16)");
}

// QK-norm (Qwen3): q_norm and k_norm over each head, before RoPE.
TEST(LlamaGradcheck, ModelQkNorm) {
  GPTConfig c = small_llama();
  c.head_dim = 6;
  c.qk_norm = true;
  check_model(c, "llama (qk_norm, head_dim 6)");
}

// Multi-head latent attention (DeepSeek-V3): every MLA tensor (q_a_proj,
// q_a_layernorm, q_b_proj, kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj,
// o_proj) and the rest of the model, values narrower than the scores'
// heads; then without q's latent (q_proj).
TEST(LlamaGradcheck, ModelMla) {
  GPTConfig c = small_llama();
  c.n_kv_head = 0, c.head_dim = 3;
  c.q_lora_rank = 6, c.kv_lora_rank = 5, c.qk_rope_head_dim = 2, c.v_head_dim = 4;
  check_model(c, "llama (mla: q 6, kv 5, 3+2, v 4)");
  c.q_lora_rank = 0;
  check_model(c, "llama (mla without q latent)");
}

// mla_rope alone: q's rotated features per head, the shared key's rotated
// once for every head (its gradient the heads' sum), v padded with zeros.
TEST(LlamaKernels, MlaRopeGradcheck) {
  std::mt19937_64 rng(15);
  const MlaHeads h{3, 2, 4, 3};
  const int B = 2, T = 3, N = B * T;
  auto q = random_vector(rng, N * h.q_width()), kv = random_vector(rng, N * h.kv_width()),
       kpe = random_vector(rng, N * h.Dr), w = random_vector(rng, N * h.core_width());
  std::vector<double> out(N * h.core_width());
  auto loss = [&] {
    mla_rope_forward(out.data(), q.data(), kv.data(), kpe.data(), nullptr, B, T, h, 50.0);
    return dot(out, w);
  };
  loss();
  // The padding of v (features Dv..HS of every head) is zero.
  EXPECT_EQ(out[size_t(2 * h.q_width() + h.Dv)], 0.0);
  std::vector<double> dq(q.size()), dkv(kv.size()), dkpe(kpe.size());
  mla_rope_backward(dq.data(), dkv.data(), dkpe.data(), w.data(), nullptr, B, T, h, 50.0);
  check_gradients("mla_rope", {{"dq", &q, &dq}, {"dkv", &kv, &dkv}, {"dkpe", &kpe, &dkpe}}, loss, kKernelTol);
}

// Two models' losses on the same 2 x 6 random tokens agree to 1e-12.
void expect_same_loss(GPT<double>& x, GPT<double>& y, const char* x_name, const char* y_name) {
  const int vocab = x.config().vocab_size;
  const auto inputs = testing::random_tokens(3, 2 * 6, vocab), targets = testing::random_tokens(4, 2 * 6, vocab);
  const double a = x.forward(inputs.data(), targets.data(), 2, 6), b = y.forward(inputs.data(), targets.data(), 2, 6);
  std::printf("%s %.15f vs %s %.15f: |diff| %.1e (tol 1e-12)\n", x_name, a, y_name, b, std::abs(a - b));
  EXPECT_NEAR(a, b, 1e-12);
}

// Llama MoE: SwiGLU experts (gate, up, down; no biases) of their own width,
// top-2 of 4 routed plus one shared SwiGLU expert, block 0 dense (DeepSeek-V3's
// layout), under each router. Every expert's gate_proj, up_proj and down_proj,
// the router mlp.gate and the shared expert are checked tensor by tensor.
GPTConfig llama_moe(Router router, bool norm_topk) {
  GPTConfig c = small_llama();
  c.n_expert = 4, c.top_k = 2, c.n_moe_ffn = 6, c.n_shared_expert = 1, c.moe_first_dense = 1;
  c.aux_coef = 0.1, c.router = router, c.moe_norm_topk = norm_topk;
  return c;
}

TEST(LlamaGradcheck, MoeSwigluExpertsSoftmaxShared) {
  check_model(llama_moe(Router::kSoftmax, true), "llama moe (softmax top-2 of 4, shared 1, 1 dense)");
}

TEST(LlamaGradcheck, MoeSwigluExpertsSigmoidEveryBlock) {
  GPTConfig c = llama_moe(Router::kSigmoid, true);
  c.moe_first_dense = 0, c.n_shared_expert = 0;
  check_model(c, "llama moe (sigmoid top-2 of 4, every block MoE)");
}

// The unsharded SwiGLU expert is the dense llama MLP: a llama MoE with one
// expert, top-1 and softmax (gate 1 for every token) and aux_coef 0 computes
// the same loss as the dense llama whose gate/up/down are that expert's.
TEST(LlamaGradcheck, OneExpertEqualsTheDenseSwigluMlp) {
  GPTConfig m = small_llama(), d = small_llama();
  m.n_expert = 1, m.top_k = 1, m.n_moe_ffn = d.ffn_hidden(), m.aux_coef = 0;
  GPT<double> moe(m, 5), dense(d, 5);
  for (const ParamSpec& s : dense.table().specs()) {
    std::string name = s.name;
    for (const char* mlp : {"gate_proj", "up_proj", "down_proj"}) {
      const std::string from = std::string("mlp.") + mlp, to = std::string("mlp.experts.0.") + mlp;
      if (const size_t at = name.find(from); at != std::string::npos) name.replace(at, from.size(), to);
    }
    auto src = dense.param(s.name);
    auto dst = moe.param(name);
    ASSERT_EQ(src.size(), dst.size()) << name;
    std::copy(src.begin(), src.end(), dst.begin());
  }
  expect_same_loss(moe, dense, "one-expert moe", "dense swiglu");
}

// GQA is multi-head attention whose heads of one group share K and V: a
// llama with 2 K/V heads equals one with 4 whose k_proj / v_proj rows repeat
// each K/V head twice (heads 0,1 -> K/V 0; 2,3 -> K/V 1).
TEST(LlamaGradcheck, GqaEqualsMultiHeadWithRepeatedKv) {
  GPTConfig g = small_llama(), m = small_llama();
  m.n_kv_head = 4;
  GPT<double> gqa(g, 5), mha(m, 5);
  const int HS = g.head_size(), C = g.n_embd;
  for (const ParamSpec& s : gqa.table().specs()) {
    auto src = gqa.param(s.name);
    auto dst = mha.param(s.name);
    if (s.role != ParamRole::kKvWeight) {
      std::copy(src.begin(), src.end(), dst.begin());
      continue;
    }
    for (int h = 0; h < 4; ++h)  // MHA head h takes GQA head h / 2
      std::copy_n(src.data() + int64_t{h / 2} * HS * C, HS * C, dst.data() + int64_t{h} * HS * C);
  }
  expect_same_loss(gqa, mha, "gqa", "mha with repeated kv");
}

}  // namespace
}  // namespace shardlab::model
