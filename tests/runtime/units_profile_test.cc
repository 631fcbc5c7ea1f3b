#include <cmath>
#include <fstream>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "runtime/cost_model.h"
#include "runtime/errors.h"
#include "runtime/link_model.h"
#include "runtime/profile.h"
#include "runtime/units.h"
#include "tests/runtime/test_util.h"

namespace shardlab {
namespace {

TEST(Time, TransferTimeIsExactCeiling) {
  EXPECT_EQ(transfer_time(0, 300'000'000'000), 0);
  // 300 GB/s: 3 bytes take exactly 10 ps; 1 byte takes 3.33.. -> 4 ps.
  EXPECT_EQ(transfer_time(3, 300'000'000'000), 10);
  EXPECT_EQ(transfer_time(1, 300'000'000'000), 4);
  // 256 MiB at 25 GB/s: 268435456 / 25e9 s = 10737418.24 ns -> ceil in ps.
  EXPECT_EQ(transfer_time(268435456, 25'000'000'000), 10'737'418'240);
  EXPECT_EQ(us_to_time(2.5), 2'500'000);
}

TEST(Units, ParseBytes) {
  EXPECT_EQ(parse_bytes("8", "--x"), 8u);
  EXPECT_EQ(parse_bytes("64K", "--x"), 65536u);
  EXPECT_EQ(parse_bytes("256MiB", "--x"), 268435456u);
  EXPECT_EQ(parse_bytes("1GiB", "--x"), 1073741824u);
  EXPECT_EQ(parse_bytes("2MB", "--x"), 2000000u);
  EXPECT_EQ(parse_bytes("1.5K", "--x"), 1536u);
  for (const char* bad : {"", "MiB", "12Q", "-3", "1.3", "abc"}) {
    try {
      parse_bytes(bad, "--max-bytes");
      ADD_FAILURE() << "accepted " << bad;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("--max-bytes"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(1536), "1.5 KiB");
}

TEST(Profiles, BuiltinsMatchPublicFigures) {
  auto p = load_profile("a100-nvlink");
  EXPECT_EQ(p.devices_per_node, 8);
  EXPECT_DOUBLE_EQ(p.intra.bandwidth_GBps, 300);
  EXPECT_DOUBLE_EQ(p.inter.bandwidth_GBps, 25);
  EXPECT_EQ(p.intra.bytes_per_second(), 300'000'000'000u);
  EXPECT_DOUBLE_EQ(load_profile("h100-nvlink").intra.bandwidth_GBps, 450);
  EXPECT_DOUBLE_EQ(load_profile("h100-nvlink").inter.bandwidth_GBps, 50);
  EXPECT_DOUBLE_EQ(load_profile("a100-pcie").intra.bandwidth_GBps, 32);
}

// The H100 family against the vendors' datasheets (dense tensor-core peaks;
// sources in README "Hardware profiles" and runtime/profile_builtin.cc).
TEST(Profiles, HopperAndBlackwellDatasheetFigures) {
  struct Row {
    const char* name;
    double fp32, bf16, fp8, hbm_GBps, memory_GiB, nvlink_GBps;
    int sms;
  };
  for (const Row& r : {Row{"h100-nvlink", 67, 989, 1979, 3350, 80, 450, 132},
                       Row{"h200-nvlink", 67, 989, 1979, 4800, 141, 450, 132},
                       Row{"b200-nvlink", 80, 2250, 4500, 8000, 180, 900, 148}}) {
    const HardwareProfile p = load_profile(r.name);
    SCOPED_TRACE(r.name);
    EXPECT_DOUBLE_EQ(p.device.peak_tflops_fp32, r.fp32);
    EXPECT_DOUBLE_EQ(p.device.peak_tflops_bf16, r.bf16);
    EXPECT_DOUBLE_EQ(p.device.peak_tflops_fp8, r.fp8);
    EXPECT_DOUBLE_EQ(p.device.mem_bandwidth_GBps, r.hbm_GBps);
    EXPECT_DOUBLE_EQ(p.device.memory_GiB, r.memory_GiB);
    EXPECT_DOUBLE_EQ(p.intra.bandwidth_GBps, r.nvlink_GBps);
    EXPECT_EQ(p.device.gemm.sm_count, r.sms);
    EXPECT_DOUBLE_EQ(p.inter.bandwidth_GBps, 50);  // 400 Gb/s per GPU
  }
  EXPECT_DOUBLE_EQ(load_profile("a100-nvlink").device.peak_tflops_fp8, 0);  // Ampere: no FP8
}

TEST(Profiles, JsonHasTheContractShapeAndRoundTrips) {
  for (const auto& p : builtin_profiles()) {
    nlohmann::json j = profile_to_json(p);
    for (const char* key : {"name", "nodes", "devices_per_node", "device", "links"}) EXPECT_TRUE(j.contains(key));
    EXPECT_TRUE(j["device"]["peak_tflops"].contains("fp32"));
    EXPECT_TRUE(j["device"]["peak_tflops"].contains("bf16"));
    for (const char* key : {"mem_bandwidth_GBps", "memory_GiB", "launch_overhead_us"})
      EXPECT_TRUE(j["device"].contains(key)) << key;
    for (const char* cls : {"intra", "inter"})
      for (const char* key : {"latency_us", "bandwidth_GBps"}) EXPECT_TRUE(j["links"][cls].contains(key));
    HardwareProfile q = profile_from_json(j, "test");
    EXPECT_EQ(profile_to_json(q), j);
  }
}

using testing::load_error;
using testing::write_temp;

TEST(Profiles, FileErrorsNameTheProblem) {
  nlohmann::json good = profile_to_json(load_profile("a100-pcie"));
  good["name"] = "mybox";
  EXPECT_EQ(load_profile(write_temp("good.json", good.dump())).name, "mybox");

  nlohmann::json missing = good;
  missing["links"]["inter"].erase("bandwidth_GBps");
  EXPECT_NE(load_error(write_temp("missing.json", missing.dump())).find("missing field \"links.inter.bandwidth_GBps\""),
            std::string::npos);

  nlohmann::json negative = good;
  negative["links"]["intra"]["bandwidth_GBps"] = -5;
  EXPECT_NE(load_error(write_temp("neg.json", negative.dump())).find("links.intra.bandwidth_GBps\" must be > 0"),
            std::string::npos);

  // Values beyond physical sense would overflow the integer time model.
  struct Bad {
    const char* section;
    const char* sub;
    const char* key;
    double value;
    const char* says;
  };
  for (const Bad& b : {Bad{"links", "intra", "latency_us", 1e300, "must be at most 1e+06"},
                       Bad{"links", "inter", "bandwidth_GBps", 1e300, "must be at most 1e+09"},
                       Bad{"links", "inter", "bandwidth_GBps", 1e-300, "must be at least 0.001"},
                       Bad{"device", "peak_tflops", "fp32", 1e-9, "must be at least 0.001"},
                       Bad{"device", nullptr, "memory_GiB", 1e30, "must be at most 1e+06"},
                       Bad{"device", nullptr, "collective_launch_us", 1e300, "must be at most 1e+06"}}) {
    nlohmann::json j = good;
    nlohmann::json& at = b.sub ? j[b.section][b.sub] : j[b.section];
    at[b.key] = b.value;
    const std::string err = load_error(write_temp("bound.json", j.dump()));
    EXPECT_NE(err.find(b.key), std::string::npos) << err;
    EXPECT_NE(err.find(b.says), std::string::npos) << err;
  }

  // A GEMM tile's dimension is named by its full path (it said field "m").
  nlohmann::json tile = profile_to_json(load_profile("a100-nvlink"));
  tile["device"]["gemm"]["tiles"][1][1] = 0;
  const std::string tile_err = load_error(write_temp("tile.json", tile.dump()));
  EXPECT_NE(tile_err.find("field \"device.gemm.tiles.1.1\" must be a positive integer"), std::string::npos) << tile_err;

  // links.intra.nvls_efficiency (NVLink SHARP): a share of the link's rate, in (0, 1].
  for (double bad : {0.0, 1.5, -0.2}) {
    nlohmann::json j = good;
    j["links"]["intra"]["nvls_efficiency"] = bad;
    const std::string err = load_error(write_temp("nvls.json", j.dump()));
    EXPECT_NE(err.find("links.intra.nvls_efficiency"), std::string::npos) << bad << ": " << err;
  }
  nlohmann::json nvls = good;
  nvls["links"]["intra"]["nvls_efficiency"] = 0.5;
  EXPECT_EQ(load_profile(write_temp("nvls_ok.json", nvls.dump())).intra.nvls_efficiency, 0.5);
  EXPECT_EQ(load_profile("h100-nvlink").intra.nvls_efficiency, 0.85);  // NCCL's nvlsEfficiency, Hopper
  EXPECT_EQ(load_profile("b200-nvlink").intra.nvls_efficiency, 0.74);  // Blackwell
  EXPECT_EQ(load_profile("a100-nvlink").intra.nvls_efficiency, 0.0);   // no SHARP on NVSwitch gen2

  EXPECT_NE(load_error(write_temp("bad.json", "{ nope")).find("not valid JSON"), std::string::npos);
  EXPECT_NE(load_error("/nonexistent/p.json").find("no such file"), std::string::npos);
  EXPECT_NE(load_error("tpu-v9").find("unknown profile \"tpu-v9\""), std::string::npos);
}

// The fused attention kernel's published rates (H100: cuDNN's in Shah et al.
// 2024, Figures 5 and 6), read back by hand: at a published length the
// figure itself; between two, linear in log2(s); the causal backward the
// non-causal one times the forward's causal/non-causal ratio.
TEST(Profiles, AttentionRatesAreThePublishedFigures) {
  const AttentionSpec& a = load_profile("h100-nvlink").device.attention;
  ASSERT_FALSE(a.empty());
  EXPECT_DOUBLE_EQ(a.forward_tflops(2048, /*causal=*/true), 484);
  EXPECT_DOUBLE_EQ(a.forward_tflops(2048, false), 617);
  EXPECT_DOUBLE_EQ(a.backward_tflops(4096, false), 499);
  EXPECT_DOUBLE_EQ(a.backward_tflops(4096, true), 499.0 * 518 / 609);
  EXPECT_NEAR(a.forward_tflops(2896.309375740099, true), 501, 1e-9);  // 2^11.5: halfway from 484 to 518
  EXPECT_DOUBLE_EQ(a.forward_tflops(128, true), 315);                // below 512: 512's
  EXPECT_DOUBLE_EQ(a.forward_tflops(1 << 20, true), 539);            // beyond 16k: 16k's
  EXPECT_EQ(load_profile("h200-nvlink").device.attention.fwd_causal, a.fwd_causal);
  EXPECT_TRUE(load_profile("a100-nvlink").device.attention.empty());  // no figures: the GEMM model
  EXPECT_TRUE(load_profile("b200-nvlink").device.attention.empty());

  nlohmann::json good = profile_to_json(load_profile("h100-nvlink"));
  for (auto [field, value, says] :
       {std::tuple<const char*, nlohmann::json, const char*>{"seq", {1024, 512, 2048, 4096, 8192, 16384}, "strictly increasing"},
        {"bwd_tflops", {1, 2}, "as many numbers as \"seq\" (6)"},
        {"fwd_tflops", nlohmann::json::array(), "non-empty list"},
        {"fwd_causal_tflops", {315, 410, "fast", 518, 529, 539}, "device.attention.fwd_causal_tflops.2\" must be a number"},
        {"fwd_causal_tflops", {315, 410, 0, 518, 529, 539}, "must be a number in [0.001, 1e9]"}}) {
    nlohmann::json j = good;
    j["device"]["attention"][field] = value;
    const std::string err = load_error(write_temp("attention.json", j.dump()));
    EXPECT_NE(err.find(says), std::string::npos) << field << ": " << err;
  }
}

// The other kernels (device.attention_kernels): FlashAttention-2 and -3 on
// H100 and H200, the same figures' other bars; select_attention_kernel
// swaps one in by name and refuses a name the profile lacks, saying which
// it has; a file's list is checked like device.attention, and its names.
TEST(Profiles, AttentionKernelsAreNamedAndSelectable) {
  HardwareProfile h = load_profile("h100-nvlink");
  EXPECT_EQ(h.device.attention.kernel, "cudnn");
  ASSERT_EQ(h.device.attention_kernels.size(), 2u);
  EXPECT_EQ(h.device.attention_kernels[0].kernel, "fa2");
  EXPECT_EQ(h.device.attention_kernels[1].kernel, "fa3");
  select_attention_kernel(h, "");  // the default: unchanged
  select_attention_kernel(h, "cudnn");
  EXPECT_EQ(h.device.attention.kernel, "cudnn");
  select_attention_kernel(h, "fa2");
  EXPECT_EQ(h.device.attention.kernel, "fa2");
  EXPECT_DOUBLE_EQ(h.device.attention.forward_tflops(16384, true), 335);
  EXPECT_DOUBLE_EQ(h.device.attention.backward_tflops(2048, false), 291);
  select_attention_kernel(h, "fa3");
  EXPECT_DOUBLE_EQ(h.device.attention.forward_tflops(4096, false), 638);
  select_attention_kernel(h, "cudnn");  // back, from the alternatives
  EXPECT_DOUBLE_EQ(h.device.attention.forward_tflops(2048, true), 484);
  EXPECT_EQ(h.device.attention_kernels.size(), 2u);
  try {
    select_attention_kernel(h, "fa4");
    ADD_FAILURE() << "fa4 accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("has the fused attention kernels cudnn, fa2, fa3"), std::string::npos)
        << e.what();
  }
  HardwareProfile a = load_profile("a100-nvlink");
  EXPECT_THROW(select_attention_kernel(a, "cudnn"), ConfigError);  // no figures at all
  EXPECT_EQ(load_profile("h200-nvlink").device.attention_kernels.size(), 2u);

  nlohmann::json good = profile_to_json(load_profile("h100-nvlink"));
  EXPECT_EQ(good["device"]["attention"]["kernel"], "cudnn");
  EXPECT_EQ(good["device"]["attention_kernels"][0]["kernel"], "fa2");
  auto error_of = [&](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json j = good;
    edit(j);
    return load_error(write_temp("kernels.json", j.dump()));
  };
  struct Case {
    std::function<void(nlohmann::json&)> edit;
    const char* says;
  };
  for (const Case& c :
       {Case{[](nlohmann::json& j) { j["device"]["attention_kernels"][1]["kernel"] = "fa2"; },
             "device.attention_kernels.1.kernel\": \"fa2\" is named twice"},
        Case{[](nlohmann::json& j) { j["device"]["attention_kernels"][0]["kernel"] = "cudnn"; }, "is named twice"},
        Case{[](nlohmann::json& j) { j["device"]["attention_kernels"][0].erase("kernel"); },
             "missing field \"device.attention_kernels.0.kernel\""},
        Case{[](nlohmann::json& j) { j["device"]["attention_kernels"][0]["kernel"] = ""; }, "must be a name"},
        Case{[](nlohmann::json& j) { j["device"]["attention_kernels"][0]["kernel"] = 7; }, "must be a name"},
        Case{[](nlohmann::json& j) { j["device"]["attention_kernels"][1]["fwd_tflop"] = 1; },
             "unknown field \"device.attention_kernels.1.fwd_tflop\""},
        Case{[](nlohmann::json& j) { j["device"]["attention_kernels"][0]["bwd_tflops"] = {1, 2}; },
             "\"device.attention_kernels.0\": every list must have as many numbers as \"seq\" (6)"},
        Case{[](nlohmann::json& j) { j["device"]["attention_kernels"] = nlohmann::json::array(); }, "non-empty list"},
        Case{[](nlohmann::json& j) { j["device"]["attention_kernels"] = {1, 2}; },
             "\"device.attention_kernels.0\" must be an object"},
        Case{[](nlohmann::json& j) { j["device"]["attention"].erase("kernel"); },
             "needs \"device.attention\" with a \"kernel\" name"}}) {
    const std::string err = error_of(c.edit);
    EXPECT_NE(err.find(c.says), std::string::npos) << c.says << ": " << err;
  }
  nlohmann::json unnamed = good;  // one kernel, unnamed: a file of before still loads
  unnamed["device"]["attention"].erase("kernel");
  unnamed["device"].erase("attention_kernels");
  const HardwareProfile u = load_profile(write_temp("unnamed.json", unnamed.dump()));
  EXPECT_EQ(u.device.attention.kernel, "");
  EXPECT_DOUBLE_EQ(u.device.attention.forward_tflops(2048, true), 484);
}

// A field the loader does not know is refused: an optional one misspelt
// would otherwise leave its default in place without a word. Every field of
// every built-in profile is known (they round-trip through the file format).
TEST(Profiles, UnknownFieldsAreRefusedByTheirPath) {
  for (const HardwareProfile& p : builtin_profiles())
    EXPECT_EQ(profile_from_json(profile_to_json(p), "round trip").name, p.name);
  const nlohmann::json good = profile_to_json(load_profile("a100-nvlink"));
  struct Case {
    std::vector<std::string> where;  // the object the field goes into
    const char* key;
    const char* path;
  };
  for (const Case& c : {Case{{"device"}, "compute_eficiency", "device.compute_eficiency"},
                        Case{{}, "node", "node"},
                        Case{{"links", "intra"}, "latency_ms", "links.intra.latency_ms"},
                        Case{{"links"}, "nvlink", "links.nvlink"},
                        Case{{"device", "gemm", "max_efficiency"}, "fp16", "device.gemm.max_efficiency.fp16"},
                        Case{{"device", "peak_tflops"}, "fp4", "device.peak_tflops.fp4"},
                        // NVLink SHARP is the NVSwitch's: inside a node only.
                        Case{{"links", "inter"}, "nvls_efficiency", "links.inter.nvls_efficiency"}}) {
    nlohmann::json j = good;
    nlohmann::json* at = &j;
    for (const std::string& k : c.where) at = &(*at)[k];
    (*at)[c.key] = 1;
    const std::string path = write_temp("unknown.json", j.dump());
    EXPECT_EQ(load_error(path),
              fmt::format("profile {}: unknown field \"{}\" (a misspelt field would be ignored)", path, c.path));
  }
  nlohmann::json j = good;
  j["description"] = 5;
  EXPECT_NE(load_error(write_temp("desc.json", j.dump())).find("field \"description\" must be a string"),
            std::string::npos);
}

// "pcie": a node's PCIe tree. Round-trips, and each bad input is one line
// naming the field.
TEST(Profiles, PcieTreeSaysWhichGpusShareASwitchAndSocket) {
  const HardwareProfile box = load_profile("a100-pcie-8");
  EXPECT_EQ(box.pcie.switches, (std::vector<std::vector<int>>{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(box.pcie.sockets, (std::vector<std::vector<int>>{{0, 1}, {2, 3}}));
  EXPECT_DOUBLE_EQ(box.pcie.uplink_GBps, 32);
  EXPECT_DOUBLE_EQ(box.pcie.inter_socket_GBps, 16);  // NCCL's AMD_BW (src/graph/topo.h)
  EXPECT_DOUBLE_EQ(box.intra.bandwidth_GBps, 32);    // PCIe Gen4 x16
  EXPECT_DOUBLE_EQ(box.device.mem_bandwidth_GBps, 1935);  // A100 80GB PCIe datasheet
  for (int g = 0; g < 8; ++g) {
    EXPECT_EQ(box.pcie.switch_of(g), g / 2);
    EXPECT_EQ(box.pcie.socket_of_switch(g / 2), g / 4);
  }
  EXPECT_TRUE(load_profile("a100-pcie").pcie.empty());
  const nlohmann::json j = profile_to_json(box);
  auto error = [&](const char* key, const char* value) {
    nlohmann::json k = j;
    k["pcie"][key] = nlohmann::json::parse(value);
    return load_error(write_temp("pcie.json", k.dump()));
  };
  EXPECT_NE(error("switches", "[[0,1],[1,2,3],[4,5],[6,7]]").find("\"pcie.switches.1\": GPU 1 is already in pcie.switches.0"),
            std::string::npos);
  EXPECT_NE(error("switches", "[[0,1],[2,3],[4,5],[6]]").find("\"pcie.switches\": GPU 7 is in none of them"),
            std::string::npos);
  EXPECT_NE(error("switches", "[[0,1],[2,3],[4,5],[6,9]]").find("\"pcie.switches.3.1\" must be a GPU index in [0, 8)"),
            std::string::npos);
  EXPECT_NE(error("sockets", "[[0,1],[2]]").find("\"pcie.sockets\": switch 3 is in none of them"), std::string::npos);
  EXPECT_NE(error("sockets", "[]").find("\"pcie.sockets\" must be a non-empty list"), std::string::npos);
  EXPECT_NE(error("inter_socket_GBps", "-16").find("\"pcie.inter_socket_GBps\" must be > 0"), std::string::npos);
  EXPECT_NE(error("uplinks", "32").find("unknown field \"pcie.uplinks\""), std::string::npos);
  nlohmann::json k = j;
  k["pcie"].erase("uplink_GBps");
  EXPECT_NE(load_error(write_temp("pcie.json", k.dump())).find("missing field \"pcie.uplink_GBps\""),
            std::string::npos);
}

// The fuzz harness's property (fuzz/profile_fuzz.cc, input
// fuzz/corpus/profile/bad_device_count_overflow.json): a device count that
// overflows int (total_devices) is refused, one line naming both counts.
TEST(Profiles, NicsSayWhichGpusShareANic) {
  // Absent (files written before "nics", and the DGX profiles): one NIC per GPU.
  const HardwareProfile dgx = load_profile("a100-nvlink");
  EXPECT_TRUE(dgx.nics.empty());
  EXPECT_EQ(dgx.nic_count(), 8);
  for (int r = 0; r < 16; ++r) {
    EXPECT_EQ(dgx.nic_of(r), r % 8);
    EXPECT_EQ(dgx.nic_sharers(r), 1);
  }
  const HardwareProfile four = load_profile("a100-nvlink-4nic");
  EXPECT_EQ(four.nic_count(), 4);
  for (int r = 0; r < 16; ++r) {
    EXPECT_EQ(four.nic_of(r), (r % 8) / 2);
    EXPECT_EQ(four.nic_sharers(r), 2);
  }
  // Across nodes each GPU gets its share of its NIC; inside a node, NVLink.
  const ProfileLinkModel links(four);
  EXPECT_EQ(links.link(0, 8).bytes_per_second, 12'500'000'000u);
  EXPECT_EQ(links.link(0, 1).bytes_per_second, 300'000'000'000u);
  EXPECT_EQ(ProfileLinkModel(dgx).link(0, 8).bytes_per_second, 25'000'000'000u);
  // Errors name the field.
  nlohmann::json j = profile_to_json(four);
  EXPECT_EQ(j["nics"], nlohmann::json::parse("[[0,1],[2,3],[4,5],[6,7]]"));
  auto error = [&](const char* nics) {
    nlohmann::json k = j;
    k["nics"] = nlohmann::json::parse(nics);
    return load_error(write_temp("nics.json", k.dump()));
  };
  EXPECT_NE(error("[[0,1],[2,3],[4,5],[6]]").find("GPU 7 is near no NIC"), std::string::npos);
  EXPECT_NE(error("[[0,1],[1,2,3],[4,5],[6,7]]").find("\"nics.1\": GPU 1 is already near NIC 0"), std::string::npos);
  EXPECT_NE(error("[[0,1],[2,3],[4,5],[6,8]]").find("\"nics.3.1\" must be a local GPU index in [0, 8)"),
            std::string::npos);
  EXPECT_NE(error("[]").find("field \"nics\" must be a list"), std::string::npos);
  EXPECT_NE(error("{\"count\": 4}").find("unknown field \"nics.count\""), std::string::npos);
}

TEST(Profiles, DeviceCountThatOverflowsIntIsRefused) {
  nlohmann::json j = profile_to_json(load_profile("a100-nvlink"));
  j["nodes"] = 65536;
  j["devices_per_node"] = 65536;
  const std::string path = write_temp("devices.json", j.dump());
  EXPECT_EQ(load_error(path),
            "profile " + path + ": nodes 65536 x devices_per_node 65536 = 4294967296 devices: at most 1048576");
  j["nodes"] = 1024;
  j["devices_per_node"] = 1024;  // exactly kMaxDevices
  EXPECT_EQ(load_profile(write_temp("devices.json", j.dump())).total_devices(), 1 << 20);
}

TEST(CostModel, RooflineTakesTheSlowerSidePlusLaunch) {
  DeviceSpec spec{10.0, 20.0, 1000.0, 1.0, 2.0, 0.5};
  CostModel fp32(spec, Precision::kFp32);
  // Compute bound: 1e9 FLOP at 10 TFLOP/s * 0.5 = 200 us; bytes 1e3 at 1e12 B/s = 1 ns.
  EXPECT_EQ(fp32.duration({1e9, 1e3}), us_to_time(2.0) + us_to_time(200.0));
  // Memory bound: 1e9 bytes at 1 TB/s = 1 ms.
  EXPECT_EQ(fp32.duration({1e6, 1e9}), us_to_time(2.0) + us_to_time(1000.0));
  CostModel bf16(spec, Precision::kBf16);
  EXPECT_EQ(bf16.duration({1e9, 0}), us_to_time(2.0) + us_to_time(100.0));
  EXPECT_EQ(element_size(Precision::kBf16), 2);
  // Past 1e6 s, or NaN (a cost from a user's code), a kernel is refused:
  // 1e300 FLOPs overflowed the picosecond clock (to 0 in a Python run).
  EXPECT_EQ(fp32.duration({5e18, 0}), us_to_time(2.0) + us_to_time(1e12));  // 1e6 s: the limit itself
  for (const OpCost& op : {OpCost{1e300, 0}, OpCost{0, 1e300}, OpCost{std::nan(""), 0}, OpCost{0, std::nan("")}}) {
    try {
      (void)fp32.duration(op);
      ADD_FAILURE() << op.flops << " FLOPs, " << op.bytes << " bytes: no error";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("(at most 1e6 s a kernel)"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace shardlab
