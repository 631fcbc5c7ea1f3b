// AdamW against values computed by hand with torch.optim.AdamW's update:
//   p *= 1 - lr·wd;  m = lerp(m, g, 1-β1);  v = β2·v + (1-β2)·g²
//   p -= lr/(1-β1^t) · m / (sqrt(v)/sqrt(1-β2^t) + eps)
// lr 0.1, β 0.9/0.95, eps 1e-8, gradients 0.5, -0.25, 0.125. Step 1 by hand:
// p = 1·0.99 − 1.0 · 0.05 / (sqrt(0.0125)/sqrt(0.05) + 1e-8) = 0.890000002.
#include "model/optimizer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

namespace shardlab::model {
namespace {

template <typename Real>
double run_steps(double p0, double wd, const double* expected, const double* expected_m,
                 const double* expected_v) {
  AdamWHyper hyper;
  hyper.lr = 0.1, hyper.beta1 = 0.9, hyper.beta2 = 0.95, hyper.eps = 1e-8;
  const double grads[3] = {0.5, -0.25, 0.125};
  Real p = static_cast<Real>(p0), m = 0, v = 0;
  double max_rel = 0;
  for (int t = 1; t <= 3; ++t) {
    const Real g = static_cast<Real>(grads[t - 1]);
    adamw_update(&p, &m, &v, &g, 1, hyper, wd, t);
    max_rel = std::max(max_rel, std::abs(p - expected[t - 1]) / std::abs(expected[t - 1]));
    max_rel = std::max(max_rel, std::abs(m - expected_m[t - 1]) / std::abs(expected_m[t - 1]));
    max_rel = std::max(max_rel, std::abs(v - expected_v[t - 1]) / std::abs(expected_v[t - 1]));
  }
  return max_rel;
}

const double kM[3] = {0.05, 0.02, 0.0305};
const double kV[3] = {0.0125, 0.015, 0.01503125};

TEST(AdamW, MatchesTorchSemanticsWithDecay) {
  const double expected[3] = {0.890000002, 0.8542630578558273, 0.8110522654784148};
  const double d = run_steps<double>(1.0, 0.1, expected, kM, kV);
  const double f = run_steps<float>(1.0, 0.1, expected, kM, kV);
  std::printf("[adamw] decay 0.1: max rel err double %.2e (tol 1e-14), float %.2e (tol 1e-6)\n", d,
              f);
  EXPECT_LE(d, 1e-14);
  EXPECT_LE(f, 1e-6);
}

TEST(AdamW, NoDecayForOneDimTensors) {
  const double expected[3] = {-2.099999998, -2.1268369421241724, -2.1615051039230266};
  const double d = run_steps<double>(-2.0, 0.0, expected, kM, kV);
  std::printf("[adamw] no decay: max rel err double %.2e (tol 1e-14)\n", d);
  EXPECT_LE(d, 1e-14);
}

TEST(AdamW, VectorUpdateIsElementwise) {
  AdamWHyper hyper;
  std::vector<double> p = {1, -1, 0.5}, m(3, 0), v(3, 0), g = {0.1, 0.2, -0.3};
  adamw_update(p.data(), m.data(), v.data(), g.data(), 3, hyper, 0.1, 1);
  // First step: update = lr · g/(|g| + eps) after decay.
  for (int i = 0; i < 3; ++i) {
    const double p0 = i == 0 ? 1 : (i == 1 ? -1 : 0.5);
    const double want = p0 * (1 - 1e-3 * 0.1) - 1e-3 * g[i] / (std::abs(g[i]) + 1e-8);
    EXPECT_NEAR(p[i], want, 1e-15);
  }
}

TEST(GradNorm, SumSquaresAndScale) {
  std::vector<float> g = {3, 4};
  EXPECT_DOUBLE_EQ(sum_squares(g.data(), 2), 25.0);
  scale_inplace(g.data(), 0.5f, 2);
  EXPECT_FLOAT_EQ(g[1], 2.0f);
}

}  // namespace
}  // namespace shardlab::model
