#include <fstream>
#include <set>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "runtime/cluster.h"
#include "tests/runtime/test_util.h"
#include "tests/runtime/trace_checks.h"

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
    // Times by hand (simple_profile: 10 TFLOP/s, 1000 GB/s, no launch
    // overhead; intra-node links 1 us + 100 GB/s), in us:
    //   matmul  2e6 flops / 1e13 = 0.2 (1e3 bytes / 1e12 = 0.001 is less), from 0
    //   send    leaves at once (the comm stream is at 0): 4096 B / 1e11 = 0.04096 on the wire
    //   recv    posted at 0, arrives at 0 + 1 + 0.04096
    if (e["ph"] == "X" && e["name"] == "send") {
      ++sends;
      EXPECT_EQ(e["args"]["bytes"], 4096);
      EXPECT_EQ(e["tid"], 1);
      EXPECT_DOUBLE_EQ(e["ts"].get<double>(), 0.0);
      EXPECT_DOUBLE_EQ(e["dur"].get<double>(), 0.04096);
    }
    if (e["ph"] == "X" && e["name"] == "recv") {
      EXPECT_EQ(e["tid"], 1);
      EXPECT_DOUBLE_EQ(e["ts"].get<double>(), 0.0);
      EXPECT_DOUBLE_EQ(e["dur"].get<double>(), 1.04096);
    }
    if (e["ph"] == "X" && e["name"] == "matmul") {
      ++kernels;
      EXPECT_EQ(e["tid"], 0);
      EXPECT_DOUBLE_EQ(e["args"]["flops"].get<double>(), 2e6);
      EXPECT_DOUBLE_EQ(e["ts"].get<double>(), 0.0);
      EXPECT_DOUBLE_EQ(e["dur"].get<double>(), 0.2);
    }
  }
  // Every track a sequence of disjoint spans, the last ending at the device's end.
  ASSERT_EQ(r.traces.size(), 3u);
  for (size_t d = 0; d < 3; ++d) EXPECT_EQ(testing::trace_fault(r.traces[d], r.devices[d]), "") << "device " << d;
  EXPECT_EQ(pids, (std::set<int>{0, 1, 2}));
  EXPECT_EQ(named_threads.size(), 6u);
  EXPECT_EQ(sends, 3);
  EXPECT_EQ(kernels, 3);
}

// --tp-comm-overlap's side stream has its own track, named "tp-comm" (tid
// 3), on the devices whose traces carry it; the others show compute and comm
// only (as the pipeline track).
TEST(Trace, TheTpCommTrackIsNamedWhereItCarriesEvents) {
  Cluster c(testing::simple_profile(), {.world_size = 3, .trace = true});
  RunResult r = c.run([](Device& d) {
    Stream side(&d, StreamKind::kTpComm);
    if (d.rank() == 0) d.isend(side, 1, 0, {}, 4096);
    if (d.rank() == 1) d.recv(side, 0, 0);
  });
  const nlohmann::json j = nlohmann::json::parse(chrome_trace_json(r.traces, "test"));
  std::set<std::pair<int, int>> named;
  for (const auto& e : j.at("traceEvents")) {
    if (e["ph"] == "M" && e["name"] == "thread_name") {
      named.insert({e["pid"].get<int>(), e["tid"].get<int>()});
      if (e["tid"] == 3) {
        EXPECT_EQ(e["args"]["name"], "tp-comm");
      }
    }
    if (e["ph"] == "X") {
      EXPECT_EQ(e["tid"], 3) << e.dump();
    }
  }
  EXPECT_EQ(named, (std::set<std::pair<int, int>>{{0, 0}, {0, 1}, {0, 3}, {1, 0}, {1, 1}, {1, 3}, {2, 0}, {2, 1}}));
  EXPECT_STREQ(stream_name(StreamKind::kTpComm), "tp-comm");
}

