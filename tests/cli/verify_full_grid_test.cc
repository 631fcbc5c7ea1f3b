// The full verify grid of issue 5: dense and MoE x dp {1,2,4} x tp {1,2,4} x
// sp x ZeRO {0,1,2} where valid and not a self-comparison, 5 steps of tiny each. Labelled "full": `make test-full`
// (ctest -L full); CI runs the subset in cli_verify_test.cc.
#include <tuple>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/support/cli_util.h"

namespace shardlab {
namespace {

using Config = std::tuple<bool, int, int, bool, int>;  // moe, dp, tp, sp, zero

class FullGrid : public ::testing::TestWithParam<Config> {};

TEST_P(FullGrid, MatchesTheUnshardedModel) {
  const auto [moe, dp, tp, sp, zero] = GetParam();
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

// Only configurations that are valid and compare two different runs:
// --sp needs --tp > 1; dp 1 x tp 1 is the unsharded reference itself; ZeRO
// over dp 1 is plain dp 1 (a duplicate). Per model: dp 1 x tp {2, 4} x sp
// {off, on} = 4, dp {2, 4} x (tp 1 x 3 ZeRO + tp {2, 4} x sp x 3 ZeRO) = 30;
// 34 x {dense, MoE} = 68.
std::vector<Config> valid_configs() {
  std::vector<Config> out;
  for (bool moe : {false, true})
    for (int dp : {1, 2, 4})
      for (int tp : {1, 2, 4})
        for (bool sp : {false, true})
          for (int zero : {0, 1, 2})
            if (!(sp && tp == 1) && !(dp == 1 && tp == 1) && !(dp == 1 && zero > 0))
              out.emplace_back(moe, dp, tp, sp, zero);
  return out;
}

TEST(FullGridCases, SixtyEightValidConfigurations) { EXPECT_EQ(valid_configs().size(), 68u); }

INSTANTIATE_TEST_SUITE_P(All, FullGrid, ::testing::ValuesIn(valid_configs()), grid_name);

}  // namespace
}  // namespace shardlab
