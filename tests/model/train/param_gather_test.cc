// --overlap-param-gather (parallel/data/param_gather.h): ZeRO 1/2's
// parameter all-gathers moved from the end of the optimizer step to the
// next forward. The numbers cannot change (the same data moves, only later),
// and the time follows from the order of the gathers, derived below.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "tests/model/train/train_test_util.h"

namespace shardlab::train {
namespace {

using testing::run;
using testing::small_options;

// The collectives on the communication stream, each from its launch to its
// last transfer's end (a trace shows "coll.launch", then the sends and receives).
std::vector<TraceEvent> comm_collectives(const std::vector<TraceEvent>& events) {
  std::vector<TraceEvent> out;
  for (const TraceEvent& e : events) {
    if (e.stream != StreamKind::kComm) continue;
    if (!std::strcmp(e.name, "coll.launch")) out.push_back(e);
    else if (!out.empty()) out.back().end = std::max(out.back().end, e.end);
  }
  return out;
}
bool is_forward(const TraceEvent& e) {
  return e.stream == StreamKind::kCompute && std::strstr(e.name, "fwd") != nullptr;
}
bool is_backward(const TraceEvent& e) {
  return e.stream == StreamKind::kCompute && std::strstr(e.name, "bwd") != nullptr;
}

// Losses and the final parameters: bit for bit (tolerance 0) with and
// without the overlap, every data-parallel replica equal (the trainer's
// check), on compositions with tensor, pipeline (interleaved too) and expert
// parallelism and both ZeRO stages. (Each runs the sharded model either way:
// the overlap needs its hook points; pure data parallelism is verify's, in
// cli_verify_test.)
TEST(OverlapParamGather, MatchesTheGatherAfterTheStepBitForBit) {
  struct Case {
    const char* name;
    int experts, dp, tp, pp, vpp, ep, zero, micro;
  };
  const Case cases[] = {{"dp 2 x tp 2, ZeRO-1", 0, 2, 2, 1, 0, 1, 1, 1},
                        {"dp 4 x tp 2, ZeRO-2", 0, 4, 2, 1, 0, 1, 2, 1},
                        {"dp 2 x pp 2, ZeRO-1", 0, 2, 1, 2, 0, 1, 1, 2},
                        {"dp 2 x pp 2 interleaved (2 chunks), ZeRO-2", 0, 2, 1, 2, 2, 1, 2, 2},
                        {"MoE dp 2 x ep 2, ZeRO-2", 4, 2, 1, 1, 0, 2, 2, 1}};
  for (const Case& c : cases) {
    TrainOptions o = small_options(c.experts);
    o.parallel.dp = c.dp, o.parallel.tp = c.tp, o.parallel.pp = c.pp, o.parallel.ep = c.ep;
    o.parallel.zero = c.zero;
    o.parallel.bucket_mb = 0.02;  // several buckets (20 KB of fp32 gradients each)
    if (c.vpp > 1) {
      o.parallel.vpp = c.vpp;
      o.parallel.schedule = parallel::ScheduleKind::kInterleaved;
    }
    o.micro_batches = c.micro;
    const TrainResult sync = run(o);
    o.parallel.overlap_param_gather = true;
    const TrainResult overlapped = run(o);
    ASSERT_EQ(sync.steps.size(), overlapped.steps.size()) << c.name;
    double loss_diff = 0;
    float param_diff = 0;
    for (size_t s = 0; s < sync.steps.size(); ++s)
      loss_diff = std::max(loss_diff, std::abs(sync.steps[s].loss - overlapped.steps[s].loss));
    ASSERT_EQ(sync.final_params.size(), overlapped.final_params.size()) << c.name;
    for (size_t i = 0; i < sync.final_params.size(); ++i)
      param_diff = std::max(param_diff, std::abs(sync.final_params[i] - overlapped.final_params[i]));
    std::printf("%s: max |loss diff| %g, max |param diff| %g over %zu parameters (tolerance 0); replicas %s\n",
                c.name, loss_diff, param_diff, sync.final_params.size(),
                overlapped.replica_mismatch.empty() ? "equal" : overlapped.replica_mismatch.c_str());
    EXPECT_TRUE(overlapped.replica_mismatch.empty()) << c.name << ": " << overlapped.replica_mismatch;
    EXPECT_EQ(loss_diff, 0.0) << c.name;
    EXPECT_EQ(param_diff, 0.0f) << c.name;
  }
}

// One bucket: the step's first point needs it, so its gather is launched at
// the step's start and waited for at once; nothing else is in flight then
// (the gradients' all-reduce comes after backward), so it takes what it took
// after the optimizer step. Each step only moves it from its end to its
// start: every step ends at the same virtual time, exactly.
TEST(OverlapParamGather, OneBucketIsExposedWhole) {
  TrainOptions o = small_options(0);
  o.parallel.dp = 2;
  o.parallel.zero = 1;
  o.parallel.bucket_mb = 1e3;  // every gradient in one bucket
  o.phantom = true;            // the sharded model both ways (the overlap's hook points are its)
  const TrainResult sync = run(o, nullptr, /*trace=*/true);
  o.parallel.overlap_param_gather = true;
  const TrainResult overlapped = run(o, nullptr, /*trace=*/true);
  for (size_t s = 0; s < sync.steps.size(); ++s) {
    std::printf("step %zu ends at %.6f us (gathered after the step) and %.6f us (in the next forward)\n", s,
                to_us(sync.steps[s].virtual_end), to_us(overlapped.steps[s].virtual_end));
    EXPECT_EQ(sync.steps[s].virtual_end, overlapped.steps[s].virtual_end) << "step " << s;
  }
  // The gathers: the first event of each step, before its first forward kernel.
  const auto& events = overlapped.run.traces[0].events;
  const auto first_forward = std::find_if(events.begin(), events.end(), is_forward);
  ASSERT_NE(first_forward, events.end());
  const std::vector<TraceEvent> comm = comm_collectives(events);
  ASSERT_FALSE(comm.empty());
  std::printf("the first gather: %.3f to %.3f us, the first forward kernel at %.3f us\n", to_us(comm[0].start),
              to_us(comm[0].end), to_us(first_forward->start));
  EXPECT_LE(comm[0].end, first_forward->start);
}

// Several buckets, one chunk: a point waits for its bucket and launches the
// next (Megatron's finish_param_sync), so in every step (1) each bucket is
// gathered once, all launched before the step's first backward kernel, (2) a gather
// starts only once the one before it has ended (the compute stream launches
// it right after waiting for that one), (3) some gather moves while a forward
// kernel computes, and (4) the step is shorter than with the gathers after it.
TEST(OverlapParamGather, EachBucketGathersUnderTheForwardBeforeIt) {
  TrainOptions o = small_options(0);
  o.parallel.dp = 2;
  o.parallel.zero = 2;
  o.parallel.bucket_mb = 0.02;
  o.steps = 2;
  o.phantom = true;
  const TrainResult sync = run(o, nullptr, /*trace=*/true);
  o.parallel.overlap_param_gather = true;
  const TrainResult r = run(o, nullptr, /*trace=*/true);
  // Rank 0's buckets: the unsharded model's in 20 KB of fp32, ZeRO-padded.
  const size_t buckets = testing::bucket_sizes(model::ParamTable(o.model), 0.02e6).size();
  const auto& events = r.run.traces[0].events;
  const std::vector<TraceEvent> comm = comm_collectives(events);
  Time step_start = 0;
  for (size_t s = 0; s < r.steps.size(); ++s) {
    const Time step_end = r.steps[s].virtual_end;
    Time first_backward = step_end;
    for (const TraceEvent& e : events)
      if (is_backward(e) && e.start >= step_start && e.start < first_backward) first_backward = e.start;
    std::vector<const TraceEvent*> gathers;  // forward has no other traffic on this stream
    for (const TraceEvent& e : comm)
      if (e.start >= step_start && e.start < first_backward) gathers.push_back(&e);
    int under_forward = 0;
    for (size_t k = 0; k < gathers.size(); ++k) {
      if (k > 0) {
        EXPECT_GE(gathers[k]->start, gathers[k - 1]->end) << "step " << s << " gather " << k;
      }
      for (const TraceEvent& c : events)
        if (is_forward(c) && c.start < gathers[k]->end && gathers[k]->start < c.end) {
          ++under_forward;
          break;
        }
    }
    std::printf("step %zu: %zu gathers, %d under a forward kernel; ends at %.3f us (%.3f us with the gathers "
                "after the step)\n",
                s, gathers.size(), under_forward, to_us(step_end), to_us(sync.steps[s].virtual_end));
    EXPECT_EQ(gathers.size(), buckets) << "step " << s << ": each bucket gathered once, before backward";
    EXPECT_GT(under_forward, 0) << "step " << s;
    EXPECT_LT(step_end - step_start, sync.steps[s].virtual_end - (s ? sync.steps[s - 1].virtual_end : 0))
        << "step " << s;
    step_start = step_end;
  }
  ASSERT_EQ(r.param_gather.size(), 2u);
  EXPECT_EQ(r.param_gather[0].gathers, int64_t(buckets * r.steps.size())) << "the report's count";
  EXPECT_GT(r.param_gather[0].exposed, 0) << "the first bucket of each step is exposed whole";
}

// The interleaved schedule (Megatron's align_param_gather): every stage
// launches its first two chunks' gathers as the step starts, before the
// schedule's first receive (schedules.py, "Synchronize params for first two
// model chunks"), so the last stage gathers while it waits for its first
// input: on every device of pp 2 x vpp 2 x dp 2, ZeRO-2, the step's first
// collective on the communication stream is launched at the step's start,
// virtual time 0 (nothing precedes it on that stream), before its first
// pipeline receive ends (stage 0 receives nothing first: before its first
// forward kernel). With the gathers launched at each stage's first forward
// instead, the last stage's came as that receive ended, stage 0's after
// zero_grad.
TEST(OverlapParamGather, InterleavedStagesGatherBeforeTheirFirstInput) {
  TrainOptions o = small_options(0);
  o.parallel.dp = 2, o.parallel.pp = 2, o.parallel.vpp = 2, o.parallel.zero = 2;
  o.parallel.schedule = parallel::ScheduleKind::kInterleaved;
  o.parallel.bucket_mb = 0.02;
  o.parallel.overlap_param_gather = true;
  o.micro_batches = 2;
  o.steps = 1;
  o.phantom = true;
  const TrainResult r = run(o, nullptr, /*trace=*/true);
  int waited = 0;  // devices whose first forward waits for a receive
  for (size_t d = 0; d < r.run.traces.size(); ++d) {
    const auto& events = r.run.traces[d].events;
    const std::vector<TraceEvent> comm = comm_collectives(events);
    ASSERT_FALSE(comm.empty()) << "device " << d;
    const auto first_forward = std::find_if(events.begin(), events.end(), is_forward);
    ASSERT_NE(first_forward, events.end()) << "device " << d;
    Time bound = first_forward->start;
    for (const TraceEvent& e : events)
      if (e.stream == StreamKind::kPipeline && !std::strcmp(e.name, "recv") && e.end <= first_forward->start) {
        bound = std::min(bound, e.end);
        ++waited;
        break;
      }
    std::printf("device %zu: first gather launched at %.3f us, first input or forward at %.3f us\n", d,
                to_us(comm[0].start), to_us(bound));
    EXPECT_EQ(comm[0].start, 0) << "device " << d;
    EXPECT_LT(comm[0].start, bound) << "device " << d;
  }
  EXPECT_GT(waited, 0) << "no stage waited for its first input";
}

// Folded data-parallel replicas (phantom) report what each would have run:
// every device's step times and gather record equal the unfolded run's.
TEST(OverlapParamGather, FoldedEqualsUnfolded) {
  TrainOptions o = small_options(0);
  o.parallel.dp = 4;
  o.parallel.tp = 2;
  o.parallel.zero = 2;
  o.parallel.bucket_mb = 0.02;
  o.parallel.overlap_param_gather = true;
  o.steps = 2;
  o.phantom = true;
  const TrainResult folded = run(o);
  o.fold = false;
  const TrainResult unfolded = run(o);
  std::printf("folded: %d of %d devices ran (%s)\n", folded.running_devices, o.parallel.world(), folded.folded.c_str());
  EXPECT_LT(folded.running_devices, unfolded.running_devices);
  ASSERT_EQ(folded.steps.size(), unfolded.steps.size());
  for (size_t s = 0; s < folded.steps.size(); ++s) EXPECT_EQ(folded.steps[s].virtual_end, unfolded.steps[s].virtual_end);
  ASSERT_EQ(folded.param_gather.size(), unfolded.param_gather.size());
  for (size_t d = 0; d < folded.param_gather.size(); ++d) {
    EXPECT_EQ(folded.param_gather[d].exposed, unfolded.param_gather[d].exposed) << "device " << d;
    EXPECT_EQ(folded.param_gather[d].gathers, unfolded.param_gather[d].gathers) << "device " << d;
    EXPECT_EQ(folded.param_gather[d].gathered_bytes, unfolded.param_gather[d].gathered_bytes) << "device " << d;
    EXPECT_GT(folded.param_gather[d].gathers, 0) << "device " << d;
  }
}

}  // namespace
}  // namespace shardlab::train
