// Batch sampling: the sequential row formula, random sampling reproducible
// and identical whichever slice of rows a rank asks for.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "model/io/data.h"
#include "tests/model/io/test_util.h"

namespace shardlab::model {
namespace {

using testing::expect_config_error;

// tokens[i] = i: a window's content tells where it starts.
std::shared_ptr<const TokenData> identity_data(int64_t n) {
  auto d = std::make_shared<TokenData>();
  d->origin = "identity";
  d->vocab = 65536;
  d->tokens.resize(size_t(n));
  std::iota(d->tokens.begin(), d->tokens.end(), uint16_t{0});
  return d;
}

void expect_windows(const BatchSampler& s, const Batch& b, int64_t step, int64_t r0) {
  for (int64_t r = 0; r < b.rows; ++r) {
    const int64_t start = s.window_start(step, r0 + r);
    for (int64_t t = 0; t < b.seq; ++t) {
      ASSERT_EQ(b.x[size_t(r * b.seq + t)], start + t) << "step " << step << " row " << r0 + r;
      ASSERT_EQ(b.y[size_t(r * b.seq + t)], start + t + 1) << "y is x shifted by one";
    }
  }
}

TEST(Sampling, SequentialRowFormula) {
  const int64_t N = 1000, B = 4, T = 16, W = (N - 1) / T;  // 62 whole windows
  BatchSampler s(identity_data(N), B, T, Sampling::kSequential, 123);
  for (int64_t step = 0; step < 50; ++step) {
    for (int64_t j = 0; j < B; ++j)
      ASSERT_EQ(s.window_start(step, j), ((step * B + j) % W) * T)
          << "step " << step << " row " << j;
    Batch b = s.next_batch(step);
    ASSERT_EQ(b.rows, B);
    ASSERT_EQ(b.x.size(), size_t(B * T));
    expect_windows(s, b, step, 0);
  }
  // By hand: the stream in order, wrapping after window 61 (tokens 976..992).
  EXPECT_EQ(s.window_start(0, 1), 16);
  EXPECT_EQ(s.window_start(15, 1), 61 * 16);
  EXPECT_EQ(s.window_start(15, 2), 0);
  EXPECT_EQ(s.window_start(1'000'000'000'000, 3), ((4'000'000'000'000 + 3) % W) * T);
  // Exactly one window: always start 0, with y reaching the last token.
  BatchSampler one(identity_data(T + 1), B, T, Sampling::kSequential, 0);
  EXPECT_EQ(one.window_start(7, 3), 0);
  EXPECT_EQ(one.next_batch(7).y.back(), T);
}

TEST(Sampling, RandomIsReproducibleAndSliceConsistent) {
  const int64_t N = 60000, B = 8, T = 64;  // N <= 65536: identity tokens fit uint16
  auto data = identity_data(N);
  BatchSampler a(data, B, T, Sampling::kRandom, 7), same(data, B, T, Sampling::kRandom, 7);
  BatchSampler other(data, B, T, Sampling::kRandom, 8);
  for (int64_t step = 0; step < 20; ++step) {
    Batch full = a.next_batch(step);
    EXPECT_EQ(full.x, same.next_batch(step).x);
    EXPECT_NE(full.x, other.next_batch(step).x) << "the seed matters";
    EXPECT_NE(full.x, a.next_batch(step + 1).x) << "the step matters";
    expect_windows(a, full, step, 0);
    for (int64_t ranks : {2, 4, 8}) {  // DP ranks each take B / ranks rows
      std::vector<int32_t> joined;
      for (int64_t r = 0; r < ranks; ++r) {
        Batch part = a.batch_rows(step, r * B / ranks, (r + 1) * B / ranks);
        joined.insert(joined.end(), part.x.begin(), part.x.end());
      }
      EXPECT_EQ(joined, full.x) << ranks << " ranks";
    }
    // Asking for rows out of order or one at a time changes nothing.
    Batch row5 = a.batch_rows(step, 5, 6);
    EXPECT_TRUE(std::equal(row5.x.begin(), row5.x.end(), full.x.begin() + 5 * T));
  }
}

TEST(Sampling, RandomStartsCoverTheStreamUniformly) {
  const int64_t N = 1000, T = 10, starts = N - T, draws = 200000;
  BatchSampler s(identity_data(N), 100, T, Sampling::kRandom, 3);
  std::vector<int64_t> hist(size_t(starts), 0);
  for (int64_t i = 0; i < draws; ++i) {
    const int64_t st = s.window_start(i / 100, i % 100);
    ASSERT_GE(st, 0);
    ASSERT_LT(st, starts);
    ++hist[size_t(st)];
  }
  // Chi-square against uniform over 990 cells: mean 989, sd about 44.
  const double expect = double(draws) / double(starts);
  double chi2 = 0;
  for (int64_t c : hist) chi2 += (double(c) - expect) * (double(c) - expect) / expect;
  std::printf("random starts: chi2 %.1f over %lld cells (uniform: %lld +- 45)\n", chi2,
              static_cast<long long>(starts), static_cast<long long>(starts - 1));
  EXPECT_GT(hist.front() + hist.back(), 0);
  EXPECT_LT(std::abs(chi2 - double(starts - 1)), 6 * std::sqrt(2.0 * double(starts - 1)));
}

TEST(Sampling, BadConfigsAreClearErrors) {
  auto data = identity_data(65);
  expect_config_error([&] { BatchSampler(data, 0, 64, Sampling::kRandom, 0); }, {"`batch_size` must be positive (got 0)"});
  expect_config_error([&] { BatchSampler(data, 8, 0, Sampling::kRandom, 0); }, {"`block_size` must be positive (got 0)"});
  expect_config_error([&] { BatchSampler(data, 8, 65, Sampling::kRandom, 0); },
                      {"identity", "65 tokens", "too short"});
  EXPECT_NO_THROW(BatchSampler(data, 8, 64, Sampling::kRandom, 0));
}

}  // namespace
}  // namespace shardlab::model
