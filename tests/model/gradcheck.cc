#include "gradcheck.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <span>

#include "support/compare.h"

namespace shardlab::model::testing {

namespace {
// Below this an absolute difference is finite-difference noise (~1e-11 here).
constexpr double kAbsFloor = 1e-6;
}  // namespace

std::vector<double> numeric_grad(const std::function<double()>& loss, double* x, int64_t n,
                                 double h) {
  // Fourth-order central differences: truncation O(h^4), roundoff O(eps/h).
  std::vector<double> g(n);
  for (int64_t i = 0; i < n; ++i) {
    const double saved = x[i];
    double f[4];
    const double steps[4] = {2 * h, h, -h, -2 * h};
    for (int s = 0; s < 4; ++s) {
      x[i] = saved + steps[s];
      f[s] = loss();
    }
    x[i] = saved;
    g[i] = (8 * (f[1] - f[2]) - (f[0] - f[3])) / (12 * h);
  }
  return g;
}

namespace {
double rel_floor(const std::vector<double>& numeric) {
  return std::max(1e-3 * shardlab::testing::max_abs_finite(numeric), kAbsFloor);
}
}  // namespace

GradError compare_grads(const double* analytic, const std::vector<double>& numeric) {
  const double floor = rel_floor(numeric);
  const shardlab::testing::Diff d =
      shardlab::testing::diff(std::span<const double>(analytic, numeric.size()),
                              std::span<const double>(numeric), floor);
  return {d.max_rel, d.max_abs, d.worst_rel, d.non_finite, floor};
}

::testing::AssertionResult grads_close(const double* analytic, const std::vector<double>& numeric,
                                       double tol) {
  return shardlab::testing::all_close_rel(std::span<const double>(analytic, numeric.size()),
                                          numeric, tol, rel_floor(numeric));
}

double check_gradients(const std::string& what, const std::vector<Checked>& tensors,
                       const std::function<double()>& loss, double tol) {
  double worst = 0;
  bool non_finite = false;
  for (const Checked& t : tensors) {
    const std::vector<double> numeric = numeric_grad(loss, t.value, static_cast<int64_t>(t.size));
    const GradError e = compare_grads(t.grad, numeric);
    std::printf("[gradcheck] %-28s %-34s max rel err %.3e  max abs err %.3e  (tol %.0e)%s\n",
                what.c_str(), t.name.c_str(), e.max_rel, e.max_abs, tol,
                e.non_finite ? "  NON-FINITE" : "");
    EXPECT_TRUE(grads_close(t.grad, numeric, tol)) << what << " " << t.name << " (analytic vs numeric)";
    worst = std::max(worst, e.max_rel);
    non_finite = non_finite || e.non_finite > 0;
  }
  return non_finite ? std::numeric_limits<double>::quiet_NaN() : worst;
}

std::vector<double> random_vector(std::mt19937_64& rng, int64_t n, double scale) {
  std::normal_distribution<double> dist(0.0, scale);
  std::vector<double> v(n);
  for (double& x : v) x = dist(rng);
  return v;
}

Accum::Accum(std::mt19937_64& rng, int64_t n) : start_(random_vector(rng, n)), buf_(start_) {}

std::vector<double> Accum::delta() const {
  std::vector<double> d(buf_.size());
  for (size_t i = 0; i < d.size(); ++i) d[i] = buf_[i] - start_[i];
  return d;
}

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

}  // namespace shardlab::model::testing
