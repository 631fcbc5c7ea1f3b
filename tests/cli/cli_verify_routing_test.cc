// `shardlab verify` on MoE runs long enough for a router's near-tie to flip:
// the runs are compared up to the step whose routing diverged (re-run there
// on the same schedule), a real error still fails, and routing that differs
// before any training step fails. --arithmetic portable: the same bits, so
// the same divergence step, on every machine.
#include <cstdio>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "model/train/verify.h"
#include "tests/support/cli_util.h"

namespace shardlab {
namespace {

const std::string kMoe = "verify --model tiny-moe --tp 2 --steps 40 --arithmetic portable --json ";

nlohmann::json verify_json_run(const std::string& args, int code) {
  auto r = testing::run_cli(kMoe + args);
  EXPECT_EQ(r.code, code) << args << "\n" << r.err << r.out.substr(0, 2000);
  return nlohmann::json::parse(r.out.empty() ? "{}" : r.out);
}

void print_verdict(const std::string& what, const nlohmann::json& j) {
  const nlohmann::json& d = j.at("routing_divergence");
  std::printf("%s: routing diverged at step %s; compared %zu steps: max loss rel diff %.3e, parameter rel L2 "
              "%.3e (tolerances 1e-5)\n",
              what.c_str(), d.is_null() ? "(none)" : d.at("step").dump().c_str(), j.at("steps").size(),
              j.at("max_loss_rel_diff").get<double>(), j.at("param_rel_l2").get<double>());
}

// tiny-moe at tp 2: TP's split inner sums round differently, and within 40
// steps one token of one block goes to another expert (one count moves by
// one). Before the divergence the runs agree to ~1e-7 in the loss; after it
// they part by more than 1e-5 (the 100-step run failed at step 77, 1.6e-5).
TEST(VerifyRouting, ANearTieFlipIsComparedUpToTheStepThatFlipped) {
  const nlohmann::json j = verify_json_run("", 0);
  print_verdict("tiny-moe --tp 2", j);
  EXPECT_TRUE(j.at("passed").get<bool>());
  const nlohmann::json& d = j.at("routing_divergence");
  ASSERT_FALSE(d.is_null()) << "no divergence in 40 steps: this test no longer exercises it";
  const int step = d.at("step").get<int>();
  EXPECT_GT(step, 0);
  EXPECT_LT(step, 40);
  EXPECT_EQ(j.at("steps").size(), size_t(step)) << "compared steps 0..step-1";
  // One token moved: the counts differ in two experts, by one each.
  const auto a = d.at("tokens_per_expert").get<std::vector<int64_t>>();
  const auto b = d.at("reference_tokens_per_expert").get<std::vector<int64_t>>();
  ASSERT_EQ(a.size(), b.size());
  int64_t moved = 0;
  for (size_t e = 0; e < a.size(); ++e) moved += std::abs(a[e] - b[e]);
  EXPECT_EQ(moved, 2);
  EXPECT_LE(j.at("param_rel_l2").get<double>(), 1e-5);
}

// A real error: rank 0's shard of one expert's gate_proj scaled by 1 + 1e-4
// before the first step. It flips a token within a few steps, and the
// parameters at that step already differ beyond 1e-5 (rel L2 1.53e-5 at
// step 3; the whole 40-step run, before routing divergences were named,
// failed by far more, as every long MoE run did, correct or not).
TEST(VerifyRouting, APlantedErrorInAnExpertStillFails) {
  const nlohmann::json j =
      verify_json_run("--corrupt-shard model.layers.2.mlp.experts.6.gate_proj.weight:0:1e-4", 1);
  print_verdict("planted 1e-4", j);
  EXPECT_FALSE(j.at("passed").get<bool>());
  ASSERT_FALSE(j.at("first_mismatch").is_null());
  EXPECT_EQ(j["first_mismatch"]["kind"], "param");
  EXPECT_EQ(j["first_mismatch"]["name"], "model.layers.2.mlp.experts.6.gate_proj.weight");
}

// Routing that differs at step 0 leaves nothing to compare: a FAIL naming it.
// Rank 0's router of block 1 scaled by 1.5 keeps that block's order (the
// top-k of scaled logits) but not its gates, so block 3 routes otherwise.
TEST(VerifyRouting, RoutingThatDiffersBeforeAnyStepFails) {
  const nlohmann::json j = verify_json_run("--corrupt-shard model.layers.1.mlp.gate.weight:0:0.5", 1);
  print_verdict("router scaled 1.5", j);
  EXPECT_FALSE(j.at("passed").get<bool>());
  EXPECT_EQ(j.at("first_mismatch").at("kind"), "routing");
  EXPECT_EQ(j.at("routing_divergence").at("step"), 0);
  auto r = testing::run_cli("verify --model tiny-moe --tp 2 --steps 2 --arithmetic portable "
                            "--corrupt-shard model.layers.1.mlp.gate.weight:0:0.5");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("FAIL: the routing differs at step 0"), std::string::npos) << r.out;
}

// The first step whose tokens per expert differ, over every block.
TEST(VerifyRouting, DivergenceIsTheEarliestStepOfAnyBlock) {
  train::TrainResult a, b;
  a.moe_layers = {{1, {{4, 4}, {4, 4}, {3, 5}}, {}}, {3, {{4, 4}, {5, 3}, {5, 3}}, {}}};
  b.moe_layers = {{1, {{4, 4}, {4, 4}, {4, 4}}, {}}, {3, {{4, 4}, {4, 4}, {5, 3}}, {}}};
  const auto d = train::routing_divergence(a, b);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->step, 1);
  EXPECT_EQ(d->layer, 3);
  EXPECT_EQ(d->sharded, (std::vector<int64_t>{5, 3}));
  EXPECT_EQ(d->reference, (std::vector<int64_t>{4, 4}));
  EXPECT_FALSE(train::routing_divergence(b, b).has_value());
  EXPECT_FALSE(train::routing_divergence(train::TrainResult{}, b).has_value()) << "dense: no routing";
}

}  // namespace
}  // namespace shardlab
