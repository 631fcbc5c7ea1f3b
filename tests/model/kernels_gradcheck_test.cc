// Finite-difference checks of every dense kernel in double precision. Each
// check prints its max relative error. (Their costs: kernel_costs_test.cc.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "gradcheck.h"
#include "model/host_split.h"
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

// The fused kernels a recomputing backward uses (gelu_forward_backward,
// attention_forward_backward) must give the bits of the two calls they
// replace, in float (the training type), split over idle cores or not.
// Inputs hold negative values whose products round to -0, so the 0 + v of
// accumulating into zeros matters. Tolerance: none (memcmp).
template <typename F>
void expect_same_bits(const char* what, const F& run_both) {
  for (const bool split : {false, true}) {
    set_host_split_for_test(split);
    const auto [fused, unfused] = run_both();
    set_host_split_for_test(std::nullopt);
    size_t differ = 0;
    for (size_t i = 0; i < fused.size(); ++i) differ += std::memcmp(&fused[i], &unfused[i], sizeof(float)) != 0;
    std::printf("[fused] %s split=%d: %zu of %zu floats differ\n", what, split, differ, fused.size());
    EXPECT_EQ(fused.size(), unfused.size());
    EXPECT_EQ(differ, 0u) << what;
  }
}

std::vector<float> float_randoms(std::mt19937_64& rng, size_t n, float scale) {
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

TEST(KernelFusion, GeluForwardBackwardHasTheBitsOfBoth) {
  std::mt19937_64 rng(11);
  const int64_t n = 3 * 16384 + 77;  // several split chunks and a tail
  auto x = float_randoms(rng, n, 6.0f), dout = float_randoms(rng, n, 1.0f);
  x[0] = -12.0f;  // GELU's derivative underflows: 0 · -dout is -0
  dout[0] = -1.0f;
  expect_same_bits("gelu", [&] {
    std::vector<float> out(x), d(dout), ref_out(n), ref_d(n, 0.0f);
    gelu_forward_backward(out.data(), d.data(), n);  // out: x on entry, GELU(x) on return
    gelu_forward(ref_out.data(), x.data(), n);
    gelu_backward(ref_d.data(), dout.data(), x.data(), n);
    out.insert(out.end(), d.begin(), d.end());
    ref_out.insert(ref_out.end(), ref_d.begin(), ref_d.end());
    return std::pair{out, ref_out};
  });
}

TEST(KernelFusion, AttentionForwardBackwardHasTheBitsOfBoth) {
  std::mt19937_64 rng(12);
  const int B = 3, T = 37, NH = 4, HS = 32, C = NH * HS;  // T past Eigen's panels, HS a whole run
  const auto qkv = float_randoms(rng, size_t(B) * T * 3 * C, 2.0f);
  const auto dout = float_randoms(rng, size_t(B) * T * C, 1.0f);
  const auto start = float_randoms(rng, size_t(B) * T * 3 * C, 1.0f);  // dqkv accumulates
  expect_same_bits("attention", [&] {
    std::vector<float> out(size_t(B) * T * C), dqkv(start), ref_out(out.size()), ref_dqkv(start);
    attention_forward_backward(out.data(), dqkv.data(), dout.data(), qkv.data(), B, T, NH, HS);
    attention_forward(ref_out.data(), static_cast<float*>(nullptr), qkv.data(), B, T, NH, HS);
    attention_backward(ref_dqkv.data(), dout.data(), qkv.data(), static_cast<const float*>(nullptr), B, T, NH,
                       HS);
    out.insert(out.end(), dqkv.begin(), dqkv.end());
    ref_out.insert(ref_out.end(), ref_dqkv.begin(), ref_dqkv.end());
    return std::pair{out, ref_out};
  });
}

// Tensor parallelism runs attention on a subset of heads with the c_attn rows
// of those heads: the result must be the matching columns of the full output.
// Kernels split over idle cores by rows, then by columns for a sum over the
// rows (LayerNorm's dweight and dbias, a linear's dbias), and the split
// fills: the bits of one core, which sums every column over the rows in
// order. Rows and columns past whole chunks (64 each). Tolerance: none.
TEST(KernelSplit, LayerNormBackwardAndBiasGradientsSameBitsSplitOrNot) {
  std::mt19937_64 rng(13);
  const int64_t N = 300, C = 200, IC = 24;
  const auto x = float_randoms(rng, size_t(N * C), 3.0f), dout = float_randoms(rng, size_t(N * C), 1.0f);
  const auto w = float_randoms(rng, size_t(C), 1.0f), b = float_randoms(rng, size_t(C), 1.0f);
  const auto start = float_randoms(rng, size_t(N * C + 2 * C), 1.0f);  // the gradients accumulate
  const auto inp = float_randoms(rng, size_t(N * IC), 1.0f);
  const auto run = [&](bool split) {
    set_host_split_for_test(split);
    std::vector<float> out(static_cast<size_t>(N * C)), mean(static_cast<size_t>(N)), rstd(static_cast<size_t>(N));
    layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, int(C));
    std::vector<float> g(start);  // dinp, dweight, dbias
    layernorm_backward(g.data(), g.data() + N * C, g.data() + N * C + C, dout.data(), x.data(), w.data(),
                       mean.data(), rstd.data(), N, int(C));
    std::vector<float> dw(size_t(C * IC), 0.5f), db(start.begin(), start.begin() + C);
    linear_backward_weight(dw.data(), db.data(), dout.data(), inp.data(), N, int(IC), int(C));
    std::vector<float> zeros(size_t(N * C), 1.0f);
    fill_split(zeros.data(), N * C, 0.0f);
    set_host_split_for_test(std::nullopt);
    for (const auto* v : {&out, &mean, &rstd, &dw, &db, &zeros}) g.insert(g.end(), v->begin(), v->end());
    return g;
  };
  const auto one = run(false), split = run(true);
  size_t differ = 0;
  for (size_t i = 0; i < one.size(); ++i) differ += std::memcmp(&one[i], &split[i], sizeof(float)) != 0;
  std::printf("[split] layernorm backward, linear dbias, fill: %zu of %zu floats differ\n", differ, one.size());
  ASSERT_EQ(one.size(), split.size());
  EXPECT_EQ(differ, 0u);
  EXPECT_EQ(std::count(split.end() - N * C, split.end(), 0.0f), N * C);  // the fill did fill
}

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
