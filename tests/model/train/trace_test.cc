// The trace of a training run against its virtual clocks: on every device,
// each track (compute, comm, pipeline) is a sequence of disjoint spans, the
// last event ends at the device's virtual end time, which device 0's last
// step record holds.
#include <cstdio>
#include <string>

#include <gtest/gtest.h>

#include "tests/model/train/train_test_util.h"
#include "tests/runtime/trace_checks.h"

namespace shardlab::train {
namespace {

void expect_consistent_trace(const TrainOptions& o, const char* what) {
  const TrainResult r = testing::run(o, nullptr, /*trace=*/true);
  ASSERT_EQ(r.run.traces.size(), size_t(o.parallel.world()));
  size_t events = 0;
  for (size_t d = 0; d < r.run.traces.size(); ++d) {
    events += r.run.traces[d].events.size();
    EXPECT_EQ(shardlab::testing::trace_fault(r.run.traces[d], r.run.devices[d]), "") << what << " device " << d;
  }
  // The step record's virtual end is device 0's clock after the last step:
  // the end of its last event (the optimizer, or ZeRO's parameter all-gather).
  Time last = 0;
  const char* last_name = "";
  for (const TraceEvent& e : r.run.traces[0].events)
    if (e.end >= last) last = e.end, last_name = e.name;
  std::printf("%s: %zu events on %d devices; device 0's last event %s ends at %.6f us, step record %.6f us\n",
              what, events, o.parallel.world(), last_name, to_us(last), to_us(r.steps.back().virtual_end));
  EXPECT_EQ(last, r.steps.back().virtual_end) << what;
}

TEST(TrainTrace, TensorAndDataParallelWithZero) {
  TrainOptions o = testing::small_options(0);
  o.steps = 2;
  o.parallel.tp = 2, o.parallel.dp = 2, o.parallel.zero = 1;
  o.parallel.bucket_mb = 0.05;
  expect_consistent_trace(o, "tp 2 x dp 2, ZeRO-1, overlap");
}

TEST(TrainTrace, PipelineWithExperts) {
  TrainOptions o = testing::small_options(4);
  o.steps = 2;
  o.parallel.pp = 2, o.parallel.dp = 2, o.parallel.ep = 2;
  o.micro_batches = 2;
  expect_consistent_trace(o, "pp 2 x dp 2 x ep 2, 1f1b");
}

}  // namespace
}  // namespace shardlab::train
