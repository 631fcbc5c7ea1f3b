// ZeRO-2 reduces every micro-batch (DeepSpeed's stage 2,
// deepspeed/runtime/zero/stage_1_and_2.py, reduce_ready_partitions_and_remove_grads),
// not once per step: its traffic by hand count, its overlap with the next
// micro-batch's forward, its memory (unchanged) and its numbers against the
// unsharded model. Figures computed here from the parameter table (the
// buckets by hand: train_test_util.h, bucket_sizes and padded).
#include <algorithm>
#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "model/params.h"
#include "model/train/verify.h"
#include "tests/model/train/train_test_util.h"

namespace shardlab::train {
namespace {

using namespace testing;  // train_test_util.h

// Modeled bytes this rank sent (the "send" events of its trace).
uint64_t sent_bytes(const TrainResult& r, size_t rank) {
  uint64_t bytes = 0;
  for (const TraceEvent& e : r.run.traces[rank].events)
    if (std::string(e.name) == "send") bytes += e.bytes;
  return bytes;
}

TrainOptions zero2(int M) {
  TrainOptions o = small_options(0);
  o.steps = 1;
  o.micro_batches = M;
  o.parallel.dp = 2;
  o.parallel.zero = 2;
  o.parallel.bucket_mb = 0.15;  // 150 kB: a handful of buckets
  return o;
}

// With M micro-batches every bucket is reduce-scattered M times a step. At
// dp 2 a ring reduce-scatter of a padded bucket of n elements sends one
// message of n/2 fp32 elements (4 B); nothing else in the step depends on M
// (the parameters' all-gathers, the loss and norm all-reduces happen once),
// so the step sends (M - 1) x sum(n/2 x 4) bytes more than with one
// micro-batch. After every reduce-scatter but the only one of a bucket in a
// one-micro-batch step, an accumulation kernel on the communication stream
// adds the owned chunk into the fp32 gradient (read both, write one: 12 B
// per owned element of the padded chunk).
TEST(Zero2Reduction, EveryMicroBatchReduceScattersEachBucket) {
  const model::ParamTable table(zero2(1).model);
  const std::vector<int64_t> pad = padded(bucket_sizes(table, 0.15e6), 2);
  const auto buckets = int64_t(pad.size());
  ASSERT_GE(buckets, 3);
  const int64_t total = std::accumulate(pad.begin(), pad.end(), int64_t{0});
  std::vector<uint64_t> sent_m1(2, 0);
  for (const int M : {1, 2, 4}) {
    const TrainResult r = run(zero2(M), nullptr, /*trace=*/true);
    for (size_t rank = 0; rank < 2; ++rank) {
      EXPECT_EQ(r.grad_reduce_scatters[rank], buckets * M) << "M " << M << " rank " << rank;
      const uint64_t sent = sent_bytes(r, rank);
      if (M == 1) sent_m1[rank] = sent;
      const uint64_t extra = uint64_t(M - 1) * uint64_t(total / 2) * 4;
      EXPECT_EQ(sent - sent_m1[rank], extra) << "M " << M << " rank " << rank;
      int acc = 0;
      double acc_bytes = 0;
      for (const TraceEvent& e : r.run.traces[rank].events) {
        if (std::string(e.name) != "zero2.grad_acc") continue;
        EXPECT_EQ(e.stream, StreamKind::kComm);
        ++acc;
        acc_bytes += double(e.bytes);
      }
      EXPECT_EQ(acc, M == 1 ? 0 : buckets * M) << "M " << M;
      EXPECT_EQ(acc_bytes, M == 1 ? 0.0 : double(M) * 12 * double(owned(pad, 2, int(rank)))) << "M " << M;
      std::printf("M %d rank %zu: %lld reduce-scatters (want %lld x %d), sent %llu B (M=1 + %llu), "
                  "%d accumulations, step %.3f us\n",
                  M, rank, static_cast<long long>(r.grad_reduce_scatters[rank]), static_cast<long long>(buckets), M,
                  static_cast<unsigned long long>(sent), static_cast<unsigned long long>(extra), acc,
                  to_us(r.steps.back().virtual_end));
    }
  }
}

// Stage 1 and Megatron's distributed optimizer keep one reduction per step,
// at the last micro-batch; so does ZeRO-2 without overlap (nothing is
// launched before backward ends). With one micro-batch the distributed
// optimizer and ZeRO-2 run the same collectives at the same points: the
// same step time to the picosecond.
TEST(Zero2Reduction, StageOneAndNoOverlapReduceOncePerStep) {
  const model::ParamTable table(zero2(1).model);
  const auto buckets = int64_t(bucket_sizes(table, 0.15e6).size());
  TrainOptions o = zero2(4);
  o.parallel.zero = 1;
  o.parallel.distributed_optimizer = true;
  EXPECT_EQ(run(o).grad_reduce_scatters[0], buckets) << "distributed optimizer";
  o.micro_batches = 1;
  EXPECT_EQ(run(o).run.makespan(), run(zero2(1)).run.makespan()) << "distributed optimizer vs ZeRO-2, M = 1";
  o = zero2(4);
  o.parallel.overlap = false;
  EXPECT_EQ(run(o).grad_reduce_scatters[0], buckets) << "ZeRO-2 without overlap";
}

// Overlap: the first micro-batch's buckets are reduce-scattered as its
// backward finishes them, so a reduce-scatter message starts inside that
// backward, and the last one (the embeddings', finished at its end) is
// still on the wire while the second micro-batch's forward computes.
TEST(Zero2Timeline, ReduceScatterOverlapsTheNextForward) {
  const TrainResult r = run(zero2(2), nullptr, /*trace=*/true);
  for (size_t rank = 0; rank < 2; ++rank) {
    const auto& spans = r.first_step_spans[rank];
    auto span = [&](parallel::ActionKind k, int mb) {
      for (const auto& s : spans)
        if (s.kind == k && s.micro_batch == mb) return s;
      ADD_FAILURE() << "no span for micro-batch " << mb;
      return parallel::ComputeSpan{};
    };
    const parallel::ComputeSpan b0 = span(parallel::ActionKind::kBackward, 0);
    const parallel::ComputeSpan f1 = span(parallel::ActionKind::kForward, 1);
    ASSERT_LE(b0.end, f1.start);
    Time first = -1;
    bool during_f1 = false;
    for (const TraceEvent& e : r.run.traces[rank].events) {
      if (std::string(e.name) != "send" || e.start < b0.start) continue;
      if (first < 0 || e.start < first) first = e.start;
      during_f1 = during_f1 || (e.start < f1.end && e.end > f1.start);
    }
    std::printf("rank %zu: backward 0 [%.3f, %.3f] us, forward 1 [%.3f, %.3f] us, first gradient send at %.3f us, "
                "a send during forward 1: %s\n",
                rank, to_us(b0.start), to_us(b0.end), to_us(f1.start), to_us(f1.end), to_us(first),
                during_f1 ? "yes" : "no");
    EXPECT_GE(first, b0.start);
    EXPECT_LT(first, b0.end) << "a reduce-scatter starts inside the first micro-batch's backward";
    EXPECT_TRUE(during_f1) << "a reduce-scatter of micro-batch 0 overlaps micro-batch 1's forward";
  }
}

// Memory is what today's ZeRO-2 holds, whatever M: the owned chunks of the
// padded buckets plus the largest padded bucket (zero_memory_test.cc), and
// AdamW's two moments of the owned chunks.
TEST(Zero2Memory, GradientPeakIndependentOfMicroBatches) {
  const model::ParamTable table(zero2(1).model);
  const std::vector<int64_t> pad = padded(bucket_sizes(table, 0.15e6), 2);
  const int64_t total = std::accumulate(pad.begin(), pad.end(), int64_t{0});
  const int64_t largest = *std::max_element(pad.begin(), pad.end());
  for (const int M : {1, 4}) {
    const TrainResult r = run(zero2(M));
    for (int rank = 0; rank < 2; ++rank) {
      const DeviceStats& d = r.run.devices[size_t(rank)];
      const int64_t own = owned(pad, 2, rank), held = std::min(total, own + largest);
      EXPECT_EQ(d.peak_by_kind[int(MemKind::kGrad)], uint64_t(held) * 4) << "M " << M << " rank " << rank;
      EXPECT_EQ(d.peak_by_kind[int(MemKind::kOptimizer)], uint64_t(own) * 8) << "M " << M << " rank " << rank;
    }
  }
}

// Numbers: the sum of M reduced micro-batch gradients differs from the
// reduction of their sum in rounding only. Each run matches the unsharded
// model with the same micro-batches within verify's tolerance (1e-5
// relative: loss per step, parameters' and step-0 gradients' L2): pure data
// parallelism (the unsharded model per replica), tp 2 with sequence
// parallelism (the LayerNorm row sums staged until final), and pp 2 (the
// tied wte's bucket reduced once, after its two copies are summed).
TEST(Zero2Verify, MatchesTheUnshardedModel) {
  struct Case {
    const char* what;
    int tp, pp;
    bool sp;
  };
  for (const Case c : {Case{"dp 2", 1, 1, false}, Case{"dp 2 x tp 2, SP", 2, 1, true}, Case{"dp 2 x pp 2", 1, 2, false}}) {
    TrainOptions o = zero2(4);
    o.steps = 3;
    o.keep_step0_grads = true;
    o.parallel.tp = c.tp;
    o.parallel.pp = c.pp;
    o.parallel.sp = c.sp;
    validate_parallel(o);
    const TrainResult sharded = run(o), reference = run(unsharded(o));
    const VerifyResult v = compare_runs(sharded, reference, model::ParamTable(o.model), {.grads = true});
    std::printf("%s, ZeRO-2, 4 micro-batches: loss rel diff %.2e, param rel L2 %.2e (max abs %.2e), grad rel L2 "
                "%.2e (tolerance 1e-5); %lld reduce-scatters on device 0\n",
                c.what, v.max_loss_rel_diff, v.param_rel_l2, v.max_param_abs_diff, v.grad_rel_l2,
                static_cast<long long>(sharded.grad_reduce_scatters[0]));
    EXPECT_TRUE(v.passed) << c.what;
    EXPECT_GT(sharded.grad_reduce_scatters[0], 0) << c.what;
  }
}

}  // namespace
}  // namespace shardlab::train
