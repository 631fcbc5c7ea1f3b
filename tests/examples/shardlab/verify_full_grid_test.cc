// The full verify grid of issue 5: dense and MoE x dp {1,2,4} x tp {1,2,4} x
// sp x ZeRO {0,1,2}, 5 steps of tiny each. Labelled "full": `make test-full`
// (ctest -L full); CI runs the subset in cli_verify_test.cc.
#include <tuple>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/examples/shardlab/cli_util.h"

namespace shardlab {
namespace {

using Config = std::tuple<bool, int, int, bool, int>;  // moe, dp, tp, sp, zero

class FullGrid : public ::testing::TestWithParam<Config> {};

TEST_P(FullGrid, MatchesTheUnshardedModel) {
  const auto [moe, dp, tp, sp, zero] = GetParam();
  if (sp && tp == 1) GTEST_SKIP() << "--sp needs --tp > 1";
  const std::string args = "verify --model tiny --steps 5 --json --bucket-mb 0.5 --dp " + std::to_string(dp) +
                           " --tp " + std::to_string(tp) + (sp ? " --sp" : "") + " --zero " + std::to_string(zero) +
                           (moe ? " --experts 4 --top-k 2" : "");
  auto r = testing::run_cli(args);
  ASSERT_EQ(r.code, 0) << args << "\n" << r.err << r.out.substr(0, 3000);
  auto j = nlohmann::json::parse(r.out);
  const double loss = j.at("max_loss_rel_diff").get<double>(), param = j.at("param_rel_l2").get<double>();
  std::printf("%s: max loss rel diff %.3e, parameter rel L2 %.3e (tolerances 1e-5)\n", args.c_str(), loss, param);
  EXPECT_TRUE(j.at("passed").get<bool>());
  EXPECT_LE(loss, 1e-5);
  EXPECT_LE(param, 1e-5);
  EXPECT_TRUE(j.at("first_mismatch").is_null()) << j.at("first_mismatch").dump();
}

std::string grid_name(const ::testing::TestParamInfo<Config>& info) {
  const auto [moe, dp, tp, sp, zero] = info.param;
  return std::string(moe ? "moe" : "dense") + "_dp" + std::to_string(dp) + "_tp" + std::to_string(tp) +
         (sp ? "_sp" : "") + "_zero" + std::to_string(zero);
}

INSTANTIATE_TEST_SUITE_P(All, FullGrid,
                         ::testing::Combine(::testing::Bool(), ::testing::Values(1, 2, 4), ::testing::Values(1, 2, 4),
                                            ::testing::Bool(), ::testing::Values(0, 1, 2)),
                         grid_name);

}  // namespace
}  // namespace shardlab
