// The README's elastic restart: a device dies, the run stops with exit 3
// after its last checkpoint, and resumes on the devices left (dp 4 -> dp 2,
// resharding the optimizer state), ending where the uninterrupted run does.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/examples/shardlab/cli_util.h"

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
  double worst = 0;
  for (int s = 0; s < 8; ++s) {
    const double la = a["steps"][s]["loss"].get<double>(), lb = b["steps"][s]["loss"].get<double>();
    if (s < 4) {
      EXPECT_EQ(la, lb) << "step " << s << " ran before the failure, on the same devices";
    }
    worst = std::max(worst, std::abs(la - lb) / std::abs(la));
  }
  // dp 2 sums the same gradients in another order: float rounding only.
  std::printf("elastic restart: max loss relative difference %.3g (tolerance 1e-5)\n", worst);
  EXPECT_LE(worst, 1e-5);
}

}  // namespace
}  // namespace shardlab::testing
