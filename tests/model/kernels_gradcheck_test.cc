// Finite-difference checks of every dense kernel in double precision. Each
// check prints its max relative error. (Their costs: kernel_costs_test.cc.)
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>

#include "gradcheck.h"
#include "model/kernels.h"
#include "model/params.h"
#include "support/compare.h"

namespace shardlab::model {
namespace {

using testing::Accum;
using testing::check_gradients;
using testing::dot;
using testing::random_vector;

using testing::kKernelTol;

TEST(KernelGradcheck, Embedding) {
  std::mt19937_64 rng(1);
  const int B = 2, T = 3, C = 4, V = 5;
  std::vector<Token> inp = {1, 4, 1, 0, 1, 3};  // repeated tokens accumulate
  auto wte = random_vector(rng, V * C), wpe = random_vector(rng, (T + 1) * C);
  auto w = random_vector(rng, B * T * C);
  auto loss = [&] {
    std::vector<double> out(B * T * C);
    embedding_forward(out.data(), inp.data(), wte.data(), wpe.data(), B, T, C);
    return dot(out, w);
  };
  Accum dwte(rng, V * C), dwpe(rng, (T + 1) * C);
  embedding_backward(dwte.data(), dwpe.data(), w.data(), inp.data(), B, T, C);
  auto g1 = dwte.delta(), g2 = dwpe.delta();
  check_gradients("embedding", {{"dwte", &wte, &g1}, {"dwpe", &wpe, &g2}}, loss, kKernelTol);
}

TEST(KernelGradcheck, LayerNorm) {
  std::mt19937_64 rng(2);
  const int N = 6, C = 8;
  auto x = random_vector(rng, N * C, 2.0), weight = random_vector(rng, C),
       bias = random_vector(rng, C), w = random_vector(rng, N * C);
  auto loss = [&] {
    std::vector<double> out(N * C), mean(N), rstd(N);
    layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), weight.data(), bias.data(), N,
                      C);
    return dot(out, w);
  };
  std::vector<double> out(N * C), mean(N), rstd(N);
  layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), weight.data(), bias.data(), N,
                    C);
  Accum dx(rng, N * C), dweight(rng, C), dbias(rng, C);
  layernorm_backward(dx.data(), dweight.data(), dbias.data(), w.data(), x.data(), weight.data(),
                     mean.data(), rstd.data(), N, C);
  auto g1 = dx.delta(), g2 = dweight.delta(), g3 = dbias.delta();
  check_gradients("layernorm",
                  {{"dinp", &x, &g1}, {"dweight", &weight, &g2}, {"dbias", &bias, &g3}}, loss,
                  kKernelTol);
}

void check_linear(bool with_bias) {
  std::mt19937_64 rng(3);
  const int N = 5, C = 7, OC = 3;
  auto x = random_vector(rng, N * C), weight = random_vector(rng, OC * C),
       bias = random_vector(rng, OC), w = random_vector(rng, N * OC);
  const double* b = with_bias ? bias.data() : nullptr;
  auto loss = [&] {
    std::vector<double> out(N * OC);
    linear_forward(out.data(), x.data(), weight.data(), b, N, C, OC);
    return dot(out, w);
  };
  Accum dx(rng, N * C), dweight(rng, OC * C), dbias(rng, OC);
  linear_backward(dx.data(), dweight.data(), with_bias ? dbias.data() : nullptr, w.data(), x.data(),
                  weight.data(), N, C, OC);
  auto g1 = dx.delta(), g2 = dweight.delta(), g3 = dbias.delta();
  std::vector<testing::Checked> checked = {{"dinp", &x, &g1}, {"dweight", &weight, &g2}};
  if (with_bias) checked.push_back({"dbias", &bias, &g3});
  check_gradients(with_bias ? "linear" : "linear (no bias)", checked, loss, kKernelTol);
}

TEST(KernelGradcheck, Linear) { check_linear(true); }
TEST(KernelGradcheck, LinearNoBias) { check_linear(false); }

TEST(KernelGradcheck, Attention) {
  std::mt19937_64 rng(4);
  const int B = 2, T = 5, NH = 3, HS = 4, C = NH * HS;
  auto qkv = random_vector(rng, B * T * 3 * C), w = random_vector(rng, B * T * C);
  auto loss = [&] {
    std::vector<double> out(B * T * C), att(B * NH * T * T);
    attention_forward(out.data(), att.data(), qkv.data(), B, T, NH, HS);
    return dot(out, w);
  };
  std::vector<double> out(B * T * C), att(B * NH * T * T);
  attention_forward(out.data(), att.data(), qkv.data(), B, T, NH, HS);
  Accum dqkv(rng, B * T * 3 * C);
  attention_backward(dqkv.data(), w.data(), qkv.data(), att.data(), B, T, NH, HS);
  auto g = dqkv.delta();
  check_gradients("attention", {{"dqkv", &qkv, &g}}, loss, kKernelTol);
}

