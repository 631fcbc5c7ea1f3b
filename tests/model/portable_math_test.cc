// The project's own exp, tanh, log, cos, pow and fixed-lane sums
// (model/portable_math.h), and the two GEMM arithmetics (model/gemm.h).
// Accuracy is measured against long double (a different algorithm, more
// precision); each test states its bound in ulps and prints the worst case.
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "model/arithmetic.h"
#include "model/gemm.h"
#include "model/portable_math.h"
#include "support/compare.h"

namespace shardlab::model {
namespace {

// |got - want| in units of the last place of want rounded to float.
double ulps_float(float got, long double want) {
  const float w = static_cast<float>(want);
  const float up = std::nextafter(std::abs(w), std::numeric_limits<float>::infinity());
  const double ulp = double(up) - double(std::abs(w));
  return double(std::abs((long double)got - want)) / ulp;
}

double ulps_double(double got, long double want) {
  const double w = static_cast<double>(want);
  const double up = std::nextafter(std::abs(w), std::numeric_limits<double>::infinity());
  return double(std::abs((long double)got - want) / (long double)(up - std::abs(w)));
}

TEST(PortableMath, ExpIsWithinTwoUlpsOverItsRange) {
  double worst = 0;
  float at = 0;
  for (float x = -86.9f; x < 87.9f; x += 0.000731f) {
    const double u = ulps_float(pm::exp(x), std::exp((long double)x));
    if (u > worst) worst = u, at = x;
  }
  std::printf("exp: max %.3f ulp at x = %.9g (bound 2)\n", worst, at);
  EXPECT_LE(worst, 2.0);
  EXPECT_EQ(pm::exp(0.0f), 1.0f);
  EXPECT_EQ(pm::exp(-100.0f), 0.0f);
  EXPECT_EQ(pm::exp(-std::numeric_limits<float>::infinity()), 0.0f);
  EXPECT_TRUE(std::isinf(pm::exp(100.0f)));
  EXPECT_TRUE(std::isnan(pm::exp(std::numeric_limits<float>::quiet_NaN())));
}

TEST(PortableMath, TanhIsWithinFourUlpsAndOdd) {
  double worst = 0;
  float at = 0;
  for (float x = -12.0f; x < 12.0f; x += 0.000173f) {
    const float t = pm::tanh(x);
    EXPECT_EQ(pm::tanh(-x), -t) << "x = " << x;  // odd, bit for bit
    const long double want = std::tanh((long double)x);
    if (want == 0) continue;
    const double u = ulps_float(t, want);
    if (u > worst) worst = u, at = x;
  }
  std::printf("tanh: max %.3f ulp at x = %.9g (bound 4)\n", worst, at);
  EXPECT_LE(worst, 4.0);
  EXPECT_EQ(pm::tanh(0.0f), 0.0f);
  EXPECT_EQ(pm::tanh(50.0f), 1.0f);
  EXPECT_TRUE(std::isnan(pm::tanh(std::numeric_limits<float>::quiet_NaN())));
}

TEST(PortableMath, LogIsWithinTwoUlps) {
  std::mt19937_64 gen(7);
  std::uniform_real_distribution<double> exponent(-300, 300), mantissa(1, 10);
  double worst = 0;
  double at = 0;
  for (int i = 0; i < 200000; ++i) {
    const double x = i % 2 ? mantissa(gen) * std::pow(10.0, exponent(gen)) : 1.0 + (mantissa(gen) - 5.5) * 1e-3;
    const double u = ulps_double(pm::log(x), std::log((long double)x));
    if (u > worst) worst = u, at = x;
  }
  std::printf("log: max %.3f ulp at x = %.17g (bound 2)\n", worst, at);
  EXPECT_LE(worst, 2.0);
  EXPECT_EQ(pm::log(1.0), 0.0);
  EXPECT_TRUE(std::isinf(pm::log(0.0)));
  EXPECT_TRUE(std::isnan(pm::log(-1.0)));
}

TEST(PortableMath, Cos2PiIsWithinTwoUlpsOfOne) {
  double worst = 0;  // absolute error in units of 2^-53 (the ulp just below 1)
  double at = 0;
  const long double two_pi = 2 * 3.14159265358979323846264338327950288L;
  for (int i = 0; i <= 1 << 20; ++i) {
    const double u = double(i) / double(1 << 20) + (i % 7) * 1e-9;
    if (u > 1) continue;
    const double e = double(std::abs((long double)pm::cos_2pi(u) - std::cos(two_pi * u))) / 0x1p-53;
    if (e > worst) worst = e, at = u;
  }
  std::printf("cos_2pi: max abs error %.3f x 2^-53 at u = %.17g (bound 2)\n", worst, at);
  EXPECT_LE(worst, 2.0);
  EXPECT_EQ(pm::cos_2pi(0.0), 1.0);
  EXPECT_EQ(pm::cos_2pi(0.5), -1.0);
  EXPECT_EQ(pm::cos_2pi(1.0), 1.0);
}

TEST(PortableMath, IntegerPowerIsCorrectlyRoundedOnAdamsBetas) {
  double worst = 0;
  for (double b : {0.9, 0.95, 0.98, 0.999, 0.9999}) {
    for (int64_t n : {0, 1, 2, 3, 10, 77, 1000, 4096, 99999}) {
      const double u = ulps_double(pm::pow_int(b, n), std::pow((long double)b, (long double)n));
      worst = std::max(worst, u);
      EXPECT_LE(u, 0.5 + 1e-3) << b << "^" << n;
    }
  }
  std::printf("pow_int: max %.4f ulp (bound 0.5: correctly rounded)\n", worst);
  EXPECT_EQ(pm::pow_int(0.9, 0), 1.0);
  EXPECT_EQ(pm::pow_int(0.5, 3), 0.125);
}

// The order lane_sum promises, written out another way: lane l sums
// elements l, l+16, l+32, ... in order, then lanes pair up 8, 4, 2, 1.
float sum_in_the_stated_order(const std::vector<float>& x) {
  float lane[16] = {};
  for (size_t i = 0; i < x.size(); ++i) lane[i % 16] += x[i];
  for (int w = 8; w >= 1; w /= 2)
    for (int l = 0; l < w; ++l) lane[l] += lane[l + w];
  return lane[0];
}

TEST(PortableMath, LaneSumFollowsTheStatedOrderBitForBit) {
  std::mt19937 gen(3);
  std::normal_distribution<float> normal(0, 1);
  for (int n : {1, 7, 16, 17, 100, 1023, 4096}) {
    std::vector<float> x(static_cast<size_t>(n));
    for (float& v : x) v = normal(gen) * 1e3f;
    EXPECT_EQ(pm::sum(x.data(), n), sum_in_the_stated_order(x)) << "n = " << n;
  }
}

std::vector<float> randn(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0, 1);
  std::vector<float> v(n);
  for (float& x : v) x = normal(gen);
  return v;
}

// The three GEMMs in both arithmetics agree to fp32 reduction noise; the
// portable ones follow their stated order (gemm.h) exactly.
TEST(Gemm, PortableAndNativeAgreeAndPortableFollowsItsOrder) {
  const int64_t N = 37, M = 29, K = 45;
  const auto a = randn(size_t(N * K), 1), b = randn(size_t(M * K), 2), c = randn(size_t(K * M), 3);
  const auto y0 = randn(size_t(N * M), 4);
  const auto at = randn(size_t(N * M), 5), bt = randn(size_t(N * K), 6);
  struct Out { std::vector<float> nt, nn, tn; };
  auto run = [&](Arithmetic mode) {
    const ArithmeticScope scope(mode);
    Out o{std::vector<float>(size_t(N * M)), y0, std::vector<float>(size_t(M * K), 0.5f)};
    gemm_nt(o.nt.data(), M, a.data(), K, b.data(), K, N, M, K);
    gemm_nn_acc(o.nn.data(), a.data(), c.data(), N, M, K);
    gemm_tn_acc(o.tn.data(), at.data(), bt.data(), N, M, K);
    return o;
  };
  const Out native = run(Arithmetic::kNative), portable = run(Arithmetic::kPortable);
  for (auto [p, q, what] : {std::tuple{&portable.nt, &native.nt, "nt"}, {&portable.nn, &native.nn, "nn"},
                            {&portable.tn, &native.tn, "tn"}}) {
    // |error| <= K·ε·Σ|a·b| ~ 45 · 6e-8 · 45 for unit normals: abs tol 1e-5.
    const auto r = testing::all_close(*p, *q, 1e-5);
    std::printf("gemm_%s portable vs native: %s\n", what, r.message());
    EXPECT_TRUE(r) << what;
  }
  // gemm_nn_acc: y[n][m] = (((y0 + a[n][0]·c[0][m]) + a[n][1]·c[1][m]) + ...).
  for (int64_t n = 0; n < N; ++n)
    for (int64_t m = 0; m < M; ++m) {
      float y = y0[size_t(n * M + m)];
      for (int64_t k = 0; k < K; ++k) y += a[size_t(n * K + k)] * c[size_t(k * M + m)];
      ASSERT_EQ(portable.nn[size_t(n * M + m)], y) << n << "," << m;
    }
}

}  // namespace
}  // namespace shardlab::model
