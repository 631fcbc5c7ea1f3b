// The comparison helper must be able to fail: on NaN and Inf anywhere (not
// only at element 0), on a difference just above the tolerance, and on sizes
// that differ; and it must pass just within the tolerance.
#include "support/compare.h"

#include <cmath>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace shardlab::testing {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

bool mentions(const ::testing::AssertionResult& r, const std::string& s) {
  return std::string(r.message()).find(s) != std::string::npos;
}

TEST(AllClose, PassesWithinTolerance) {
  const std::vector<double> want = {1, -2, 3, 0};
  const std::vector<double> got = {1 + 0.5e-6, -2 - 0.9e-6, 3, 0};
  const auto r = all_close(got, want, 1e-6);
  EXPECT_TRUE(r) << r.message();
  EXPECT_TRUE(mentions(r, "max abs diff 9e-07 at [1]")) << r.message();
  EXPECT_TRUE(mentions(r, "tol 1e-06")) << r.message();
}

TEST(AllClose, FailsJustAboveToleranceAndSaysWhere) {
  const std::vector<float> want = {1, 2, 3, 4};
  const std::vector<float> got = {1, 2, 3.001f, 4};
  const auto r = all_close(got, want, 1e-4);
  EXPECT_FALSE(r);
  EXPECT_TRUE(mentions(r, "at [2]")) << r.message();
  EXPECT_TRUE(mentions(r, "> tol 0.0001")) << r.message();
  EXPECT_TRUE(mentions(r, "1 of 4 elements over tol")) << r.message();
}

TEST(AllClose, FailsOnNaNAnywhere) {
  // The bug this replaces: std::max(worst, NaN) keeps worst, so a NaN past
  // element 0 passed. Try every position, in got and in want.
  for (size_t pos = 0; pos < 5; ++pos) {
    std::vector<double> want = {1, 2, 3, 4, 5}, got = want;
    got[pos] = kNaN;
    const auto r = all_close(got, want, 1e9);
    EXPECT_FALSE(r) << "NaN in got at " << pos;
    EXPECT_TRUE(mentions(r, "1 of 5 elements are NaN or Inf, first at [" + std::to_string(pos) + "]"))
        << r.message();
    EXPECT_FALSE(all_close(want, got, 1e9)) << "NaN in want at " << pos;
    EXPECT_FALSE(all_close_rel(got, want, 1e9, 0)) << "relative, NaN at " << pos;
  }
}

TEST(AllClose, FailsOnInf) {
  const std::vector<double> want = {1, 2, 3};
  EXPECT_FALSE(all_close(std::vector<double>{1, kInf, 3}, want, 1e9));
  EXPECT_FALSE(all_close(std::vector<double>{1, 2, -kInf}, want, 1e9));
  // Inf on both sides is not "equal": an overflow is a failure.
  EXPECT_FALSE(all_close(std::vector<double>{1, 2, kInf}, std::vector<double>{1, 2, kInf}, 1e9));
  EXPECT_FALSE(all_close_rel(std::vector<float>{1, 2, std::numeric_limits<float>::infinity()}, want,
                             1e9, 0));
}

TEST(AllClose, FailsOnSizeMismatch) {
  const auto r = all_close(std::vector<double>{1, 2}, std::vector<double>{1, 2, 3}, 1e9);
  EXPECT_FALSE(r);
  EXPECT_TRUE(mentions(r, "sizes differ: got 2 elements, want 3")) << r.message();
}

TEST(AllCloseRel, UsesTheLargerMagnitudeAndTheFloor) {
  // |1000.5 - 1000| / 1000.5 ~ 5.0e-4; |1e-9 - 0| / floor 1e-3 = 1e-6.
  const std::vector<double> want = {1000, 0}, got = {1000.5, 1e-9};
  const Diff d = diff(got, want, 1e-3);
  EXPECT_NEAR(d.max_rel, 0.5 / 1000.5, 1e-15);
  EXPECT_EQ(d.worst_rel, 0);
  EXPECT_DOUBLE_EQ(d.max_abs, 0.5);
  EXPECT_TRUE(all_close_rel(got, want, 5e-4, 1e-3));
  EXPECT_FALSE(all_close_rel(got, want, 4.9e-4, 1e-3));
  // Without a floor, 1e-9 against 0 is a 100% error.
  EXPECT_FALSE(all_close_rel(got, want, 0.5, 0));
}

TEST(Diff, MixedPrecisionAndSpans) {
  const float got[3] = {1.0f, 2.0f, 3.5f};
  const std::vector<double> want = {1.0, 2.0, 3.0};
  const Diff d = diff(std::span<const float>(got, 3), std::span<const double>(want));
  EXPECT_EQ(d.size, 3);
  EXPECT_TRUE(d.finite());
  EXPECT_DOUBLE_EQ(d.max_abs, 0.5);
  EXPECT_EQ(d.worst_abs, 2);
  const Diff bad = diff(std::vector<double>{kNaN, 1, kInf}, want);
  EXPECT_EQ(bad.non_finite, 2);
  EXPECT_EQ(bad.first_non_finite, 0);
  EXPECT_FALSE(bad.finite());
}

}  // namespace
}  // namespace shardlab::testing
