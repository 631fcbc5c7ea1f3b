// The cluster fabric's tiers (profile "fabric", runtime/link_model.h): a
// message's latency by the tier its nodes first share, its rate capped by
// the oversubscription below that tier; h100-roce's 3-layer Clos; the JSON
// field and its bad values. Every expected time is worked out by hand.
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "runtime/cluster.h"
#include "runtime/errors.h"
#include "runtime/link_model.h"
#include "runtime/profile.h"
#include "tests/runtime/test_util.h"

namespace shardlab {
namespace {

using testing::kUs;

std::span<const std::byte> no_bytes() { return {}; }

// Meta's RoCE cluster (Dubey et al. 2024, sec. 3.3.1): racks of 2 nodes (16
// GPUs) under a ToR, pods of 3,072 GPUs (384 nodes) at full bisection, 1:7
// between pods.
TEST(FabricTiers, H100RoceIsAThreeLayerClos) {
  const HardwareProfile p = load_profile("h100-roce");
  ASSERT_EQ(p.fabric.tiers.size(), 3u);
  EXPECT_EQ(p.fabric.tiers[0].nodes * p.devices_per_node, 16);
  EXPECT_EQ(p.fabric.tiers[1].nodes * p.devices_per_node, 3072);
  EXPECT_DOUBLE_EQ(p.fabric.tiers[1].oversubscription, 7.0);
  EXPECT_DOUBLE_EQ(p.inter.bandwidth_GBps, 50.0);  // 400 Gb/s RoCE, one NIC per GPU
  EXPECT_EQ(p.nic_count(), 8);
  EXPECT_EQ(p.fabric.common_tier(0, 1), 0);    // one rack
  EXPECT_EQ(p.fabric.common_tier(1, 2), 1);    // racks 0 and 1 of pod 0
  EXPECT_EQ(p.fabric.common_tier(383, 384), 2);  // pods 0 and 1
  // The link model, by hand: links.inter is 4 us and 50 GB/s through one ToR;
  // every switch adds 1 us. Another rack of the pod: ToR, cluster switch,
  // ToR: +2 us. Another pod: ToR, cluster switch, aggregation, cluster
  // switch, ToR: +4 us, at 50e9 / 7 = 7,142,857,142.86 -> 7,142,857,142 B/s.
  const ProfileLinkModel links(p);
  const Link rack = links.link(0, 8), pod = links.link(0, 16), cross = links.link(0, 384 * 8);
  EXPECT_EQ(rack.latency, 4 * kUs);
  EXPECT_EQ(rack.bytes_per_second, 50'000'000'000u);
  EXPECT_EQ(pod.latency, 6 * kUs);
  EXPECT_EQ(pod.bytes_per_second, 50'000'000'000u);
  EXPECT_EQ(cross.latency, 8 * kUs);
  EXPECT_EQ(cross.bytes_per_second, 7'142'857'142u);
  // Inside a node: NVLink, untouched by the fabric.
  EXPECT_EQ(links.link(0, 1).port, LinkClass::kIntra);
  EXPECT_EQ(links.link(0, 1).latency, us_to_time(1.5));
  // The protocols' hop latencies get the same switches: Simple's inter hop
  // on the cross-pod link is its hop on one ToR plus 4 us.
  EXPECT_EQ(cross.latency_of(Engine::kSimple) - rack.latency_of(Engine::kSimple), 4 * kUs);
}

// A small fabric with every term visible: 8 nodes of one GPU, leaves of 2
// nodes (0.5 us per switch, 2:1 up), pods of 4 (1 us, 4:1 up), a top tier
// (2 us). links.inter: 5 us, 10 GB/s, no packet headers. 1 MB messages on
// distinct ports (no queueing):
//   0 -> 1, one leaf:  5 + 1e6 / 10e9 s = 5 + 100 = 105 us
//   2 -> 0, one pod:   + 0.5 + 1 = 1.5 us; 10 GB/s / 2 = 5 GB/s: 5 + 1.5 + 200 = 206.5 us
//   3 -> 7, two pods:  + 0.5 + 2 x 1 + 2 = 4.5 us; 10 / (2 x 4) = 1.25 GB/s:
//                      5 + 4.5 + 800 = 809.5 us
HardwareProfile small_clos() {
  HardwareProfile p = testing::simple_profile(8, 1);
  p.fabric.tiers = {{"leaf", 2, 0.5, 2.0}, {"pod", 4, 1.0, 4.0}, {"top", 0, 2.0, 1.0}};
  return p;
}

TEST(FabricTiers, AMessageWithinALeafAPodAndAcrossPods) {
  Time leaf = 0, pod = 0, cross = 0;
  Cluster c(small_clos(), {.world_size = 8});
  c.run([&](Device& d) {
    if (d.rank() == 0) d.isend(d.comm(), 1, 7, no_bytes(), 1'000'000);
    if (d.rank() == 2) d.isend(d.comm(), 0, 7, no_bytes(), 1'000'000);
    if (d.rank() == 3) d.isend(d.comm(), 7, 7, no_bytes(), 1'000'000);
    if (d.rank() == 1) d.recv(d.comm(), 0, 7), leaf = d.comm().now();
    if (d.rank() == 0) d.recv(d.comm(), 2, 7), pod = d.comm().now();
    if (d.rank() == 7) d.recv(d.comm(), 3, 7), cross = d.comm().now();
  });
  EXPECT_EQ(leaf, 105 * kUs);
  EXPECT_EQ(pod, 206 * kUs + kUs / 2);
  EXPECT_EQ(cross, 809 * kUs + kUs / 2);
  // Without the fabric every one is 105 us (the fabric is what moves them).
  HardwareProfile flat = small_clos();
  flat.fabric = {};
  EXPECT_EQ(ProfileLinkModel(flat).link(3, 7).latency, 5 * kUs);
  EXPECT_EQ(ProfileLinkModel(flat).link(3, 7).bytes_per_second, 10'000'000'000u);
}

// The share divides a NIC's share: two GPUs behind one NIC (each 1/2) and a
// 4:1 tier below give 1/8 of the NIC.
TEST(FabricTiers, OversubscriptionDividesTheNicShare) {
  HardwareProfile p = testing::simple_profile(4, 2);
  p.nics = {{0, 1}};
  p.fabric.tiers = {{"leaf", 2, 0.0, 4.0}, {"top", 0, 0.0, 1.0}};
  const ProfileLinkModel links(p);
  EXPECT_EQ(links.link(0, 2).bytes_per_second, 5'000'000'000u);       // one leaf: 10 / 2
  EXPECT_EQ(links.link(0, 4).bytes_per_second, 1'250'000'000u);       // across: 10 / 2 / 4
}

using testing::write_temp;

std::string load_error(const nlohmann::json& j) { return testing::load_error(write_temp("fabric.json", j.dump())); }

TEST(FabricTiers, JsonRoundTripsAndRefusesBadValues) {
  const nlohmann::json j = profile_to_json(load_profile("h100-roce"));
  EXPECT_EQ(j["fabric"]["tiers"][1]["nodes"], 384);
  EXPECT_FALSE(j["fabric"]["tiers"][2].contains("nodes"));  // the top tier spans the cluster
  const HardwareProfile back = load_profile(write_temp("roce.json", j.dump()));
  EXPECT_EQ(back.fabric.tiers, load_profile("h100-roce").fabric.tiers);
  EXPECT_TRUE(load_profile("h100-nvlink").fabric.empty());
  EXPECT_FALSE(profile_to_json(load_profile("h100-nvlink")).contains("fabric"));

  auto error = [&](const char* tiers) {
    nlohmann::json k = j;
    k["fabric"]["tiers"] = nlohmann::json::parse(tiers);
    return load_error(k);
  };
  auto has = [](const std::string& what, const char* needle) {
    EXPECT_NE(what.find(needle), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;  // one line
  };
  has(error("[]"), "\"fabric.tiers\" must be a non-empty list");
  has(error("[{\"nodes\": 2, \"hop_latency_us\": 1}, {\"nodes\": 3, \"hop_latency_us\": 1}, {\"hop_latency_us\": 1}]"),
      "\"fabric.tiers.1.nodes\" must be a multiple of 2");
  has(error("[{\"nodes\": 4, \"hop_latency_us\": 1}, {\"nodes\": 2, \"hop_latency_us\": 1}, {\"hop_latency_us\": 1}]"),
      "\"fabric.tiers.1.nodes\" must be a multiple of 4");
  has(error("[{\"nodes\": 0, \"hop_latency_us\": 1}, {\"hop_latency_us\": 1}]"),
      "\"fabric.tiers.0.nodes\" must be a positive integer");
  has(error("[{\"hop_latency_us\": 1}, {\"hop_latency_us\": 1}]"), "missing field \"fabric.tiers.0.nodes\"");
  has(error("[{\"nodes\": 2, \"hop_latency_us\": -1}, {\"hop_latency_us\": 1}]"),
      "\"fabric.tiers.0.hop_latency_us\" must be >= 0");
  has(error("[{\"nodes\": 2, \"hop_latency_us\": 1, \"oversubscription\": 0.5}, {\"hop_latency_us\": 1}]"),
      "\"fabric.tiers.0.oversubscription\" must be >= 1");
  has(error("[{\"nodes\": 2, \"hop_latency_us\": 1}, {\"hop_latency_us\": 1, \"oversubscription\": 7}]"),
      "\"fabric.tiers.1.oversubscription\": the top tier has no uplinks");
  has(error("[{\"nodes\": 2, \"hop_latency_us\": 1}, {\"nodes\": 8, \"hop_latency_us\": 1}]"),
      "\"fabric.tiers.1.nodes\": the top tier spans the cluster");
  has(error("[{\"nodes\": 2, \"hop_latency\": 1}, {\"hop_latency_us\": 1}]"), "unknown field \"fabric.tiers.0.hop_latency\"");
  has(error("[3]"), "\"fabric.tiers.0\" must be an object");
  nlohmann::json k = j;
  k["fabric"]["spine"] = 1;
  has(load_error(k), "unknown field \"fabric.spine\"");
}

}  // namespace
}  // namespace shardlab
