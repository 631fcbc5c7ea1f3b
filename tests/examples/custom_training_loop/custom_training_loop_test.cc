// examples/custom_training_loop is the built-in trainer's pure data-parallel
// run written out on the public API: its losses and virtual step times must
// equal train()'s for the same options bit for bit (tolerance 0), its loss
// must fall, the check that says so must fail when nothing is learned
// (LR 0), and bad arguments are one line with exit code 2.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "model/config.h"
#include "model/train/trainer.h"
#include "runtime/cluster.h"
#include "support/compare.h"
#include "tests/support/cli_util.h"

namespace shardlab {
namespace {

using testing::expect_usage_error;
using testing::run_cli;

struct Step {
  float loss = 0;
  Time virtual_end = 0;  // ps
};

// The example's "step N loss L virtual T ms" lines.
std::vector<Step> parse_steps(const std::string& out) {
  std::vector<Step> steps;
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line)) {
    int n = 0;
    float loss = 0;
    double ms = 0;
    if (std::sscanf(line.c_str(), "step %d loss %f virtual %lf ms", &n, &loss, &ms) == 3)
      steps.push_back({loss, Time(std::llround(ms * 1e9))});
  }
  return steps;
}

// `shardlab train --model tiny --dp 2 --steps N` (the defaults the example uses:
// seed 1337, synthetic:markov, lr 1e-3, clip 1, a100-nvlink).
train::TrainResult builtin_trainer(int steps) {
  train::TrainOptions o;
  o.model = model::preset("tiny");
  o.parallel.dp = 2;
  o.steps = steps;
  Cluster cluster(load_profile("a100-nvlink"), {.world_size = o.parallel.world()});
  return train::train(cluster, o);
}

TEST(CustomTrainingLoop, MatchesTheBuiltinTrainerBitForBit) {
  constexpr int kSteps = 30;
  const auto r = run_cli(std::to_string(kSteps));
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("\nPASS: loss "), std::string::npos) << r.out;
  const std::vector<Step> mine = parse_steps(r.out);
  const train::TrainResult ref = builtin_trainer(kSteps);
  ASSERT_EQ(mine.size(), size_t(kSteps)) << r.out;
  ASSERT_EQ(ref.steps.size(), size_t(kSteps));
  std::vector<float> loss, want_loss;  // per step
  std::vector<Time> end, want_end;     // ps
  for (int s = 0; s < kSteps; ++s) {
    loss.push_back(mine[size_t(s)].loss), want_loss.push_back(float(ref.steps[size_t(s)].loss));
    end.push_back(mine[size_t(s)].virtual_end), want_end.push_back(ref.steps[size_t(s)].virtual_end);
  }
  const auto losses = testing::all_close(loss, want_loss, 0), ends = testing::all_close(end, want_end, 0);
  std::printf("custom loop vs train(), by step: losses %s; virtual ends (ps) %s; loss %.4f -> %.4f\n",
              losses.message(), ends.message(), ref.steps.front().loss, ref.steps.back().loss);
  EXPECT_TRUE(losses);
  EXPECT_TRUE(ends);
  EXPECT_LT(ref.steps.back().loss, 0.9 * ref.steps.front().loss);  // what the example's check says
}

TEST(CustomTrainingLoop, ItsCheckFailsWhenNothingIsLearned) {
  const auto r = run_cli("4 0");  // learning rate 0: the weights never move
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_NE(r.out.find("\nFAIL: loss "), std::string::npos) << r.out;
}

TEST(CustomTrainingLoop, BadArgumentsAreOneLineAndExitTwo) {
  for (const char* args : {"abc", "5x", "1", "1000000", "10 1", "10 -0.1", "10 nan", "10 0.1 extra"})
    expect_usage_error(args, "usage: custom_training_loop [STEPS [LR]]");
}

}  // namespace
}  // namespace shardlab
