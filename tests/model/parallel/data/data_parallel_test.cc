// DataParallel (model/parallel/data) on hand-made shard lists, where every
// expected value is worked out by hand in the comments: the backward-ready
// order, the bucket boundaries, expert buckets kept apart, ZeRO's owned
// chunks (over dp, and over edp for expert buckets), held_grad_elements(),
// and the reduced gradients after finish_grads against the dp average
// computed here from each rank's known inputs.
#include "model/parallel/data/data_parallel.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "collectives/mesh.h"
#include "runtime/cluster.h"
#include "runtime/profile.h"
#include "support/compare.h"

namespace shardlab {
// Readable failure messages for Range comparisons.
void PrintTo(const Range& r, std::ostream* os) { *os << "[" << r.begin << ", +" << r.size << ")"; }
}  // namespace shardlab

namespace shardlab::parallel {
namespace {

using model::ParamRole;

ShardSpec spec(std::string name, int64_t offset, int64_t numel, int layer, ParamRole role,
               bool expert = false) {
  ShardSpec s;
  s.name = std::move(name);
  s.offset = offset;
  s.numel = numel;
  s.global_shape = s.local_shape = {numel};
  s.layer = layer;
  s.role = role;
  s.expert = expert;
  return s;
}

// A dense model of 100 elements, laid out like a ParamTable (wte, wpe, the
// blocks in order, ln_f); each block's tensors are contiguous.
std::vector<ShardSpec> dense_shards() {
  return {spec("wte", 0, 24, -1, ParamRole::kTokenEmbedding),
          spec("wpe", 24, 8, -1, ParamRole::kPositionEmbedding),
          spec("h.0.ln_1", 32, 4, 0, ParamRole::kLayerNorm),
          spec("h.0.attn", 36, 16, 0, ParamRole::kQkvWeight),
          spec("h.0.mlp", 52, 12, 0, ParamRole::kFcWeight),
          spec("h.1.ln_1", 64, 4, 1, ParamRole::kLayerNorm),
          spec("h.1.attn", 68, 16, 1, ParamRole::kQkvWeight),
          spec("h.1.mlp", 84, 12, 1, ParamRole::kFcWeight),
          spec("ln_f", 96, 4, -1, ParamRole::kLayerNorm)};
}
constexpr int64_t kDenseElements = 100;

// 80 elements; block 1 is MoE: its router is not an expert tensor, its two
// experts are.
std::vector<ShardSpec> moe_shards() {
  return {spec("wte", 0, 16, -1, ParamRole::kTokenEmbedding),
          spec("wpe", 16, 8, -1, ParamRole::kPositionEmbedding),
          spec("h.0.ln_1", 24, 4, 0, ParamRole::kLayerNorm),
          spec("h.0.mlp", 28, 12, 0, ParamRole::kFcWeight),
          spec("h.1.ln_1", 40, 4, 1, ParamRole::kLayerNorm),
          spec("h.1.router", 44, 8, 1, ParamRole::kRouter),
          spec("h.1.experts.0", 52, 12, 1, ParamRole::kFcWeight, true),
          spec("h.1.experts.1", 64, 12, 1, ParamRole::kFcWeight, true),
          spec("ln_f", 76, 4, -1, ParamRole::kLayerNorm)};
}
constexpr int64_t kMoeElements = 80;

TEST(BackwardReadyOrder, LnFThenBlocksFromLastToFirstThenTheEmbeddings) {
  // Inside a group from the highest offset down, so consecutive ranges touch.
  const std::vector<Range> want{{96, 4}, {84, 12}, {68, 16}, {64, 4}, {52, 12},
                                {36, 16}, {32, 4}, {24, 8}, {0, 24}};
  EXPECT_EQ(backward_ready_order(dense_shards()), want);
  EXPECT_EQ(expert_ranges(dense_shards()), std::vector<Range>{});
  EXPECT_EQ(expert_ranges(moe_shards()), (std::vector<Range>{{52, 12}, {64, 12}}));
}

// Runs `body(dev, mesh)` on every device of a dp x ep mesh (tp = 1).
RunResult on_mesh(int dp, int ep, const std::function<void(Device&, const collectives::DeviceMesh&)>& body) {
  const collectives::DeviceMesh mesh({.ep = ep, .dp = dp});
  HardwareProfile p = load_profile("a100-nvlink");
  p.nodes = 1;
  p.devices_per_node = std::max(p.devices_per_node, mesh.size());
  ClusterOptions o;
  o.world_size = mesh.size();
  Cluster cluster(p, o);
  return cluster.run([&](Device& dev) { body(dev, mesh); });
}

struct Plan {
  std::vector<Range> buckets, owned;
  std::vector<bool> expert;
  int64_t owned_elements = 0, held = 0;
  uint64_t largest_bytes = 0;
};

// The plan DataParallel makes on every rank of a dp x ep mesh.
std::vector<Plan> plans(const std::vector<ShardSpec>& shards, int64_t numel, int dp, int ep,
                        const DataParallelOptions& o) {
  std::vector<Plan> out(static_cast<size_t>(dp));
  on_mesh(dp, ep, [&](Device& dev, const collectives::DeviceMesh& mesh) {
    std::vector<float> grads(size_t(numel), 0.0f);
    const collectives::ProcessGroup dp_group = mesh.group(dev.rank(), "dp");
    const collectives::ProcessGroup edp_group = mesh.group(dev.rank(), "edp");
    DataParallel::ExpertGrads experts;
    if (ep > 1) experts = {&edp_group, expert_ranges(shards)};
    const DataParallel d(dev, dp_group, grads, backward_ready_order(shards), o, experts);
    Plan& p = out[size_t(dev.rank())];
    p.buckets = d.buckets();
    for (size_t i = 0; i < p.buckets.size(); ++i) p.expert.push_back(d.expert_bucket(i));
    p.owned = d.owned();
    p.owned_elements = d.owned_elements();
    p.held = d.held_grad_elements();
    p.largest_bytes = d.largest_bucket_bytes();
  });
  return out;
}

TEST(DataParallelBuckets, FillInReadyOrderUntilBucketBytes) {
  // bucket_bytes 64 = 16 fp32 elements; a bucket closes once it holds >= 16:
  //   ln_f (96,4) + h1.mlp (84,12)        -> [84, +16)
  //   h1.attn (68,16)                      -> [68, +16)
  //   h1.ln_1 (64,4) + h0.mlp (52,12)      -> [52, +16)
  //   h0.attn (36,16)                      -> [36, +16)
  //   h0.ln_1 (32,4) + wpe (24,8) + wte (0,24) = 36 -> [0, +36) (the end closes it)
  const std::vector<Plan> p64 = plans(dense_shards(), kDenseElements, 1, 1, {.bucket_bytes = 64});
  EXPECT_EQ(p64[0].buckets, (std::vector<Range>{{84, 16}, {68, 16}, {52, 16}, {36, 16}, {0, 36}}));
  EXPECT_EQ(p64[0].largest_bytes, 36u * 4);
  // bucket_bytes 100 = 25 elements: a bucket may overshoot (the range that
  // crosses the limit stays whole):
  //   (96,4) + (84,12) = 16, + (68,16) = 32 >= 25  -> [68, +32)
  //   (64,4) + (52,12) = 16, + (36,16) = 32        -> [36, +32)
  //   (32,4) + (24,8) + (0,24) = 36                -> [0, +36)
  const std::vector<Plan> p100 = plans(dense_shards(), kDenseElements, 1, 1, {.bucket_bytes = 100});
  EXPECT_EQ(p100[0].buckets, (std::vector<Range>{{68, 32}, {36, 32}, {0, 36}}));
  // 25 MB: one bucket of everything.
  const std::vector<Plan> big = plans(dense_shards(), kDenseElements, 1, 1, {});
  EXPECT_EQ(big[0].buckets, (std::vector<Range>{{0, 100}}));
  for (const Plan* p : {&p64[0], &p100[0], &big[0]}) {
    // Without ZeRO a rank owns every bucket (listed in flat order).
    std::vector<Range> sorted = p->buckets;
    std::sort(sorted.begin(), sorted.end(), [](const Range& a, const Range& b) { return a.begin < b.begin; });
    EXPECT_EQ(p->owned, sorted);
    EXPECT_EQ(p->owned_elements, kDenseElements);
    EXPECT_EQ(p->held, kDenseElements);
  }
}

TEST(DataParallelBuckets, AnAloneRangeIsABucketOfItsOwn) {
  // The tied embedding copy (wte, [0, +24)) alone, with room for everything
  // (25 MB): ln_f .. wpe fill one bucket [24, +76) that the alone range
  // closes, then wte makes its own. Reduced in a bucket of its own, the
  // first stage's copy (among wpe and block 0) and the last stage's (among
  // ln_f) are chunked alike whatever their neighbours.
  const std::vector<Plan> p = plans(dense_shards(), kDenseElements, 1, 1, {.alone = {0, 24}});
  EXPECT_EQ(p[0].buckets, (std::vector<Range>{{24, 76}, {0, 24}}));
  // With small buckets (16 elements) wte no longer joins h0.ln_1 and wpe:
  const std::vector<Plan> q = plans(dense_shards(), kDenseElements, 1, 1, {.bucket_bytes = 64, .alone = {0, 24}});
  EXPECT_EQ(q[0].buckets, (std::vector<Range>{{84, 16}, {68, 16}, {52, 16}, {36, 16}, {24, 12}, {0, 24}}));
}

TEST(DataParallelBuckets, ExpertTensorsNeverShareABucketWithOthers) {
  // Even with room for everything (25 MB): ln_f alone, the two experts
  // (52..76) together, then router, ln_1, block 0 and the embeddings.
  const std::vector<Plan> p = plans(moe_shards(), kMoeElements, 2, 2, {});
  for (const Plan& rank : p) {
    EXPECT_EQ(rank.buckets, (std::vector<Range>{{76, 4}, {52, 24}, {0, 52}}));
    EXPECT_EQ(rank.expert, (std::vector<bool>{false, true, false}));
  }
  // Small buckets (16 elements): the experts split at their own boundary only.
  //   (76,4) | e1 (64,12) + e0 (52,12) = 24 -> [52, +24) | (44,8) + (40,4) +
  //   (28,12) = 24 -> [28, +24) | (24,4) + (16,8) + (0,16) = 28 -> [0, +28)
  const std::vector<Plan> q = plans(moe_shards(), kMoeElements, 2, 2, {.bucket_bytes = 64});
  EXPECT_EQ(q[0].buckets, (std::vector<Range>{{76, 4}, {52, 24}, {28, 24}, {0, 28}}));
  EXPECT_EQ(q[0].expert, (std::vector<bool>{false, true, false, false}));
  // Whatever the sizes: a bucket is inside the experts or disjoint from them.
  for (uint64_t bytes : {4ull, 48ull, 64ull, 200ull, 1ull << 20}) {
    const Plan r = plans(moe_shards(), kMoeElements, 2, 2, {.bucket_bytes = bytes})[0];
    for (size_t i = 0; i < r.buckets.size(); ++i) {
      const Range& b = r.buckets[i];
      const int64_t in_experts = std::max<int64_t>(0, std::min<int64_t>(b.end(), 76) - std::max<int64_t>(b.begin, 52));
      EXPECT_EQ(in_experts, r.expert[i] ? b.size : 0) << "bucket_bytes " << bytes << " bucket " << i;
    }
  }
}

TEST(DataParallelZero, EachRankOwnsChunkRankOfEveryPaddedBucket) {
  // dp 4, buckets of the 64-byte plan: [84,+16) [68,+16) [52,+16) [36,+16)
  // [0,+36). Megatron's padding (padded_bucket) makes each a multiple of
  // lcm(4, 128) = 128 elements; chunk r of 128 over 4 is [32r, 32r+32). Rank
  // 0's chunks hold every 16-element bucket whole and [0, 32) of the last;
  // rank 1's hold [32, 36) of the last; ranks 2 and 3 hold padding only.
  // Every rank is charged 5 chunks of 32 = 160 elements; the buffer holds 5
  // x 128 = 640.
  const std::vector<std::vector<Range>> want{
      {{0, 32}, {36, 16}, {52, 16}, {68, 16}, {84, 16}}, {{32, 4}}, {}, {}};
  for (int zero : {1, 2}) {
    const std::vector<Plan> p = plans(dense_shards(), kDenseElements, 4, 1, {.bucket_bytes = 64, .zero = zero});
    for (int r = 0; r < 4; ++r) {
      EXPECT_EQ(p[size_t(r)].owned, want[size_t(r)]) << "zero " << zero << " rank " << r;
      EXPECT_EQ(p[size_t(r)].owned_elements, 160);
      EXPECT_EQ(p[size_t(r)].largest_bytes, 128u * 4);
      // ZeRO-2 holds the owned chunks plus the largest padded bucket (128)
      // while it is reduced: 288 of 640; ZeRO-1 the whole padded buffer.
      EXPECT_EQ(p[size_t(r)].held, zero == 2 ? 160 + 128 : 640);
    }
  }
  // dp 3: lcm(3, 128) = 384, chunks of 128: rank 0 owns every real element,
  // ranks 1 and 2 only padding; each is charged 5 x 128 = 640 and ZeRO-2
  // holds 640 + 384 of the 5 x 384 = 1920.
  const std::vector<Plan> p3 = plans(dense_shards(), kDenseElements, 3, 1, {.bucket_bytes = 64, .zero = 2});
  for (int r = 0; r < 3; ++r) {
    const std::vector<Range> want3 =
        r == 0 ? std::vector<Range>{{0, 36}, {36, 16}, {52, 16}, {68, 16}, {84, 16}} : std::vector<Range>{};
    EXPECT_EQ(p3[size_t(r)].owned, want3) << "dp 3 rank " << r;
    EXPECT_EQ(p3[size_t(r)].owned_elements, 640);
    EXPECT_EQ(p3[size_t(r)].held, 640 + 384);
  }
  // One bucket of everything, padded to 128: rank 1 owns [32, 64); ZeRO-2's
  // held figure (32 + 128) is capped at the padded buffer, 128.
  const std::vector<Plan> one = plans(dense_shards(), kDenseElements, 4, 1, {.zero = 2});
  EXPECT_EQ(one[1].owned, (std::vector<Range>{{32, 32}}));
  EXPECT_EQ(one[1].held, 128);
  // Without ZeRO nothing is padded (every bucket whole, 100 elements held).
  const std::vector<Plan> none = plans(dense_shards(), kDenseElements, 4, 1, {.bucket_bytes = 64});
  EXPECT_EQ(none[3].owned_elements, kDenseElements);
  EXPECT_EQ(none[3].held, kDenseElements);
  EXPECT_EQ(none[3].largest_bytes, 36u * 4);
}

TEST(DataParallelZero, ExpertBucketsArePaddedAndChunkedOverEdp) {
  // dp 4 x ep 2: the mesh puts ep fastest, so rank = ep + 2·edp, and edp has
  // 2 members. Buckets (25 MB): [76,+4) over dp and [0,+52) over dp, padded
  // to lcm(4, 128) = 128 (chunks of 32); the experts [52,+24) over edp,
  // padded to lcm(2, 128) = 128 (chunks of 64):
  //   rank 0: [0,+32) [52,+24) [76,+4); rank 1: [32,+20) [52,+24) (edp 0);
  //   ranks 2 and 3 (edp 1): padding only.
  // Every rank is charged 32 + 64 + 32 = 128; ZeRO-2 holds 128 + 128 of 384.
  const collectives::DeviceMesh mesh({.ep = 2, .dp = 4});
  const std::vector<Plan> p = plans(moe_shards(), kMoeElements, 4, 2, {.zero = 2});
  const std::vector<std::vector<Range>> want{{{0, 32}, {52, 24}, {76, 4}}, {{32, 20}, {52, 24}}, {}, {}};
  for (int r = 0; r < 4; ++r) {
    ASSERT_EQ(mesh.coords(r).ep, r % 2);
    ASSERT_EQ(mesh.coords(r).edp, r / 2);
    EXPECT_EQ(p[size_t(r)].owned, want[size_t(r)]) << r;
    EXPECT_EQ(p[size_t(r)].owned_elements, 128);
    EXPECT_EQ(p[size_t(r)].held, 128 + 128);
  }
}

// ---- finish_grads: the owned gradients hold the dp average -----------------

// Rank r's gradient element i before the reduction: (r + 1)(i + 1) / 4. Every
// sum and mean below is a multiple of 1/16 under 2^12: exact in fp32, so the
// comparisons use tolerance 0.
float input_grad(int rank, int64_t i) { return float(rank + 1) * float(i + 1) * 0.25f; }

// What element i of rank r must hold after finish_grads, by hand: the mean
// over the dp ranks; for an expert element the sum over the ranks holding the
// same experts (same ep coordinate r % ep), divided by dp.
double want_grad(int rank, int64_t i, int dp, int ep, bool expert) {
  double sum = 0;
  for (int q = 0; q < dp; ++q)
    if (!expert || q % ep == rank % ep) sum += input_grad(q, i);
  return sum / dp;
}

struct ReduceCase {
  bool moe;
  int dp, ep, zero;
  bool overlap;
};

std::string reduce_name(const ::testing::TestParamInfo<ReduceCase>& info) {
  const ReduceCase& c = info.param;
  return std::string(c.moe ? "moe" : "dense") + "_dp" + std::to_string(c.dp) + "_ep" + std::to_string(c.ep) +
         "_zero" + std::to_string(c.zero) + (c.overlap ? "_overlap" : "_after");
}

// ZeRO-2: the owned chunks of the dp ranks tile every bucket exactly once
// per group (experts: once per ep coordinate); `checked` elements were compared.
template <typename IsExpert>
void expect_owned_tiling(const std::vector<std::vector<Range>>& owned, int64_t n, int ep, IsExpert is_expert,
                         int64_t checked) {
  std::vector<int> times(size_t(n), 0);
  for (const auto& ranges : owned)
    for (const Range& o : ranges)
      for (int64_t i = o.begin; i < o.end(); ++i) ++times[size_t(i)];
  int64_t expert_elements = 0;
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_EQ(times[size_t(i)], is_expert(i) ? ep : 1) << "element " << i;
    expert_elements += is_expert(i);
  }
  EXPECT_EQ(checked, n + (ep - 1) * expert_elements);
}

class DataParallelReduce : public ::testing::TestWithParam<ReduceCase> {};

TEST_P(DataParallelReduce, OwnedGradientsAreTheDataParallelMean) {
  const ReduceCase c = GetParam();
  const std::vector<ShardSpec> shards = c.moe ? moe_shards() : dense_shards();
  const int64_t n = c.moe ? kMoeElements : kDenseElements;
  const std::vector<Range> experts = expert_ranges(shards);
  auto is_expert = [&](int64_t i) {
    return c.ep > 1 && std::any_of(experts.begin(), experts.end(), [&](const Range& e) { return e.contains(i); });
  };
  std::vector<std::vector<float>> got(size_t(c.dp)), want(size_t(c.dp));
  std::vector<std::vector<Range>> owned(size_t(c.dp));
  on_mesh(c.dp, c.ep, [&](Device& dev, const collectives::DeviceMesh& mesh) {
    const int r = dev.rank();
    std::vector<float> grads(static_cast<size_t>(n));
    const collectives::ProcessGroup dp_group = mesh.group(r, "dp");
    const collectives::ProcessGroup edp_group = mesh.group(r, "edp");
    DataParallel::ExpertGrads eg;
    if (c.ep > 1) eg = {&edp_group, experts};
    DataParallel d(dev, dp_group, grads, backward_ready_order(shards),
                   {.bucket_bytes = 64, .overlap = c.overlap, .zero = c.zero}, eg);
    for (int step = 0; step < 2; ++step) {  // the plan and the counters are reused across steps
      d.begin_step();
      for (int64_t i = 0; i < n; ++i) grads[size_t(i)] = input_grad(r, i) * float(step + 1);
      // Announce in backward order, each range in two pieces.
      for (const Range& g : backward_ready_order(shards)) {
        d.grads_ready(g.begin, g.size / 2);
        d.grads_ready(g.begin + g.size / 2, g.size - g.size / 2);
      }
      d.finish_grads();
    }
    // Step 2 doubled the inputs: the mean doubles too.
    std::vector<float>& g = got[size_t(r)];
    std::vector<float>& w = want[size_t(r)];
    // ZeRO 0/1 all-reduce every element; ZeRO-2 only the owned chunks.
    const std::vector<Range> check = c.zero == 2 ? d.owned() : std::vector<Range>{{0, n}};
    for (const Range& o : check) {
      for (int64_t i = o.begin; i < o.end(); ++i) {
        g.push_back(grads[size_t(i)]);
        w.push_back(float(2 * want_grad(r, i, c.dp, c.ep, is_expert(i))));
      }
    }
    owned[size_t(r)] = d.owned();
  });
  int64_t checked = 0;
  for (int r = 0; r < c.dp; ++r) {
    const ::testing::AssertionResult same = shardlab::testing::all_close(got[size_t(r)], want[size_t(r)], 0.0);
    std::printf("  %s rank %d: %zu elements checked, %s\n", reduce_name({c, 0}).c_str(), r, got[size_t(r)].size(),
                same.message());
    EXPECT_TRUE(same) << "rank " << r;
    checked += int64_t(got[size_t(r)].size());
  }
  if (c.zero == 2) expect_owned_tiling(owned, n, c.ep, is_expert, checked);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, DataParallelReduce,
    ::testing::Values(ReduceCase{false, 4, 1, 0, true}, ReduceCase{false, 4, 1, 1, true},
                      ReduceCase{false, 4, 1, 2, true}, ReduceCase{false, 4, 1, 2, false},
                      ReduceCase{false, 2, 1, 1, false}, ReduceCase{true, 4, 2, 0, true},
                      ReduceCase{true, 4, 2, 1, false}, ReduceCase{true, 4, 2, 2, true},
                      ReduceCase{true, 4, 4, 2, true}),
    reduce_name);

}  // namespace
}  // namespace shardlab::parallel