TEST(KernelGradcheck, Gelu) {
  std::mt19937_64 rng(5);
  const int n = 64;
  auto x = random_vector(rng, n, 2.5), w = random_vector(rng, n);
  auto loss = [&] {
    std::vector<double> out(n);
    gelu_forward(out.data(), x.data(), n);
    return dot(out, w);
  };
  Accum dx(rng, n);
  gelu_backward(dx.data(), w.data(), x.data(), n);
  auto g = dx.delta();
  check_gradients("gelu", {{"dinp", &x, &g}}, loss, kKernelTol);
}

TEST(KernelGradcheck, Residual) {
  std::mt19937_64 rng(6);
  const int n = 20;
  auto a = random_vector(rng, n), b = random_vector(rng, n), w = random_vector(rng, n);
  auto loss = [&] {
    std::vector<double> out(n);
    residual_forward(out.data(), a.data(), b.data(), n);
    return dot(out, w);
  };
  Accum da(rng, n), db(rng, n);
  residual_backward(da.data(), db.data(), w.data(), n);
  auto g1 = da.delta(), g2 = db.delta();
  check_gradients("residual", {{"dinp1", &a, &g1}, {"dinp2", &b, &g2}}, loss, kKernelTol);
}

TEST(KernelGradcheck, CrossEntropy) {
  std::mt19937_64 rng(7);
  const int N = 6, V = 9;
  auto logits = random_vector(rng, N * V, 3.0);
  std::vector<Token> targets = {0, 8, 3, 3, 5, 1};
  const double dloss = 0.7;
  std::vector<double> probs(N * V), losses(N);
  auto loss = [&] {
    return dloss *
           crossentropy_forward(probs.data(), losses.data(), logits.data(), targets.data(), N, V);
  };
  loss();
  Accum dlogits(rng, N * V);
  crossentropy_backward(dlogits.data(), probs.data(), targets.data(), dloss, N, V);
  auto g = dlogits.delta();
  check_gradients("crossentropy", {{"dlogits", &logits, &g}}, loss, kKernelTol);
}

// Tensor parallelism runs attention on a subset of heads with the c_attn rows
// of those heads: the result must be the matching columns of the full output.
TEST(KernelSlicing, AttentionOnHeadSubsetMatchesFullOutput) {
  std::mt19937_64 rng(8);
  const int B = 2, T = 7, NH = 4, HS = 3, C = NH * HS, h0 = 1, h1 = 3, C_local = (h1 - h0) * HS;
  const auto qkv = random_vector(rng, B * T * 3 * C);
  std::vector<double> out(B * T * C), att(B * NH * T * T);
  attention_forward(out.data(), att.data(), qkv.data(), B, T, NH, HS);
  // The local [q | k | v] of heads h0..h1-1: the feature ranges of c_attn_head_rows.
  const auto rows = c_attn_head_rows(C, NH, h0, h1);
  std::vector<double> local_qkv;
  for (int n = 0; n < B * T; ++n) {
    for (const Range& r : rows) {
      local_qkv.insert(local_qkv.end(), qkv.begin() + n * 3 * C + r.begin,
                       qkv.begin() + n * 3 * C + r.end());
    }
  }
  std::vector<double> local_out(B * T * C_local), local_att(B * (h1 - h0) * T * T);
  attention_forward(local_out.data(), local_att.data(), local_qkv.data(), B, T, h1 - h0, HS);
  std::vector<double> want;  // the columns of heads h0..h1-1 of the full output
  for (int n = 0; n < B * T; ++n) {
    want.insert(want.end(), out.begin() + n * C + h0 * HS, out.begin() + n * C + h1 * HS);
  }
  const auto close = shardlab::testing::all_close(local_out, want, 1e-14);
  std::printf("[slicing] attention heads [%d,%d) of %d vs full: %s\n", h0, h1, NH, close.message());
  EXPECT_TRUE(close);
  EXPECT_EQ(rows[1].begin, C + h0 * HS);
  EXPECT_EQ(rows[2].end(), 2 * C + h1 * HS);
}

}  // namespace
}  // namespace shardlab::model
