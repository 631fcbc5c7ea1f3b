// examples/hello_cluster: it passes its own checks on every built-in profile
// and a one-node profile file, prints the times a hand calculation gives, and
// refuses bad input with one line and exit code 2.
#include <cstdio>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "tests/support/cli_util.h"

namespace shardlab {
namespace {

using testing::expect_usage_error;
using testing::run_cli;

// The virtual time (us) of the table row that starts with `label`; -1 if none.
double virtual_us(const std::string& out, const std::string& label) {
  const size_t at = out.find("\n" + label + " ");
  double bytes = 0, t = -1;
  if (at != std::string::npos) std::sscanf(out.c_str() + at + 1 + 28, "%lf %lf", &bytes, &t);
  return t;
}

TEST(HelloCluster, PassesOnEveryBuiltinProfile) {
  for (const char* profile : {"a100-nvlink", "a100-pcie", "h100-nvlink"}) {
    const auto r = run_cli(profile);
    EXPECT_EQ(r.code, 0) << profile << "\n" << r.out << r.err;
    EXPECT_NE(r.out.find("\nPASS: "), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("MISMATCH"), std::string::npos) << r.out;
  }
}

// By hand, a100-nvlink: 1 MiB in 8192 packets of 128 B, each with 32 B of
// header, is W = 1310720 B at 300 GB/s: w = ceil(4369066.67) ps = 4.369067 us,
// α = 2 us. Inter-node (HDR InfiniBand): 64 KiB in 16 packets of 4096 B + 42 B,
// W = 66208 B at 25 GB/s: 2.64832 us, α = 5 us. Printed to the picosecond.
TEST(HelloCluster, PrintsTheHandComputedTimes) {
  const auto r = run_cli("");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_DOUBLE_EQ(virtual_us(r.out, "0 -> 1"), 6.369067) << r.out;                    // α + w
  EXPECT_DOUBLE_EQ(virtual_us(r.out, "0 -> 1 queued behind it"), 10.738134) << r.out;  // α + 2w
  EXPECT_DOUBLE_EQ(virtual_us(r.out, "0 -> node 1 (inter-node)"), 7.648320) << r.out;  // α' + w'
  EXPECT_DOUBLE_EQ(virtual_us(r.out, "1 -> 0 reply"), 17.107201) << r.out;             // 2α + 3w
}

// One node: no inter-node message; no packets: W = S. 1 MiB at 100 GB/s is
// 10.48576 us, with α = 1 us: the reply arrives at 2 + 3 · 10.48576 us.
TEST(HelloCluster, OneNodeProfileFile) {
  const std::string path = ::testing::TempDir() + "hello_one_node.json";
  std::ofstream(path) << R"({"name": "one-node", "nodes": 1, "devices_per_node": 4,
    "device": {"peak_tflops": {"fp32": 19.5, "bf16": 312}, "mem_bandwidth_GBps": 2000,
               "memory_GiB": 80, "launch_overhead_us": 4},
    "links": {"intra": {"latency_us": 1, "bandwidth_GBps": 100},
              "inter": {"latency_us": 5, "bandwidth_GBps": 25}}})";
  const auto r = run_cli(path);
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("2 virtual devices"), std::string::npos) << r.out;
  EXPECT_EQ(virtual_us(r.out, "0 -> node 1 (inter-node)"), -1) << r.out;
  EXPECT_DOUBLE_EQ(virtual_us(r.out, "1 -> 0 reply"), 33.45728) << r.out;
}

TEST(HelloCluster, HelpIsTheUsageAndExitZero) {
  const auto r = run_cli("--help");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("usage: hello_cluster [PROFILE]"), std::string::npos) << r.out;
}

TEST(HelloCluster, BadInputIsOneLineAndExitTwo) {
  expect_usage_error("no-such-profile", "no-such-profile");
  expect_usage_error("a100-nvlink extra", "usage: hello_cluster [PROFILE]");
  const std::string path = ::testing::TempDir() + "hello_one_device.json";
  std::ofstream(path) << R"({"name": "single", "nodes": 2, "devices_per_node": 1,
    "device": {"peak_tflops": {"fp32": 19.5, "bf16": 312}, "mem_bandwidth_GBps": 2000,
               "memory_GiB": 80, "launch_overhead_us": 4},
    "links": {"intra": {"latency_us": 1, "bandwidth_GBps": 100},
              "inter": {"latency_us": 5, "bandwidth_GBps": 25}}})";
  expect_usage_error(path, "needs 2 devices per node");
}

}  // namespace
}  // namespace shardlab