// A send waits for the egress port, which a send from another stream holds,
// so it is traced from its departure; a receive posted on the same stream
// before that departure is traced from its posting. The stream's busy time
// is the union of both spans. Times by hand (simple_profile, intra node:
// 1 us + 100 GB/s; 4096 B take 0.04096 us on the wire), in us:
//   device 0  compute: send A to 1 over [0, 0.04096)     (egress busy until 0.04096)
//             comm:    send B to 1 over [0.04096, 0.08192)
//             comm:    receive C from 1 posted at 0, arrives 0 + 1 + 0.04096
//   comm busy = |[0, 1.04096)| = 1.04096
TEST(Trace, BusyTimeIsTheUnionOfTheSpansWhateverTheirOrder) {
  Cluster c(testing::simple_profile(), {.world_size = 2, .trace = true});
  RunResult r = c.run([](Device& d) {
    if (d.rank() == 0) {
      d.isend(d.compute(), 1, 1, {}, 4096);
      d.isend(d.comm(), 1, 2, {}, 4096);
      d.recv(d.comm(), 1, 3);
    } else {
      d.isend(d.comm(), 0, 3, {}, 4096);
      d.recv(d.compute(), 0, 1);
      d.recv(d.comm(), 0, 2);
    }
  });
  const DeviceStats& d0 = r.devices[0];
  EXPECT_EQ(d0.comm_end, 1'040'960);
  EXPECT_EQ(d0.comm_busy, 1'040'960) << "the receive's span before the send departed is busy time too";
  EXPECT_EQ(d0.compute_busy, 40'960);
  for (size_t d = 0; d < 2; ++d) EXPECT_EQ(testing::trace_fault(r.traces[d], r.devices[d]), "") << "device " << d;
}

// The checker itself: it must catch what it is for.
TEST(TraceChecks, CatchOverlapsCrossingsBusyTimeAndAWrongEnd) {
  constexpr Time us = testing::kUs;
  DeviceStats d;
  d.compute_end = 30 * us;
  d.comm_end = 25 * us;
  d.compute_busy = 30 * us;  // k1 + k2
  d.comm_busy = 20 * us;     // recv
  auto trace = [](std::vector<TraceEvent> events) { return DeviceTrace{0, 0, std::move(events)}; };
  const TraceEvent k1{"k1", StreamKind::kCompute, 0, 10 * us}, k2{"k2", StreamKind::kCompute, 10 * us, 30 * us};
  const TraceEvent recv{"recv", StreamKind::kComm, 5 * us, 25 * us};
  EXPECT_EQ(testing::trace_fault(trace({k1, k2, recv}), d), "");
  // A send nested in a receive is fine; one that crosses its end is not.
  EXPECT_EQ(testing::trace_fault(trace({k1, k2, recv, {"send", StreamKind::kComm, 6 * us, 8 * us}}), d), "");
  EXPECT_NE(testing::trace_fault(trace({k1, k2, recv, {"send", StreamKind::kComm, 20 * us, 26 * us}}), d), "");
  // Two kernels at once on one stream, even nested.
  EXPECT_NE(testing::trace_fault(trace({k1, k2, recv, {"k3", StreamKind::kCompute, 2 * us, 4 * us}}), d), "");
  // Two sends at once of one stream (its transfers queue on the port)...
  EXPECT_NE(testing::trace_fault(trace({k1, k2, recv, {"send", StreamKind::kComm, 6 * us, 8 * us},
                                        {"send", StreamKind::kComm, 7 * us, 9 * us}}),
                                 d),
            "");
  // ... but two streams' sends may overlap: they share the port (runtime/port.h).
  EXPECT_EQ(testing::trace_fault(trace({k1, k2, recv, {"send", StreamKind::kComm, 6 * us, 8 * us},
                                        {"send", StreamKind::kPipeline, 7 * us, 9 * us}}),
                                 d),
            "");
  // The same kernels on another track do not collide.
  EXPECT_EQ(testing::trace_fault(trace({k1, k2, recv, {"k3", StreamKind::kPipeline, 2 * us, 4 * us}}), d), "");
  // A busy time that is not the union of the track's spans.
  DeviceStats idle = d;
  idle.comm_busy = 19 * us;
  EXPECT_NE(testing::trace_fault(trace({k1, k2, recv}), idle), "");
  // The device ran past its last event.
  DeviceStats later = d;
  later.compute_end = 31 * us;
  EXPECT_NE(testing::trace_fault(trace({k1, k2, recv}), later), "");
}

}  // namespace
}  // namespace shardlab
