// `shardlab verify`'s tolerance from a measured noise floor (issue 27): long
// runs' fp32 drift passes, small real errors still fail, and the help says
// what the tolerances are.
#include <cstdio>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "model/config.h"
#include "model/train/verify.h"
#include "tests/support/cli_util.h"

namespace shardlab {
namespace {

using testing::expect_usage_error;
using testing::run_cli;

// verify --json with `args` after the model; the exit code must be `code`.
nlohmann::json verify_json_run(const std::string& args, int code) {
  auto r = run_cli("verify --model tiny --json " + args);
  EXPECT_EQ(r.code, code) << args << "\n" << r.err << r.out.substr(0, 2000);
  return nlohmann::json::parse(r.out.empty() ? "{}" : r.out);
}

double num(const nlohmann::json& j, const char* a, const char* b = nullptr) {
  const nlohmann::json& v = b ? j.at(a).at(b) : j.at(a);
  return v.get<double>();
}

// Prints what a numerical verdict rests on: the difference, the floor, the tolerance.
void print_verdict(const std::string& what, const nlohmann::json& j) {
  std::printf("%s: parameter rel L2 %.3e, max loss rel diff %.3e; noise floor %.3e (param), %.3e (loss); "
              "factor %g; tolerances %.3e (param), %.3e (loss)\n",
              what.c_str(), num(j, "param_rel_l2"), num(j, "max_loss_rel_diff"), num(j, "noise_floor", "param_rel_l2"),
              num(j, "noise_floor", "max_loss_rel_diff"), num(j, "floor_factor"), num(j, "tolerances", "param"),
              num(j, "tolerances", "loss"));
}

// Real fp32 drift beyond the old fixed 1e-5: tp 2 x cp 2 x dp 2, ZeRO-3 and
// sp, 50 steps at lr 3e-3 (parameter rel L2 2.2e-5 at 50 steps, 2.8e-5 at 80,
// 4.7e-5 at 150; step-0 gradients agree to 1e-6 and the drift grows smoothly
// with the steps). The tolerance is 4 x the drift of two unsharded runs that
// differ in their micro-batch split and in their GEMMs' sums over K (split in
// two halves, as tp and cp split theirs), which must cover it. ~6 s on 2 cores.
TEST(VerifyFloor, LongRunFp32DriftPassesAgainstTheMeasuredFloor) {
  const std::string cfg = "--steps 50 --tp 2 --cp 2 --dp 2 --zero 3 --sp --lr 3e-3";
  const nlohmann::json j = verify_json_run(cfg, 0);
  print_verdict(cfg, j);
  EXPECT_TRUE(j.at("passed").get<bool>());
  EXPECT_TRUE(j.at("noise_floor").at("measured").get<bool>());
  EXPECT_GT(num(j, "param_rel_l2"), 1e-5) << "no longer beyond the old fixed tolerance: the test shows nothing";
  EXPECT_LE(num(j, "param_rel_l2"), num(j, "tolerances", "param"));
  EXPECT_TRUE(j.at("noise_floor").at("split_sums").get<bool>());
  EXPECT_EQ(num(j, "floor_factor"), train::kSplitFloorFactor);
  EXPECT_DOUBLE_EQ(num(j, "tolerances", "param"), train::kSplitFloorFactor * num(j, "noise_floor", "param_rel_l2"));
}

// The issue's case verbatim (lr 1e-3): it failed at 2.1e-5 > 1e-5 with the
// Eigen sums of c4d6923; with the fixed-lane sums its drift is ~5e-6, and it
// passes with the floor printed. ~10 s.
TEST(VerifyFloor, TheIssuesLongRunPasses) {
  const std::string cfg = "--steps 150 --tp 2 --cp 2 --dp 2 --zero 3 --sp";
  const nlohmann::json j = verify_json_run(cfg, 0);
  print_verdict(cfg, j);
  EXPECT_TRUE(j.at("passed").get<bool>());
  EXPECT_LE(num(j, "param_rel_l2"), num(j, "tolerances", "param"));
}

// A real error well below the old tolerance's reach: rank 0's shard of
// ln_f.weight scaled by 1 + 1e-4 before the first step, the drift case's
// config and steps. Training carries it along; the floor-based tolerance
// (4x the floor, 1.5e-4 here) catches it (parameter rel L2 1.8e-3).
TEST(VerifyFloor, APlantedRelativeErrorOf1e4FailsOverTheSameSteps) {
  const std::string cfg =
      "--steps 50 --tp 2 --cp 2 --dp 2 --zero 3 --sp --lr 3e-3 --corrupt-shard transformer.ln_f.weight:0:1e-4";
  const nlohmann::json j = verify_json_run(cfg, 1);
  print_verdict(cfg, j);
  EXPECT_FALSE(j.at("passed").get<bool>());
  ASSERT_FALSE(j.at("first_mismatch").is_null());
  EXPECT_NE(j["first_mismatch"]["kind"], "replica") << "caught by the replica check, not by the tolerance";
  EXPECT_GT(num(j, "param_rel_l2"), num(j, "tolerances", "param"));
}

// The same planted error over 20 steps (the short case of the default suite),
// and on tp 2 alone, where no replica could give it away.
TEST(VerifyFloor, APlantedRelativeErrorFailsOnShortRunsToo) {
  for (const std::string cfg : {"--steps 20 --tp 2 --corrupt-shard transformer.h.1.mlp.c_fc.weight:0:1e-4",
                                "--steps 20 --tp 2 --cp 2 --dp 2 --zero 3 --sp --corrupt-shard transformer.ln_f.weight:0:1e-4"}) {
    const nlohmann::json j = verify_json_run(cfg, 1);
    print_verdict(cfg, j);
    EXPECT_EQ(j.at("first_mismatch").at("kind"), "param") << cfg;
    EXPECT_GT(num(j, "param_rel_l2"), num(j, "tolerances", "param")) << cfg;
  }
}

TEST(VerifyFloor, JsonKeepsItsFieldsAndAddsTheFloorAndFactor) {
  const nlohmann::json j = verify_json_run("--steps 3 --dp 2", 0);
  for (const char* k : {"passed", "max_loss_rel_diff", "max_param_abs_diff", "param_rel_l2", "first_mismatch",
                        "noise_floor", "floor_factor", "tolerances", "sharded"})
    EXPECT_TRUE(j.contains(k)) << k;
  EXPECT_EQ(j["noise_floor"]["micro_batches"], nlohmann::json::array({1, 2}));
  EXPECT_EQ(num(j, "floor_factor"), train::kFloorFactor);
  // Below 1e-5 x 1/10 the floor leaves the default: never stricter than before.
  EXPECT_GE(num(j, "tolerances", "param"), 1e-5);
}

// The user's tolerances win over the floor's, and are reported as given.
TEST(VerifyFloor, GivenTolerancesWin) {
  const nlohmann::json j = verify_json_run("--steps 3 --tp 2 --tol-param 1e-12", 1);
  EXPECT_EQ(num(j, "tolerances", "param"), 1e-12);
  EXPECT_TRUE(j["tolerances"]["param_given"].get<bool>());
  EXPECT_FALSE(j["tolerances"]["loss_given"].get<bool>());
  EXPECT_EQ(j["first_mismatch"]["kind"], "param");
  auto both = run_cli("verify --model tiny --steps 3 --tp 2 --tol-param 1e-3 --tol-loss 1e-3");
  EXPECT_EQ(both.code, 0) << both.err;
  EXPECT_NE(both.out.find("noise floor: not measured (--tol-loss and --tol-param were given)"), std::string::npos)
      << both.out;
}

// Without a split that changes only the order, the default applies and verify says why.
TEST(VerifyFloor, NoSplitFallsBackToTheDefaultAndSaysWhy) {
  const nlohmann::json one = verify_json_run("--steps 2 --pp 2 --batch 1", 0);
  EXPECT_FALSE(one["noise_floor"]["measured"].get<bool>());
  EXPECT_NE(one["noise_floor"]["note"].get<std::string>().find("batch of one sequence"), std::string::npos);
  EXPECT_EQ(num(one, "tolerances", "param"), 1e-5);
  // tp splits the GEMMs' sums: the floor run splits its own, with the batch as it is.
  const nlohmann::json tp = verify_json_run("--steps 2 --tp 2 --batch 1", 0);
  EXPECT_TRUE(tp["noise_floor"]["measured"].get<bool>());
  EXPECT_TRUE(tp["noise_floor"]["split_sums"].get<bool>());
  EXPECT_EQ(tp["noise_floor"]["micro_batches"], nlohmann::json::array({1, 1}));
  EXPECT_GT(num(tp, "noise_floor", "param_rel_l2"), 0) << "the split sums changed no bit";
  // MoE with an expert capacity: which tokens overflow depends on their
  // order, so neither a split nor reversed sequences change only the sums.
  const nlohmann::json moe = verify_json_run("--steps 2 --dp 2 --experts 4 --capacity-factor 1.25", 0);
  EXPECT_FALSE(moe["noise_floor"]["measured"].get<bool>());
  EXPECT_NE(moe["noise_floor"]["note"].get<std::string>().find("capacity"), std::string::npos);
  // With a balancing loss alone: the floor run reverses every micro-batch's sequences.
  const nlohmann::json aux = verify_json_run("--steps 2 --dp 2 --experts 4", 0);
  EXPECT_TRUE(aux["noise_floor"]["measured"].get<bool>());
  EXPECT_TRUE(aux["noise_floor"]["reversed_rows"].get<bool>());
  auto text = run_cli("verify --model tiny --steps 2 --dp 2 --experts 4");
  EXPECT_NE(text.out.find("the second with every micro-batch's sequences in reverse order"), std::string::npos)
      << text.out;
}

TEST(VerifyFloor, TheTextReportPrintsTheFloorAndTheFactor) {
  auto r = run_cli("verify --model tiny --steps 3 --tp 2");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("noise floor: two unsharded runs, --micro-batches 1 and 2, the second with every GEMM's "
                       "sum over K in two halves"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("factor 4"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("tolerances: loss 1e-05"), std::string::npos) << r.out;
  // dp alone splits no per-token sum: the batch's floor and factor 10.
  auto dp = run_cli("verify --model tiny --steps 3 --dp 2");
  EXPECT_EQ(dp.code, 0) << dp.err;
  EXPECT_NE(dp.out.find("two unsharded runs, --micro-batches 1 and 2 (only"), std::string::npos) << dp.out;
  EXPECT_NE(dp.out.find("factor 10"), std::string::npos) << dp.out;
}

// dp 1 and no other split: the "sharded" run is the reference itself.
TEST(VerifyFloor, NothingShardedSaysSo) {
  auto r = run_cli("verify --model tiny --steps 2");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("nothing is sharded"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("PASS: matches"), std::string::npos) << r.out;
  const nlohmann::json j = verify_json_run("--steps 2 --zero 1", 0);
  EXPECT_FALSE(j.at("sharded").get<bool>());
}

TEST(VerifyFloor, HelpSaysTolParamIsTheWholeVectorAndShowsCorruptShard) {
  auto r = run_cli("verify --help");
  EXPECT_EQ(r.code, 0);
  EXPECT_EQ(r.out.find("per tensor"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("whole parameter vector"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--corrupt-shard NAME:RANK[:REL]"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("noise floor"), std::string::npos) << r.out;
}

TEST(VerifyFloor, BadRelativeCorruptionIsOneLineAndExitCode2) {
  expect_usage_error("verify --model tiny --steps 1 --tp 2 --corrupt-shard transformer.wte.weight:0:x", "REL \"x\"");
  expect_usage_error("verify --model tiny --steps 1 --tp 2 --corrupt-shard transformer.wte.weight:0:0", "0 < |REL| <= 1");
  expect_usage_error("verify --model tiny --steps 1 --tp 2 --corrupt-shard transformer.wte.weight:0:2", "0 < |REL| <= 1");
  expect_usage_error("verify --model tiny --steps 1 --tp 2 --cp 2 --dp 2 --zero 3 --sp --corrupt-shard "
                     "transformer.h.1.mlp.c_fc.weight:0:1e-4",
                     "holds no value of \"transformer.h.1.mlp.c_fc.weight\" yet");
}

// The library's rules, without a run.
TEST(VerifyFloor, SplitAndTolerancesRules) {
  train::TrainOptions o;
  o.model = model::preset("tiny");  // batch 8
  std::string note;
  auto split = [&] { return train::floor_run(o, false, note).micro_batches; };
  EXPECT_EQ(split(), 2);
  o.micro_batches = 4;
  EXPECT_EQ(split(), 1);
  o.micro_batches = 1;
  o.model.batch_size = 9;
  EXPECT_EQ(split(), 3);
  o.model.batch_size = 1;
  EXPECT_EQ(split(), 0);
  EXPECT_FALSE(note.empty());
  // MoE with a balancing loss: the same micro-batches, rows reversed; with
  // micro-batches of one sequence, or a capacity, none.
  o.model = model::preset("tiny-moe");  // batch 8, aux 0.01
  o.micro_batches = 2;
  EXPECT_EQ(train::floor_run(o, false, note).micro_batches, 2);
  EXPECT_TRUE(train::floor_run(o, false, note).reversed);
  o.micro_batches = 8;
  EXPECT_EQ(split(), 0);
  o.micro_batches = 1;
  o.model.capacity_factor = 1.25;
  EXPECT_EQ(split(), 0);
  EXPECT_NE(note.find("capacity"), std::string::npos) << note;
  o.model.capacity_factor = 0;
  o.model.aux_coef = 0;  // no balancing loss: a split changes only the order
  EXPECT_EQ(split(), 2);
  EXPECT_FALSE(train::floor_run(o, false, note).reversed);
  // Split sums (tp, cp): with the batch's split where there is one, alone
  // (the reference's micro-batches) where there is none.
  EXPECT_TRUE(train::floor_run(o, true, note).split_sums);
  EXPECT_EQ(train::floor_run(o, true, note).micro_batches, 2);
  o.model.capacity_factor = 1.25;
  EXPECT_EQ(train::floor_run(o, true, note).micro_batches, 1);
  EXPECT_TRUE(train::floor_run(o, true, note).split_sums);
  EXPECT_TRUE(note.empty()) << note;
  o.model.capacity_factor = 0;
  EXPECT_EQ(train::floor_factor_for(true), train::kSplitFloorFactor);
  EXPECT_EQ(train::floor_factor_for(false), train::kFloorFactor);

  train::NoiseFloor f;
  f.measured = true;
  f.loss = 1e-7;
  f.param = 3e-6;
  const train::VerifyOptions a = train::floor_options(f, 10, {}, {}, true);
  EXPECT_DOUBLE_EQ(a.tol_loss, 1e-5);  // 10 x 1e-7 is below the default
  EXPECT_DOUBLE_EQ(a.tol_param, 3e-5);
  EXPECT_DOUBLE_EQ(a.tol_grad, 1e-5);  // step-0 gradients have not drifted
  const train::VerifyOptions b = train::floor_options(f, 10, 2e-3, 2e-6, false);
  EXPECT_DOUBLE_EQ(b.tol_loss, 2e-3);
  EXPECT_DOUBLE_EQ(b.tol_param, 2e-6);
  EXPECT_DOUBLE_EQ(b.tol_grad, 2e-6);
  f.measured = false;
  EXPECT_DOUBLE_EQ(train::floor_options(f, 10, {}, {}, false).tol_param, 1e-5);
}

}  // namespace
}  // namespace shardlab
