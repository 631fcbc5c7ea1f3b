// ZeRO-3 (FSDP) memory, exactly, and its timeline. Figures computed here
// from the parameter table (not by Fsdp or DataParallel). On one pipeline
// stage the units are the head (ln_f), each block and the embeddings (wte
// and wpe, adjacent: one bucket); rank r owns chunk r of each,
// [n·r/dp, n·(r+1)/dp) (HSDP over groups of N: chunk r mod N of N). Per
// device, in fp32:
//   param      4 x (owned + gathered): gathered at most the embeddings (the
//              tied wte, kept from the embedding to the head) plus two
//              blocks with prefetch (this one and the next), one without;
//              every unit without resharding after forward
//   grad       4 x (owned + the largest unit, reduce-scattered in place)
//   optimizer  8 x owned (AdamW's two moments)
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "model/params.h"
#include "model/train/preflight.h"
#include "tests/model/train/train_test_util.h"

namespace shardlab::train {
namespace {

using testing::owned;
using testing::run;
using testing::small_options;

struct Units {
  int64_t head = 0, embeddings = 0, block = 0;
  std::vector<int64_t> all;  // bucket sizes, in any order
};

Units units_of(const model::ParamTable& table) {
  Units u;
  const int L = table.config().n_layer;
  std::vector<int64_t> blocks(size_t(L), 0);
  for (const auto& s : table.specs()) {
    if (s.name.rfind("transformer.h.", 0) == 0) {
      blocks[size_t(std::stoi(s.name.substr(14)))] += s.numel;
    } else if (s.name.rfind("transformer.ln_f.", 0) == 0) {
      u.head += s.numel;
    } else {
      u.embeddings += s.numel;  // wte, wpe
    }
  }
  u.block = *std::max_element(blocks.begin(), blocks.end());
  u.all = blocks;
  u.all.push_back(u.head);
  u.all.push_back(u.embeddings);
  return u;
}

uint64_t peak(const DeviceStats& d, MemKind k) { return d.peak_by_kind[int(k)]; }

// HSDP (--hsdp 2 at dp 4): the chunks are halves, over pairs of dp ranks.
class Zero3Memory : public ::testing::TestWithParam<int> {};

TEST_P(Zero3Memory, ShardsPlusTheUnitsInFlightExactly) {
  TrainOptions o = small_options(0);
  o.steps = 1;
  o.parallel.dp = 4;
  o.parallel.zero = 3;
  o.parallel.hsdp = GetParam();
  const int shards = GetParam() > 0 ? GetParam() : o.parallel.dp;
  const model::ParamTable table(o.model);
  const Units u = units_of(table);
  const int64_t n = table.numel();
  ASSERT_GT(u.block, u.embeddings) << "the closed forms below assume a block is the largest unit";
  struct Mode {
    const char* name;
    bool prefetch, reshard;
    int64_t gathered;
  };
  const Mode modes[] = {{"prefetch", true, true, u.embeddings + 2 * u.block},
                        {"no prefetch", false, true, u.embeddings + u.block},
                        {"no reshard after forward", true, false, n}};
  for (const Mode& m : modes) {
    o.parallel.prefetch = m.prefetch;
    o.parallel.reshard_after_forward = m.reshard;
    const TrainResult r = run(o);
    for (int rank = 0; rank < o.parallel.dp; ++rank) {
      const DeviceStats& d = r.run.devices[size_t(rank)];
      const int64_t own = owned(u.all, shards, rank % shards);
      std::printf("  %s rank %d: param %llu B (want 4 x (%lld owned + %lld gathered)), grad %llu B, optimizer %llu B\n",
                  m.name, rank, (unsigned long long)peak(d, MemKind::kParam), (long long)own, (long long)m.gathered,
                  (unsigned long long)peak(d, MemKind::kGrad), (unsigned long long)peak(d, MemKind::kOptimizer));
      EXPECT_EQ(peak(d, MemKind::kParam), uint64_t(own + m.gathered) * 4) << m.name << " rank " << rank;
      EXPECT_EQ(peak(d, MemKind::kGrad), uint64_t(own + u.block) * 4) << m.name << " rank " << rank;
      EXPECT_EQ(peak(d, MemKind::kOptimizer), uint64_t(own) * 8) << m.name << " rank " << rank;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(ShardGroups, Zero3Memory, ::testing::Values(0, 2),
                         [](const auto& info) { return info.param ? "hsdp2" : "fsdp"; });

// The preflight counts what the arena holds, for compositions too.
TEST(Zero3Preflight, MatchesTheArenaComposed) {
  struct Case {
    const char* name;
    int experts, dp, tp, pp, ep, micro;
    bool reshard;
    int hsdp = 0;
  };
  const Case cases[] = {{"dp 2 x tp 2", 0, 2, 2, 1, 1, 1, true},
                        {"dp 2 x pp 2", 0, 2, 1, 2, 1, 2, true},
                        {"dp 2 x pp 2, no reshard", 0, 2, 1, 2, 1, 2, false},
                        {"MoE dp 4 x ep 2", 4, 4, 1, 1, 2, 1, true},
                        {"dp 4 (hsdp 2) x tp 2", 0, 4, 2, 1, 1, 1, true, 2}};
  for (const Case& c : cases) {
    TrainOptions o = small_options(c.experts);
    o.steps = 1;
    o.parallel.zero = 3;
    o.parallel.dp = c.dp, o.parallel.tp = c.tp, o.parallel.pp = c.pp, o.parallel.ep = c.ep;
    o.parallel.reshard_after_forward = c.reshard;
    o.parallel.hsdp = c.hsdp;
    o.micro_batches = c.micro;
    const TrainResult r = run(o);
    const MemoryEstimate e = estimate_memory(o, ParallelPlan(o), 4);
    ASSERT_EQ(e.devices.size(), r.run.devices.size()) << c.name;
    for (size_t rank = 0; rank < e.devices.size(); ++rank) {
      const DeviceStats& d = r.run.devices[rank];
      EXPECT_EQ(e.devices[rank].params_bytes, peak(d, MemKind::kParam)) << c.name << " rank " << rank;
      EXPECT_EQ(e.devices[rank].grads_bytes, peak(d, MemKind::kGrad)) << c.name << " rank " << rank;
      EXPECT_EQ(e.devices[rank].optimizer_bytes, peak(d, MemKind::kOptimizer)) << c.name << " rank " << rank;
    }
    std::printf("%s: device 0 param %llu B, grad %llu B, optimizer %llu B (preflight agrees)\n", c.name,
                (unsigned long long)peak(r.run.devices[0], MemKind::kParam),
                (unsigned long long)peak(r.run.devices[0], MemKind::kGrad),
                (unsigned long long)peak(r.run.devices[0], MemKind::kOptimizer));
  }
}

// Forward has no gradient traffic, so every transfer on the communication
// stream before the first backward kernel is a unit's all-gather: with
// prefetch some run while a forward kernel computes, and the step is faster
// than without, whose gathers the compute stream waits for (exposed).
TEST(Zero3Timeline, PrefetchOverlapsGathersWithForwardCompute) {
  TrainOptions o = small_options(0);
  o.steps = 1;
  o.parallel.dp = 2;
  o.parallel.zero = 3;
  Time step[2] = {0, 0}, exposed[2] = {0, 0};
  for (const bool prefetch : {true, false}) {
    o.parallel.prefetch = prefetch;
    const TrainResult r = run(o, nullptr, /*trace=*/true);
    const auto& events = r.run.traces[0].events;
    Time first_backward = 0;
    for (const TraceEvent& e : events)
      if (e.stream == StreamKind::kCompute && std::string(e.name).find("bwd") != std::string::npos) {
        first_backward = e.start;
        break;
      }
    ASSERT_GT(first_backward, 0);
    int gathers = 0, overlapped = 0;
    for (const TraceEvent& e : events) {
      if (e.stream != StreamKind::kComm || e.start >= first_backward || e.peer < 0) continue;
      ++gathers;
      for (const TraceEvent& c : events)
        if (c.stream == StreamKind::kCompute && c.start < e.end && e.start < c.end && std::string(c.name).find("fwd") != std::string::npos) {
          ++overlapped;
          break;
        }
    }
    step[prefetch] = r.steps.back().virtual_end;
    exposed[prefetch] = r.fsdp[0].exposed;
    std::printf("prefetch %d: %d forward transfers on the comm stream, %d under a forward kernel; step %.3f us, "
                "gathers exposed %.3f us\n",
                int(prefetch), gathers, overlapped, to_us(step[prefetch]), to_us(exposed[prefetch]));
    EXPECT_GT(gathers, 0);
    if (prefetch) {
      EXPECT_GT(overlapped, 0);
    }
    EXPECT_EQ(r.fsdp[0].gathers, 12) << "6 units, each gathered for forward and backward";
  }
  EXPECT_LT(step[1], step[0]);
  EXPECT_LT(exposed[1], exposed[0]);
}


// FSDP reduces every backward (PyTorch FSDP without no_sync, DeepSpeed
// ZeRO-3, Megatron-FSDP's optim_grads_params: megatron_fsdp.py
// `grad_reduce_every_bprop`), not only the step's last: with M micro-batches
// each of the 6 units is reduce-scattered M times a step, and after each
// reduce-scatter but the only one of a one-micro-batch step an accumulation
// kernel on the communication stream adds the chunk into the sharded
// gradient (fp32: read both, write one, 12 bytes per owned element). Counts
// from the parameter table; the kernel starts where a message of its
// reduce-scatter ends (the stream runs them back to back).
TEST(Zero3Reduction, EveryMicroBatchReduceScattersEachUnit) {
  TrainOptions o = small_options(0);
  o.steps = 1;
  o.parallel.dp = 2;
  o.parallel.zero = 3;
  const Units u = units_of(model::ParamTable(o.model));
  const auto units = int64_t(u.all.size());
  ASSERT_EQ(units, 6);
  for (const int M : {1, 2, 4}) {
    o.micro_batches = M;
    const TrainResult r = run(o, nullptr, /*trace=*/true);
    for (int rank = 0; rank < 2; ++rank) {
      EXPECT_EQ(r.fsdp[size_t(rank)].reduce_scatters, units * M) << "M " << M << " rank " << rank;
      const auto& events = r.run.traces[size_t(rank)].events;
      int acc = 0;
      double acc_bytes = 0;
      for (const TraceEvent& e : events) {
        if (std::string(e.name) != "fsdp.grad_acc") continue;
        EXPECT_EQ(e.stream, StreamKind::kComm);
        ++acc;
        acc_bytes += double(e.bytes);
        bool after_message = false;
        for (const TraceEvent& m : events)
          after_message = after_message || (m.stream == StreamKind::kComm && m.peer >= 0 && m.end == e.start);
        EXPECT_TRUE(after_message) << "an accumulation not right after a reduce-scatter message";
      }
      EXPECT_EQ(acc, M == 1 ? 0 : units * M) << "M " << M;
      EXPECT_EQ(acc_bytes, M == 1 ? 0.0 : double(M) * 12 * double(owned(u.all, 2, rank))) << "M " << M;
    }
    std::printf("M %d: %lld reduce-scatters per device, step %.3f us\n", M,
                static_cast<long long>(r.fsdp[0].reduce_scatters), to_us(r.steps.back().virtual_end));
  }
}

}  // namespace
}  // namespace shardlab::train
