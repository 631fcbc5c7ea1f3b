// `--fault` on the command line: bad specs refused before any thread starts
// (one line, exit 2), a dead device or downed link stops the run with exit 3
// and one line (dense dp, and MoE under pipeline and expert parallelism),
// and the slow faults change the clock exactly where they say, never the
// numbers.
#include <fstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/support/cli_util.h"

namespace shardlab {
namespace {

using testing::count_lines;
using testing::expect_usage_error;
using testing::run_cli;

const std::string kTrain = "train --model nano --steps 3 --dp 4 ";

TEST(FaultCli, BadSpecsAreOneLineAndExit2) {
  const std::pair<const char*, const char*> cases[] = {
      {"--fault bogus", "--fault bogus: expected KIND:TARGET"},
      {"--fault slow-nic:4:bw=0.5", "device 4 is not one of the 4 devices of this run"},
      {"--fault slow-link:0-1:bw=2", "bw \"2\" is not a number in"},
      {"--fault straggler:1:compute=0.5", "compute \"0.5\""},
      {"--fault dead:1:step=3", "step 3 is not below --steps 3"},
      {"--fault dead:1:step=1 --fault link-down:0-1:step=2", "only one dead device or downed link"},
      {"--fault memory:1:capacity=1TiB", "more than the device's capacity"},
      {"--fault memory:1:capacity=0", "capacity 0"},
      {"--fault=", "--fault"},
      {"--fault @/nonexistent/faults.json", "--fault @/nonexistent/faults.json: no such file"},
  };
  for (auto [flags, needle] : cases) expect_usage_error(kTrain + flags, needle);
  expect_usage_error("train --model nano --steps 3 --fault dead:0:step=1", "no peer to lose");
  expect_usage_error("verify --model nano --steps 2 --dp 2 --fault slow-nic:2:bw=0.5", "device 2 is not one");
}

TEST(FaultCli, AFaultFileHoldsAListOfSpecs) {
  const std::string path = ::testing::TempDir() + "fault_cli.json";
  std::ofstream(path) << R"(["straggler:1:compute=2", "dead:3:step=1"])";
  const auto r = run_cli(kTrain + "--json --fault @" + path);
  EXPECT_EQ(r.code, 3) << r.err;
  // The tuner's choice for nano's small buckets under NCCL's protocols: the
  // tree, where device 3's first send goes to its parent, device 1.
  EXPECT_EQ(r.err, "shardlab: error: device 3 died at step 1 during all_reduce (tree) on dp[0,1,2,3] (its send "
                   "to device 1); resume from a checkpoint without it\n");
  std::ofstream(path) << R"(["straggler:1"])";
  expect_usage_error(kTrain + "--fault @" + path, "--fault straggler:1: expected KIND:TARGET");
}

// Exit 3, one line starting with `start`, nothing on stdout (--json: no
// progress lines on stderr before the error).
void expect_stopped(const std::string& args, const std::string& start) {
  const auto r = run_cli(args + " --json");
  EXPECT_EQ(r.code, 3) << args << "\n" << r.err;
  EXPECT_EQ(count_lines(r.err), 1) << args << "\n" << r.err;
  EXPECT_TRUE(r.err.starts_with("shardlab: error: " + start)) << args << "\n" << r.err;
  EXPECT_EQ(r.out, "") << args;
}

TEST(FaultCli, ADeadDeviceOrDownedLinkStopsTheRunWithExit3) {
  expect_stopped(kTrain + "--fault dead:2:step=1", "device 2 died at step 1 during all_reduce");
  expect_stopped(kTrain + "--fault link-down:1-2:step=2", "link 1-2 went down at step 2 during all_reduce");
  // MoE with expert parallelism inside data parallelism, on a two-stage pipeline.
  const std::string moe = "train --model nano --experts 4 --ep 2 --dp 2 --pp 2 --micro-batches 2 --steps 3 ";
  expect_stopped(moe + "--fault dead:3:step=1", "device 3 died at step 1 during ");
  expect_stopped(moe + "--fault link-down:0-2:step=2",
                 "link 0-2 went down at step 2 during a point-to-point transfer (device 0's send to device 2)");
  expect_stopped("train --model nano --tp 2 --pp 2 --micro-batches 2 --steps 2 --phantom --fault dead:1:step=0",
                 "device 1 died at step 0 during ");
}

nlohmann::json report(const std::string& args) {
  const auto r = run_cli(args + " --json");
  EXPECT_EQ(r.code, 0) << args << "\n" << r.err;
  return nlohmann::json::parse(r.out);
}

TEST(FaultCli, ASlowNicFromAStepLeavesEarlierStepsBitForBit) {
  const std::string base = "train --model nano --steps 4 --dp 4 --bucket-mb 0.01";
  const auto plain = report(base);
  const auto slow = report(base + " --fault slow-nic:1:bw=0.25,from_step=2");
  for (int s = 0; s < 4; ++s) {
    const auto &a = plain["steps"][s], &b = slow["steps"][s];
    EXPECT_EQ(a["loss"], b["loss"]) << "step " << s;  // the numbers never change
    EXPECT_EQ(a["grad_norm"], b["grad_norm"]) << "step " << s;
    if (s < 2) {
      EXPECT_EQ(a["virtual_time_s"], b["virtual_time_s"]) << "step " << s;
    }
  }
  const double d_plain = plain["steps"][3]["virtual_time_s"].get<double>() - plain["steps"][2]["virtual_time_s"].get<double>();
  const double d_slow = slow["steps"][3]["virtual_time_s"].get<double>() - slow["steps"][2]["virtual_time_s"].get<double>();
  EXPECT_GT(d_slow, d_plain);
}

TEST(FaultCli, AStragglersComputeScalesExactlyAndTheOthersWait) {
  const std::string base = "train --model nano --steps 2 --dp 2";
  const auto plain = report(base);
  const auto slow = report(base + " --fault straggler:1:compute=2");
  const auto &p = plain["devices"], &s = slow["devices"];
  EXPECT_EQ(s[1]["compute_s"].get<double>(), 2 * p[1]["compute_s"].get<double>());
  EXPECT_EQ(s[0]["compute_s"], p[0]["compute_s"]);
  EXPECT_GT(s[0]["idle_s"].get<double>(), p[0]["idle_s"].get<double>());  // device 0 waits at the all-reduces
  EXPECT_EQ(slow["steps"][1]["loss"], plain["steps"][1]["loss"]);
}

TEST(FaultCli, MemoryPressureTurnsAFittingRunIntoTheModeledOom) {
  const std::string base = "train --model nano --steps 1 --dp 2 --memory 64MiB";
  EXPECT_EQ(run_cli(base).code, 0);
  expect_usage_error(base + " --fault memory:1:capacity=0.001", "device 1: out of memory allocating");
  expect_usage_error(base + " --fault memory:1:capacity=16KiB", "of 16.0 KiB capacity");
  EXPECT_EQ(report(base + " --fault memory:1:capacity=0.5")["devices"][1]["capacity_bytes"], 32u << 20);
}

TEST(FaultCli, VerifyPassesUnderSlowFaults) {
  const auto r = run_cli("verify --model nano --steps 2 --dp 2 --fault straggler:1:compute=3 --fault "
                         "slow-link:0-1:bw=0.1,lat_us=+20");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("PASS"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace shardlab
