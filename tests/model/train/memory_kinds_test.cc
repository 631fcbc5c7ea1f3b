// Memory by kind, as Megatron-LM holds it, for fp32 and bf16 x ZeRO 0/1/2.
// Bytes per parameter (n local parameters; owned: what ZeRO leaves a rank,
// chunk r of every bucket; held: n, or with ZeRO-2 the owned chunks plus the
// largest bucket):
//   kind        fp32        bf16
//   param       4 x n       2 x n           the weights at the device precision
//   grad        4 x held    4 x held        fp32 main gradients
//   master      0           4 x owned       fp32 master weights
//   optimizer   8 x owned   8 x owned       AdamW's two fp32 moments
// Checked three ways: the arena's peaks equal these figures computed here
// from the bucket layout (planned by hand from the parameter table), the
// memory preflight (estimate_memory) gives the same bytes for every device,
// sharded configs included, and the table of bytes per parameter at dp 4
// follows (the README's table).
#include <gtest/gtest.h>

#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

#include "model/params.h"
#include "model/train/preflight.h"
#include "tests/model/train/train_test_util.h"

namespace shardlab::train {
namespace {

using testing::bucket_sizes;
using testing::owned;
using testing::padded;
using testing::small_options;

struct Kinds {
  uint64_t param = 0, grad = 0, master = 0, optimizer = 0;
};

Kinds arena(const DeviceStats& d) {
  return {d.peak_by_kind[int(MemKind::kParam)], d.peak_by_kind[int(MemKind::kGrad)],
          d.peak_by_kind[int(MemKind::kMaster)], d.peak_by_kind[int(MemKind::kOptimizer)]};
}

// Bytes a rank sent on the communication stream (traced runs).
uint64_t wire(const TrainResult& r, size_t rank) {
  uint64_t bytes = 0;
  for (const TraceEvent& e : r.run.traces[rank].events)
    if (e.stream == StreamKind::kComm && e.peer >= 0) bytes += e.bytes;
  return bytes;
}

const char* name(Precision p) { return p == Precision::kBf16 ? "bf16" : "fp32"; }

// Every device's preflight figures equal its arena peaks, kind by kind.
void expect_preflight_matches(const TrainOptions& o, Precision p, const TrainResult& r,
                              const char* what) {
  const MemoryEstimate e = estimate_memory(o, ParallelPlan(o), element_size(p));
  ASSERT_EQ(e.devices.size(), r.run.devices.size()) << what;
  for (size_t rank = 0; rank < e.devices.size(); ++rank) {
    const DeviceMemory& m = e.devices[rank];
    const Kinds k = arena(r.run.devices[rank]);
    EXPECT_EQ(m.params_bytes, k.param)
        << what << " " << name(p) << " ZeRO-" << o.parallel.zero << " rank " << rank;
    EXPECT_EQ(m.grads_bytes, k.grad)
        << what << " " << name(p) << " ZeRO-" << o.parallel.zero << " rank " << rank;
    EXPECT_EQ(m.master_bytes, k.master)
        << what << " " << name(p) << " ZeRO-" << o.parallel.zero << " rank " << rank;
    EXPECT_EQ(m.optimizer_bytes, k.optimizer)
        << what << " " << name(p) << " ZeRO-" << o.parallel.zero << " rank " << rank;
  }
}

// Bytes per parameter by kind at dp, owned = n/dp: {param, grad, master,
// optimizer}; `pad`: ZeRO-1/2's padded buffer over the parameters (1 without
// padding), which scales every kind.
std::vector<double> per_param(Precision p, int zero, int dp, double bucket_share, double pad = 1.0) {
  const bool bf16 = p == Precision::kBf16;
  const double shard = zero >= 1 ? 1.0 / dp : 1.0;
  return {pad * (bf16 ? 2.0 : 4.0), zero >= 2 ? pad * 4.0 / dp + 4 * bucket_share : pad * 4.0,
          pad * (bf16 ? 4 * shard : 0.0), pad * 8 * shard};
}

TEST(MemoryKinds, ArenaPreflightAndDefinitionAgree) {
  TrainOptions o = small_options(0);
  o.steps = 1;
  o.parallel.dp = 4;
  o.parallel.bucket_mb = 0.15;
  const model::ParamTable table(o.model);
  const int64_t n = table.numel();
  const std::vector<int64_t> buckets = bucket_sizes(table, o.parallel.bucket_mb * 1e6);
  const int64_t largest = *std::max_element(buckets.begin(), buckets.end());
  std::printf("bytes per parameter at dp 4 (%lld parameters, largest bucket %lld):\n", (long long)n,
              (long long)largest);
  std::printf("  precision ZeRO   param    grad  master    adam   total\n");
  for (Precision p : {Precision::kFp32, Precision::kBf16}) {
    for (int zero : {0, 1, 2}) {
      o.parallel.zero = zero;
      const TrainResult r = testing::run(o, nullptr, false, p);
      for (int rank = 0; rank < o.parallel.dp; ++rank) {
        // ZeRO-1/2: the buffers hold the padded buckets (multiples of 128 at dp 4).
        const std::vector<int64_t> pad = zero == 0 ? buckets : padded(buckets, o.parallel.dp);
        const int64_t total = std::accumulate(pad.begin(), pad.end(), int64_t{0});
        const int64_t own = zero == 0 ? n : owned(pad, o.parallel.dp, rank);
        const int64_t held = zero == 2 ? std::min(total, own + *std::max_element(pad.begin(), pad.end())) : total;
        const Kinds k = arena(r.run.devices[size_t(rank)]);
        const bool bf16 = p == Precision::kBf16;
        EXPECT_EQ(k.param, uint64_t(total) * (bf16 ? 2 : 4))
            << name(p) << " ZeRO-" << zero << " rank " << rank;
        EXPECT_EQ(k.grad, uint64_t(held) * 4) << name(p) << " ZeRO-" << zero << " rank " << rank;
        EXPECT_EQ(k.master, bf16 ? uint64_t(own) * 4 : 0)
            << name(p) << " ZeRO-" << zero << " rank " << rank;
        EXPECT_EQ(k.optimizer, uint64_t(own) * 8)
            << name(p) << " ZeRO-" << zero << " rank " << rank;
      }
      expect_preflight_matches(o, p, r, "dp 4");
      // Rank 0's bytes per parameter against the table, scaled by the
      // padding (ZeRO-1/2 at dp 4: 128 elements over 206,208, +0.0025 B for
      // fp32 gradients); without ZeRO the chunks are whole: 1e-3 B/param
      // is ample.
      const Kinds k = arena(r.run.devices[0]);
      const std::vector<double> got = {double(k.param) / n, double(k.grad) / n,
                                       double(k.master) / n, double(k.optimizer) / n};
      const std::vector<int64_t> pad = zero == 0 ? buckets : padded(buckets, o.parallel.dp);
      const double total = double(std::accumulate(pad.begin(), pad.end(), int64_t{0}));
      const double largest_pad = double(*std::max_element(pad.begin(), pad.end()));
      const std::vector<double> want = per_param(p, zero, o.parallel.dp, largest_pad / n, total / n);
      std::printf("  %-9s %4d %7.3f %7.3f %7.3f %7.3f %7.3f\n", name(p), zero, got[0], got[1],
                  got[2], got[3], got[0] + got[1] + got[2] + got[3]);
      for (size_t i = 0; i < want.size(); ++i)
        EXPECT_NEAR(got[i], want[i], 1e-3) << name(p) << " ZeRO-" << zero;
    }
  }
  // Without ZeRO: 16 bytes per parameter in fp32, 18 in bf16 (Megatron's 2 + 4 + 4 + 8).
  EXPECT_EQ(per_param(Precision::kBf16, 0, 8, 0), (std::vector<double>{2, 4, 4, 8}));
}

TEST(MemoryKinds, PreflightEqualsTheArenaForShardedRuns) {
  struct Case {
    const char* what;
    int tp, pp, dp, ep, experts;
  };
  for (const Case& c : {Case{"tp 2 x dp 2", 2, 1, 2, 1, 0}, Case{"pp 2 x dp 2", 1, 2, 2, 1, 0},
                        Case{"MoE dp 4 x ep 2", 1, 1, 4, 2, 4}}) {
    TrainOptions o = small_options(c.experts);
    o.steps = 1;
    o.parallel.tp = c.tp, o.parallel.pp = c.pp, o.parallel.dp = c.dp, o.parallel.ep = c.ep;
    o.parallel.bucket_mb = 0.05;
    if (c.pp > 1) o.micro_batches = 2;
    for (Precision p : {Precision::kFp32, Precision::kBf16}) {
      for (int zero : {0, 1, 2}) {
        o.parallel.zero = zero;
        validate_parallel(o);
        expect_preflight_matches(o, p, testing::run(o, nullptr, false, p), c.what);
      }
    }
  }
}

// Data parallelism reduces fp32 main gradients in bf16 too: with ZeRO 0 the
// communication stream carries only the gradient buckets, so a bf16 and an
// fp32 run keep it busy as long: the same bytes on the same links, within
// 1 ns (busy time is a union of intervals, and the buckets start at other
// times when the compute is bf16's). bf16 on the wire would halve it.
TEST(MemoryKinds, Bf16ReducesFp32GradientsOnTheWire) {
  TrainOptions o = small_options(0);
  o.steps = 1;
  o.parallel.dp = 2;
  const TrainResult fp32 = testing::run(o, nullptr, false, Precision::kFp32);
  const TrainResult bf16 = testing::run(o, nullptr, false, Precision::kBf16);
  for (size_t rank = 0; rank < 2; ++rank) {
    std::printf("rank %zu comm busy: fp32 %lld ps, bf16 %lld ps\n", rank,
                (long long)fp32.run.devices[rank].comm_busy,
                (long long)bf16.run.devices[rank].comm_busy);
    EXPECT_GT(fp32.run.devices[rank].comm_busy, 0);
    EXPECT_NEAR(double(fp32.run.devices[rank].comm_busy), double(bf16.run.devices[rank].comm_busy), 1000.0);
  }
}

// --grad-reduce-in-bf16 (ParallelOptions::grad_reduce_bf16; Megatron's flag,
// grad_reduce_in_fp32 = False): the main gradients are bf16, so the
// gradient buffer holds half the bytes for the same elements (ZeRO 0, 2 and
// 3 alike), the preflight counts them so, the gradient all-reduce of ZeRO 0
// moves exactly half the bytes, and the optimizer first casts its owned chunk to fp32:
// "main_grad_cast", 2 + 4 bytes per owned element (owned = AdamW's fp32
// moments / 8).
TEST(MemoryKinds, GradReduceInBf16HalvesTheGradientsInMemoryAndOnTheWire) {
  auto cast_bytes = [](const TrainResult& r, size_t rank) {
    double bytes = 0;
    for (const TraceEvent& e : r.run.traces[rank].events)
      if (std::string(e.name) == "main_grad_cast") bytes += double(e.bytes);
    return bytes;
  };
  for (int zero : {0, 2, 3}) {
    TrainOptions o = small_options(0);
    o.steps = 1;
    o.parallel.dp = 2;
    o.parallel.zero = zero;
    const TrainResult fp32 = testing::run(o, nullptr, true, Precision::kBf16);
    o.parallel.grad_reduce_bf16 = true;
    validate_parallel(o);
    const TrainResult bf16 = testing::run(o, nullptr, true, Precision::kBf16);
    expect_preflight_matches(o, Precision::kBf16, bf16, "--grad-reduce-in-bf16");
    for (size_t rank = 0; rank < 2; ++rank) {
      const Kinds a = arena(fp32.run.devices[rank]), b = arena(bf16.run.devices[rank]);
      EXPECT_EQ(2 * b.grad, a.grad) << "ZeRO-" << zero << " rank " << rank;
      EXPECT_EQ(cast_bytes(fp32, rank), 0.0);
      EXPECT_EQ(cast_bytes(bf16, rank), 6.0 * double(b.optimizer / 8)) << "ZeRO-" << zero << " rank " << rank;
      if (zero == 0) {
        // Besides the gradients the stream carries the step's loss record,
        // 3 floats all-reduced over dp in fp32 (12 bytes on a 2-rank ring):
        // fp32 = G + 12, bf16 = G / 2 + 12.
        EXPECT_GT(wire(fp32, rank), 0u);
        EXPECT_EQ(2 * wire(bf16, rank), wire(fp32, rank) + 12) << "rank " << rank;
      }
    }
  }
}

// --precision fp8 (on an H100: an FP8 peak): the parameters add Transformer
// Engine's FP8 copies of W and Wᵀ, 1 B each, of the linears' weights. The
// tiny model (C = 64, F = 4C, 4 blocks) has per block qkv 64 x 192 = 12,288,
// proj 64 x 64 = 4,096, fc 64 x 256 = 16,384 and its projection 16,384:
// 49,152 weights, 196,608 in all, so 393,216 bytes beyond the bf16 weights
// (tp 2 halves each). The preflight counts them as the arena holds them.
TEST(MemoryKinds, Fp8WeightCopiesInTheArenaAndThePreflight) {
  for (int tp : {1, 2}) {
    TrainOptions o = small_options(0);
    o.steps = 1;
    o.parallel.tp = tp;
    o.parallel.dp = 2;
    o.parallel.zero = 1;
    HardwareProfile h = load_profile("h100-nvlink");
    h.nodes = 1;
    ClusterOptions co;
    co.precision = Precision::kFp8;
    co.world_size = o.parallel.world();
    Cluster cluster(h, co);
    const TrainResult r = train(cluster, o);
    const int64_t n = model::ParamTable(o.model).numel();
    const MemoryEstimate e = estimate_memory(o, ParallelPlan(o), 2, /*fp8=*/true);
    const MemoryEstimate bf16 = estimate_memory(o, ParallelPlan(o), 2);
    ASSERT_EQ(e.devices.size(), r.run.devices.size());
    for (size_t rank = 0; rank < e.devices.size(); ++rank) {
      EXPECT_EQ(e.devices[rank].params_bytes, arena(r.run.devices[rank]).param) << "tp " << tp << " rank " << rank;
      EXPECT_EQ(e.devices[rank].params_bytes - bf16.devices[rank].params_bytes, uint64_t(393216 / tp));
    }
    if (tp == 1) {
      EXPECT_EQ(arena(r.run.devices[0]).param, uint64_t(n) * 2 + 393216);
    }
  }
}


// Megatron's distributed optimizer (--use-distributed-optimizer,
// ParallelOptions::distributed_optimizer, with zero 1): ZeRO-1's buffers,
// so every kind of memory is ZeRO-1's on every rank (the gradient buffer
// holds all the padded buckets, 4 B each in fp32), and ZeRO-2's collectives,
// reduce-scatter then all-gather, but once per step: ZeRO-2 reduce-scatters
// every micro-batch (DeepSpeed's stage 2), so with 2 micro-batches it moves
// one more reduce-scatter of every bucket a step (at dp 4 a ring sends and
// receives 3/4 of the bucket: 2 x 3/4 x 4 B = 6 B per padded element), and
// ZeRO-2 without overlap (one reduction after backward) ends with the same
// final parameters bit for bit (tolerance 0). Fewer bytes than ZeRO-1
// alone, which all-reduces them (a ring all-reduce sends twice a
// reduce-scatter's bytes).
TEST(MemoryKinds, DistributedOptimizerIsZeroOnesMemoryWithZeroTwosTraffic) {
  TrainOptions o = small_options(0);
  o.steps = 2;
  o.micro_batches = 2;
  o.parallel.dp = 4;
  o.parallel.bucket_mb = 0.15;
  const model::ParamTable table(o.model);
  const std::vector<int64_t> pad = padded(bucket_sizes(table, o.parallel.bucket_mb * 1e6), o.parallel.dp);
  const int64_t total = std::accumulate(pad.begin(), pad.end(), int64_t{0});
  for (Precision p : {Precision::kFp32, Precision::kBf16}) {
    o.parallel.zero = 1;
    const TrainResult z1 = testing::run(o, nullptr, true, p);
    o.parallel.zero = 2;
    const TrainResult z2 = testing::run(o, nullptr, true, p);
    o.parallel.overlap = false;
    const TrainResult z2_once = testing::run(o, nullptr, true, p);
    o.parallel.overlap = true;
    o.parallel.zero = 1;
    o.parallel.distributed_optimizer = true;
    validate_parallel(o);
    const TrainResult d = testing::run(o, nullptr, true, p);
    o.parallel.distributed_optimizer = false;
    expect_preflight_matches(o, p, z1, "zero 1");
    o.parallel.distributed_optimizer = true;
    expect_preflight_matches(o, p, d, "distributed optimizer");
    o.parallel.distributed_optimizer = false;
    for (size_t rank = 0; rank < 4; ++rank) {
      const Kinds a = arena(d.run.devices[rank]), b = arena(z1.run.devices[rank]);
      EXPECT_EQ(a.grad, uint64_t(total) * 4) << name(p) << " rank " << rank;
      EXPECT_EQ(a.param, b.param) << name(p) << " rank " << rank;
      EXPECT_EQ(a.grad, b.grad) << name(p) << " rank " << rank;
      EXPECT_EQ(a.master, b.master) << name(p) << " rank " << rank;
      EXPECT_EQ(a.optimizer, b.optimizer) << name(p) << " rank " << rank;
      EXPECT_LT(arena(z2.run.devices[rank]).grad, a.grad) << name(p) << " rank " << rank;
      EXPECT_EQ(wire(z2, rank) - wire(d, rank), uint64_t(o.steps) * 6 * uint64_t(total)) << name(p) << " rank " << rank;
      EXPECT_LT(wire(d, rank), wire(z1, rank)) << name(p) << " rank " << rank;
      std::printf("%s rank %zu: wire bytes zero 1 %llu, distributed optimizer %llu, zero 2 %llu\n", name(p), rank,
                  (unsigned long long)wire(z1, rank), (unsigned long long)wire(d, rank),
                  (unsigned long long)wire(z2, rank));
    }
    EXPECT_NE(d.run.makespan(), z1.run.makespan()) << name(p);
    size_t differ = 0;
    for (size_t i = 0; i < d.final_params.size(); ++i) differ += d.final_params[i] != z2_once.final_params[i];
    std::printf("%s: %zu of %zu final parameters differ from ZeRO-2's without overlap (tolerance 0)\n", name(p), differ,
                d.final_params.size());
    EXPECT_EQ(differ, 0u) << name(p);
    ASSERT_FALSE(d.final_params.empty());
  }
}

}  // namespace
}  // namespace shardlab::train
