// MoE under tensor parallelism: route -> dispatch -> experts -> combine.
// The router is replicated (every rank routes the same full rows to the same
// experts, bit for bit); each expert's MLP is split like the dense MLP, and
// one all-reduce of all expert outputs (M,C) completes them before the biases
// and the combine. Shapes use the letters declared in dims.h.
//
// The route, expert and backward pieces are shared with expert parallelism
// (expert/ep_dispatch.cc), which only adds the token exchange around the experts.
#include <algorithm>
#include <cmath>
#include <vector>

#include "model/kernels.h"
#include "model/kernels_llama.h"
#include "model/parallel/expert/moe.h"
#include "model/parallel/shard_layers.h"

namespace shardlab::parallel {

using model::BlockView;
using model::Exec;
using model::GPTConfig;
using model::MlpView;

namespace coll = collectives;
using model::shifted;

namespace {

// A phantom run has no router logits; its routing is an assumption, stated
// in the report. Uniform (zipf 0): a token's experts spread as evenly as its
// groups allow (GPTConfig::moe_groups G, moe_group_top_k M; 1 and 1 without
// group-limited routing), as a balanced router spreads them: token n takes
// the M groups (n + ⌊i·G/M⌋) mod G, i < M, and in each, K/M experts
// ⌊j·E/(G·K/M)⌋ apart, j < K/M, from offset ⌊n/⌊G/M⌋⌋ mod E/G. Without groups
// that is experts (n + ⌊j·E/K⌋) mod E. Every expert gets N·K/E assignments
// when E·G divides N·K·M; where the experts sit (which ranks and nodes a
// token reaches) is what DeepEP's dispatcher pays for (ep_node_dispatch.h). Zipf s > 0: token n's first choice
// is the expert at quantile (n + 0.5)/N of p(e) ~ 1/(e+1)^s, its k-th
// (first + k) mod E, so the load is skewed towards the low experts as a
// power law. Slots are numbered per expert in token order and capped as
// router_forward caps them. Returns the aux loss (0: no values). `filled`
// (E) is scratch.
int32_t zipf_expert(int64_t n, int64_t N, int E, double s) {
  double total = 0;
  for (int e = 0; e < E; ++e) total += std::pow(e + 1.0, -s);
  const double u = (static_cast<double>(n) + 0.5) / static_cast<double>(N) * total;
  double acc = 0;
  for (int e = 0; e < E; ++e) {
    acc += std::pow(e + 1.0, -s);
    if (u < acc) return e;
  }
  return E - 1;
}

int32_t spread_expert(int64_t n, int k, int E, int K, int G, int M) {
  const int Kg = K / M, Eg = E / G, i = k / Kg, j = k % Kg;
  const int64_t g = (n + int64_t{i} * G / M) % G, base = n / std::max(1, G / M);
  return static_cast<int32_t>(g * Eg + (base + int64_t{j} * Eg / Kg) % Eg);
}

float phantom_route(int32_t* expert, int32_t* slot, int64_t* filled, int64_t N, int E, int K,
                    double capacity_factor, double zipf, int G, int M) {
  const int64_t cap = model::expert_capacity(N, E, K, capacity_factor);
  std::fill(filled, filled + E, 0);
  for (int64_t i = 0; i < N * K; ++i) {
    const int64_t n = i / K, k = i % K;
    const auto e = zipf > 0 ? static_cast<int32_t>((zipf_expert(n, N, E, zipf) + k) % E)
                            : spread_expert(n, int(k), E, K, G, M);
    expert[i] = e;
    slot[i] = filled[e] < cap ? static_cast<int32_t>(filled[e]) : -1;
    ++filled[e];
  }
  return 0.0f;
}
// Where a forward's routing lives: the layer's own buffers, or in a phantom
// run one scratch per device thread (moe_buffers.cc). A phantom run's
// routing is the same for every micro-batch (phantom_route: by position),
// and after the forward only kernels' math reads it, which a phantom run
// skips, so the micro-batches in flight need no copy each (at DeepSeek-V3's
// N 4096 and top-8, 512 KiB per MoE layer and micro-batch).
struct Routing {
  int32_t* expert;
  int32_t* slot;
  int64_t* src;
};

Routing routing_of(TpMoeActs& a, int64_t NK, bool phantom) {
  if (!phantom) return {a.expert.data(), a.slot.data(), a.src.data()};
  thread_local std::vector<int32_t> expert, slot;
  thread_local std::vector<int64_t> src;
  if (expert.size() < size_t(NK)) expert.resize(size_t(NK)), slot.resize(size_t(NK)), src.resize(size_t(NK));
  return {expert.data(), slot.data(), src.data()};
}


// The unsharded model routes the concatenation of the dp replicas' rows:
// gather every replica's per-expert counts (exact in fp32 below 2^24) so that
// f_i = (global count) / (N_global·K), computed as router_forward does, and
// replica d keeps an assignment only if (earlier replicas' count + its local
// slot) < ⌈F·N_global·K/E⌉. Slots arrive numbered locally (no capacity).
void route_globally(TpMoeActs& a, const Routing& r, int64_t N, const GPTConfig& config, const ExpertContext& c) {
  const Exec& ex = c.ex;
  const int E = config.n_expert, K = config.top_k;
  const coll::ProcessGroup& g = *c.capacity_group;
  const int dp = g.size(), me = g.rank();
  if (a.gathered.size() != size_t(dp) * E) a.gathered.assign_real(size_t(dp) * E, 0.0f);  // first step
  model::moe_expert_counts(a.counts.data(), r.expert, N, E, K);
  float* mine = a.gathered.data() + static_cast<int64_t>(me) * E;
  for (int e = 0; e < E; ++e) mine[e] = static_cast<float>(a.counts[e]);
  coll::all_gather(*c.dev, g, coll::ConstBuffer(mine, size_t(E)),
                   coll::Buffer(a.gathered.data(), size_t(dp) * E), c.on_compute());
  const int64_t N_global = N * dp;
  for (int e = 0; e < E; ++e) {
    int64_t earlier = 0, total = 0;
    for (int r = 0; r < dp; ++r) {
      const auto n = static_cast<int64_t>(a.gathered[int64_t(r) * E + e]);
      total += n;
      if (r < me) earlier += n;
    }
    a.earlier[e] = earlier;
    a.frac[e] = static_cast<float>(static_cast<double>(total) /
                                   (static_cast<double>(N_global) * K));
  }
  // The routing kernel, split by the counts' all-gather (sink.h), charged with moe.capacity.
  if (ex.math()) a.aux = model::moe_aux_loss(a.frac.data(), a.probs.data(), N, E, config.router);
  if (config.capacity_factor > 0) {
    const int64_t cap = model::expert_capacity(N_global, E, K, config.capacity_factor);
    a.stats.dropped = model::moe_apply_capacity(r.slot, r.expert, a.earlier.data(),
                                                cap, N, K);
  }
  ex.op("moe.capacity", OpCost{0, 2.0 * static_cast<double>(N * K) * ex.elem});
}

// ye (n) = Σ over the experts' TP group of each rank's partial outputs
// (Megatron's reduce_from_tensor_model_parallel_region, on the compute stream).
void reduce_expert_outputs(const ExpertContext& c, float* ye, int64_t n) {
  coll::all_reduce(*c.dev, *c.tp, coll::ConstBuffer(ye, static_cast<size_t>(n)),
                   coll::Buffer(ye, static_cast<size_t>(n)), coll::ReduceOp::kSum, c.on_compute());
}

}  // namespace

void tp_moe_route(TpMoeActs& a, const BlockView<float>& p, const float* inp, const ShardDims& d,
                  const GPTConfig& config, const ExpertContext& c) {
  const Exec& ex = c.ex;
  const int64_t N = d.moe_rows();
  const int C = d.C, E = config.n_expert, K = config.top_k;
  model::linear_forward(ex, "moe.router.fwd", a.logits.data(), inp, p.router, N, C, E);
  const bool global = c.global_routing();
  const double local_capacity = global ? 0.0 : config.capacity_factor;
  const Routing r = routing_of(a, N * K, !ex.math());
  // Local phantom routing: its plan, once per thread for every layer and micro-batch.
  const int G = config.moe_groups, Mg = config.moe_group_top_k;
  const PhantomPlan* known =
      !ex.math() && !global ? &phantom_plan(N, E, K, local_capacity, c.phantom_zipf, G, Mg) : nullptr;
  if (ex.math()) {  // phantom_route is its stand-in (sink.h)
    a.aux = model::router_forward(a.probs.data(), r.expert, r.slot, a.gates.data(),
                                  a.frac.data(), a.logits.data(), p.router_bias, N, E,
                                  K, local_capacity, model::RouterSpec::of(config));
  } else if (known) {
    std::copy(known->filled.begin(), known->filled.end(), a.counts.data());
    a.aux = 0.0f;
  } else {
    a.aux = phantom_route(r.expert, r.slot, a.counts.data(), N, E, K, local_capacity,
                          c.phantom_zipf, G, Mg);
  }
  ex.op("moe.topk.fwd", model::router_forward_cost(N, E, K, ex.elem, model::RouterSpec::of(config)));
  a.stats.dropped = 0;
  if (global) {
    route_globally(a, r, N, config, c);
  } else if (model::average_fractions_over_replicas(a.frac.data(), E, config, ex) &&
             ex.math()) {  // split kernel (sink.h)
    // As in model/layers.cc: every TP rank averages the same fractions over its dp group.
    a.aux = model::moe_aux_loss(a.frac.data(), a.probs.data(), N, E, config.router);
  }
  if (known) {
    std::copy(known->offsets.begin(), known->offsets.end(), a.offsets.data());
    a.M = known->M;
    a.routed = known->src.data();
  } else {
    a.M = model::moe_plan(r.src, a.offsets.data(), r.expert, r.slot, N, E, K);
    a.routed = r.src;
  }
  if (!global) a.stats.dropped = N * K - a.M;
}

PhantomPlan plan_phantom_routing(int64_t N, int E, int K, double capacity, double zipf, int groups,
                                 int group_top_k) {
  PhantomPlan p{N, E, K, capacity, zipf, groups, group_top_k, std::vector<int64_t>(size_t(E)),
                std::vector<int64_t>(size_t(E) + 1), 0, std::vector<int64_t>(size_t(N * K))};
  std::vector<int32_t> expert(size_t(N * K)), slot(size_t(N * K));
  phantom_route(expert.data(), slot.data(), p.filled.data(), N, E, K, capacity, zipf, groups, group_top_k);
  p.M = model::moe_plan(p.src.data(), p.offsets.data(), expert.data(), slot.data(), N, E, K);
  p.src.resize(size_t(p.M));
  return p;
}

const PhantomPlan& phantom_plan(int64_t N, int E, int K, double capacity, double zipf, int groups,
                                int group_top_k) {
  thread_local PhantomPlan last;
  if (!(last.N == N && last.E == E && last.K == K && last.capacity == capacity && last.zipf == zipf &&
        last.groups == groups && last.group_top_k == group_top_k))
    last = plan_phantom_routing(N, E, K, capacity, zipf, groups, group_top_k);
  return last;
}

void tp_experts_forward(float* ye, float* fc, float* fc_gelu,
                        const std::vector<MlpView<float>>& experts, const float* xe,
                        const int64_t* offsets, int n, int Fl, const ShardDims& d, const ExpertContext& c,
                        bool swiglu) {
  const int C = d.C, W = swiglu ? 2 * Fl : Fl;
  // column-parallel c_fc (SwiGLU: gate and up), row-parallel c_proj (partial sums)
  // Grouped kernels (model/sink.h Exec::Grouped): one launch for all experts.
  bool launched = false;
  for (int e = 0; e < n; ++e) {
    const int64_t r0 = offsets[e], rows = offsets[e + 1] - r0;
    tp_mlp_partial_forward(shifted(ye, r0 * C), shifted(fc, r0 * W), shifted(fc_gelu, r0 * Fl),
                           experts[e], shifted(xe, r0 * C), rows, C, Fl, c.ex.expert_of_group(rows, launched),
                           swiglu);
  }
  if (!d.experts_whole)
    reduce_expert_outputs(c, ye, offsets[n] * C);  // whole experts: complete already
  if (swiglu) return;  // no biases
  launched = false;
  for (int e = 0; e < n; ++e) {
    const int64_t r0 = offsets[e], rows = offsets[e + 1] - r0;
    add_bias_rows(shifted(ye, r0 * C), experts[e].c_proj.bias, rows, C, "mlp.c_proj.bias.fwd",
                  c.ex.expert_of_group(rows, launched));
  }
}

int64_t experts_activation_elements(const TpMoeActs& a, const ShardDims& d, const GPTConfig& config) {
  // With EP the experts ran the R rows they received (TpMoeActs::saved_elements).
  return a.ep.row_elems > 0 ? a.ep.R * expert_fl(d, config) : static_cast<int64_t>(a.fc_gelu.size());
}

void tp_experts_activation_forward(TpMoeActs& a, const ShardDims& d, const GPTConfig& config, const Exec& any) {
  const Exec ex = any.te_linear();  // as tp_mlp_partial_forward runs it
  const int Fl = expert_fl(d, config);
  const bool swiglu = config.is_llama();
  const int W = swiglu ? 2 * Fl : Fl;
  // The local experts' rows, expert-major: with EP the rows received.
  const Buf<int64_t>& offsets = a.ep.row_elems > 0 ? a.ep.offsets : a.offsets;
  bool launched = false;  // one grouped kernel
  for (size_t e = 0; e + 1 < offsets.size(); ++e) {
    const int64_t r0 = offsets[e], rows = offsets[e + 1] - r0;
    const Exec member = ex.expert_of_group(rows, launched);
    if (swiglu)
      model::swiglu_forward(member, "mlp.swiglu.fwd", shifted(a.fc_gelu.data(), r0 * Fl),
                            shifted(a.fc.data(), r0 * W), rows, Fl);
    else
      model::gelu_forward(member, "mlp.gelu.fwd", shifted(a.fc_gelu.data(), r0 * Fl), shifted(a.fc.data(), r0 * W),
                          rows * Fl);
  }
}

void tp_shared_experts_forward(float* out, TpMoeActs& a, const BlockView<float>& p, const float* inp,
                               const ShardDims& d, const GPTConfig& config, const ExpertContext& c) {
  // With whole experts the block runs the shared ones on the gathered rows (block.cc).
  if (config.n_shared_expert == 0 || d.experts_whole) return;
  const Exec& ex = c.ex;
  const int64_t N = d.N();
  const int C = d.C;
  const bool swiglu = config.is_llama();
  tp_mlp_partial_forward(a.shared_out.data(), a.shared_fc.data(), a.shared_fc_gelu.data(), p.shared, inp, N, C,
                         shared_fl(d, config), ex, swiglu);
  reduce_expert_outputs(c, a.shared_out.data(), N * C);
  if (!swiglu) add_bias_rows(a.shared_out.data(), p.shared.c_proj.bias, N, C, "moe.shared.c_proj.bias.fwd", ex);
  model::residual_forward(ex, "moe.shared.add", out, out, a.shared_out.data(), N * C);
}

void tp_shared_experts_backward(float* dexperts, const BlockView<float>& g, MoeScratch& s, const float* dout,
                                const TpMoeActs& a, const float* inp, const BlockView<float>& p, const ShardDims& d,
                                const GPTConfig& config, WeightGrads& wg, const Exec& ex) {
  if (config.n_shared_expert == 0 || d.experts_whole) return;  // block.cc's, as in the forward
  tp_mlp_backward(dexperts, g.shared, s.dfc.data(), s.dfc_gelu.data(), dout, inp, a.shared_fc.data(),
                  a.shared_fc_gelu.data(), p.shared, d.N(), d.C, shared_fl(d, config), wg, ex, config.is_llama());
}

void tp_experts_backward(float* dxe, const std::vector<MlpView<float>>& g, MoeScratch& s,
                         const float* dye, const float* xe, const float* fc, const float* fc_gelu,
                         const std::vector<MlpView<float>>& p, const int64_t* offsets, int n, int Fl,
                         const ShardDims& d, WeightGrads& wg, const Exec& ex, bool swiglu) {
  const int C = d.C, W = swiglu ? 2 * Fl : Fl;
  if (ex.math()) std::fill(dxe, dxe + offsets[n] * C, 0.0f);  // a handover (sink.h)
  bool launched = false;  // grouped kernels (model/sink.h Exec::Grouped)
  for (int e = 0; e < n; ++e) {
    const int64_t r0 = offsets[e], rows = offsets[e + 1] - r0;
    tp_mlp_backward(shifted(dxe, r0 * C), g[e], shifted(s.dfc.data(), r0 * W),
                    shifted(s.dfc_gelu.data(), r0 * Fl), shifted(dye, r0 * C), shifted(xe, r0 * C),
                    shifted(fc, r0 * W), shifted(fc_gelu, r0 * Fl), p[e], rows, C, Fl, wg,
                    ex.expert_of_group(rows, launched), swiglu);
  }
}

void tp_moe_combine_backward(MoeScratch& s, const float* dout, const TpMoeActs& a,
                             const ShardDims& d, const GPTConfig& config, const Exec& ex) {
  const int C = d.C, K = config.top_k;
  // ye and dout are complete on every rank: dgates is replicated
  if (ex.math()) {  // handovers (sink.h)
    std::fill(s.dye.begin(), s.dye.begin() + a.M * C, 0.0f);
    std::fill(s.dgates.begin(), s.dgates.begin() + d.moe_rows() * K, 0.0f);
  }
  model::moe_combine_backward(ex, "moe.combine.bwd", s.dye.data(), s.dgates.data(), dout,
                              a.ye.data(), a.gates.data(), a.src.data(), a.M, K, C);
}

void tp_moe_route_backward(float* dexperts, float* drouter, const BlockView<float>& g,
                           MoeScratch& s, float daux, const TpMoeActs& a, const float* inp,
                           const BlockView<float>& p, const ShardDims& d, const GPTConfig& config,
                           WeightGrads& wg, const Exec& ex) {
  model::moe_dispatch_backward(ex, "moe.dispatch.bwd", dexperts, s.dxe.data(), a.src.data(), a.M, config.top_k,
                               d.C);
  tp_moe_router_backward(drouter, g, s, daux, a, inp, p, d, config, wg, ex);
}

void tp_moe_router_backward(float* drouter, const BlockView<float>& g, MoeScratch& s, float daux,
                            const TpMoeActs& a, const float* inp, const BlockView<float>& p, const ShardDims& d,
                            const GPTConfig& config, WeightGrads& wg, const Exec& ex) {
  const int64_t N = d.moe_rows();
  const int C = d.C, E = config.n_expert, K = config.top_k;
  if (ex.math()) std::fill(s.dlogits.begin(), s.dlogits.begin() + N * E, 0.0f);  // a handover (sink.h)
  model::router_backward(ex, "moe.topk.bwd", s.dlogits.data(), s.dgates.data(), daux, a.probs.data(),
                         a.expert.data(), a.frac.data(), N, E, K, model::RouterSpec::of(config));
  linear_backward_split(drouter, g.router, nullptr, s.dlogits.data(), inp, p.router, N, C, E,
                        {"moe.router.dgrad", "moe.router.wgrad", false}, wg, ex);
  // aux-loss-free balancing's load signal (kernels_moe.h), replicated like the router
  if (config.router_bias()) model::router_bias_load(ex, "moe.bias_load", g.router_bias, a.expert.data(), N, E, K);
}

void tp_moe_dispatch(TpMoeActs& a, const float* inp, const ShardDims& d, const GPTConfig& config,
                     const Exec& ex) {
  model::moe_dispatch_forward(ex, "moe.dispatch.fwd", a.xe.data(), inp, a.src.data(), a.M,
                              config.top_k, d.C);
}

float tp_moe_combine(float* out, const TpMoeActs& a, const ShardDims& d, const GPTConfig& config,
                     const Exec& ex) {
  model::moe_combine_forward(ex, "moe.combine.fwd", out, a.ye.data(), a.gates.data(), a.src.data(),
                             d.moe_rows(), a.M, config.top_k, d.C);
  return a.aux;
}

float tp_moe_forward(float* out, TpMoeActs& a, const BlockView<float>& p, const float* inp,
                     const ShardDims& d, const GPTConfig& config, const ExpertContext& c) {
  const int E = config.n_expert;
  tp_moe_route(a, p, inp, d, config, c);
  tp_moe_dispatch(a, inp, d, config, c.ex);
  tp_experts_forward(a.ye.data(), a.fc.data(), a.fc_gelu.data(), p.experts, a.xe.data(),
                     a.offsets.data(), E, expert_fl(d, config), d, c, config.is_llama());
  for (int e = 0; e < E; ++e) a.stats.received[e] = a.offsets[e + 1] - a.offsets[e];
  const float aux = tp_moe_combine(out, a, d, config, c.ex);
  tp_shared_experts_forward(out, a, p, inp, d, config, c);
  return aux;
}

void tp_moe_backward(float* dexperts, float* drouter, const BlockView<float>& g, MoeScratch& s,
                     const float* dout, float daux, const TpMoeActs& a, const float* inp,
                     const BlockView<float>& p, const ShardDims& d, const GPTConfig& config,
                     WeightGrads& wg, const ExpertContext& c) {
  tp_shared_experts_backward(dexperts, g, s, dout, a, inp, p, d, config, wg, c.ex);
  tp_moe_combine_backward(s, dout, a, d, config, c.ex);
  // experts: partial input gradients (copy_to_tp_region's all-reduce is left
  // to the caller, after dispatch, on N rows instead of M)
  tp_experts_backward(s.dxe.data(), g.experts, s, s.dye.data(), a.xe.data(), a.fc.data(),
                      a.fc_gelu.data(), p.experts, a.offsets.data(), config.n_expert, expert_fl(d, config), d,
                      wg, c.ex, config.is_llama());
  tp_moe_route_backward(dexperts, drouter, g, s, daux, a, inp, p, d, config, wg, c.ex);
}

}  // namespace shardlab::parallel
