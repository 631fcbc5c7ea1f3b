#include <fstream>
#include <set>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "runtime/cluster.h"
#include "tests/runtime/test_util.h"

namespace shardlab {
namespace {

TEST(Trace, ChromeTraceHasATrackPerDeviceAndStream) {
  Cluster c(testing::simple_profile(), {.world_size = 3, .trace = true});
  RunResult r = c.run([](Device& d) {
    d.run(d.compute(), "matmul", {2e6, 1e3});
    int next = (d.rank() + 1) % 3, prev = (d.rank() + 2) % 3;
    d.isend(d.comm(), next, 0, {}, 4096);
    d.recv(d.comm(), prev, 0);
  });
  const std::string path = ::testing::TempDir() + "trace.json";
  write_chrome_trace(path, r.traces, "test");
  nlohmann::json j = nlohmann::json::parse(std::ifstream(path));
  std::set<int> pids;
  std::set<std::pair<int, int>> named_threads;
  int sends = 0, kernels = 0;
  for (const auto& e : j.at("traceEvents")) {
    pids.insert(e.at("pid").get<int>());
    if (e["ph"] == "M" && e["name"] == "thread_name")
      named_threads.insert({e["pid"].get<int>(), e["tid"].get<int>()});
    if (e["ph"] == "X" && e["name"] == "send") {
      ++sends;
      EXPECT_EQ(e["args"]["bytes"], 4096);
      EXPECT_EQ(e["tid"], 1);
    }
    if (e["ph"] == "X" && e["name"] == "matmul") {
      ++kernels;
      EXPECT_EQ(e["tid"], 0);
      EXPECT_DOUBLE_EQ(e["args"]["flops"].get<double>(), 2e6);
    }
  }
  EXPECT_EQ(pids, (std::set<int>{0, 1, 2}));
  EXPECT_EQ(named_threads.size(), 6u);
  EXPECT_EQ(sends, 3);
  EXPECT_EQ(kernels, 3);
}

}  // namespace
}  // namespace shardlab
