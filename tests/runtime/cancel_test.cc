// Cancellation (runtime/cancel.h): a run whose devices compute forever, or
// wait on messages never sent, ends with Cancelled once the flag is set, and
// no run starts while it stays set. A hang is caught by bounded_run's bound.
#include <atomic>
#include <thread>

#include <gtest/gtest.h>

#include "runtime/cancel.h"
#include "runtime/cluster.h"
#include "runtime/errors.h"
#include "support/bounded_run.h"
#include "tests/runtime/test_util.h"

namespace shardlab {
namespace {

using testing::bounded_run;

// Clears the flag however the test ends (it is process-wide).
struct ClearCancel {
  ~ClearCancel() { clear_cancel(); }
};

TEST(Cancel, EndsARunOfDevicesComputingAndWaiting) {
  ClearCancel guard;
  Cluster c(testing::simple_profile(), {.world_size = 4});
  std::atomic<int> started{0};
  std::thread canceller([&] {
    while (started.load() < 4) std::this_thread::yield();
    request_cancel();  // every device is inside its program
  });
  EXPECT_THROW(bounded_run(c,
                           [&](Device& d) {
                             ++started;
                             if (d.rank() == 3) d.recv(d.comm(), 0, 7);  // never sent: a waiting device
                             for (;;) d.run(d.compute(), "work", {.flops = 1e6});  // each op checks for the abort
                           }),
               Cancelled);
  canceller.join();
}

TEST(Cancel, NoRunStartsWhileTheFlagIsSetAndRunsAgainOnceCleared) {
  ClearCancel guard;
  Cluster c(testing::simple_profile(), {.world_size = 2});
  request_cancel();
  std::atomic<int> ran{0};
  EXPECT_THROW(c.run([&](Device&) { ++ran; }), Cancelled);
  EXPECT_EQ(ran.load(), 0);
  clear_cancel();
  c.run([&](Device&) { ++ran; });
  EXPECT_EQ(ran.load(), 2);
}

}  // namespace
}  // namespace shardlab
