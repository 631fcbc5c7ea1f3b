// Request routing across data-parallel replicas (serving.h, --router), by
// hand with a linear step cost (1 + 0.01 per token).
#include <gtest/gtest.h>

#include <cstdio>

#include "model/serve/serving.h"
#include "support/config_error.h"
#include "tests/model/serve/linear_step.h"

namespace shardlab::serve {
namespace {

ServeOptions two(Routing router, bool prefix_caching = false) {
  ServeOptions o;
  o.replicas = 2;
  o.router = router;
  o.scheduler.kv_blocks = 100;
  o.scheduler.kv_block = 4;
  o.scheduler.prefix_caching = prefix_caching;
  return o;
}

// A (output 10) and B (output 2) at 0, C (output 2) at 3; prompts of 10.
//   round-robin   A, C on replica 0, B on 1
//   least-loaded  A on 0, B on 1 (0 has A), C on 1: B ended at 1.1 + 1.01 =
//                 2.11, while A decodes until 1.1 + 9 · 1.01 = 10.19
// So least-loaded serves C alone from its arrival: first token 3 + 1.1 =
// 4.1, last 4.1 + 1.01 = 5.11; round-robin adds C's prefill to A's step
// that starts at 1.1 + 2 · 1.01 = 3.12 (1 + 0.01 · 11): first token 4.23.
TEST(Routing, LeastLoadedSendsARequestWhereFewestAreUnfinished) {
  const std::vector<Request> reqs = {{0, 0, 10, 10}, {1, 0, 10, 2}, {2, 3, 10, 2}};
  LinearStep a, b;
  const ServeResult rr = simulate_serving(reqs, two(Routing::kRoundRobin), a);
  const ServeResult ll = simulate_serving(reqs, two(Routing::kLeastLoaded), b);
  EXPECT_EQ(rr.requests[2].replica, 0);
  EXPECT_EQ(ll.requests[0].replica, 0);
  EXPECT_EQ(ll.requests[1].replica, 1);
  EXPECT_EQ(ll.requests[2].replica, 1);
  std::printf("C: round-robin first token %.4f s, least-loaded %.4f s\n", rr.requests[2].first_token_s,
              ll.requests[2].first_token_s);
  EXPECT_DOUBLE_EQ(ll.requests[2].first_token_s, 3 + 1.1);
  EXPECT_DOUBLE_EQ(ll.requests[2].finish_s, 3 + 1.1 + 1.01);
  EXPECT_DOUBLE_EQ(rr.requests[2].first_token_s, 1.1 + 2 * 1.01 + 1.11);
  EXPECT_DOUBLE_EQ(ll.requests[0].finish_s, 1.1 + 9 * 1.01);
}

// A (output 10) and C share an 8-token prefix (2 blocks of 4); B shares
// nothing. A goes to 0, B to 1; when C arrives at 3, B has ended (2.11) and
// A still decodes: least-loaded sends C to 1 (nothing cached there), prefix
// to 0, where A's prefix blocks are cached: C computes 12 - 8 tokens.
TEST(Routing, PrefixSendsARequestWhereItsPrefixIsCached) {
  std::vector<Request> reqs = {{0, 0, 12, 10}, {1, 0, 12, 2}, {2, 3, 12, 2}};
  for (const int i : {0, 2}) {
    reqs[size_t(i)].prefix_id = 7;
    reqs[size_t(i)].prefix_len = 8;
  }
  LinearStep a, b;
  const ServeResult ll = simulate_serving(reqs, two(Routing::kLeastLoaded, true), a);
  const ServeResult px = simulate_serving(reqs, two(Routing::kPrefix, true), b);
  EXPECT_EQ(ll.requests[2].replica, 1);
  EXPECT_EQ(ll.requests[2].cached_tokens, 0);
  EXPECT_EQ(px.requests[2].replica, 0);
  EXPECT_EQ(px.requests[2].cached_tokens, 8);
  // Nothing cached anywhere (A and B's own blocks): least-loaded's choice.
  EXPECT_EQ(px.requests[1].replica, 1);
  // The prefix router needs the prefix cache.
  EXPECT_NE(testing::config_error_of([&] { simulate_serving(reqs, two(Routing::kPrefix, false), a); })
                .find("`prefix_caching`"),
            std::string::npos);
  for (const char* bad : {"random", "", "least_loaded", "Prefix"})
    EXPECT_NE(testing::config_error_of([&] { parse_routing(bad); }).find("`router`"), std::string::npos) << bad;
}

}  // namespace
}  // namespace shardlab::serve
