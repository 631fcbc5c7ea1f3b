// Failures are loud and bounded: an exception or a deadlock ends the run.
// Tests assert the outcome (which error, from whom, saying what); a hang is
// caught by bounded_run's generous bound, never by timing the run.
#include <chrono>
#include <functional>
#include <new>
#include <span>
#include <stdexcept>
#include <thread>

#include <gtest/gtest.h>

#include "runtime/cluster.h"
#include "runtime/errors.h"
#include "support/bounded_run.h"
#include "tests/runtime/test_util.h"

namespace shardlab {
namespace {

using testing::bounded_run;

TEST(Failures, AnExceptionOnOneDeviceStopsDevicesBlockedInReceive) {
  for (int hosts : {0, 1}) {  // a thread per device, and fibers of one thread (runtime/fiber.h)
    Cluster c(testing::simple_profile(), {.world_size = 4, .host_threads = hosts});
    try {
      bounded_run(c, [](Device& d) {
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
      EXPECT_EQ(e.cause(), RunCause::kProgram) << run_cause_name(e.cause());
      EXPECT_FALSE(e.input_error());
    }
  }
}

TEST(Failures, DevicesWaitingOnEachOtherAreReportedByTheWatchdog) {
  Cluster c(testing::simple_profile(), {.world_size = 4});
  try {
    bounded_run(c, [](Device& d) {
      if (d.rank() == 0) d.recv(d.comm(), 1, 5);
      if (d.rank() == 1) d.recv(d.comm(), 0, 5);
    });
    FAIL() << "no error";
  } catch (const RunError& e) {
    std::string m = e.what();
    EXPECT_EQ(e.rank(), -1);
    EXPECT_EQ(e.cause(), RunCause::kDeadlock) << run_cause_name(e.cause());
    EXPECT_NE(m.find("deadlock"), std::string::npos) << m;
    EXPECT_NE(m.find("device 0 waits for a message from device 1"), std::string::npos) << m;
    EXPECT_NE(m.find("device 1 waits for a message from device 0"), std::string::npos) << m;
    // Devices 2 and 3 returned: they are not part of the cycle.
    EXPECT_EQ(m.find("device 2 waits"), std::string::npos) << m;
    EXPECT_EQ(m.find("device 3 waits"), std::string::npos) << m;
  }
}

TEST(Failures, WaitingOnAFinishedDeviceIsADeadlock) {
  Cluster c(testing::simple_profile(), {.world_size = 2});
  try {
    bounded_run(c, [](Device& d) {
      if (d.rank() == 0) d.recv(d.comm(), 1, 9);
    });
    FAIL() << "no error";
  } catch (const RunError& e) {
    EXPECT_EQ(e.rank(), -1);
    EXPECT_NE(std::string(e.what()).find("device 0 waits for a message from device 1 (tag 0x9), which has finished"), std::string::npos)
        << e.what();
  }
}

TEST(Failures, SlowHostWorkIsNotADeadlock) {
  Cluster c(testing::simple_profile(), {.world_size = 2, .watchdog_period = std::chrono::milliseconds(10)});
  Time arrival = 0;
  bounded_run(c, [&](Device& d) {
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
    bounded_run(c, [](Device& d) {
      if (d.rank() == 1) Tensor t = d.alloc("activations", {1024}, MemKind::kActivation);
    });
    FAIL() << "no error";
  } catch (const RunError& e) {
    EXPECT_EQ(e.rank(), 1);
    EXPECT_EQ(e.cause(), RunCause::kInput) << run_cause_name(e.cause());
    EXPECT_TRUE(e.input_error());
    EXPECT_NE(std::string(e.what()).find("device 1: out of memory allocating 'activations'"), std::string::npos)
        << e.what();
  }
}

// Each exception a device program throws becomes the RunError cause the tool
// maps to its exit code (cli/main.cc).
TEST(Failures, EachErrorKindIsItsCause) {
  struct Case {
    std::function<void()> raise;
    RunCause cause;
  };
  const Case cases[] = {
      {[] { throw ConfigError("bad flag"); }, RunCause::kInput},
      {[] { throw FoldingError("not foldable"); }, RunCause::kFolding},
      {[] { throw DeviceFailure("device 1 died"); }, RunCause::kDeviceFailure},
      {[] { throw std::logic_error("a bug"); }, RunCause::kProgram},
      // Sizes the host cannot hold (a phantom batch of 16M x 64K tokens with
      // --memory 1000000GiB): an input error naming the host, not "std::bad_alloc", exit 1.
      {[] { throw std::bad_alloc(); }, RunCause::kInput},
  };
  for (const Case& k : cases) {
    Cluster c(testing::simple_profile(), {.world_size = 2});
    try {
      bounded_run(c, [&](Device& d) {
        if (d.rank() == 1) k.raise();
      });
      ADD_FAILURE() << "no error for " << run_cause_name(k.cause);
    } catch (const RunError& e) {
      EXPECT_EQ(e.cause(), k.cause) << run_cause_name(e.cause()) << " for " << run_cause_name(k.cause);
      EXPECT_EQ(e.rank(), 1);
      if (k.cause == RunCause::kInput && std::string(e.what()).find("bad flag") == std::string::npos) {
        EXPECT_EQ(std::string(e.what()), std::string("device 1: ") + kHostOutOfMemory);
      }
    }
  }
}

// A device program of the C++ API that names a peer outside the world (or
// itself) fails its run with a RunError naming the device and the peer; the
// process that hosts the cluster goes on (it aborted before).
TEST(Failures, ABadPeerIsTheProgramsErrorNotAnAbort) {
  struct Case {
    std::function<void(Device&)> call;
    const char* message;
  };
  const Case cases[] = {
      {[](Device& d) { d.isend(d.comm(), 3, 0, std::span<const std::byte>{}, 8); },
       "device 1: send peer 3 invalid: outside the world of 3"},
      {[](Device& d) { d.isend(d.comm(), -1, 0, std::span<const std::byte>{}, 8); },
       "device 1: send peer -1 invalid: outside the world of 3"},
      {[](Device& d) { d.isend(d.comm(), 1, 0, std::span<const std::byte>{}, 8); },
       "device 1: send peer 1 invalid: a device's own rank"},
      {[](Device& d) { (void)d.recv(d.comm(), 7, 0); }, "device 1: recv peer 7 invalid: outside the world of 3"},
      {[](Device& d) { (void)d.recv(d.comm(), 1, 0); }, "device 1: recv peer 1 invalid: a device's own rank"},
  };
  for (const Case& k : cases) {
    Cluster c(testing::simple_profile(), {.world_size = 3});
    try {
      bounded_run(c, [&](Device& d) {
        if (d.rank() == 1) k.call(d);
        if (d.rank() == 0) (void)d.recv(d.comm(), 2, 0);  // never sent: torn down by device 1's error
      });
      ADD_FAILURE() << "no error for " << k.message;
    } catch (const RunError& e) {
      EXPECT_EQ(e.cause(), RunCause::kProgram) << run_cause_name(e.cause());
      EXPECT_EQ(e.rank(), 1);
      EXPECT_STREQ(e.what(), k.message);
    }
  }
}

TEST(Failures, PacingIsInterruptedByAnAbort) {
  // 1 wall second per virtual microsecond: the pacing sleep would take hours.
  // Device 1 would pace for an hour: bounded_run fails the test if the abort
  // does not cut that sleep short (its bound is far below an hour).
  Cluster c(testing::simple_profile(), {.world_size = 2, .pace = 1e6});
  try {
    bounded_run(c, [](Device& d) {
      if (d.rank() == 0) throw std::runtime_error("stop");
      d.compute().run("long", 3'600 * testing::kUs);
    });
    FAIL() << "no error";
  } catch (const RunError& e) {
    EXPECT_EQ(e.rank(), 0);
    EXPECT_STREQ(e.what(), "device 0: stop");
  }
}

TEST(Pacing, PlaysOutInWallClockTime) {
  // 0.05 virtual seconds at pace 2: the device may not finish before 0.1 wall
  // seconds after the run started. This is a lower bound that holds however
  // slow or loaded the host is (pacing sleeps until start + pace * virtual
  // time on the steady clock, and wall_seconds is measured from the same
  // start), so it cannot flake; there is no upper bound.
  Cluster c(testing::simple_profile(), {.world_size = 1, .pace = 2.0});
  RunResult r = bounded_run(c, [](Device& d) { d.compute().run("k", 50'000 * testing::kUs); });
  EXPECT_EQ(r.makespan(), 50'000 * testing::kUs);  // reported time is virtual, not wall
  EXPECT_GE(r.wall_seconds, 2.0 * 0.05);
}

TEST(Pacing, DoesNotChangeVirtualTimes) {
  auto program = [](Device& d) {
    d.compute().run("k", 700 * testing::kUs);
    if (d.rank() == 0) d.isend(d.comm(), 1, 3, {}, 1000);
    if (d.rank() == 1) d.recv(d.comm(), 0, 3);
  };
  Cluster plain(testing::simple_profile(), {.world_size = 2});
  Cluster paced(testing::simple_profile(), {.world_size = 2, .pace = 10.0});
  const RunResult a = bounded_run(plain, program), b = bounded_run(paced, program);
  ASSERT_EQ(a.devices.size(), 2u);
  ASSERT_EQ(b.devices.size(), 2u);
  for (size_t r = 0; r < 2; ++r) {
    EXPECT_EQ(a.devices[r].compute_end, b.devices[r].compute_end) << r;
    EXPECT_EQ(a.devices[r].comm_end, b.devices[r].comm_end) << r;
  }
}

}  // namespace
}  // namespace shardlab
