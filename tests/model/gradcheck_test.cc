// The gradient checker itself must be able to fail: on a wrong gradient, and
// on NaN or Inf at any element (it used to pass a NaN anywhere but element 0).
#include "gradcheck.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

namespace shardlab::model::testing {
namespace {

TEST(Gradcheck, NumericGradientOfAKnownFunction) {
  // loss = Σ x_i³: gradient 3 x_i²; 4th-order differences are exact for cubics.
  std::vector<double> x = {0.5, -1.25, 2.0};
  auto loss = [&] {
    double s = 0;
    for (double v : x) s += v * v * v;
    return s;
  };
  const std::vector<double> numeric = numeric_grad(loss, x.data(), 3);
  const std::vector<double> analytic = {0.75, 4.6875, 12.0};
  EXPECT_TRUE(grads_close(analytic.data(), numeric, 1e-9));
  EXPECT_EQ(x, (std::vector<double>{0.5, -1.25, 2.0})) << "x must be restored";
}

TEST(Gradcheck, FailsOnAWrongGradient) {
  const std::vector<double> numeric = {1.0, 2.0, 3.0};
  const std::vector<double> analytic = {1.0, 2.0, 3.0 * (1 + 2e-6)};
  EXPECT_TRUE(grads_close(analytic.data(), numeric, 3e-6));
  const auto r = grads_close(analytic.data(), numeric, 1e-6);
  EXPECT_FALSE(r);
  EXPECT_NE(std::string(r.message()).find("at [2]"), std::string::npos) << r.message();
  EXPECT_EQ(compare_grads(analytic.data(), numeric).worst, 2);
}

TEST(Gradcheck, FailsOnNaNOrInfAtAnyElement) {
  const double bad[] = {std::numeric_limits<double>::quiet_NaN(),
                        std::numeric_limits<double>::infinity()};
  for (double b : bad) {
    for (size_t pos = 0; pos < 4; ++pos) {
      std::vector<double> numeric = {0.5, -1.0, 2.0, 0.25}, analytic = numeric;
      analytic[pos] = b;
      EXPECT_FALSE(grads_close(analytic.data(), numeric, 1e9)) << b << " in analytic at " << pos;
      EXPECT_EQ(compare_grads(analytic.data(), numeric).non_finite, 1);
      analytic[pos] = numeric[pos];
      numeric[pos] = b;
      EXPECT_FALSE(grads_close(analytic.data(), numeric, 1e9)) << b << " in numeric at " << pos;
    }
  }
}

}  // namespace
}  // namespace shardlab::model::testing
