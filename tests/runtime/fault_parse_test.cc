// The fault spec (runtime/fault.h): what each spec means, what is refused
// (one ConfigError line naming the problem), and the plan's queries.
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/errors.h"
#include "runtime/fault.h"
#include "runtime/time.h"

namespace shardlab {
namespace {

struct Good {
  const char* spec;
  FaultKind kind;
  int device, peer;
  double bandwidth, latency_us, compute;
  int step;
  uint64_t capacity_bytes;
  double capacity_fraction;
};

TEST(FaultSpec, ParsesEveryKind) {
  const Good cases[] = {
      {"slow-link:0-1:bw=0.25", FaultKind::kSlowLink, 0, 1, 0.25, 0, 1, 0, 0, 0},
      {"slow-link:3-2:bw=0.5,lat_us=+5,from_step=2", FaultKind::kSlowLink, 3, 2, 0.5, 5, 1, 2, 0, 0},
      {"slow-link:0-8:lat_us=12.5", FaultKind::kSlowLink, 0, 8, 1, 12.5, 1, 0, 0, 0},
      {"slow-nic:3:bw=0.25", FaultKind::kSlowNic, 3, -1, 0.25, 0, 1, 0, 0, 0},
      {"slow-nic:0:from_step=4,bw=1e-6", FaultKind::kSlowNic, 0, -1, 1e-6, 0, 1, 4, 0, 0},
      {"link-down:1-2:step=3", FaultKind::kLinkDown, 1, 2, 1, 0, 1, 3, 0, 0},
      {"straggler:1:compute=2.0", FaultKind::kStraggler, 1, -1, 1, 0, 2, 0, 0, 0},
      {"straggler:7:compute=1.5,from_step=1", FaultKind::kStraggler, 7, -1, 1, 0, 1.5, 1, 0, 0},
      {"dead:2:step=0", FaultKind::kDead, 2, -1, 1, 0, 1, 0, 0, 0},
      {"memory:0:capacity=40GiB", FaultKind::kMemory, 0, -1, 1, 0, 1, 0, uint64_t{40} << 30, 0},
      {"memory:5:capacity=64MB", FaultKind::kMemory, 5, -1, 1, 0, 1, 0, 64'000'000, 0},
      {"memory:1:capacity=0.5", FaultKind::kMemory, 1, -1, 1, 0, 1, 0, 0, 0.5},
      {"memory:1:capacity=1.0", FaultKind::kMemory, 1, -1, 1, 0, 1, 0, 0, 1.0},
  };
  for (const Good& c : cases) {
    SCOPED_TRACE(c.spec);
    const Fault f = parse_fault(c.spec);
    EXPECT_EQ(f.kind, c.kind);
    EXPECT_EQ(f.device, c.device);
    EXPECT_EQ(f.peer, c.peer);
    EXPECT_EQ(f.bandwidth, c.bandwidth);
    EXPECT_EQ(f.latency_us, c.latency_us);
    EXPECT_EQ(f.compute, c.compute);
    EXPECT_EQ(f.step, c.step);
    EXPECT_EQ(f.capacity_bytes, c.capacity_bytes);
    EXPECT_EQ(f.capacity_fraction, c.capacity_fraction);
    EXPECT_EQ(f.spec, c.spec);
  }
}

struct Bad {
  const char* spec;
  const char* needle;
};

// Each refused spec and a piece of its message.
constexpr Bad kBadSpecs[] = {
    {"", "expected KIND:TARGET:KEY=VALUE"},
    {"slow-nic:3", "expected KIND:TARGET:KEY=VALUE"},
    {"slow-nic:3:bw=0.5:x", "expected KIND:TARGET:KEY=VALUE"},
    {"slow:3:bw=0.5", "unknown fault \"slow\""},
    {"SLOW-NIC:3:bw=0.5", "unknown fault"},
    {"slow-nic:-1:bw=0.5", "device \"-1\" is not an integer"},
    {"slow-nic:x:bw=0.5", "device \"x\""},
    {"slow-nic: 3:bw=0.5", "device \" 3\""},
    {"slow-nic:3.0:bw=0.5", "device \"3.0\""},
    {"slow-nic:99999999999:bw=0.5", "device \"99999999999\""},
    {"slow-nic:1048576:bw=0.5", "device \"1048576\""},
    {"slow-nic:0-1:bw=0.5", "device \"0-1\""},
    {"slow-link:3:bw=0.5", "is not A-B"},
    {"slow-link:1-2-3:bw=0.5", "is not A-B"},
    {"slow-link:-1:bw=0.5", "device \"\""},
    {"slow-link:2-2:bw=0.5", "joins a device to itself"},
    {"slow-link:0-1:bw=0", "bw \"0\" is not a number"},
    {"slow-link:0-1:bw=-0.5", "bw \"-0.5\""},
    {"slow-link:0-1:bw=1.5", "bw \"1.5\""},
    {"slow-link:0-1:bw=nan", "bw \"nan\""},
    {"slow-link:0-1:bw=inf", "bw \"inf\""},
    {"slow-link:0-1:bw=1e-9", "bw \"1e-9\""},
    {"slow-link:0-1:bw=0.5x", "bw \"0.5x\""},
    {"slow-link:0-1:bw=", "bw \"\""},
    {"slow-link:0-1:lat_us=-5", "lat_us \"-5\""},
    {"slow-link:0-1:lat_us=+-5", "lat_us \"-5\""},
    {"slow-link:0-1:lat_us=1e7", "lat_us \"1e7\""},
    {"slow-link:0-1:from_step=2", "needs bw=F or lat_us=+X"},
    {"slow-link:0-1:bw=1", "change nothing"},
    {"slow-link:0-1:bw=0.5,bw=0.25", "bw given twice"},
    {"slow-link:0-1:bw=0.5,", "\"\" is not KEY=VALUE"},
    {"slow-link:0-1:bw", "\"bw\" is not KEY=VALUE"},
    {"slow-link:0-1:=0.5", "\"=0.5\" is not KEY=VALUE"},
    {"slow-link:0-1:bw=0.5,step=2", "slow-link has no parameter \"step\""},
    {"slow-nic:0:bw=0.5,compute=2", "slow-nic has no parameter \"compute\""},
    {"slow-nic:0:bw=0.5,from_step=-1", "from_step \"-1\""},
    {"slow-nic:0:bw=0.5,from_step=1.5", "from_step \"1.5\""},
    {"slow-nic:0:bw=0.5,from_step=1000001", "from_step \"1000001\""},
    {"link-down:0-1:from_step=2", "has no parameter \"from_step\""},
    {"link-down:0-1:bw=0.5", "link-down has no parameter \"bw\""},
    {"link-down:0-1:step=", "step \"\""},
    {"dead:1:bw=0.5", "dead has no parameter \"bw\""},
    {"dead:1:x=1", "dead has no parameter \"x\""},
    {"dead:1-2:step=1", "device \"1-2\""},
    {"straggler:1:from_step=2", "needs compute=F"},
    {"straggler:1:compute=0.5", "compute \"0.5\""},
    {"straggler:1:compute=0", "compute \"0\""},
    {"straggler:1:compute=1e9", "compute \"1e9\""},
    {"straggler:1:compute=NaN", "compute \"NaN\""},
    {"memory:1:bw=0.5", "memory has no parameter \"bw\""},
    {"memory:1:capacity=0", "capacity 0"},
    {"memory:1:capacity=0.0", "capacity fraction must be above 0"},
    {"memory:1:capacity=1.5", "capacity fraction \"1.5\""},
    {"memory:1:capacity=abc", "cannot parse size"},
    {"memory:1:capacity=-1GiB", "cannot parse size"},
    {"memory:1:capacity=40XB", "cannot parse size"},
    {"memory:1:capacity=", "cannot parse size"},
};

TEST(FaultSpec, RefusesBadSpecsWithOneLine) {
  for (const Bad& c : kBadSpecs) {
    SCOPED_TRACE(c.spec);
    try {
      (void)parse_fault(c.spec);
      ADD_FAILURE() << "accepted";
    } catch (const ConfigError& e) {
      const std::string what = e.what();
      EXPECT_TRUE(what.starts_with(std::string("`faults` ") + c.spec + ": ")) << what;
      EXPECT_NE(what.find(c.needle), std::string::npos) << what;
      EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    }
  }
}

std::string error_of(const std::vector<std::string>& args, int world, int steps) {
  try {
    FaultPlan plan(parse_faults(args), world, steps);
    return "";
  } catch (const ConfigError& e) {
    return e.what();
  }
}

TEST(FaultPlan, RefusesFaultsThatCannotHappenInThisRun) {
  EXPECT_NE(error_of({"slow-nic:4:bw=0.5"}, 4, 10).find("device 4 is not one of the 4 devices"), std::string::npos);
  EXPECT_NE(error_of({"slow-link:0-4:bw=0.5"}, 4, 10).find("device 4 is not one"), std::string::npos);
  EXPECT_NE(error_of({"dead:1:step=10"}, 4, 10).find("step 10 is not below `steps` 10"), std::string::npos);
  EXPECT_NE(error_of({"slow-nic:1:bw=0.5,from_step=10"}, 4, 10).find("not below `steps`"), std::string::npos);
  EXPECT_NE(error_of({"dead:0:step=1"}, 1, 10).find("no peer to lose"), std::string::npos);
  EXPECT_NE(error_of({"dead:0:step=1", "link-down:1-2:step=3"}, 4, 10).find("only one dead device or downed link"),
            std::string::npos);
  EXPECT_EQ(error_of({"dead:3:step=9", "slow-nic:0:bw=0.5", "memory:0:capacity=1GiB"}, 4, 10), "");
  EXPECT_EQ(error_of({}, 1, 1), "");
}

TEST(FaultPlan, ReadsAJsonListOfSpecs) {
  const std::string path = ::testing::TempDir() + "faults.json";
  std::ofstream(path) << R"(["slow-nic:1:bw=0.25", "straggler:2:compute=3"])";
  const std::vector<Fault> f = parse_faults({"dead:0:step=1", "@" + path});
  ASSERT_EQ(f.size(), 3u);
  EXPECT_EQ(f[0].kind, FaultKind::kDead);
  EXPECT_EQ(f[1].kind, FaultKind::kSlowNic);
  EXPECT_EQ(f[2].compute, 3);
  const std::pair<const char*, const char*> bad[] = {
      {R"({"fault": "dead:0:step=1"})", "expected a JSON list"},
      {R"([1])", "item 1 is not a string"},
      {R"(["dead:0"])", "`faults` dead:0: expected KIND"},
      {"not json", "not JSON"},
  };
  for (auto [text, needle] : bad) {
    std::ofstream(path) << text;
    EXPECT_NE(error_of({"@" + path}, 4, 10).find(needle), std::string::npos) << text;
  }
  EXPECT_NE(error_of({"@" + path + ".missing"}, 4, 10).find("no such file"), std::string::npos);
  EXPECT_NE(error_of({"@" + ::testing::TempDir()}, 4, 10).find("is a directory"), std::string::npos);
}

TEST(FaultPlan, SlowsTheLinksItNamesFromItsStepOn) {
  const FaultPlan plan(parse_faults({"slow-link:1-2:bw=0.5,from_step=2", "slow-nic:2:bw=0.5,lat_us=+3"}), 4);
  const Link base{LinkClass::kIntra, 2'000'000, 300'000'000'000, 32, {128, 0}};
  auto at = [&](int src, int dst, int step) { return plan.apply(base, src, dst, step); };
  EXPECT_EQ(at(0, 1, 5).bytes_per_second, base.bytes_per_second);  // untouched link
  EXPECT_EQ(at(0, 1, 5).latency, base.latency);
  EXPECT_EQ(at(1, 2, 1).bytes_per_second, 150'000'000'000u);  // only the NIC before step 2
  EXPECT_EQ(at(1, 2, 1).latency, 5'000'000);
  EXPECT_EQ(at(2, 1, 2).bytes_per_second, 75'000'000'000u);  // both faults: the factors multiply
  EXPECT_EQ(at(3, 2, 0).bytes_per_second, 150'000'000'000u);  // the NIC: into device 2 as well
  EXPECT_EQ(at(2, 3, 0).latency, 5'000'000);
  EXPECT_EQ(at(2, 3, 0).header_bytes, 32u);
}

TEST(FaultPlan, ComputeCapacityAndFatalFaults) {
  const FaultPlan plan(parse_faults({"straggler:1:compute=2,from_step=1", "straggler:1:compute=1.5",
                                     "memory:2:capacity=0.25", "memory:3:capacity=1KiB", "link-down:3-0:step=2"}),
                       4);
  EXPECT_EQ(plan.compute_scale(1, 0), 1.5);
  EXPECT_EQ(plan.compute_scale(1, 1), 3.0);
  EXPECT_EQ(plan.compute_scale(0, 1), 1.0);
  EXPECT_EQ(plan.capacity(2, 1000), 250u);
  EXPECT_EQ(plan.capacity(3, 1 << 20), 1024u);
  EXPECT_EQ(plan.capacity(0, 1000), 1000u);
  EXPECT_EQ(plan.fatal_for(0, 3, 1), nullptr);  // before its step
  EXPECT_NE(plan.fatal_for(0, 3, 2), nullptr);  // the lower end reports it
  EXPECT_EQ(plan.fatal_for(3, 0, 2), nullptr);
  EXPECT_EQ(plan.fatal_for(0, 1, 2), nullptr);  // another link
}

}  // namespace
}  // namespace shardlab
