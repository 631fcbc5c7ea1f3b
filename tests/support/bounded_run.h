// Runs a cluster program with a generous bound on the wait, for tests of
// failure paths (aborts, deadlocks) whose bug would be a hang.
//
//   RunResult r = bounded_run(cluster, program);   // rethrows the run's RunError
//
// The bound is not a measurement: tests never assert wall-clock times (they
// flake under TSan on 2 cores). It only turns a hang into a loud failure
// long before ctest's 300 s timeout. A hung run cannot be cancelled (its
// device threads are blocked), so on timeout the test binary prints what
// timed out and aborts.
#pragma once

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <future>
#include <thread>

#include <gtest/gtest.h>

#include "runtime/cluster.h"

namespace shardlab::testing {

inline constexpr std::chrono::seconds kGenerousBound{120};

inline RunResult bounded_run(Cluster& cluster, const Cluster::Program& program,
                             std::chrono::seconds bound = kGenerousBound) {
  std::packaged_task<RunResult()> task([&] { return cluster.run(program); });
  std::future<RunResult> result = task.get_future();
  std::thread runner(std::move(task));
  if (result.wait_for(bound) != std::future_status::ready) {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::fprintf(stderr, "%s.%s: Cluster::run did not return within %lld s (hang); aborting\n",
                 info ? info->test_suite_name() : "?", info ? info->name() : "?",
                 static_cast<long long>(bound.count()));
    std::fflush(stderr);
    std::abort();
  }
  runner.join();
  return result.get();  // rethrows RunError
}

}  // namespace shardlab::testing
