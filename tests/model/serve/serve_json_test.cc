// serve_json.h: a serving run's records as JSON, as `shardlab serve` writes them.
#include "model/serve/serve_json.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace shardlab::serve {
namespace {

ServeResult two_replicas() {
  ServeResult r;
  r.replicas.resize(2);
  RequestRecord a;
  a.id = 1;
  a.replica = 0;
  a.arrival_s = 0.5;
  a.first_token_s = 0.75;
  a.finish_s = 1.25;
  a.prompt_len = 2;
  a.output_len = 3;
  a.preemptions = 1;
  a.tokens = {7, 8, 9};
  r.replicas[0].requests.push_back(a);
  RequestRecord b = a;
  b.id = 0;
  b.replica = 1;
  b.tokens = {4, 5, 6};
  r.replicas[1].requests.push_back(b);
  r.replicas[1].usage.push_back({2.0, 0.25, 5, 1, 2, 64});
  r.requests = {b, a};  // in id order
  return r;
}

TEST(ServeJson, RequestsCarryTheirTokensOnlyForARunOnValues) {
  const ServeResult r = two_replicas();
  std::vector<Request> prompts(2);
  prompts[0].prompt = {1, 2};
  prompts[1].prompt = {3, 4};
  const nlohmann::json shapes = requests_json(r, nullptr);
  ASSERT_EQ(shapes.size(), 2u);  // in id order
  EXPECT_EQ(shapes[1]["id"], 1);
  EXPECT_EQ(shapes[1]["replica"], 0);
  EXPECT_EQ(shapes[1]["arrival_s"], 0.5);
  EXPECT_EQ(shapes[1]["first_token_s"], 0.75);
  EXPECT_EQ(shapes[1]["finish_s"], 1.25);
  EXPECT_EQ(shapes[1]["preemptions"], 1);
  EXPECT_FALSE(shapes[1].contains("tokens"));
  EXPECT_FALSE(shapes[1].contains("handoff"));  // colocated
  const nlohmann::json values = requests_json(r, &prompts);
  EXPECT_EQ(values[1]["prompt_tokens"], nlohmann::json({3, 4}));  // request 1's prompt
  EXPECT_EQ(values[1]["tokens"], nlohmann::json({7, 8, 9}));
  EXPECT_EQ(values[0]["prompt_tokens"], nlohmann::json({1, 2}));
}

TEST(ServeJson, UsageNamesItsReplica) {
  const nlohmann::json u = usage_json(two_replicas());
  ASSERT_EQ(u.size(), 1u);
  EXPECT_EQ(u[0], nlohmann::json({{"replica", 1}, {"t", 2.0}, {"step_s", 0.25}, {"used_blocks", 5}, {"running", 1},
                                  {"waiting", 2}, {"batch_tokens", 64}}));
}

TEST(ServeJson, PlanHasOneEntryPerDevice) {
  ReplicaPlan p;
  p.capacity_bytes = {100, 200};
  p.weight_bytes = {10, 20};
  p.activation_bytes = {1, 2};
  p.kv_bytes_per_token = {0.5, 1.5};
  const nlohmann::json j = plan_json(p);
  ASSERT_EQ(j.size(), 2u);
  EXPECT_EQ(j[1], nlohmann::json({{"rank", 1}, {"capacity_bytes", 200}, {"weight_bytes", 20},
                                  {"activation_bytes", 2}, {"kv_bytes_per_token", 1.5}}));
}

}  // namespace
}  // namespace shardlab::serve
