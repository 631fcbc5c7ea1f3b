// Failures are loud and bounded: an exception or a deadlock ends the run.
#include <chrono>
#include <stdexcept>
#include <thread>

#include <gtest/gtest.h>

#include "runtime/cluster.h"
#include "runtime/errors.h"
#include "tests/runtime/test_util.h"

namespace shardlab {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

TEST(Failures, AnExceptionOnOneDeviceStopsDevicesBlockedInReceive) {
  Cluster c(testing::simple_profile(), {.world_size = 4});
  const auto t0 = Clock::now();
  try {
    c.run([](Device& d) {
      if (d.rank() == 2) {
        d.compute().run("work", 1000);
        throw std::runtime_error("boom in layer 3");
      }
      d.recv(d.comm(), 2, 0);  // never sent: must be woken, not hang
    });
    FAIL() << "no error";
  } catch (const RunError& e) {
    EXPECT_EQ(e.rank(), 2);
    EXPECT_STREQ(e.what(), "device 2: boom in layer 3");
    EXPECT_FALSE(e.input_error());
  }
  EXPECT_LT(seconds_since(t0), 2.0);
}

TEST(Failures, DevicesWaitingOnEachOtherAreReportedByTheWatchdog) {
  Cluster c(testing::simple_profile(), {.world_size = 4});
  const auto t0 = Clock::now();
  try {
    c.run([](Device& d) {
      if (d.rank() == 0) d.recv(d.comm(), 1, 5);
      if (d.rank() == 1) d.recv(d.comm(), 0, 5);
    });
    FAIL() << "no error";
  } catch (const RunError& e) {
    std::string m = e.what();
    EXPECT_EQ(e.rank(), -1);
    EXPECT_NE(m.find("deadlock"), std::string::npos) << m;
    EXPECT_NE(m.find("device 0 waits for a message from device 1"), std::string::npos) << m;
    EXPECT_NE(m.find("device 1 waits for a message from device 0"), std::string::npos) << m;
  }
  const double took = seconds_since(t0);
  std::printf("deadlock reported after %.3f s (limit 2 s)\n", took);
  EXPECT_LT(took, 2.0);
}

TEST(Failures, WaitingOnAFinishedDeviceIsADeadlock) {
  Cluster c(testing::simple_profile(), {.world_size = 2});
  try {
    c.run([](Device& d) {
      if (d.rank() == 0) d.recv(d.comm(), 1, 9);
    });
    FAIL() << "no error";
  } catch (const RunError& e) {
    EXPECT_NE(std::string(e.what()).find("from device 1 (tag 0x9), which has finished"), std::string::npos)
        << e.what();
  }
}

TEST(Failures, SlowHostWorkIsNotADeadlock) {
  Cluster c(testing::simple_profile(), {.world_size = 2, .watchdog_period = std::chrono::milliseconds(10)});
  Time arrival = 0;
  c.run([&](Device& d) {
    if (d.rank() == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));  // long host-side compute
      d.isend(d.comm(), 1, 1, {}, 1000);
    } else {
      d.recv(d.comm(), 0, 1);
      arrival = d.comm().now();
    }
  });
  EXPECT_EQ(arrival, testing::kUs + 10'000);  // 1 us + 1000 B at 100 GB/s
}

TEST(Failures, OutOfMemoryOnADeviceIsAnInputError) {
  Cluster c(testing::simple_profile(), {.world_size = 2, .memory_bytes = 1024});
  try {
    c.run([](Device& d) {
      if (d.rank() == 1) Tensor t = d.alloc("activations", {1024}, MemKind::kActivation);
    });
    FAIL() << "no error";
  } catch (const RunError& e) {
    EXPECT_TRUE(e.input_error());
    EXPECT_NE(std::string(e.what()).find("device 1: out of memory allocating 'activations'"), std::string::npos)
        << e.what();
  }
}

TEST(Failures, PacingIsInterruptedByAnAbort) {
  // 1 wall second per virtual microsecond: the pacing sleep would take hours.
  Cluster c(testing::simple_profile(), {.world_size = 2, .pace = 1e6});
  const auto t0 = Clock::now();
  EXPECT_THROW(c.run([](Device& d) {
                 if (d.rank() == 0) throw std::runtime_error("stop");
                 d.compute().run("long", 3'600 * testing::kUs);
               }),
               RunError);
  EXPECT_LT(seconds_since(t0), 2.0);
}

TEST(Pacing, PlaysOutInWallClockTime) {
  // 0.05 virtual seconds at pace 2 -> about 0.1 wall seconds.
  Cluster c(testing::simple_profile(), {.world_size = 1, .pace = 2.0});
  const auto t0 = Clock::now();
  RunResult r = c.run([](Device& d) { d.compute().run("k", 50'000 * testing::kUs); });
  EXPECT_EQ(r.makespan(), 50'000 * testing::kUs);  // reported time is virtual, not wall
  EXPECT_GE(seconds_since(t0), 0.099);
}

}  // namespace
}  // namespace shardlab
