// CpAttention on a cluster of cp devices against the unsharded causal
// attention (model/kernels.h) of the whole sequence: every rank holds chunks
// r and 2cp−1−r of 2cp, runs the ring (or the all-gather), and its output
// rows and qkv-gradient rows must be the reference's rows at those
// positions. Then what it charges: each chunk pair's kernel (a diagonal pair
// half the work), and the ring's bytes.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "collectives/group.h"
#include "model/kernels.h"
#include "model/parallel/context/cp_attention.h"
#include "runtime/cluster.h"
#include "runtime/profile.h"
#include "support/compare.h"
#include "support/random.h"
#include "tests/runtime/test_util.h"

namespace shardlab::parallel {
namespace {

constexpr int kB = 2, kT = 16, kNH = 2, kHS = 8, kC = kNH * kHS;

std::vector<float> random_values(size_t n, uint64_t seed) { return testing::normal_values<std::vector<float>>(n, seed); }

// The global time of local row t on cp rank r (chunks r and 2cp−1−r of T/(2cp)).
int global_t(int t, int r, int cp) {
  const int c = kT / (2 * cp);
  return t < c ? r * c + t : (2 * cp - 1 - r) * c + (t - c);
}

// Records every op's name and cost (and charges the compute stream).
class Sink final : public model::OpSink {
 public:
  explicit Sink(Device& dev) : dev_(dev) {}
  void op(const char* name, const OpCost& cost) override {
    dev_.run(dev_.compute(), name, cost);
    ops.emplace_back(name, cost);
  }
  std::vector<std::pair<std::string, OpCost>> ops;

