// The command-line contract of `shardlab p2p` and `shardlab profiles`, and of
// the SHARDLAB_HOST_THREADS variable every command reads.
#include <cstdlib>
#include <cmath>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "runtime/profile.h"
#include "runtime/time.h"
#include "support/compare.h"
#include "tests/support/cli_util.h"

namespace shardlab {
namespace {

using testing::expect_usage_error;
using testing::run_cli;

// p2p moves device buffers as cudaMemcpy does (copy engines): S bytes of
// payload travel in packets of at most P = copy_payload_bytes, each with H
// header bytes, so the wire carries W = S + ceil(S/P)·H (W = S without packets).
uint64_t wire_bytes(const LinkSpec& l, uint64_t bytes) {
  const uint64_t P = static_cast<uint64_t>(l.copy_payload_bytes);
  return P == 0 ? bytes
                : bytes + (bytes + P - 1) / P * static_cast<uint64_t>(l.packet_header_bytes);
}
// Exact one-way time of one message: a + ceil(W * 1e12 / B) picoseconds.
double exact_us(const LinkSpec& l, uint64_t bytes) {
  return to_us(l.latency() + transfer_time(wire_bytes(l, bytes), l.bytes_per_second()));
}

void check_p2p(const std::string& profile_name, int src, int dst, const char* link_class) {
  auto r = run_cli("p2p --json --profile " + profile_name + " --src " + std::to_string(src) +
                   " --dst " + std::to_string(dst) + " --max-bytes 256MiB");
  ASSERT_EQ(r.code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["profile"], profile_name);
  EXPECT_EQ(j["src"], src);
  EXPECT_EQ(j["dst"], dst);
  EXPECT_EQ(j["link"], link_class);
  const HardwareProfile p = load_profile(profile_name);
  const LinkSpec& l = std::string(link_class) == "intra" ? p.intra : p.inter;
  const auto& rows = j["rows"];
  ASSERT_EQ(rows.size(), 29u);  // 1 B .. 256 MiB
  std::vector<double> latency, exact;
  for (const auto& row : rows) {
    const uint64_t bytes = row["bytes"];
    latency.push_back(row["latency_us"].get<double>());
    exact.push_back(exact_us(l, bytes));
    EXPECT_GT(row["host_GBps"].get<double>(), 0);
  }
  // Exact up to the JSON's double printing.
  const auto close = shardlab::testing::all_close(latency, exact, 1e-6);
  std::printf("%s %s: latency vs a + W/B (us): %s\n", profile_name.c_str(), link_class,
              close.message());
  EXPECT_TRUE(close);
  const double lat0 = rows.front()["latency_us"];
  const double bw_last = rows.back()["bandwidth_GBps"];
  // The link's achieved rate: B · S/W for a large S.
  const double S = 256.0 * 1024 * 1024;
  const double achieved = l.bandwidth_GBps * S / static_cast<double>(wire_bytes(l, 256ull << 20));
  std::printf("  smallest latency %.4f us vs %.4f; 256 MiB bandwidth %.3f GB/s vs %.1f\n", lat0,
              l.latency_us, bw_last, achieved);
  EXPECT_NEAR(lat0, l.latency_us, 0.01 * l.latency_us);
  EXPECT_NEAR(bw_last, achieved, 0.01 * achieved);
}

TEST(CliP2p, IntraNodeFiguresAreTheProfilesLink) { check_p2p("a100-nvlink", 0, 1, "intra"); }
TEST(CliP2p, InterNodeFiguresAreTheProfilesLink) { check_p2p("h100-nvlink", 3, 12, "inter"); }

TEST(CliP2p, BidirectionalSumsBothDirections) {
  auto r = run_cli("p2p --json --bidirectional --min-bytes 64MiB --max-bytes 64MiB");
  ASSERT_EQ(r.code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  const double bw = j["rows"][0]["bandwidth_GBps"];
  // Each direction at the copy engines' rate, 300 GB/s x 256/(256 + 32).
  const double both = 2 * 300.0 * 256 / 288;
  std::printf("bidirectional 64 MiB: %.2f GB/s (2 x 266.67 = %.2f)\n", bw, both);
  EXPECT_NEAR(bw, both, 0.02 * both);
}

TEST(CliP2p, TableAndTraceFile) {
  const std::string trace = ::testing::TempDir() + "p2p_trace.json";
  auto r = run_cli("p2p --min-bytes 1K --max-bytes 4K --trace " + trace);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("latency(us)"), std::string::npos);
  EXPECT_NE(r.out.find("      4096"), std::string::npos) << r.out;
  auto j = nlohmann::json::parse(testing::slurp(trace));
  EXPECT_GT(j["traceEvents"].size(), 10u);
}

TEST(CliP2p, CustomProfileFile) {
  nlohmann::json p = profile_to_json(load_profile("a100-pcie"));
  p["name"] = "slowbox";
  p["links"]["intra"] = {{"latency_us", 10.0}, {"bandwidth_GBps", 1.0}};
  const std::string path = ::testing::TempDir() + "slowbox.json";
  std::ofstream(path) << p.dump();
  auto r = run_cli("p2p --json --min-bytes 1MB --max-bytes 1MB --profile " + path);
  ASSERT_EQ(r.code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["profile"], "slowbox");
  EXPECT_NEAR(j["rows"][0]["latency_us"].get<double>(), 10.0 + 1000.0, 1e-9);
}

TEST(CliProfiles, JsonListsEveryBuiltin) {
  auto r = run_cli("profiles --json");
  ASSERT_EQ(r.code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  ASSERT_TRUE(j.is_array());
  std::vector<std::string> names;
  for (const auto& p : j) {
    names.push_back(p["name"]);
    EXPECT_TRUE(p["links"]["inter"].contains("bandwidth_GBps"));
    EXPECT_TRUE(p["device"]["peak_tflops"].contains("bf16"));
  }
  EXPECT_EQ(names,
            (std::vector<std::string>{"a100-nvlink", "a100-nvlink-4nic", "a100-pcie", "a100-pcie-8", "h100-nvlink",
                                      "h200-nvlink", "b200-nvlink", "h100-roce"}));
  EXPECT_TRUE(j[3].contains("pcie"));  // the PCIe tree of the 8x A100 PCIe server
  // The cluster fabric: only Meta's RoCE cluster has one (its 3 Clos tiers).
  EXPECT_EQ(j[7]["fabric"]["tiers"].size(), 3u);
  EXPECT_FALSE(j[4].contains("fabric"));
  // NICs: listed where GPUs share them (absent: one per GPU).
  EXPECT_EQ(j[1]["nics"], nlohmann::json::parse("[[0,1],[2,3],[4,5],[6,7]]"));
  EXPECT_FALSE(j[0].contains("nics"));
}

TEST(CliErrors, BadInputIsOneLineAndExitCode2) {
  expect_usage_error("p2p --profile tpu-v9", "unknown profile \"tpu-v9\"");
  expect_usage_error("p2p --src 2 --dst 2", "--src and --dst are both 2");
  expect_usage_error("p2p --src 0 --dst 32", "--dst 32: out of range");
  expect_usage_error("p2p --src -1", "--src -1: out of range");
  expect_usage_error("p2p --max-bytes 12parsecs", "--max-bytes: cannot parse size");
  expect_usage_error("p2p --min-bytes 1MiB --max-bytes 1KiB", "--min-bytes 1048576 is above --max-bytes 1024");
  expect_usage_error("p2p --frobnicate", "frobnicate");
  expect_usage_error("warp-drive", "warp-drive");
  expect_usage_error("", "subcommand");

  nlohmann::json p = profile_to_json(load_profile("a100-pcie"));
  p["device"].erase("memory_GiB");
  const std::string missing = ::testing::TempDir() + "missing.json";
  std::ofstream(missing) << p.dump();
  expect_usage_error("p2p --profile " + missing, "missing field \"device.memory_GiB\"");

  p = profile_to_json(load_profile("a100-pcie"));
  p["links"]["inter"]["bandwidth_GBps"] = -25;
  const std::string negative = ::testing::TempDir() + "negative.json";
  std::ofstream(negative) << p.dump();
  expect_usage_error("p2p --profile " + negative, "\"links.inter.bandwidth_GBps\" must be > 0");
}

TEST(CliHelp, EverySubcommandHasHelp) {
  for (const char* sub : {"p2p", "profiles"}) {
    auto r = run_cli(std::string(sub) + " --help");
    EXPECT_EQ(r.code, 0) << sub;
    EXPECT_NE(r.out.find("--json"), std::string::npos) << sub;
  }
}

// SHARDLAB_HOST_THREADS (runtime/host_cores.h): a whole number from 1 to
// 4096, or unset. Anything else is one error line and exit 2 before a device
// starts, never silently "no cap"; a valid value runs.
TEST(CliRuntime, HostThreadsVariableIsCheckedOrRefused) {
  const char* saved = std::getenv("SHARDLAB_HOST_THREADS");
  const std::string keep = saved ? saved : "";
  for (const char* bad : {"", "0", "-1", "two", "1.5", "2x", "4097", "99999999999"}) {
    setenv("SHARDLAB_HOST_THREADS", bad, 1);
    expect_usage_error("train --model nano --steps 1",
                       "SHARDLAB_HOST_THREADS=\"" + std::string(bad) + "\": expected a whole number");
  }
  for (const char* good : {"1", "2", "4096"}) {
    setenv("SHARDLAB_HOST_THREADS", good, 1);
    const testing::CliResult r = run_cli("train --model nano --steps 1");
    EXPECT_EQ(r.code, 0) << good << "\nstderr: " << r.err;
  }
  if (saved) setenv("SHARDLAB_HOST_THREADS", keep.c_str(), 1);
  else unsetenv("SHARDLAB_HOST_THREADS");
}

}  // namespace
}  // namespace shardlab
