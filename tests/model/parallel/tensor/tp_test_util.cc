#include "tests/model/parallel/tensor/tp_test_util.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <random>
#include <span>

#include "collectives/collectives.h"
#include "collectives/group.h"
#include "collectives/mesh.h"
#include "model/gpt.h"
#include "model/parallel/data/data_parallel.h"
#include "model/parallel/sharded_gpt.h"
#include "runtime/cluster.h"
#include "support/compare.h"
#include "tests/model/test_models.h"

namespace shardlab::parallel::testing {

model::GPTConfig small_config(bool moe) {
  model::GPTConfig c;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_embd = 32;
  c.block_size = 16;
  c.vocab_size = 64;
  if (moe) {
    c.n_expert = 4;
    c.top_k = 2;
    c.moe_every = 2;
  }
  return c;
}

Batch make_batch(const model::GPTConfig& config, int B, int T, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> dist(0, config.vocab_size - 1);
  Batch b{{}, {}, B, T};
  for (int i = 0; i < B * T; ++i) {
    b.inputs.push_back(dist(rng));
    b.targets.push_back(dist(rng));
  }
  return b;
}

void RecordingSink::op(const char* name, const OpCost& cost) {
  dev_.run(dev_.compute(), name, cost);
}

void RecordingSink::saved(int64_t n) {
  r_.live_activations += n;
  r_.peak_activations = std::max(r_.peak_activations, r_.live_activations);
}

bool RecordingSink::average_over_replicas(float* data, int64_t n) {
  if (dp_.size() == 1) return false;
  collectives::all_reduce(dev_, dp_, collectives::Buffer(data, size_t(n)),
                          collectives::ReduceOp::kAvg);
  return true;
}

HardwareProfile test_profile(int devices) {
  HardwareProfile p = load_profile("a100-nvlink");
  p.nodes = 1;
  p.devices_per_node = std::max(devices, 1);
  return p;
}

// Overwrites the model's shards with their slices of the unsharded `global`.
void load_global(ShardedGPT& m, const model::ParamTable& table, const std::vector<float>& global) {
  for (const ShardSpec& s : m.shards()) {
    const int64_t base = table.at(s.name).offset;
    for (int64_t i = 0; i < s.numel; ++i) m.params()[s.offset + i] = global[base + global_index(s, i)];
  }
}

// What a rank reports after its passes: losses, shards, MoE stats, times.
void record(RankResult& r, ShardedGPT& m, Device& dev, const model::GPTConfig& config) {
  r.ce = m.ce_loss();
  r.aux = m.aux_loss();
  r.params.assign(m.params().begin(), m.params().end());
  r.grads.assign(m.grads().begin(), m.grads().end());
  r.shards = m.shards();
  r.moe.resize(static_cast<size_t>(config.n_layer));
  for (int l = 0; l < config.n_layer; ++l)
    if (const MoeStats* st = m.moe_stats(l)) r.moe[static_cast<size_t>(l)] = *st;
  dev.synchronize();
  r.end_time = dev.now();
  r.compute_busy = dev.compute().busy() - dev.compute().transfer_busy();
}

std::vector<RankResult> run_all(const model::GPTConfig& config, const Batch& batch,
                                const RunSpec& spec) {
  const collectives::DeviceMesh mesh({.tp = spec.tp, .ep = spec.ep, .dp = spec.dp});
  std::vector<RankResult> results(static_cast<size_t>(mesh.size()));
  const model::ParamTable table(config);
  ClusterOptions opts;
  opts.world_size = mesh.size();
  Cluster cluster(test_profile(mesh.size()), opts);
  cluster.run([&](Device& dev) {
    RankResult& r = results[static_cast<size_t>(dev.rank())];
    const collectives::ProcessGroup tp_group = mesh.group(dev.rank(), "tp");
    const collectives::ProcessGroup dp_group = mesh.group(dev.rank(), "dp");
    const collectives::ProcessGroup ep_group = mesh.group(dev.rank(), "ep");
    const collectives::ProcessGroup edp_group = mesh.group(dev.rank(), "edp");
    const int rows = batch.B / spec.dp, r0 = mesh.coords(dev.rank()).dp * rows;
    ModelGroups groups{&tp_group};
    if (spec.ep > 1) groups.ep = &ep_group;
    if (spec.global_routing) groups.capacity = &dp_group;
    ShardedGPT m(config, spec.seed, dev, groups, {.sequence_parallel = spec.sp});
    if (!spec.global_params.empty()) load_global(m, table, spec.global_params);
    // With EP the gradients go through DataParallel (expert buckets over edp,
    // small buckets so that several of each kind exist); otherwise one average.
    std::optional<DataParallel> dp;
    if (spec.ep > 1) {
      const DataParallelOptions o{.bucket_bytes = 8192, .overlap = false, .zero = spec.zero};
      dp.emplace(dev, dp_group, m.grads(), backward_ready_order(m.shards()), o,
                 DataParallel::ExpertGrads{&edp_group, expert_ranges(m.shards())});
      dp->begin_step();
    }
    RecordingSink sink(dev, r, dp_group);
    m.set_sink(&sink);
    m.zero_grad();
    for (int k = 0; k < spec.backwards; ++k) {
      const int64_t first = int64_t(r0) * batch.T;
      float loss =
          m.forward(batch.inputs.data() + first, batch.targets.data() + first, rows, batch.T);
      m.backward();
      if (spec.dp > 1)
        collectives::all_reduce(dev, dp_group, collectives::Buffer(&loss, 1),
                                collectives::ReduceOp::kAvg);
      r.losses.push_back(loss);
    }
    if (dp) {
      dp->finish_grads();
      // ZeRO-2 reduces each chunk onto its owner only: gather them back.
      if (dp->sharded_grads()) dp->gather_params(m.grads());
    } else if (spec.dp > 1) {
      collectives::all_reduce(dev, dp_group, collectives::Buffer(m.grads()),
                              collectives::ReduceOp::kAvg);
    }
    record(r, m, dev, config);
    r.ep_rank = mesh.coords(dev.rank()).ep;
  });
  return results;
}

std::vector<RankResult> run_tp(const model::GPTConfig& config, const Batch& batch,
                               const RunSpec& spec) {
  return holding_ranks(run_all(config, batch, spec), spec);
}

std::vector<RankResult> holding_ranks(std::vector<RankResult> results, const RunSpec& spec) {
  // tp, then ep are the fastest dimensions: ep coordinates 0..ep-1 of dp block 0 first
  results.resize(static_cast<size_t>(spec.tp * spec.ep));
  for (RankResult& r : results) {
    if (r.ep_rank == 0) continue;
    std::erase_if(r.shards, [](const ShardSpec& s) {
      return s.name.find(".mlp.experts.") == std::string::npos;
    });
  }
  return results;
}

std::vector<float> gather(const model::ParamTable& table, const std::vector<RankResult>& ranks,
                          bool grads, std::string* mismatch) {
  std::vector<float> out(static_cast<size_t>(table.numel()), 0.0f);
  std::vector<int> covered(out.size(), 0);
  for (size_t rank = 0; rank < ranks.size(); ++rank) {
    const RankResult& r = ranks[rank];
    const std::vector<float>& local = grads ? r.grads : r.params;
    for (const ShardSpec& s : r.shards) {
      const int64_t base = table.at(s.name).offset;
      for (int64_t i = 0; i < s.numel; ++i) {
        const size_t gi = static_cast<size_t>(base + global_index(s, i));
        const float v = local[static_cast<size_t>(s.offset + i)];
        if (covered[gi]++ > 0) {
          const bool same = std::memcmp(&v, &out[gi], sizeof v) == 0;
          if ((!s.tp_replicated || !same) && mismatch->empty()) {
            *mismatch = s.name +
                        (s.tp_replicated ? ": replicated copy differs on rank "
                                         : ": element held by two ranks, rank ") +
                        std::to_string(rank) + " local index " + std::to_string(i);
          }
        }
        out[gi] = v;
      }
    }
  }
  const auto missing = std::find(covered.begin(), covered.end(), 0);
  if (missing != covered.end() && mismatch->empty())
    *mismatch = "global element " + std::to_string(missing - covered.begin()) + " held by no rank";
  return out;
}

Diff max_tensor_diff(const model::ParamTable& table, const std::vector<float>& a,
                     const std::vector<float>& b) {
  Diff worst;
  if (a.size() != b.size()) return {INFINITY, INFINITY, "(sizes differ)"};
  for (const model::ParamSpec& p : table.specs()) {
    const std::span<const float> got(a.data() + p.offset, size_t(p.numel));
    const std::span<const float> want(b.data() + p.offset, size_t(p.numel));
    // compare.h counts NaN / Inf instead of letting std::max skip them.
    const shardlab::testing::Diff d = shardlab::testing::diff(got, want);
    if (!d.finite()) return {INFINITY, INFINITY, p.name + " (NaN or Inf)"};
    const double scale = shardlab::testing::max_abs_finite(want);
    const double rel = scale > 0 ? d.max_abs / scale : d.max_abs;
    if (rel >= worst.rel) worst = {rel, d.max_abs, p.name};
  }
  return worst;
}

std::vector<int> announce_counts(const RankResult& r) {
  std::vector<int> count(r.grads.size(), 0);
  for (const auto& [offset, size] : r.grads_ready) {
    for (int64_t i = offset; i < offset + size; ++i) {
      if (i < 0 || i >= int64_t(count.size())) return {};  // outside the buffer
      ++count[size_t(i)];
    }
  }
  return count;
}

Match match_reference(const model::GPTConfig& config, const Batch& batch, RunSpec spec) {
  model::GPT<float> ref(config, spec.seed);
  model::testing::randomize_params(ref, 99, 0.05);
  Match m;
  m.ref_loss = ref.forward(batch.inputs.data(), batch.targets.data(), batch.B, batch.T);
  m.ref_aux = ref.aux_loss();
  ref.zero_grad();
  ref.backward();
  spec.global_params.assign(ref.params().begin(), ref.params().end());
  m.all = run_all(config, batch, spec);
  m.holders = holding_ranks(m.all, spec);
  for (size_t rank = 0; rank < m.all.size(); ++rank) {
    const RankResult& r = m.all[rank];
    const float ref_loss[1] = {m.ref_loss};
    const shardlab::testing::Diff d =
        shardlab::testing::diff(std::span<const float>(r.losses.data(), 1), ref_loss);
    // A NaN or Inf loss is infinitely far off (std::max would skip a NaN).
    const double rel = d.finite() ? d.max_abs / std::abs(double(m.ref_loss)) : INFINITY;
    m.loss_rel = std::max(m.loss_rel, rel);
    EXPECT_EQ(r.live_activations, 0) << "saved/freed activations do not balance";
    // Every element announced exactly once: a gap plus an overlap would pass a sum.
    const std::vector<int> count = announce_counts(r);
    if (count.size() != r.grads.size()) {
      ADD_FAILURE() << "rank " << rank << ": grads_ready announced a range outside the gradient buffer";
      continue;
    }
    const auto bad = std::find_if(count.begin(), count.end(), [](int c) { return c != 1; });
    EXPECT_EQ(bad, count.end()) << "rank " << rank << ": local gradient element "
                                << (bad - count.begin()) << " announced " << (bad == count.end() ? 1 : *bad)
                                << " times by grads_ready (want exactly once)";
  }
  const std::vector<float> grads = gather(ref.table(), m.holders, true, &m.mismatch);
  const std::vector<float> ref_grads(ref.grads().begin(), ref.grads().end());
  m.grad = max_tensor_diff(ref.table(), grads, ref_grads);
  return m;
}

}  // namespace shardlab::parallel::testing
