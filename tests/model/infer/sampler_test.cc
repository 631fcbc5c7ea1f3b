// The sampler: greedy is the argmax (lowest id on ties), top_k 1 is greedy
// at any temperature, draws follow softmax(z / T) (frequencies within 5
// standard deviations over 20000 draws), top_p keeps the smallest most
// likely set reaching its mass, a seed fixes the draws, and a draw key
// (seed, index) picks the stream's index-th draw.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "model/infer/sampler.h"
#include "runtime/errors.h"

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

TEST(Sampler, TopPKeepsTheSmallestMostLikelySetReachingP) {
  // Probabilities 0.5, 0.3, 0.15, 0.05 at T = 1. top_p 0.75: 0.5 < 0.75, then
  // 0.5 + 0.3 = 0.8 reaches it -> tokens 0 and 1 at 0.625 and 0.375.
  const std::vector<float> z = {std::log(0.5f), std::log(0.3f), std::log(0.15f), std::log(0.05f)};
  Sampler s({1.0, 0, 7, 0.75});
  std::vector<int> count(4, 0);
  const int n = 20000;
  for (int i = 0; i < n; ++i) ++count[size_t(s.next(z))];
  EXPECT_EQ(count[2] + count[3], 0);
  for (auto [v, p] : {std::pair{0, 0.625}, std::pair{1, 0.375}}) {
    const double sd = std::sqrt(n * p * (1 - p));
    EXPECT_NEAR(count[size_t(v)], n * p, 5 * sd) << "token " << v;
  }
  // top_p 0.5: the first token alone reaches it.
  Sampler one({1.0, 0, 7, 0.5});
  for (int i = 0; i < 100; ++i) EXPECT_EQ(one.next(z), 0);
}

TEST(Sampler, ADrawKeyPicksThatDrawOfThatSeed) {
  const std::vector<float> z = {0.0f, 0.1f, 0.2f, 0.3f, 0.4f, 0.5f};
  Sampler stream({1.0, 0, 42});
  std::vector<int> want;
  for (int i = 0; i < 32; ++i) want.push_back(stream.next(z));
  Sampler keyed({1.0, 0, 0});  // its own seed unused
  for (int i = 31; i >= 0; --i) EXPECT_EQ(keyed.draw(z, 42, uint64_t(i)), want[size_t(i)]) << "draw " << i;
}

TEST(Sampler, BadOptionsAreConfigErrorsNamingTheField) {
  auto message = [](SamplingOptions o) {
    try {
      validate(o);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(message({1.0, 0, 1, 0.0}).find("`top_p`"), std::string::npos);
  EXPECT_NE(message({1.0, 0, 1, 1.5}).find("`top_p`"), std::string::npos);
  EXPECT_NE(message({0.0, 0, 1, 0.9}).find("`top_p` 0.9 filters sampling"), std::string::npos);
  EXPECT_NE(message({0.0, 3, 1, 1.0}).find("`top_k` 3 filters sampling"), std::string::npos);
  EXPECT_NE(message({-1.0, 0, 1, 1.0}).find("`temperature`"), std::string::npos);
  EXPECT_EQ(message({0.7, 5, 1, 0.9}), "");
}

}  // namespace
}  // namespace shardlab::infer
