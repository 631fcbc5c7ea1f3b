// Synthetic tasks: determinism, structure, and the known best losses checked
// against long samples.
#include "model/io/synthetic.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <vector>

#include "support/compare.h"

namespace shardlab::model {
namespace {

TEST(Synthetic, RegistryListsTasks) {
  std::set<std::string> names;
  for (const SyntheticTask& t : synthetic_tasks()) {
    names.insert(t.name);
    EXPECT_GT(std::string(t.description).size(), 10u) << t.name;
    std::optional<double> best = t.best_loss(512);
    std::printf("synthetic:%-9s best loss (V=512) %-10s %s\n", t.name,
                best ? std::to_string(*best).c_str() : "unknown", t.description);
  }
  EXPECT_EQ(names, (std::set<std::string>{"markov", "counting", "copy", "reverse"}));
  EXPECT_EQ(synthetic_task_list(),
            "synthetic:markov, synthetic:counting, synthetic:copy, synthetic:reverse");
}

TEST(Synthetic, DeterministicFromSeedAndInVocab) {
  for (const SyntheticTask& t : synthetic_tasks()) {
    for (int vocab : {t.min_vocab, 512}) {
      SCOPED_TRACE(std::string(t.name) + " vocab " + std::to_string(vocab));
      auto a = t.generate(vocab, 5000, 42), b = t.generate(vocab, 5000, 42);
      auto c = t.generate(vocab, 5000, 43);
      EXPECT_EQ(a, b);
      EXPECT_NE(a, c);
      EXPECT_EQ(a.size(), 5000u);
      for (uint16_t tok : a) ASSERT_LT(tok, vocab);
      // A longer stream extends the shorter one.
      auto longer = t.generate(vocab, 6000, 42);
      EXPECT_TRUE(std::equal(a.begin(), a.end(), longer.begin()));
    }
  }
}

TEST(Synthetic, MarkovTableIsWellFormed) {
  const MarkovTable table = markov_table(512);
  EXPECT_EQ(table.next, markov_table(512).next) << "the table depends on the vocab only";
  constexpr int K = MarkovTable::kFanout;
  for (int s = 0; s < 512; ++s) {
    std::set<int> succ;
    uint32_t total = 0;
    for (int k = 0; k < K; ++k) {
      succ.insert(table.next[size_t(s * K + k)]);
      EXPECT_GE(table.weight[size_t(s * K + k)], 1u);
      EXPECT_LE(table.weight[size_t(s * K + k)], 8u);
      total += table.weight[size_t(s * K + k)];
    }
    EXPECT_EQ(succ.size(), size_t(K)) << "row " << s;
    EXPECT_EQ(total, table.total[size_t(s)]);
  }
  // pi is a probability vector and a fixed point of P.
  std::vector<double> pi = table.stationary(), next(512, 0.0);
  double sum = 0;
  for (int s = 0; s < 512; ++s) {
    sum += pi[size_t(s)];
    for (int k = 0; k < K; ++k)
      next[size_t(table.next[size_t(s * K + k)])] += pi[size_t(s)] * table.prob(s, k);
  }
  EXPECT_NEAR(sum, 1.0, 1e-12);
  const auto fixed_point = shardlab::testing::all_close(next, pi, 1e-12);
  std::printf("[markov] pi·P vs pi: %s\n", fixed_point.message());
  EXPECT_TRUE(fixed_point);
}

// Mean of -log P(x[t+1] | x[t]) over a long sample, and the plug-in
// conditional entropy from bigram counts: both estimate the entropy rate.
TEST(Synthetic, MarkovBestLossMatchesLongSample) {
  constexpr int V = 512;
  constexpr int64_t N = 4 << 20;
  const MarkovTable table = markov_table(V);
  const double best = *find_synthetic_task("markov").best_loss(V);
  const std::vector<uint16_t> toks = find_synthetic_task("markov").generate(V, N, 1234);
  double nll = 0;
  std::vector<int64_t> bigrams(size_t(V) * V, 0);
  std::vector<int64_t> from(V, 0);
  for (int64_t i = 0; i + 1 < N; ++i) {
    const int s = toks[size_t(i)], t = toks[size_t(i + 1)];
    int k = 0;
    while (k < MarkovTable::kFanout && table.next[size_t(s * MarkovTable::kFanout + k)] != t) ++k;
    ASSERT_LT(k, MarkovTable::kFanout) << "transition " << s << " -> " << t << " not in table";
    nll -= std::log(table.prob(s, k));
    ++bigrams[size_t(s) * V + size_t(t)];
    ++from[size_t(s)];
  }
  nll /= double(N - 1);
  double plugin = 0;
  for (size_t st = 0; st < bigrams.size(); ++st) {
    const double c = double(bigrams[st]);
    if (c > 0) plugin -= c / double(N - 1) * std::log(c / double(from[st / V]));
  }
  const double tol = 0.005;  // about 10 standard errors of the NLL mean
  std::printf(
      "markov V=%d: entropy rate %.6f, sample NLL %.6f (diff %.2e), plug-in %.6f (diff "
      "%.2e), tolerance %.0e\n",
      V, best, nll, nll - best, plugin, plugin - best, tol);
  EXPECT_NEAR(nll, best, tol);
  EXPECT_NEAR(plugin, best, tol);
  EXPECT_GT(best, 0.5);  // far below ln V, far above 0: visible learning
  EXPECT_LT(best, std::log(double(V)) - 3);
}

TEST(Synthetic, CountingBestLossMatchesLongSample) {
  constexpr int V = 512;
  constexpr int64_t N = 4 << 20;
  const double best = *find_synthetic_task("counting").best_loss(V);
  const std::vector<uint16_t> toks = find_synthetic_task("counting").generate(V, N, 99);
  double nll = 0;
  int64_t runs = 0;
  for (int64_t i = 0; i + 1 < N; ++i) {
    nll -= std::log(counting_prob(V, toks[size_t(i)], toks[size_t(i + 1)]));
    runs += toks[size_t(i + 1)] != (toks[size_t(i)] + 1) % V;
  }
  nll /= double(N - 1);
  // Closed form: q = 7/8 + 1/(8V) for the successor, 1/(8V) for each other token.
  const double q = 7.0 / 8 + 1.0 / (8 * V), r = 1.0 / (8 * V);
  const double closed = -q * std::log(q) - (V - 1) * r * std::log(r);
  std::printf("counting V=%d: best %.6f, closed form %.6f, sample NLL %.6f (diff %.2e)\n", V, best,
              closed, nll, nll - best);
  EXPECT_NEAR(best, closed, 1e-12);
  EXPECT_NEAR(nll, best, 0.01);
  EXPECT_NEAR(double(runs) / double(N - 1), 1.0 / 8 * (1 - 1.0 / V), 0.002);
}

// Both segment tasks: BOS, k in [4, 12] content tokens in [2, 18), SEP, then
// the same tokens (copy) or reversed (reverse).
void check_segments(const char* name, bool reversed) {
  const std::vector<uint16_t> toks = find_synthetic_task(name).generate(64, 20000, 5);
  size_t i = 0, segments = 0;
  while (i < toks.size()) {
    ASSERT_EQ(toks[i], 0) << name << ": BOS expected at " << i;
    size_t k = 0;
    while (i + 1 + k < toks.size() && toks[i + 1 + k] != 1) ++k;
    if (i + 1 + k + 1 + k > toks.size()) break;  // the stream cut the last segment
    ASSERT_GE(k, 4u);
    ASSERT_LE(k, 12u);
    for (size_t j = 0; j < k; ++j) {
      ASSERT_GE(toks[i + 1 + j], 2);
      ASSERT_LE(toks[i + 1 + j], 17) << "alphabet of 16 content tokens";
      const uint16_t want = toks[i + 1 + (reversed ? k - 1 - j : j)];
      ASSERT_EQ(toks[i + 2 + k + j], want) << name << " segment at " << i << " item " << j;
    }
    i += 2 + 2 * k;
    ++segments;
  }
  EXPECT_GT(segments, 20000u / 30);
}

TEST(Synthetic, CopyAndReverseHaveTheirStructure) {
  check_segments("copy", false);
  check_segments("reverse", true);
}

}  // namespace
}  // namespace shardlab::model
