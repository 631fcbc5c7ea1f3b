// The command-line contract of `shardlab collectives`.
#include <fstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "runtime/profile.h"
#include "runtime/time.h"
#include "tests/support/cli_util.h"

namespace shardlab {
namespace {

using testing::expect_usage_error;
using testing::run_cli;

TEST(CliCollectives, JsonRowsFollowNcclTestsDefinitions) {
  auto r = run_cli(
      "collectives --op all_reduce --ranks 4 --algo ring --proto Simple --min-bytes 1MiB --max-bytes 4MiB --check --json");
  ASSERT_EQ(r.code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["op"], "all_reduce");
  EXPECT_EQ(j["ranks"], 4);
  EXPECT_EQ(j["algo"], "ring");
  EXPECT_EQ(j["profile"], "a100-nvlink");
  ASSERT_EQ(j["rows"].size(), 3u);
  const LinkSpec l = load_profile("a100-nvlink").intra;
  for (const auto& row : j["rows"]) {
    const uint64_t bytes = row["bytes"];
    EXPECT_EQ(row["count"].get<uint64_t>(), bytes / 4);
    // Ring all_reduce under NCCL's Simple: the collective's start (4 us launch
    // + 8.4 us Simple base), then 2(n-1) steps of a + W/B, exact, a Simple's
    // NVLink hop (3.4 us), B the link's full rate; W = S/n plus a 32 B header
    // per 128 B packet (NCCL's SM stores).
    const uint64_t part = bytes / 4, wire = part + (part + 127) / 128 * 32;
    const double expect_us = 12.4 + to_us(6 * (us_to_time(3.4) + transfer_time(wire, l.bytes_per_second())));
    EXPECT_NEAR(row["time_us"].get<double>(), expect_us, 1e-6) << bytes;
    const double algbw = bytes / (row["time_us"].get<double>() * 1e-6) / 1e9;
    EXPECT_NEAR(row["algbw_GBps"].get<double>(), algbw, 1e-6 * algbw);
    EXPECT_NEAR(row["busbw_GBps"].get<double>(), algbw * 2 * 3 / 4, 1e-6 * algbw);
    EXPECT_EQ(row["max_error"].get<double>(), 0.0);
    for (const char* k : {"host_time_us", "host_busbw_GBps"}) EXPECT_TRUE(row.contains(k)) << k;
  }
}

// A profile file with NCCL's protocols (as every built-in profile has): each
// row prints the protocol auto chose with the algorithm, and --proto forces one. 8 B on 8 GPUs: direct LL,
// 4 + 3.6 us of start, 0.47 us of hop and seven 40-byte LL messages at
// 300 GB/s x 1/4 (534 ps each) through the receiver's ingress: 8.0737 us.
// 256 MiB: Simple, the full link rate (protocol_test.cc derives the switch).
TEST(CliCollectives, RowsPrintTheProtocolAutoChose) {
  HardwareProfile p = load_profile("a100-nvlink");
  p.name = "a100-nccl";
  const std::string path = ::testing::TempDir() + "a100_nccl_protocols.json";
  {
    std::ofstream out(path);
    out << profile_to_json(p).dump();
  }
  const auto r = run_cli("collectives --ranks 8 --min-bytes 8 --max-bytes 256MiB --json --profile " + path);
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  const auto& rows = j["rows"];
  EXPECT_EQ(rows.front()["algo"], "direct");
  EXPECT_EQ(rows.front()["protocol"], "LL");
  EXPECT_NEAR(rows.front()["time_us"].get<double>(), 8.073738, 1e-9);
  EXPECT_EQ(rows.back()["protocol"], "Simple");
  const auto forced = run_cli("collectives --ranks 8 --max-bytes 8 --proto LL128 --json --profile " + path);
  ASSERT_EQ(forced.code, 0) << forced.err;
  EXPECT_EQ(nlohmann::json::parse(forced.out)["rows"][0]["protocol"], "LL128");
}

TEST(CliCollectives, TwoNodesRunChannelsOverEveryRail) {
  const auto r8 = run_cli("collectives --op all_reduce --ranks 8 --min-bytes 64MiB --max-bytes 64MiB --json");
  // Across nodes --algo ring: auto takes dbtree on 2 nodes at these sizes (below).
  const auto r16 = run_cli("collectives --op all_reduce --ranks 16 --min-bytes 64MiB --max-bytes 64MiB --json --algo ring");
  const auto r4nic = run_cli(
      "collectives --op all_reduce --ranks 16 --profile a100-nvlink-4nic --min-bytes 64MiB --max-bytes 64MiB --json "
      "--algo ring");
  for (const auto* r : {&r8, &r16, &r4nic}) ASSERT_EQ(r->code, 0) << r->err;
  auto one = nlohmann::json::parse(r8.out), two = nlohmann::json::parse(r16.out), four = nlohmann::json::parse(r4nic.out);
  const double bw8 = one["rows"][0]["busbw_GBps"], bw16 = two["rows"][0]["busbw_GBps"],
               bw4nic = four["rows"][0]["busbw_GBps"];
  std::printf("64 MiB all_reduce busbw: 8 ranks %.1f GB/s, 16 ranks %.1f GB/s (4 NICs: %.1f)\n", bw8, bw16, bw4nic);
  // One node: below the 240 GB/s NCCL gets from 12 NVLinks (128 B packets), near
  // nccl-tests' ~230; one ring (channels 1 in the model).
  EXPECT_GT(bw8, 220);
  EXPECT_LT(bw8, 240);
  // Two nodes: a ring per channel, 16 channels leaving each node through its 8
  // NICs (InfiniBand's 25 GB/s less 42 B per 4 KiB packet each); 4 NICs: 8 channels.
  EXPECT_EQ(two["rows"][0]["algo"], "ring");
  EXPECT_EQ(two["rows"][0]["channels"], 16);
  EXPECT_EQ(four["rows"][0]["channels"], 8);
  const double ib = 25.0 * 4096 / 4138;
  EXPECT_LT(bw16, 8 * ib * 1.001);
  EXPECT_GT(bw16, 0.75 * 8 * ib);
  EXPECT_LT(bw4nic, 4 * ib * 1.001);
  EXPECT_GT(bw4nic, 0.75 * 4 * ib);
  // The table shows the protocol (column "proto"), the channels (column
  // "ch") and the NICs per node. At 1 GiB Simple (rails_test.cc derives it);
  // at 64 MiB Simple too: 30 steps of two 256 KiB pieces (264832 B on the
  // wire) back to back on a GPU's NIC, then one IB hop (the channels' lanes,
  // rails_test.cc closed_form; the hop is NCCL's network latency and the
  // proxy's posts, 2 us each on DGX A100, three under Simple): Simple 12.4 +
  // 60 x 10.593 + 9.6 + 6 = 663.6 us against LL128's 14 + 60 x 11.514 + 4.0
  // + 2 = 710.9 us. (Before the lanes,
  // every step waited for an IB hop, where LL128's 4 us beat Simple's 9.6.)
  const auto table = run_cli("collectives --op all_reduce --ranks 16 --min-bytes 1GiB --max-bytes 1GiB --algo ring");
  ASSERT_EQ(table.code, 0) << table.err;
  EXPECT_NE(table.out.find("8 NICs per node"), std::string::npos) << table.out;
  EXPECT_NE(table.out.find("   ring Simple   16 "), std::string::npos) << table.out;
  EXPECT_EQ(two["rows"][0]["protocol"], "Simple");
  EXPECT_NEAR(double(two["rows"][0]["time_us"]), 663.5968, 1e-4);
  // NCCL's double binary tree (dbtree_test.cc) only when asked for: on 2
  // nodes each GPU's NIC carries 1/8 of the buffer each way instead of the
  // ring's 2(n-1)/n / 8, so it beats the ring at 64 MiB (637.70 us against
  // 663.60; 625.70 before the proxy's posts, whose three 2 us posts on each
  // of its two network hops, up and down, add about 12 us), as NCCL's tree
  // does on 2 nodes (NVIDIA/nccl#812, #946); auto
  // keeps the ring (README: the CLI's auto weighs ring, tree and direct).
  const auto tree = run_cli("collectives --op all_reduce --ranks 16 --min-bytes 64MiB --max-bytes 64MiB --json --algo dbtree");
  ASSERT_EQ(tree.code, 0) << tree.err;
  const auto a = nlohmann::json::parse(tree.out)["rows"][0];
  EXPECT_EQ(a["algo"], "dbtree");
  EXPECT_EQ(a["channels"], 16);
  EXPECT_NEAR(double(a["time_us"]), 637.70, 0.01);
  const auto autod = run_cli("collectives --op all_reduce --ranks 16 --min-bytes 64MiB --max-bytes 64MiB --json");
  ASSERT_EQ(autod.code, 0) << autod.err;
  EXPECT_EQ(nlohmann::json::parse(autod.out)["rows"][0]["algo"], "ring");
}

// The cluster fabric (profile "fabric"): h100-roce runs and prints its
// tiers; a profile whose pods hold 2 nodes (7:1 above them) puts two of a
// 4-node ring's node-crossing hops across pods, each at 1/7 of its NIC, and
// the ring runs at the slowest hop: about 1/7 of the flat fabric's busbw
// (the latency terms keep it a little above). A bad tier is one line, exit 2.
TEST(CliCollectives, FabricTiersCapTheRingAcrossPods) {
  const auto roce = run_cli("collectives --profile h100-roce --ranks 16 --min-bytes 1MiB --max-bytes 1MiB");
  ASSERT_EQ(roce.code, 0) << roce.err;
  EXPECT_NE(roce.out.find("# fabric: rack (2 nodes, 1 us/hop) / pod (384 nodes, 1 us/hop, 7:1 up) / aggregation"),
            std::string::npos)
      << roce.out;
  nlohmann::json j = profile_to_json(load_profile("h100-roce"));
  j["fabric"]["tiers"][0]["nodes"] = 1;
  j["fabric"]["tiers"][1]["nodes"] = 2;
  const std::string pods = ::testing::TempDir() + "small_pods.json";
  std::ofstream(pods) << j.dump();
  j.erase("fabric");
  const std::string flat = ::testing::TempDir() + "flat.json";
  std::ofstream(flat) << j.dump();
  const std::string run = "collectives --ranks 32 --nodes 4 --min-bytes 1GiB --max-bytes 1GiB --json --algo ring --profile ";
  const auto a = run_cli(run + pods), b = run_cli(run + flat);
  ASSERT_EQ(a.code, 0) << a.err;
  ASSERT_EQ(b.code, 0) << b.err;
  const double across = nlohmann::json::parse(a.out)["rows"][0]["busbw_GBps"];
  const double one_leaf = nlohmann::json::parse(b.out)["rows"][0]["busbw_GBps"];
  std::printf("1 GiB all_reduce on 4 nodes: busbw %.2f GB/s across 2-node pods (7:1), %.2f flat (ratio %.3f)\n",
              across, one_leaf, one_leaf / across);
  EXPECT_GT(one_leaf / across, 6.5);
  EXPECT_LT(one_leaf / across, 7.0 * 1.001);
  j = profile_to_json(load_profile("h100-roce"));
  j["fabric"]["tiers"][1]["oversubscription"] = 0.5;
  const std::string bad = ::testing::TempDir() + "bad_fabric.json";
  std::ofstream(bad) << j.dump();
  expect_usage_error("collectives --profile " + bad, "\"fabric.tiers.1.oversubscription\" must be >= 1");
}

// --check's verdict can fail: 100 in rank 0's first result is an error of
// |100 - reference| (all_reduce: the 4 ranks' inputs summed, -0.875;
// all_to_all: rank 0's own first input, -1), and a NaN is an infinite error
// ("inf" in JSON), not a value std::max drops.
TEST(CliCollectives, CheckFailsOnAWrongOrNanResult) {
  const std::string run = "collectives --ranks 4 --min-bytes 1KiB --max-bytes 1KiB --check --json --op ";
  for (const char* op : {"all_reduce", "all_to_all"}) {
    const auto wrong = run_cli(run + op + " --corrupt-result 100");
    EXPECT_EQ(wrong.code, 1) << op << wrong.err;
    const double want = op == std::string("all_reduce") ? 100.875 : 101;
    EXPECT_EQ(nlohmann::json::parse(wrong.out)["rows"][0]["max_error"].get<double>(), want) << op;
    const auto nan = run_cli(run + op + " --corrupt-result nan");
    EXPECT_EQ(nan.code, 1) << op << nan.err;
    EXPECT_EQ(nlohmann::json::parse(nan.out)["rows"][0]["max_error"], "inf") << op << nan.out;
  }
  expect_usage_error("collectives --check --corrupt-result x", "--corrupt-result x: not a number");
}

TEST(CliCollectives, BadInputIsOneLineAndExitCode2) {
  expect_usage_error("collectives --ranks 0", "--ranks 0");
  expect_usage_error("collectives --ranks 64", "--ranks 64");
  expect_usage_error("collectives --op gather", "unknown op \"gather\"");
  expect_usage_error("collectives --algo magic", "unknown algorithm \"magic\"");
  expect_usage_error("collectives --min-bytes 1M --max-bytes 1K", "--min-bytes 1048576 is above --max-bytes 1024");
  expect_usage_error("collectives --max-bytes 1Q", "--max-bytes: cannot parse size");
  expect_usage_error("collectives --profile nowhere", "unknown profile");
  // NVLink SHARP: an all_reduce inside one node whose NVSwitch reduces, on Simple.
  expect_usage_error("collectives --ranks 8 --algo nvls", "NVLink SHARP runs all_reduce");  // a100-nvlink
  expect_usage_error("collectives --ranks 8 --op all_gather --algo nvls --profile h100-nvlink",
                     "NVLink SHARP runs all_reduce");
  expect_usage_error("collectives --ranks 16 --nodes 2 --algo nvls --profile h100-nvlink",
                     "NVLink SHARP runs all_reduce");
  expect_usage_error("collectives --ranks 8 --algo nvls --proto LL --profile h100-nvlink",
                     "NVLink SHARP runs only the Simple protocol");
}

// On a DGX H100 auto runs a large all_reduce as NVLink SHARP (nvls), as NCCL
// does by default there, and prints it.
TEST(CliCollectives, H100NodeRunsLargeAllReducesAsNvls) {
  const auto r = run_cli("collectives --ranks 8 --profile h100-nvlink --min-bytes 256MiB --max-bytes 256MiB --json");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto row = nlohmann::json::parse(r.out)["rows"][0];
  EXPECT_EQ(row["algo"], "nvls");
  EXPECT_EQ(row["protocol"], "Simple");
}

}  // namespace
}  // namespace shardlab
