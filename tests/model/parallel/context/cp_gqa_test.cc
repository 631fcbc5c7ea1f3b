// Context parallelism with grouped-query attention: the ring carries only
// the K/V heads a rank's query heads read, not repeat_kv's copies. The core
// receives the repeated [q | k | v] rows of one TP rank's heads (as the block
// hands them over); its outputs and, after repeat_kv's backward sums each
// group's copies, its K/V gradients must equal plain causal attention of the
// same heads over the whole sequence; and the bytes on the wire must be the
// hand count of K/V heads.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "collectives/group.h"
#include "model/kernels.h"
#include "model/parallel/context/cp_attention.h"
#include "runtime/cluster.h"
#include "runtime/profile.h"
#include "support/compare.h"
#include "support/random.h"

namespace shardlab::parallel {
namespace {

// 4 query heads over 2 K/V heads (G = 2), as tiny-llama.
constexpr int kB = 2, kT = 16, kNH = 4, kKV = 2, kHS = 8, kG = kNH / kKV;

struct Case {
  int cp, tp, tp_rank;
  CpComm comm;
};

int global_t(int t, int r, int cp) {
  const int c = kT / (2 * cp);
  return t < c ? r * c + t : (2 * cp - 1 - r) * c + (t - c);
}

// Local query head h of TP rank `rank` (NHl heads) reads global K/V head (rank·NHl + h) / G.
// The repeated rows of those heads: q of each, then the k and v of its K/V head.
std::vector<float> local_repeated(const std::vector<float>& q, const std::vector<float>& k,
                                  const std::vector<float>& v, int NHl, int rank) {
  const int Cl = NHl * kHS;
  std::vector<float> out(size_t(kB * kT * 3 * Cl));
  for (int n = 0; n < kB * kT; ++n)
    for (int h = 0; h < NHl; ++h) {
      const int gh = rank * NHl + h, kv = gh / kG;
      std::copy_n(&q[size_t((n * kNH + gh) * kHS)], kHS, &out[size_t(n * 3 * Cl + h * kHS)]);
      std::copy_n(&k[size_t((n * kKV + kv) * kHS)], kHS, &out[size_t(n * 3 * Cl + Cl + h * kHS)]);
      std::copy_n(&v[size_t((n * kKV + kv) * kHS)], kHS, &out[size_t(n * 3 * Cl + 2 * Cl + h * kHS)]);
    }
  return out;
}

// dq per local head; dk and dv summed over the local heads of each K/V head (repeat_kv's backward).
std::vector<double> collapse(const std::vector<float>& dqkv, int rows, int NHl, int rank) {
  const int Cl = NHl * kHS;
  std::vector<double> out(size_t(rows) * (Cl + 2 * kKV * kHS), 0.0);
  const size_t W = size_t(Cl + 2 * kKV * kHS);
  for (int n = 0; n < rows; ++n)
    for (int h = 0; h < NHl; ++h) {
      const int kv = (rank * NHl + h) / kG;
      for (int c = 0; c < kHS; ++c) {
        out[n * W + size_t(h * kHS + c)] = dqkv[size_t(n * 3 * Cl + h * kHS + c)];
        out[n * W + size_t(Cl + kv * kHS + c)] += dqkv[size_t(n * 3 * Cl + Cl + h * kHS + c)];
        out[n * W + size_t(Cl + (kKV + kv) * kHS + c)] += dqkv[size_t(n * 3 * Cl + 2 * Cl + h * kHS + c)];
      }
    }
  return out;
}

void check(const Case& k) {
  const int NHl = kNH / k.tp, Cl = NHl * kHS, Tl = kT / k.cp;
  const auto q = testing::normal_values<std::vector<float>>(size_t(kB * kT * kNH * kHS), 3);
  const auto kk = testing::normal_values<std::vector<float>>(size_t(kB * kT * kKV * kHS), 4);
  const auto v = testing::normal_values<std::vector<float>>(size_t(kB * kT * kKV * kHS), 5);
  const auto dout = testing::normal_values<std::vector<float>>(size_t(kB * kT * Cl), 6);
  const std::vector<float> qkv = local_repeated(q, kk, v, NHl, k.tp_rank);
  // The reference: these heads' causal attention over the whole sequence.
  std::vector<float> ref(size_t(kB * kT * Cl)), att(size_t(kB * NHl * kT * kT)), dref(qkv.size(), 0.0f);
  model::attention_forward(ref.data(), att.data(), qkv.data(), kB, kT, NHl, kHS);
  model::attention_backward(dref.data(), dout.data(), qkv.data(), att.data(), kB, kT, NHl, kHS);
  std::vector<float> y(ref.size(), NAN), dq(qkv.size(), NAN);
  std::vector<uint64_t> sent(size_t(k.cp));
  ClusterOptions o;
  o.world_size = k.cp;
  Cluster cluster(builtin_profiles().front(), o);
  cluster.run([&](Device& dev) {
    const int r = dev.rank();
    std::vector<float> mine(size_t(kB * Tl * 3 * Cl)), dy(size_t(kB * Tl * Cl)), atty(dy.size()),
        dqkv(mine.size(), 0.0f);
    auto each_row = [&](auto&& f) {
      for (int b = 0; b < kB; ++b)
        for (int t = 0; t < Tl; ++t) f(b * kT + global_t(t, r, k.cp), b * Tl + t);
    };
    each_row([&](int g, int l) {
      std::copy_n(&qkv[size_t(g * 3 * Cl)], 3 * Cl, &mine[size_t(l * 3 * Cl)]);
      std::copy_n(&dout[size_t(g * Cl)], Cl, &dy[size_t(l * Cl)]);
    });
    LayerContext c;
    c.dev = &dev;
    ShardDims d{{kB, Tl, kNH * kHS, kNH, 4 * kNH * kHS}, k.tp, false, 1};
    d.cp = k.cp, d.cp_rank = r, d.kv = kKV, d.rope = true;
    const CpAttention core(collectives::ProcessGroup::world(dev), k.comm, k.tp_rank);
    std::vector<float> lse(size_t(d.att_elements()));
    core.forward(atty.data(), lse.data(), mine.data(), d, c);
    core.backward(dqkv.data(), dy.data(), mine.data(), atty.data(), lse.data(), d, c);
    each_row([&](int g, int l) {
      std::copy_n(&atty[size_t(l * Cl)], Cl, &y[size_t(g * Cl)]);
      std::copy_n(&dqkv[size_t(l * 3 * Cl)], 3 * Cl, &dq[size_t(g * 3 * Cl)]);
    });
    sent[size_t(r)] = core.sent_bytes();
  });
  const auto y_close = testing::all_close(y, ref, 1e-5);
  const auto d_close = testing::all_close(collapse(dq, kB * kT, NHl, k.tp_rank), collapse(dref, kB * kT, NHl, k.tp_rank), 1e-5);
  // The K/V heads the rank's query heads read: tp 1 and 2 one per G heads
  // (2 and 1), tp 4 (K/V replicated) the one K/V head of its query head.
  const int used = std::max(1, NHl / kG);
  const uint64_t block = uint64_t(kB) * Tl * 2 * used * kHS * 4;  // [k | v] rows, fp32
  // Ring: forward cp−1 K/V hops, backward cp−1 K/V hops and cp dK/dV hops.
  const uint64_t want = k.comm == CpComm::kRing ? block * uint64_t(3 * k.cp - 2) : 0;
  std::printf("cp %d tp %d rank %d %s: output %s; K/V gradients %s; %llu B sent per rank (%d K/V heads of %d "
              "query heads)\n",
              k.cp, k.tp, k.tp_rank, cp_comm_name(k.comm), y_close.message(), d_close.message(),
              (unsigned long long)sent[0], used, NHl);
  EXPECT_TRUE(y_close);
  EXPECT_TRUE(d_close);
  for (int r = 0; r < k.cp; ++r) EXPECT_EQ(sent[size_t(r)], want) << "rank " << r;
}

TEST(CpGqa, RingCarriesOnlyTheKvHeads) { check({2, 1, 0, CpComm::kRing}); }
TEST(CpGqa, FourRanks) { check({4, 1, 0, CpComm::kRing}); }
TEST(CpGqa, AllGather) { check({2, 1, 0, CpComm::kAllGather}); }
TEST(CpGqa, TensorParallelSplitsKvHeads) { check({2, 2, 1, CpComm::kRing}); }
TEST(CpGqa, TensorParallelReplicatesKvHeads) { check({2, 4, 3, CpComm::kRing}); }

}  // namespace
}  // namespace shardlab::parallel
