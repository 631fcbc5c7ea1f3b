// ZeRO-3's plan, without training: which tensors form each unit (the tied wte
// follows wpe, or the head on a last stage), the buckets never span two
// units and split expert from other tensors, and the peak of gathered
// elements follows the gather and free rules (closed forms from the unit
// sizes, summed here from the layout's tensors).
#include <algorithm>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "model/config.h"
#include "model/parallel/data/data_parallel.h"
#include "model/parallel/data/fsdp.h"
#include "model/parallel/layout.h"
#include "model/parallel/sharded_gpt.h"
#include "model/train/parallel_plan.h"

namespace shardlab::parallel {
namespace {

model::GPTConfig config(int experts = 0) {
  model::GPTConfig c = model::preset("tiny");
  c.n_layer = 4, c.n_embd = 32, c.n_head = 4, c.block_size = 8, c.vocab_size = 32, c.batch_size = 2;
  c.n_expert = experts, c.top_k = 2;
  return c;
}

StagePlacement stage(const model::GPTConfig& c, int pp, int rank) {
  return StagePlacement{pp, 1, rank, {}}.resolved(c);
}

std::vector<ShardSpec> shards_of(const model::GPTConfig& c, const StagePlacement& place, int ep = 1, int ep_rank = 0) {
  return ShardLayout(c, 1, 0, rank_filter(c, place, ep, ep_rank)).shards();
}

// Elements of the local tensors whose name starts with one of `prefixes`.
int64_t numel(const std::vector<ShardSpec>& shards, const std::vector<std::string>& prefixes) {
  int64_t n = 0;
  for (const ShardSpec& s : shards)
    for (const std::string& p : prefixes)
      if (s.name.rfind(p, 0) == 0) n += s.numel;
  return n;
}

std::vector<int> ids(const std::vector<FsdpUnit>& units) {
  std::vector<int> out;
  for (const FsdpUnit& u : units) out.push_back(u.id);
  return out;
}

TEST(FsdpUnits, OnePerBlockTheEmbeddingsAndTheHead) {
  const model::GPTConfig c = config();
  const auto shards = shards_of(c, stage(c, 1, 0));
  const std::vector<FsdpUnit> units = fsdp_units(shards, c.n_layer);
  EXPECT_EQ(ids(units), (std::vector<int>{4, 3, 2, 1, 0, kEmbeddingsUnit}));
  EXPECT_EQ(units.front().elements(), numel(shards, {"transformer.ln_f."}));
  EXPECT_EQ(units.back().elements(), numel(shards, {"transformer.wte.", "transformer.wpe."}));
  EXPECT_EQ(units[1].elements(), numel(shards, {"transformer.h.3."}));
}

TEST(FsdpUnits, ALastStageKeepsItsTiedCopyInTheHead) {
  const model::GPTConfig c = config();
  const auto shards = shards_of(c, stage(c, 2, 1));  // blocks 2, 3, ln_f and wte's copy
  const std::vector<FsdpUnit> units = fsdp_units(shards, c.n_layer);
  EXPECT_EQ(ids(units), (std::vector<int>{4, 3, 2}));
  EXPECT_EQ(units.front().elements(), numel(shards, {"transformer.ln_f.", "transformer.wte."}));
  const FsdpPasses passes = fsdp_passes(hook_chunks(stage(c, 2, 1)), units, shards, c.n_layer);
  EXPECT_EQ(passes.chunks, (std::vector<std::vector<int>>{{2, 3, 4}}));
  EXPECT_EQ(passes.needs.at(4), (std::vector<int>{4}));
}

TEST(FsdpBuckets, NeverSpanUnitsAndSplitExperts) {
  const model::GPTConfig c = config(4);
  const auto shards = shards_of(c, stage(c, 1, 0), 2, 1);
  const std::vector<FsdpUnit> units = fsdp_units(shards, c.n_layer);
  const std::vector<Range> experts = expert_ranges(shards);
  const BucketPlan plan = fsdp_bucket_plan(units, experts);
  int64_t covered = 0, expert_elements = 0;
  for (size_t b = 0; b < plan.buckets.size(); ++b) {
    const Range& r = plan.buckets[b];
    covered += r.size;
    if (plan.expert[b]) expert_elements += r.size;
    int owners = 0;
    for (const FsdpUnit& u : units)
      for (const Range& ur : u.ranges) owners += ur.contains(r.begin) ? 1 : 0;
    EXPECT_EQ(owners, 1) << "bucket " << b;
    for (const FsdpUnit& u : units) {  // wholly inside its unit's ranges
      int64_t inside = 0;
      for (const Range& ur : u.ranges) inside += std::max<int64_t>(0, std::min(ur.end(), r.end()) - std::max(ur.begin, r.begin));
      EXPECT_TRUE(inside == 0 || inside == r.size) << "bucket " << b << " unit " << u.id;
    }
  }
  int64_t all = 0, expert_total = 0;
  for (const ShardSpec& s : shards) all += s.numel, expert_total += s.expert ? s.numel : 0;
  EXPECT_EQ(covered, all);
  EXPECT_EQ(expert_elements, expert_total);
  EXPECT_GT(expert_total, 0);
  EXPECT_GT(plan.buckets.size(), units.size()) << "MoE blocks split into expert and other buckets";
}

TEST(FsdpPeak, FollowsTheGatherAndFreeRules) {
  const model::GPTConfig c = config();
  const StagePlacement place = stage(c, 1, 0);
  const auto shards = shards_of(c, place);
  const std::vector<FsdpUnit> units = fsdp_units(shards, c.n_layer);
  const FsdpPasses passes = fsdp_passes(hook_chunks(place), units, shards, c.n_layer);
  const int64_t emb = numel(shards, {"transformer.wte.", "transformer.wpe."});
  const int64_t block = numel(shards, {"transformer.h.0."});
  const int64_t all = numel(shards, {"transformer."});
  ASSERT_GT(block, numel(shards, {"transformer.ln_f."}));
  // The head needs the embeddings' wte: they stay from the embedding to the head.
  EXPECT_EQ(passes.needs.at(c.n_layer), (std::vector<int>{c.n_layer, kEmbeddingsUnit}));
  EXPECT_EQ(fsdp_peak_gathered(passes, units, {true, true}), emb + 2 * block);
  EXPECT_EQ(fsdp_peak_gathered(passes, units, {true, false}), emb + block);
  EXPECT_EQ(fsdp_peak_gathered(passes, units, {false, true}), all);
}

// Megatron-core's disable_bucketing (chunk_bucket_plan), counted by hand: 8
// blocks over pp 2 x vpp 2, two blocks per virtual stage. Rank 0 holds
// chunk 0 (stage 0: blocks 0-1, wte, wpe) and chunk 1 (stage 2: blocks
// 4-5); backward finishes chunk 1 first, so its buckets are blocks 5, 4
// (one bucket: adjacent) and then blocks 1, 0 with the embeddings (one).
// Size-limited buckets as large would merge the two chunks into one.
// Rank 1 (stages 1 and 3: blocks 2-3, blocks 6-7, ln_f and the tied wte
// copy): every bucket inside one chunk, the last chunk first.
TEST(ChunkBuckets, OneBucketPerModelChunkNeverAcrossChunks) {
  model::GPTConfig c = config();
  c.n_layer = 8;
  const StagePlacement r0 = StagePlacement{2, 2, 0, {}}.resolved(c);
  const auto shards0 = shards_of(c, r0);
  const BucketPlan plan0 = chunk_bucket_plan(shards0, [&](const ShardSpec& s) { return train::model_chunk_of(r0, s); }, {});
  ASSERT_EQ(plan0.buckets.size(), 2u);
  EXPECT_EQ(plan0.buckets[0].size, numel(shards0, {"transformer.h.4.", "transformer.h.5."}));
  EXPECT_EQ(plan0.buckets[1].size,
            numel(shards0, {"transformer.h.0.", "transformer.h.1.", "transformer.wte.", "transformer.wpe."}));
  const BucketPlan merged = plan_buckets(backward_ready_order(shards0), {}, uint64_t(1) << 40, kGradElemBytes);
  EXPECT_EQ(merged.buckets.size(), 1u) << "the layout is contiguous: size-limited buckets span chunks";

  const StagePlacement r1 = StagePlacement{2, 2, 1, {}}.resolved(c);
  const auto shards1 = shards_of(c, r1);
  const BucketPlan plan1 = chunk_bucket_plan(shards1, [&](const ShardSpec& s) { return train::model_chunk_of(r1, s); }, {});
  const int64_t last = numel(shards1, {"transformer.h.6.", "transformer.h.7.", "transformer.ln_f.", "transformer.wte."});
  const int64_t first = numel(shards1, {"transformer.h.2.", "transformer.h.3."});
  int64_t seen_last = 0, seen_first = 0;
  for (const Range& b : plan1.buckets) {
    int64_t in_last = 0;
    for (const ShardSpec& s : shards1)
      if (b.contains(s.offset) && (s.layer >= 6 || s.layer < 0)) in_last += s.numel;
    EXPECT_TRUE(in_last == 0 || in_last == b.size) << "a bucket across chunks at " << b.begin;
    (in_last > 0 ? seen_last : seen_first) += b.size;
    EXPECT_EQ(seen_first > 0 ? seen_last : last, last) << "the last chunk's buckets come first";
  }
  EXPECT_EQ(seen_last, last);
  EXPECT_EQ(seen_first, first);
  EXPECT_GT(numel(shards1, {"transformer.wte."}), 0) << "the tied copy is held here";
}

}  // namespace
}  // namespace shardlab::parallel
