// Speculative decoding: the scheduler's steps with k drafts (times by hand
// with a step of 1 s + 0.01 s per token), greedy acceptance, and the
// phantom acceptance draws.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "model/serve/scheduler.h"
#include "model/serve/speculative.h"
#include "model/infer/sampler.h"
#include "support/config_error.h"
#include "tests/model/serve/linear_step.h"

namespace shardlab::serve {
namespace {

// Accepts a fixed share of every entry's drafts: all (1.0) or none (0.0).
struct Verifying final : StepExecutor {
  bool accept_all = true;
  LinearStep cost;
  StepOutcome run_step(std::span<const BatchEntry> batch) override {
    StepOutcome o = cost.run_step(batch);
    for (const BatchEntry& e : batch)
      if (e.samples) o.counts.push_back(accept_all ? e.draft + 1 : 1);
    return o;
  }
};

SchedulerOptions speculating(int k) {
  SchedulerOptions o;
  o.kv_blocks = 100;
  o.kv_block = 4;
  o.speculative = k;
  return o;
}

// Prompt 4, output 7, k = 3, every draft accepted. Step 1 prefills 4
// tokens (1.04) and gives token 1; step 2 verifies the last token and 3
// drafts (4 tokens: 1.04) and gives 4 tokens (2..5); step 3 has 2 tokens
// left, so 1 draft (2 tokens: 1.02) gives 2 (6, 7): done at 3.10. Without
// drafts: 6 decodes of 1.01 after the prefill, 7.10.
TEST(Speculative, AllAcceptedGivesKPlusOneTokensAVerifyStepByHand) {
  const std::vector<Request> reqs = {{0, 0, 4, 7}};
  Verifying ex;
  const ReplicaResult r = simulate_replica(reqs, speculating(3), ex);
  ASSERT_EQ(ex.cost.batches.size(), 3u);
  EXPECT_EQ(ex.cost.batches[1][0].new_tokens, 4);
  EXPECT_EQ(ex.cost.batches[1][0].draft, 3);
  EXPECT_EQ(ex.cost.batches[1][0].context, 4);
  EXPECT_EQ(ex.cost.batches[2][0].draft, 1);
  EXPECT_EQ(ex.cost.batches[2][0].context, 8);  // the prompt, token 1 and drafts 2..4 accepted
  EXPECT_DOUBLE_EQ(r.requests[0].first_token_s, 1.04);
  EXPECT_DOUBLE_EQ(r.requests[0].finish_s, 1.04 + 1.04 + 1.02);
  LinearStep plain;
  EXPECT_DOUBLE_EQ(simulate_replica(reqs, speculating(0), plain).requests[0].finish_s, 1.04 + 6 * 1.01);
}

// Nothing accepted: each step still pays for 1 + k tokens and gives 1.
TEST(Speculative, NothingAcceptedPaysTheDraftsForOneToken) {
  Verifying ex;
  ex.accept_all = false;
  const ReplicaResult r = simulate_replica({{0, 0, 4, 4}}, speculating(3), ex);
  // Steps 2..4 verify min(3, left - 1) = 2, 1, 0 drafts: 1.03, 1.02, 1.01.
  EXPECT_DOUBLE_EQ(r.requests[0].finish_s, 1.04 + 1.03 + 1.02 + 1.01);
}

// Sampled verification keeps the target's distribution whatever the
// draft's: with p = (0.5, 0.3, 0.2) and q = (0.2, 0.2, 0.6), x drawn from
// q, 200000 positions give each token at p's frequency (standard error
// about 0.0011; tolerance 0.006). x is kept with probability
// sum min(p, q) = 0.2 + 0.2 + 0.2 = 0.6.
TEST(Speculative, SampledVerificationKeepsTheTargetsDistribution) {
  const std::vector<double> p = {0.5, 0.3, 0.2}, q = {0.2, 0.2, 0.6};
  const int n = 200000;
  double seen[3] = {}, kept = 0;
  for (int i = 0; i < n; ++i) {
    const model::Token x = pick(q, infer::Sampler::uniform(1, uint64_t(i)));
    const auto [t, keep] = verify_sampled(p, q, x, infer::Sampler::uniform(2, uint64_t(i)),
                                          infer::Sampler::uniform(3, uint64_t(i)));
    seen[t] += 1.0 / n;
    kept += keep ? 1.0 / n : 0;
  }
  for (int t = 0; t < 3; ++t) {
    std::printf("token %d: %.4f (p %.1f, difference %.4f)\n", t, seen[t], p[size_t(t)], seen[t] - p[size_t(t)]);
    EXPECT_NEAR(seen[t], p[size_t(t)], 0.006);
  }
  EXPECT_NEAR(kept, 0.6, 0.006);
  EXPECT_EQ(pick(std::vector<double>{0, 1, 0}, 0.99), 1);  // a zero never picked
}

// Leading successes at rate a over k drafts: mean a + a² + ... + a^k
// (0.6, k 4: 1.3056); rate 1 accepts all, 0 none. 20000 draws: the mean's
// standard error is about 0.009; tolerance 0.04.
TEST(Speculative, PhantomAcceptanceMeetsTheRate) {
  EXPECT_EQ(accept_at_rate(1.0, 4, 1, 0, 0), 4);
  EXPECT_EQ(accept_at_rate(0.0, 4, 1, 0, 0), 0);
  double sum = 0;
  for (int i = 0; i < 20000; ++i) sum += accept_at_rate(0.6, 4, 1, i % 7, i);
  const double mean = sum / 20000, want = 0.6 + 0.36 + 0.216 + 0.1296;
  std::printf("mean accepted %.4f, expected %.4f, difference %.4f\n", mean, want, mean - want);
  EXPECT_NEAR(mean, want, 0.04);
  EXPECT_EQ(accept_at_rate(0.6, 4, 1, 3, 9), accept_at_rate(0.6, 4, 1, 3, 9));  // a pure function
}

TEST(Speculative, StaticBatchingIsRefused) {
  SchedulerOptions o = speculating(2);
  o.batching = Batching::kStatic;
  LinearStep ex;
  EXPECT_NE(testing::config_error_of([&] { simulate_replica({{0, 0, 4, 3}}, o, ex); }).find("`speculative`"),
            std::string::npos);
}

}  // namespace
}  // namespace shardlab::serve
