// Fibers (runtime/fiber.h): programs on one host thread hand it to each
// other at their waits, wake-ups from other threads reach them, each keeps
// its own registered thread-locals; a cluster run on fibers
// (ClusterOptions::host_threads) gives the threads' virtual times, and the
// watchdog reports a deadlock among fibers (failures_test.cc: an exception
// wakes fibers waiting in a receive).
#include "runtime/fiber.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "runtime/cluster.h"
#include "runtime/errors.h"
#include "support/bounded_run.h"
#include "tests/runtime/test_util.h"

namespace shardlab {
namespace {

using testing::bounded_run;

thread_local int t_value = 0;
[[maybe_unused]] const bool kept =
    keep_per_fiber({[]() -> void* { return &t_value; }, sizeof(t_value)});

// Two programs take turns through a shared counter: each waits for its
// parity, appends its name, and wakes the other. The log is the strict
// alternation whatever the host does.
TEST(Fibers, TwoProgramsOnOneThreadTakeTurns) {
  FiberHost host;
  std::mutex m;
  int turn = 0;
  std::vector<int> log;
  HostWaiter waiters[2];
  const uint64_t before = fiber_switches();
  for (int me = 0; me < 2; ++me) {
    Fiber& f = host.add([&, me] {
      for (int i = 0; i < 500; ++i) {
        std::unique_lock<std::mutex> l(m);
        while (turn % 2 != me) waiters[me].wait(l);
        log.push_back(me);
        ++turn;
        waiters[1 - me].wake();
      }
    });
    waiters[me].bind(&f);
  }
  host.run();
  ASSERT_EQ(log.size(), 1000u);
  for (size_t i = 0; i < log.size(); ++i) ASSERT_EQ(log[i], int(i % 2)) << i;
  // Each program gives the thread away after each of its turns but its
  // last: 2 x 499 switches (program 1, first run after program 0's first
  // turn, finds its turn at once; a wake-up left for a running fiber makes
  // its next wait return without a switch).
  EXPECT_EQ(fiber_switches() - before, 998u);
}

// A fiber waiting for another thread: the host thread sleeps with nothing
// ready and the outside wake-up resumes it.
TEST(Fibers, AWakeFromAnotherThreadResumesTheFiber) {
  FiberHost host;
  std::mutex m;
  bool go = false, seen = false;
  HostWaiter w;
  Fiber& f = host.add([&] {
    std::unique_lock<std::mutex> l(m);
    while (!go) w.wait(l);
    seen = true;
  });
  w.bind(&f);
  std::thread outside([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    std::lock_guard<std::mutex> l(m);
    go = true;
    w.wake();
  });
  host.run();
  outside.join();
  EXPECT_TRUE(seen);
}

// Each fiber keeps its own value of a registered thread-local across its
// waits, starts from the host thread's, and the host's own is restored.
TEST(Fibers, RegisteredThreadLocalsArePerFiber) {
  t_value = 7;
  FiberHost host;
  std::mutex m;
  int turn = 0;
  HostWaiter waiters[3];
  std::vector<int> started(3), kept_values(3);
  for (int me = 0; me < 3; ++me) {
    Fiber& f = host.add([&, me] {
      started[size_t(me)] = t_value;
      t_value = 100 + me;
      std::unique_lock<std::mutex> l(m);
      for (int round = 0; round < 3; ++round) {
        while (turn % 3 != me) waiters[me].wait(l);
        ++turn;
        waiters[(me + 1) % 3].wake();
        if (t_value != 100 + me) kept_values[size_t(me)] = -1;
      }
      if (kept_values[size_t(me)] == 0) kept_values[size_t(me)] = t_value;
    });
    waiters[me].bind(&f);
  }
  host.run();
  EXPECT_EQ(t_value, 7);
  for (int me = 0; me < 3; ++me) {
    EXPECT_EQ(started[size_t(me)], 7) << me;
    EXPECT_EQ(kept_values[size_t(me)], 100 + me) << me;
  }
}

// A ring of messages around 6 devices on 1, 2 and 4 host threads: every
// device's arrival as with a thread each. Hand-derived on the simple
// profile (intra-node a = 1 us, 100 GB/s; inter-node a = 5 us, 10 GB/s; 4
// devices a node): 1000 bytes take 1 us + 10 ns inside a node, 5 us +
// 100 ns across, so the token reaches device r (r = 1..5) after the hops
// 0-1, 1-2, 2-3 inside node 0, 3-4 across, 4-5 inside node 1, and device 0
// after 5-0 across.
TEST(Fibers, ClusterOnFibersGivesTheThreadsTimes) {
  const Time intra = testing::kUs + 10'000, inter = 5 * testing::kUs + 100'000;
  const std::vector<Time> want = {
      3 * intra + 2 * inter + intra, intra, 2 * intra, 3 * intra, 3 * intra + inter,
      3 * intra + inter + intra};
  for (int hosts : {0, 1, 2, 4}) {
    ClusterOptions o;
    o.world_size = 6;
    o.host_threads = hosts;
    Cluster c(testing::simple_profile(), o);
    std::vector<Time> got(6);
    bounded_run(c, [&](Device& d) {
      const int r = d.rank(), n = d.world_size();
      if (r != 0) d.recv(d.comm(), r - 1, 3);
      d.isend(d.comm(), (r + 1) % n, 3, {}, 1000);
      if (r == 0) d.recv(d.comm(), n - 1, 3);
      got[size_t(r)] = d.comm().now();
    });
    // The comm stream ends at the receive's arrival (a send does not move it).
    EXPECT_EQ(got, want) << hosts << " host threads";
  }
}

TEST(Fibers, TheWatchdogReportsFibersWaitingOnEachOther) {
  ClusterOptions o;
  o.world_size = 4;
  o.host_threads = 2;  // devices 0, 1 on one thread, 2, 3 on the other
  Cluster c(testing::simple_profile(), o);
  try {
    bounded_run(c, [](Device& d) {
      if (d.rank() == 0) d.recv(d.comm(), 2, 5);
      if (d.rank() == 2) d.recv(d.comm(), 0, 5);
    });
    FAIL() << "no error";
  } catch (const RunError& e) {
    const std::string m = e.what();
    EXPECT_EQ(e.cause(), RunCause::kDeadlock) << run_cause_name(e.cause());
    EXPECT_NE(m.find("device 0 waits for a message from device 2"), std::string::npos) << m;
    EXPECT_NE(m.find("device 2 waits for a message from device 0"), std::string::npos) << m;
  }
}

TEST(Fibers, NegativeHostThreadsAreAConfigError) {
  ClusterOptions o;
  o.world_size = 2;
  o.host_threads = -1;
  EXPECT_THROW(Cluster(testing::simple_profile(), o), ConfigError);
}

// Interleave: two programs on the calling thread switch at their own
// yields, a first, strictly alternating; once one returns the other runs
// on (its yields return at once); a yield outside run() does nothing; each
// program keeps its own stack (locals survive the switches); an exception
// from one is rethrown after both have ended; run() may be called again.
TEST(Interleave, ProgramsSwitchAtTheirYieldsAndEndInTurn) {
  Interleave::yield();  // outside: nothing
  EXPECT_FALSE(Interleave::active());
  std::vector<std::string> log;
  const auto program = [&log](const std::string& name, int turns) {
    return [&log, name, turns] {
      for (int i = 0; i < turns; ++i) {
        const std::string mine = name + std::to_string(i);  // on this program's stack
        EXPECT_TRUE(Interleave::active());
        Interleave::yield();
        log.push_back(mine);
      }
    };
  };
  for (int round = 0; round < 2; ++round) {  // the stacks are reused
    log.clear();
    Interleave::run(program("f", 2), program("b", 4));
    EXPECT_EQ(log, (std::vector<std::string>{"f0", "b0", "f1", "b1", "b2", "b3"}));
    EXPECT_FALSE(Interleave::active());
  }
  bool other_ended = false;
  EXPECT_THROW(Interleave::run([] { throw ConfigError("from a"); },
                               [&] {
                                 Interleave::yield();
                                 other_ended = true;
                               }),
               ConfigError);
  EXPECT_TRUE(other_ended);
}

}  // namespace
}  // namespace shardlab
