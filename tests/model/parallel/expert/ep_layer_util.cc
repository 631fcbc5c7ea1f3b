#include "tests/model/parallel/expert/ep_layer_util.h"

#include <algorithm>

#include "collectives/group.h"
#include "collectives/mesh.h"
#include "model/layers.h"
#include "model/params.h"
#include "model/parallel/expert/ep_dispatch.h"
#include "model/parallel/layout.h"
#include "runtime/cluster.h"
#include "tests/model/parallel/tensor/tp_test_util.h"

namespace shardlab::parallel::testing {

namespace {

// This rank's slice (experts [e0, e1) of every MoE block) of the global params.
std::vector<float> local_params(const model::GPTConfig& config, const ShardLayout& layout,
                                const std::vector<float>& global) {
  const model::ParamTable table(config);
  std::vector<float> local(static_cast<size_t>(layout.numel()));
  for (const ShardSpec& s : layout.shards()) {
    const int64_t base = table.at(s.name).offset;
    for (int64_t i = 0; i < s.numel; ++i) local[s.offset + i] = global[base + global_index(s, i)];
  }
  return local;
}

// Outputs for every row, one record per dp rank.
LayerResult sized_result(const LayerRun& run) {
  LayerResult res;
  res.out.assign(run.x.size(), 0.0f);
  res.dinp.assign(run.x.size(), 0.0f);
  res.stats.resize(size_t(run.dp));
  res.compute_busy.resize(size_t(run.dp));
  res.end_time.resize(size_t(run.dp));
  return res;
}

}  // namespace

LayerResult run_moe_layer(const model::GPTConfig& config, const LayerRun& run) {
  const collectives::DeviceMesh mesh({.ep = run.ep, .dp = run.dp});
  const int C = config.n_embd, El = config.n_expert / run.ep;
  const int Bl = run.B / run.dp;
  const int64_t Nl = int64_t(Bl) * run.T;
  LayerResult res = sized_result(run);
  std::vector<float> aux(size_t(run.dp));
  ClusterOptions opts;
  opts.world_size = mesh.size();
  Cluster cluster(test_profile(mesh.size()), opts);
  cluster.run([&](Device& dev) {
    const int rank = dev.rank(), dp_rank = mesh.coords(rank).dp;
    const collectives::ProcessGroup tp = mesh.group(rank, "tp"), dp = mesh.group(rank, "dp");
    // ep = dp: the same members, so one group object (one sequence counter).
    const collectives::ProcessGroup ep = run.ep == run.dp ? dp : mesh.group(rank, "ep");
    LayoutFilter filter;
    filter.expert_begin = mesh.coords(rank).ep * El;
    filter.expert_end = filter.expert_begin + El;
    const ShardLayout layout(config, 1, 0, filter);
    std::vector<float> params = local_params(config, layout, run.params);
    std::vector<float> grads(params.size(), 0.0f);
    const model::BlockView<float> p = layout.view(params.data()).blocks[0];
    const model::BlockView<float> g = layout.view(grads.data()).blocks[0];
    const ShardDims d{{Bl, run.T, C, config.n_head}, 1, false, run.ep};
    TpMoeActs a;
    a.resize(d, config);
    MoeScratch s;
    s.resize(d, config);
    RankResult rr;
    RecordingSink sink(dev, rr, dp);
    ExpertContext c;
    c.dev = &dev;
    c.tp = &tp;
    c.ex = model::Exec::with(&sink);
    c.ep = &ep;
    c.capacity_group = &dp;
    const size_t first = size_t(dp_rank) * Nl * C;
    const float* x = run.x.data() + first;
    float* out = res.out.data() + first;
    aux[size_t(dp_rank)] = run.ep > 1 ? ep_moe_forward(out, a, s, p, x, d, config, c)
                                      : tp_moe_forward(out, a, p, x, d, config, c);
    std::vector<float> dexperts(size_t(Nl) * C, 0.0f), drouter(size_t(Nl) * C, 0.0f);
    const float daux = run.daux / static_cast<float>(run.dp);  // aux = mean of the ranks'
    auto backward = run.ep > 1 ? ep_moe_backward : tp_moe_backward;
    WeightGrads wg;  // immediate: B then W, as a fused backward
    backward(dexperts.data(), drouter.data(), g, s, run.dout.data() + first, daux, a, x, p, d,
             config, wg, c);
    for (int64_t i = 0; i < Nl * C; ++i) res.dinp[first + i] = dexperts[i] + drouter[i];
    res.stats[size_t(dp_rank)] = a.stats;
    dev.synchronize();
    res.end_time[size_t(dp_rank)] = dev.now();
    res.compute_busy[size_t(dp_rank)] = dev.compute().busy() - dev.compute().transfer_busy();
  });
  for (float v : aux) res.aux += v / static_cast<float>(run.dp);
  return res;
}

LayerResult reference_moe_layer(const model::GPTConfig& config, const LayerRun& run) {
  const model::ParamTable table(config);
  std::vector<float> params = run.params, grads(params.size(), 0.0f);
  const model::BlockView<float> p = model::make_view(table, params.data()).blocks[0];
  const model::BlockView<float> g = model::make_view(table, grads.data()).blocks[0];
  const model::Dims d{run.B, run.T, config.n_embd, config.n_head};
  model::MoeActs<float> a;
  a.resize(d.N(), d.C, config.n_expert, config.top_k);
  model::BlockScratch<float> s;
  s.resize(d, config);
  LayerResult res;
  res.out.assign(run.x.size(), 0.0f);
  res.dinp.assign(run.x.size(), 0.0f);
  res.aux = model::moe_forward(res.out.data(), a, p, run.x.data(), d.N(), config, model::Exec{});
  model::moe_backward(res.dinp.data(), g, s, run.dout.data(), run.daux, a, run.x.data(), p, d.N(),
                      config, model::Exec{});
  return res;
}

}  // namespace shardlab::parallel::testing
