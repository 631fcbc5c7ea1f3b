// AdamW against values computed by hand with torch.optim.AdamW's update:
//   p *= 1 - lr·wd;  m = lerp(m, g, 1-β1);  v = β2·v + (1-β2)·g²
//   p -= lr/(1-β1^t) · m / (sqrt(v)/sqrt(1-β2^t) + eps)
// lr 0.1, β 0.9/0.95, eps 1e-8, gradients 0.5, -0.25, 0.125. Step 1 by hand:
// p = 1·0.99 − 1.0 · 0.05 / (sqrt(0.0125)/sqrt(0.05) + 1e-8) = 0.890000002.
#include "model/optimizer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "support/compare.h"

namespace shardlab::model {
namespace {

// p, m, v after each of 3 steps: {p1, m1, v1, p2, m2, v2, p3, m3, v3}.
template <typename Real>
std::vector<double> run_steps(double p0, double wd) {
  AdamWHyper hyper;
  hyper.lr = 0.1, hyper.beta1 = 0.9, hyper.beta2 = 0.95, hyper.eps = 1e-8;
  const double grads[3] = {0.5, -0.25, 0.125};
  Real p = static_cast<Real>(p0), m = 0, v = 0;
  std::vector<double> trace;
  for (int t = 1; t <= 3; ++t) {
    const Real g = static_cast<Real>(grads[t - 1]);
    adamw_update(&p, &m, &v, &g, 1, hyper, wd, t);
    trace.insert(trace.end(), {double(p), double(m), double(v)});
  }
  return trace;
}

const double kM[3] = {0.05, 0.02, 0.0305};
const double kV[3] = {0.0125, 0.015, 0.01503125};

std::vector<double> expected_trace(const double* p) {
  std::vector<double> trace;
  for (int t = 0; t < 3; ++t) trace.insert(trace.end(), {p[t], kM[t], kV[t]});
  return trace;
}

// Pure relative error (floor 0): every expected value is far from zero.
::testing::AssertionResult matches(const std::vector<double>& got, const double* p, double tol) {
  return shardlab::testing::all_close_rel(got, expected_trace(p), tol, 0);
}

TEST(AdamW, MatchesTorchSemanticsWithDecay) {
  const double expected[3] = {0.890000002, 0.8542630578558273, 0.8110522654784148};
  const auto d = matches(run_steps<double>(1.0, 0.1), expected, 1e-14);
  const auto f = matches(run_steps<float>(1.0, 0.1), expected, 1e-6);
  std::printf("[adamw] decay 0.1: double %s; float %s\n", d.message(), f.message());
  EXPECT_TRUE(d);
  EXPECT_TRUE(f);
}

TEST(AdamW, NoDecayForOneDimTensors) {
  const double expected[3] = {-2.099999998, -2.1268369421241724, -2.1615051039230266};
  const auto d = matches(run_steps<double>(-2.0, 0.0), expected, 1e-14);
  std::printf("[adamw] no decay: double %s\n", d.message());
  EXPECT_TRUE(d);
}

TEST(AdamW, VectorUpdateIsElementwise) {
  AdamWHyper hyper;
  std::vector<double> p = {1, -1, 0.5}, m(3, 0), v(3, 0), g = {0.1, 0.2, -0.3};
  adamw_update(p.data(), m.data(), v.data(), g.data(), 3, hyper, 0.1, 1);
  // First step: update = lr · g/(|g| + eps) after decay.
  std::vector<double> want(3);
  for (int i = 0; i < 3; ++i) {
    const double p0 = i == 0 ? 1 : (i == 1 ? -1 : 0.5);
    want[i] = p0 * (1 - 1e-3 * 0.1) - 1e-3 * g[i] / (std::abs(g[i]) + 1e-8);
  }
  EXPECT_TRUE(shardlab::testing::all_close(p, want, 1e-15));
}

TEST(GradNorm, SumSquaresAndScale) {
  std::vector<float> g = {3, 4};
  EXPECT_DOUBLE_EQ(sum_squares(g.data(), 2), 25.0);
  scale_inplace(g.data(), 0.5f, 2);
  EXPECT_FLOAT_EQ(g[1], 2.0f);
}

}  // namespace
}  // namespace shardlab::model
