// The README's elastic restart: a device dies, the run stops with exit 3
// after its last checkpoint, and resumes on the devices left (dp 4 -> dp 2,
// resharding the optimizer state), ending where the uninterrupted run does.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "support/compare.h"
#include "tests/support/cli_util.h"

namespace shardlab::testing {
namespace {

TEST(CliElastic, ALostDeviceResumesOnFewerDevices) {
  const std::string dir = ::testing::TempDir() + "elastic_ckpt", report = ::testing::TempDir() + "elastic.json",
                    straight = ::testing::TempDir() + "elastic_straight.json";
  std::filesystem::remove_all(dir);
  const std::string run = "train --model tiny --layers 2 --steps 8 --zero 1 ";
  const CliResult died = run_cli(run + "--dp 4 --checkpoint-dir " + dir + " --checkpoint-every 2 --fault dead:3:step=5");
  EXPECT_EQ(died.code, 3) << died.err;
  EXPECT_NE(died.err.find("device 3 died at step 5"), std::string::npos) << died.err;
  EXPECT_EQ(slurp(dir + "/latest"), "step-000004\n");
  const CliResult resumed = run_cli(run + "--dp 2 --resume " + dir + " --report " + report);
  ASSERT_EQ(resumed.code, 0) << resumed.err;
  ASSERT_EQ(run_cli(run + "--dp 4 --report " + straight).code, 0);
  const nlohmann::json a = nlohmann::json::parse(slurp(straight)), b = nlohmann::json::parse(slurp(report));
  ASSERT_EQ(b["steps"].size(), 8u);
  std::vector<double> la, lb;  // per step: uninterrupted, resumed
  for (int s = 0; s < 8; ++s) la.push_back(a["steps"][s]["loss"]), lb.push_back(b["steps"][s]["loss"]);
  // Steps 0-3 ran before the failure, on the same devices: bit for bit.
  const auto before = all_close(std::span(lb).first(4), std::span(la).first(4), 0);
  // dp 2 sums the same gradients in another order: float rounding only.
  const auto after = all_close_rel(std::span(lb).last(4), std::span(la).last(4), 1e-5, 0);
  std::printf("elastic restart, resumed vs uninterrupted loss: steps 0-3 %s; steps 4-7 %s\n",
              before.message(), after.message());
  EXPECT_TRUE(before);
  EXPECT_TRUE(after);
}

}  // namespace
}  // namespace shardlab::testing