 private:
  Device& dev_;
};

struct RankOut {
  std::vector<float> atty, dqkv;
  std::vector<std::pair<std::string, OpCost>> ops;
  uint64_t sent = 0;
  Time exposed = 0;
};

std::vector<RankOut> run_cp(int cp, CpComm comm, const std::vector<float>& qkv, const std::vector<float>& dout) {
  const int Tl = kT / cp;
  std::vector<RankOut> out(static_cast<size_t>(cp));
  ClusterOptions o;
  o.world_size = cp;
  Cluster cluster(builtin_profiles().front(), o);
  cluster.run([&](Device& dev) {
    const int r = dev.rank();
    std::vector<float> q(size_t(kB * Tl * 3 * kC)), dy(size_t(kB * Tl * kC));
    for (int b = 0; b < kB; ++b)
      for (int t = 0; t < Tl; ++t) {
        const int g = b * kT + global_t(t, r, cp), l = b * Tl + t;
        std::copy_n(&qkv[size_t(g * 3 * kC)], 3 * kC, &q[size_t(l * 3 * kC)]);
        std::copy_n(&dout[size_t(g * kC)], kC, &dy[size_t(l * kC)]);
      }
    collectives::ProcessGroup cp_group = collectives::ProcessGroup::world(dev);
    Sink sink(dev);
    LayerContext c;
    c.dev = &dev;
    c.ex = model::Exec::with(&sink);
    ShardDims d{{kB, Tl, kC, kNH, 4 * kC}, 1, false, 1};
    d.cp = cp;
    d.cp_rank = r;
    const CpAttention core(cp_group, comm);
    RankOut& mine = out[size_t(r)];
    mine.atty.assign(size_t(kB * Tl * kC), 0.0f);
    mine.dqkv.assign(q.size(), 0.0f);
    std::vector<float> lse(size_t(d.att_elements()));
    core.forward(mine.atty.data(), lse.data(), q.data(), d, c);
    core.backward(mine.dqkv.data(), dy.data(), q.data(), mine.atty.data(), lse.data(), d, c);
    mine.ops = sink.ops;
    mine.sent = core.sent_bytes();
    mine.exposed = core.exposed();
  });
  return out;
}

class CpAttentionMatch : public ::testing::TestWithParam<std::tuple<int, CpComm>> {};

TEST_P(CpAttentionMatch, RowsEqualTheUnshardedAttention) {
  const auto [cp, comm] = GetParam();
  const std::vector<float> qkv = random_values(size_t(kB * kT * 3 * kC), 7);
  const std::vector<float> dout = random_values(size_t(kB * kT * kC), 8);
  std::vector<float> ref(size_t(kB * kT * kC)), att(size_t(kB * kNH * kT * kT)), dref(qkv.size(), 0.0f);
  model::attention_forward(ref.data(), att.data(), qkv.data(), kB, kT, kNH, kHS);
  model::attention_backward(dref.data(), dout.data(), qkv.data(), att.data(), kB, kT, kNH, kHS);
  const std::vector<RankOut> out = run_cp(cp, comm, qkv, dout);
  // The ranks' rows put back in global order (NaN where no rank wrote: fails).
  const int Tl = kT / cp;
  std::vector<float> y(ref.size(), NAN), dq(dref.size(), NAN);
  for (int r = 0; r < cp; ++r)
    for (int b = 0; b < kB; ++b)
      for (int t = 0; t < Tl; ++t) {
        const int g = b * kT + global_t(t, r, cp), l = b * Tl + t;
        std::copy_n(&out[size_t(r)].atty[size_t(l * kC)], kC, &y[size_t(g * kC)]);
        std::copy_n(&out[size_t(r)].dqkv[size_t(l * 3 * kC)], 3 * kC, &dq[size_t(g * 3 * kC)]);
      }
  const auto y_close = shardlab::testing::all_close(y, ref, 1e-5);
  const auto dq_close = shardlab::testing::all_close(dq, dref, 1e-5);
  std::printf("cp %d %s: output %s; dqkv %s\n", cp, cp_comm_name(comm), y_close.message(), dq_close.message());
  EXPECT_TRUE(y_close);
  EXPECT_TRUE(dq_close);
}

INSTANTIATE_TEST_SUITE_P(Grid, CpAttentionMatch,
                         ::testing::Combine(::testing::Values(2, 4), ::testing::Values(CpComm::kRing, CpComm::kAllGather)),
                         [](const auto& info) {
                           return "cp" + std::to_string(std::get<0>(info.param)) + "_" +
                                  cp_comm_name(std::get<1>(info.param));
                         });

// Per rank and pass: of the 4·cp (my chunk, block chunk) pairs, the
// 2·cp − 1 with later keys are skipped; 2 are diagonal, 2·cp − 1 full.
// A full pair of len = T/(2cp) tokens costs 4·BH·len²·HS (two GEMMs) + 7·BH·len²
// flops forward and 10·BH·len²·HS + 6·BH·len² backward; a diagonal pair half.
TEST(CpAttentionCost, EveryChunkPairOnceAndTheRingBytes) {
  const int cp = 4, len = kT / (2 * cp), BH = kB * kNH;
  const std::vector<RankOut> out =
      run_cp(cp, CpComm::kRing, random_values(size_t(kB * kT * 3 * kC), 1), random_values(size_t(kB * kT * kC), 2));
  const double pair = double(BH) * len * len;
  const std::map<std::string, double> flops = {{"attn.cp.fwd", 4 * pair * kHS + 7 * pair},
                                               {"attn.cp.fwd.diagonal", (4 * pair * kHS + 7 * pair) / 2},
                                               {"attn.cp.bwd", 10 * pair * kHS + 6 * pair},
                                               {"attn.cp.bwd.diagonal", (10 * pair * kHS + 6 * pair) / 2}};
  const std::map<std::string, int> want = {{"attn.cp.fwd", 2 * cp - 1},
                                           {"attn.cp.fwd.diagonal", 2},
                                           {"attn.cp.bwd", 2 * cp - 1},
                                           {"attn.cp.bwd.diagonal", 2}};
  // [k | v] of the local rows per ring hop, fp32: forward cp−1 hops, backward
  // cp−1 hops of K/V and cp of their dK/dV (the last one home).
  const uint64_t block = uint64_t(kB) * (kT / cp) * 2 * kC * 4;
  for (int r = 0; r < cp; ++r) {
    std::map<std::string, int> count;
    for (const auto& [name, cost] : out[size_t(r)].ops) {
      auto f = flops.find(name);
      if (f == flops.end()) continue;
      ++count[name];
      EXPECT_DOUBLE_EQ(cost.flops, f->second) << name << " rank " << r;
    }
    EXPECT_EQ(count, want) << "rank " << r;
    EXPECT_EQ(out[size_t(r)].sent, block * uint64_t(3 * cp - 2)) << "rank " << r;
  }
  std::printf("cp %d ring: %d pairs per pass (2 diagonal), %llu B sent per rank, K/V exposed %.3f us on rank 0\n", cp,
              2 * cp + 1, (unsigned long long)out[0].sent, to_us(out[0].exposed));
}

// What lets the cp ranks of a phantom run fold (model/engine/fold.h): with
// chunks r and 2cp-1-r every rank charges the same kernels, and under the
// ring in the same order (its own block first: one full pair between two
// diagonal ones; every other block two full pairs, (my chunk, its chunk)
// (0,0),(1,0) for an earlier rank's block, (1,0),(1,1) for a later one's:
// the same costs), and sends the same bytes. Exact: names, classes, FLOPs
// and bytes. The all-gather takes the blocks in rank order, so rank r meets
// its diagonal pairs at block r: the same kernels in another order, which
// can end elsewhere where they overlap other streams' collectives (SM
// contention): its cp ranks are not folded.
TEST(CpAttentionCost, EveryRankChargesTheSameKernels) {
  using Op = std::tuple<std::string, int, double, double>;
  const auto ops = [](const RankOut& o) {
    std::vector<Op> v;
    for (const auto& [name, cost] : o.ops) v.emplace_back(name, int(cost.op_class), cost.flops, cost.bytes);
    return v;
  };
  for (const CpComm comm : {CpComm::kRing, CpComm::kAllGather})
    for (const int cp : {2, 4, 8}) {
      const std::vector<RankOut> out = run_cp(cp, comm, random_values(size_t(kB * kT * 3 * kC), 3),
                                              random_values(size_t(kB * kT * kC), 4));
      const std::vector<Op> first = ops(out[0]);
      for (int r = 1; r < cp; ++r) {
        SCOPED_TRACE(fmt::format("{} cp {} rank {}", cp_comm_name(comm), cp, r));
        std::vector<Op> mine = ops(out[size_t(r)]);
        EXPECT_EQ(out[size_t(r)].sent, out[0].sent);
        if (comm == CpComm::kRing) {
          EXPECT_EQ(mine, first);
          continue;
        }
        EXPECT_NE(mine, first);
        std::vector<Op> sorted_first = first;
        std::sort(mine.begin(), mine.end());
        std::sort(sorted_first.begin(), sorted_first.end());
        EXPECT_EQ(mine, sorted_first);
      }
    }
}

// One off-diagonal chunk pair on an H100 (bf16), by hand: len = keys =
// 2816, HS = 128, B·NH = 12. Its q·kᵀ GEMM (2816 x 2816 x 128, 12 heads) is
// 11 x 22 x 12 = 2,904 tiles of 256x128, 22 waves of 132 SMs, and P·V (2816
// x 128 x 2816) 11 x 1 x 12 = 132 tiles, one wave: both at the GEMM maximum,
// 989 TFLOP/s x 0.60; the 7 softmax FLOPs per pair at 989 x 0.7.
//   fused (on chip)  the GEMMs' tile time alone: 4·pairs·HS / max, 82.1 us
//   unfused          each GEMM at the larger of its tile time (41.1 us) and
//                    its inputs' HBM time, then the store of its output:
//                    q·kᵀ reads q and k (17.3 MB, 5.7 us) and stores its
//                    2816 x 2816 scores per head (190.3 MB, 63.1 us); P·V
//                    reads them and v (199.0 MB, 66.0 us) and stores O
//                    (8.7 MB, 2.9 us), all at 3.35 TB/s x 0.90.
// Either way no less than the pair's own bytes (q, k, v, the accumulator
// read and written, m and l) at the HBM rate.
TEST(CpAttentionCost, FusedKeepsTheChunkScoresOnChip) {
  HardwareProfile p = load_profile("h100-nvlink");
  const CostModel cost(p.device, Precision::kBf16);
  constexpr int64_t len = 2816, HS = 128, BH = 12;
  constexpr double kLaunchPs = 4e6, kBw = 3350e9 * 0.90, kGemm = 989e12 * 0.60, kOther = 989e12 * 0.7;
  const BlockDims d{1, int(2 * len), int(BH), int(HS)};
  const double pairs = double(BH) * len * len, rows = double(BH) * len;
  const double bytes = (rows * HS + 2.0 * BH * len * HS + 2 * rows * HS) * 2 + 8 * rows;
  const double tiles = 4 * pairs * HS / kGemm, softmax = 7 * pairs / kOther;
  // Each GEMM's inputs, then its output (cost_model.cc: the store follows the main loop).
  const double qk_in = 2.0 * len * HS * 2 * BH / kBw, scores_out = double(len) * len * 2 * BH / kBw;
  const double pv_in = (double(len) * len + double(len) * HS) * 2 * BH / kBw, o_out = double(len) * HS * 2 * BH / kBw;
  const auto ps = [](double seconds) { return std::ceil(seconds * 1e12); };
  // Fused: the ring's off-diagonal block is one len x len call without a
  // mask, at cuDNN's published forward rate for len keys (h100-nvlink's
  // device.attention: 617 TFLOP/s at 2k, 609 at 4k, linear in log2 between).
  const double rate = 617 + std::log2(double(len) / 2048) * (609 - 617);  // TFLOP/s = FLOP/ps
  const double fused = kLaunchPs + std::max(std::ceil(4 * pairs * HS / rate), ps(bytes / kBw));
  const double unfused =
      kLaunchPs + std::max(ps(std::max(tiles / 2, qk_in) + scores_out + std::max(tiles / 2, pv_in) + o_out + softmax),
                           ps(bytes / kBw));
  const double got_fused = double(cost.duration(block_attention_forward_cost(d, len, false, 2, /*on_chip=*/true)));
  const double got_unfused = double(cost.duration(block_attention_forward_cost(d, len, false, 2, /*on_chip=*/false)));
  std::printf("chunk pair forward: fused %.3f us, scores through HBM %.3f us\n", got_fused / 1e6, got_unfused / 1e6);
  EXPECT_EQ(got_fused, fused);
  EXPECT_EQ(got_unfused, unfused);
  EXPECT_LT(got_fused, 0.6 * got_unfused);  // 79.4 us against 41.1 + 63.1 + 66.0 + 2.9 + 1.0 us, plus the launch
}

// Records every op and charges nothing: the ring's messages alone set the clocks.
class FreeSink final : public model::OpSink {
 public:
  void op(const char*, const OpCost&) override {}
};

struct RingClocks {
  Time exposed = 0, compute = 0, comm = 0;
};

// One forward and backward of CpAttention on cp 2 (ranks 0 and 1 of
// simple_profile's first node), every kernel free; `bucket` ps of a
// data-parallel reduce-scatter hold the device's communication stream when
// attention starts (DataParallel launches its buckets there during backward).
std::vector<RingClocks> ring_clocks(Time bucket) {
  constexpr int cp = 2, Tl = kT / cp;
  std::vector<RingClocks> out(cp);
  Cluster cluster(testing::simple_profile(1, 2), {.world_size = cp});
  cluster.run([&](Device& dev) {
    if (bucket > 0) dev.comm().run("dp.bucket", bucket);
    collectives::ProcessGroup cp_group = collectives::ProcessGroup::world(dev);
    FreeSink sink;
    LayerContext c;
    c.dev = &dev;
    c.ex = model::Exec::with(&sink);
    ShardDims d{{kB, Tl, kC, kNH, 4 * kC}, 1, false, 1};
    d.cp = cp;
    d.cp_rank = dev.rank();
    const CpAttention core(cp_group, CpComm::kRing);
    std::vector<float> q = random_values(size_t(kB * Tl * 3 * kC), 3), dy = random_values(size_t(kB * Tl * kC), 4);
    std::vector<float> y(size_t(kB * Tl * kC)), dq(q.size()), lse(size_t(d.att_elements()));
    core.forward(y.data(), lse.data(), q.data(), d, c);
    core.backward(dq.data(), dy.data(), q.data(), y.data(), lse.data(), d, c);
    out[size_t(dev.rank())] = {core.exposed(), dev.compute().now(), dev.comm().now()};
  });
  return out;
}

// The ring runs on a stream of its own (Transformer Engine's isend/irecv
// over the cp group, whose NCCL stream is not the dp group's), so a
// data-parallel bucket on the communication stream does not hold the K/V
// back. By hand, kernels free: a block of B·Tl·2·C fp32 = 2,048 B takes w =
// 20.48 ns on the wire after the link's a = 1 us (100 GB/s). Both ranks
// alike: forward sends at 0, the peer's block arrives at a + w = T
// (exposed a + w). Backward at T: the K/V send leaves [T, T + w), the own
// dK/dV right behind it [T + w, T + 2w) (one FIFO per stream kind on the
// port); the peer's K/V arrives at T + a + w (exposed a + w), its dK/dV at
// T + a + 2w behind it on the ingress (exposed w); the sum goes home at T +
// a + 2w and arrives a + w later (exposed a + w). In all 3a + 4w =
// 3,081,920 ps, the compute stream's end, with the bucket or without.
// Before the ring had its stream, it queued behind the bucket: 1 s more.
TEST(CpAttentionRing, TheKvExchangeDoesNotWaitForTheDataParallelStream) {
  constexpr Time a = testing::kUs, w = 20'480, want = 3 * a + 4 * w, bucket = 1'000'000 * testing::kUs;
  for (const Time held : {Time{0}, bucket}) {
    const std::vector<RingClocks> got = ring_clocks(held);
    for (int r = 0; r < 2; ++r) {
      const RingClocks& g = got[size_t(r)];
      std::printf("comm stream held %.0f us: rank %d K/V exposed %.6f us, compute ends at %.6f us\n", to_us(held), r,
                  to_us(g.exposed), to_us(g.compute));
      EXPECT_EQ(g.exposed, want) << "rank " << r << ", comm stream held " << held << " ps";
      EXPECT_EQ(g.compute, want) << "rank " << r;
      EXPECT_EQ(g.comm, held) << "rank " << r << ": the ring leaves the communication stream alone";
    }
  }
}

}  // namespace
}  // namespace shardlab::parallel
