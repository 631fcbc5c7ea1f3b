// The sampler: greedy is the argmax (lowest id on ties), top_k 1 is greedy
// at any temperature, draws follow softmax(z / T) (frequencies within 5
// standard deviations over 20000 draws), and a seed fixes the draws.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "model/infer/sampler.h"

namespace shardlab::infer {
namespace {

TEST(Sampler, GreedyIsTheArgmaxWithTheLowestIdOnTies) {
  Sampler s({});
  EXPECT_EQ(s.next(std::vector<float>{0.5f, 2.0f, -1.0f, 2.0f}), 1);
  EXPECT_EQ(s.next(std::vector<float>{-3.0f}), 0);
}

TEST(Sampler, TopKOneIsGreedyAtAnyTemperature) {
  Sampler s({5.0, 1, 3});
  for (int i = 0; i < 50; ++i) EXPECT_EQ(s.next(std::vector<float>{0.1f, 0.3f, 0.2f}), 1);
}

TEST(Sampler, DrawsFollowTheTemperedSoftmaxOfTheTopK) {
  const std::vector<float> z = {1.0f, 0.0f, 2.0f, -5.0f};
  const double T = 1.5;
  Sampler s({T, 3, 42});  // token 3 is outside the top 3
  std::vector<int> count(4, 0);
  const int n = 20000;
  for (int i = 0; i < n; ++i) ++count[size_t(s.next(z))];
  EXPECT_EQ(count[3], 0);
  double sum = 0;
  for (int v = 0; v < 3; ++v) sum += std::exp(z[size_t(v)] / T);
  for (int v = 0; v < 3; ++v) {
    const double p = std::exp(z[size_t(v)] / T) / sum;
    const double sd = std::sqrt(n * p * (1 - p));
    EXPECT_NEAR(count[size_t(v)], n * p, 5 * sd) << "token " << v;
  }
}

TEST(Sampler, TheSeedFixesTheDraws) {
  const std::vector<float> z = {0.0f, 0.1f, 0.2f, 0.3f, 0.4f};
  Sampler a({1.0, 0, 9}), b({1.0, 0, 9}), c({1.0, 0, 10});
  std::vector<int> da, db, dc;
  for (int i = 0; i < 64; ++i) {
    da.push_back(a.next(z));
    db.push_back(b.next(z));
    dc.push_back(c.next(z));
  }
  EXPECT_EQ(da, db);
  EXPECT_NE(da, dc);
}

}  // namespace
}  // namespace shardlab::infer
