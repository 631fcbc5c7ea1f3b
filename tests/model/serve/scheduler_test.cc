#include "model/serve/scheduler.h"

#include <algorithm>
#include <cstdio>

#include <gtest/gtest.h>

#include "model/serve/serving.h"
#include "support/config_error.h"
#include "tests/model/serve/linear_step.h"

namespace shardlab::serve {
namespace {

SchedulerOptions continuous(int64_t blocks, int block = 16) {
  SchedulerOptions o;
  o.kv_blocks = blocks;
  o.kv_block = block;
  return o;
}

// Step 1 prefills both (30 tokens), step 2 decodes both (2), step 3 decodes
// the first (1): ends at 1.30, 2.32, 3.33; request 1 (output 2) ends at step 2.
TEST(ServeScheduler, ContinuousPrefillsTogetherThenDecodesByHand) {
  LinearStep ex;
  const std::vector<Request> reqs = {{0, 0, 10, 3}, {1, 0, 20, 2}};
  const ReplicaResult r = simulate_replica(reqs, continuous(100), ex);
  const double t1 = 1 + 0.01 * 30, t2 = t1 + 1 + 0.01 * 2, t3 = t2 + 1 + 0.01 * 1;
  ASSERT_EQ(r.steps, 3);
  EXPECT_DOUBLE_EQ(r.requests[0].first_token_s, t1);
  EXPECT_DOUBLE_EQ(r.requests[1].first_token_s, t1);
  EXPECT_DOUBLE_EQ(r.requests[1].finish_s, t2);
  EXPECT_DOUBLE_EQ(r.requests[0].finish_s, t3);
  // The decode of request 0 in step 3 appends its third token at position 11.
  ASSERT_EQ(ex.batches[2].size(), 1u);
  EXPECT_EQ(ex.batches[2][0].context, 11);
  EXPECT_EQ(ex.batches[2][0].new_tokens, 1);
}

// Request 1 arrives while request 0 decodes: continuous batching takes its
// prefill into the next step; static batching makes it wait for the batch.
TEST(ServeScheduler, ALateRequestJoinsARunningBatchOnlyWhenContinuous) {
  const std::vector<Request> reqs = {{0, 0, 10, 4}, {1, 0.5, 5, 1}};
  LinearStep c, s;
  const ReplicaResult rc = simulate_replica(reqs, continuous(100), c);
  SchedulerOptions so = continuous(100);
  so.batching = Batching::kStatic;
  const ReplicaResult rs = simulate_replica(reqs, so, s);
  const double c1 = 1.10, c2 = c1 + 1 + 0.01 * (1 + 5);  // decode of 0 + prefill of 1
  EXPECT_DOUBLE_EQ(rc.requests[1].finish_s, c2);
  // Static: 0 runs alone (prefill, 3 decodes), then 1's prefill.
  const double s4 = 1.10 + 3 * 1.01;
  EXPECT_DOUBLE_EQ(rs.requests[0].finish_s, s4);
  EXPECT_DOUBLE_EQ(rs.requests[1].first_token_s, s4 + 1.05);
  EXPECT_LT(rc.requests[1].finish_s, rs.requests[1].finish_s);
}

// Blocks of 4 tokens, 3 blocks. Both prompts (4 tokens) fit a block each; at
// the first decode request 0 takes the last block and request 1 finds none:
// it preempts itself, waits, and is recomputed (prompt + its 1 token = 5
// tokens, 2 blocks) once request 0 has finished and freed its 2 blocks.
TEST(ServeScheduler, AFullCachePreemptsTheLatestAndRecomputesIt) {
  LinearStep ex;
  const std::vector<Request> reqs = {{0, 0, 4, 5}, {1, 0, 4, 3}};
  const ReplicaResult r = simulate_replica(reqs, continuous(3, 4), ex);
  EXPECT_EQ(r.preemptions, 1);
  EXPECT_EQ(r.requests[0].preemptions, 0);
  EXPECT_EQ(r.requests[1].preemptions, 1);
  // 0: prefill (8 tokens with 1's), then 4 decodes alone.
  const double t1 = 1.08, t5 = t1 + 4 * 1.01;
  EXPECT_DOUBLE_EQ(r.requests[0].finish_s, t5);
  EXPECT_DOUBLE_EQ(r.requests[1].first_token_s, t1);  // its first token survived
  // 1: re-prefill of 5 tokens gives its 2nd token, one decode its 3rd.
  EXPECT_DOUBLE_EQ(r.requests[1].finish_s, t5 + 1.05 + 1.01);
  ASSERT_EQ(ex.batches[5].size(), 1u);
  EXPECT_EQ(ex.batches[5][0].new_tokens, 5);
  for (const UsageSample& u : r.usage) EXPECT_LE(u.used_blocks, 3);
}

// Chunks of at most 4 prefill tokens: a 10-token prompt takes 3 steps
// (4, 4, 2) while the running request keeps decoding in each of them.
TEST(ServeScheduler, ChunkedPrefillSplitsALongPromptAndKeepsDecoding) {
  LinearStep ex;
  SchedulerOptions o = continuous(100);
  o.chunked_prefill = 4;
  const std::vector<Request> reqs = {{0, 0, 2, 6}, {1, 0.5, 10, 1}};
  const ReplicaResult r = simulate_replica(reqs, o, ex);
  ASSERT_GE(ex.batches.size(), 4u);
  EXPECT_EQ(ex.batches[0].size(), 1u);
  for (int s = 1; s <= 3; ++s) {
    ASSERT_EQ(ex.batches[size_t(s)].size(), 2u) << "step " << s;
    EXPECT_EQ(ex.batches[size_t(s)][0].new_tokens, 1);  // request 0's decode
    EXPECT_EQ(ex.batches[size_t(s)][1].new_tokens, s < 3 ? 4 : 2);
    EXPECT_EQ(ex.batches[size_t(s)][1].context, 4 * (s - 1));
  }
  const double t1 = 1.02, t4 = t1 + 1.05 + 1.05 + 1.03;
  EXPECT_DOUBLE_EQ(r.requests[1].first_token_s, t4);
  EXPECT_DOUBLE_EQ(r.requests[1].finish_s, t4);
}

TEST(ServeScheduler, RequestsThatCanNeverRunAreConfigErrors) {
  LinearStep ex;
  const std::string big = testing::config_error_of(
      [&] { simulate_replica({{0, 0, 60, 10}}, continuous(4, 16), ex); });
  EXPECT_NE(big.find("needs 69 tokens"), std::string::npos) << big;
  SchedulerOptions o = continuous(100);
  o.max_batch_tokens = 32;
  const std::string prompt = testing::config_error_of([&] { simulate_replica({{0, 0, 40, 1}}, o, ex); });
  EXPECT_NE(prompt.find("`chunked_prefill`"), std::string::npos) << prompt;
  o.chunked_prefill = 8;
  o.batching = Batching::kStatic;
  EXPECT_NE(testing::config_error_of([&] { simulate_replica({{0, 0, 4, 1}}, o, ex); }).find("continuous"),
            std::string::npos);
  EXPECT_NE(testing::config_error_of([] { parse_batching("dynamic"); }).find("`batching`"), std::string::npos);
}

// Invariants over a tight cache and a long-tailed burst: every request ends,
// in order arrival <= first token <= finish, the cache never overflows, and
// the tokens processed are the requests' plus what preemption recomputed.
TEST(ServeScheduler, ABurstOnATightCacheFinishesEveryRequest) {
  for (Batching b : {Batching::kContinuous, Batching::kStatic}) {
    LinearStep ex;
    SchedulerOptions o = continuous(40, 16);
    o.batching = b;
    o.max_seqs = 16;
    const auto reqs = make_workload(120, parse_arrival("poisson:50"), parse_length_dist("lognormal:60:0.8:300", "p"),
                                    parse_length_dist("lognormal:40:0.8:300", "o"), 9);
    const ReplicaResult r = simulate_replica(reqs, o, ex);
    int64_t processed = 0, owed = 0;
    for (const auto& batch : ex.batches)
      for (const BatchEntry& e : batch) processed += e.new_tokens;
    for (const RequestRecord& q : r.requests) {
      EXPECT_LE(q.arrival_s, q.first_token_s);
      EXPECT_LE(q.first_token_s, q.finish_s);
      owed += q.prompt_len + q.output_len - 1;
    }
    for (const UsageSample& u : r.usage) ASSERT_LE(u.used_blocks, 40);
    std::printf("%s: %lld steps, %lld preemptions, %lld tokens processed for %lld owed\n",
                b == Batching::kStatic ? "static" : "continuous", (long long)r.steps,
                (long long)r.preemptions, (long long)processed, (long long)owed);
    EXPECT_GE(processed, owed);
    if (r.preemptions == 0) {
      EXPECT_EQ(processed, owed);
    }
    if (b == Batching::kStatic) {
      EXPECT_EQ(r.preemptions, 0);
    }
  }
}

TEST(ServeScheduler, ReplicasShareTheRequestsRoundRobin) {
  LinearStep ex;
  ServeOptions o;
  o.replicas = 3;
  o.scheduler = continuous(100);
  const auto reqs = make_workload(7, parse_arrival("burst"), parse_length_dist("8", "p"), parse_length_dist("2", "o"), 1);
  const ServeResult r = simulate_serving(reqs, o, ex);
  ASSERT_EQ(r.replicas.size(), 3u);
  EXPECT_EQ(r.replicas[0].requests.size(), 3u);
  EXPECT_EQ(r.replicas[2].requests.size(), 2u);
  EXPECT_EQ(r.replicas[1].requests[1].id, 4);
  EXPECT_EQ(r.summary.requests, 7);
}

}  // namespace
}  // namespace shardlab::serve
