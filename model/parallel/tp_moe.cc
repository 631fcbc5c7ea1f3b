// MoE under tensor parallelism: route -> dispatch -> experts -> combine.
// The router is replicated (every rank routes the same full rows to the same
// experts, bit for bit); each expert's MLP is split like the dense MLP, and
// one all-reduce of all expert outputs (M,C) completes them before the biases
// and the combine. Shapes use the letters declared in tp_layers.h.
#include <algorithm>
#include <vector>

#include "model/kernels.h"
#include "model/parallel/tp_layers.h"

namespace shardlab::parallel {

using model::BlockView;
using model::Exec;
using model::GPTConfig;

namespace {
// aux = E * sum_i f_i * P_i, P_i = mean over the N tokens of probs[:, i]
// (the same sums as model/layers.cc's moe_aux, so the bits match).
float moe_aux(const float* frac, const float* probs, int64_t N, int E) {
  std::vector<double> P(size_t(E), 0.0);
  for (int64_t t = 0; t < N; ++t)
    for (int e = 0; e < E; ++e) P[size_t(e)] += probs[t * E + e];
  double aux = 0;
  for (int e = 0; e < E; ++e) aux += double(frac[e]) * P[size_t(e)] / double(N);
  return static_cast<float>(E * aux);
}
}  // namespace

float tp_moe_forward(float* out, TpMoeActs& a, const BlockView<float>& p, const float* inp,
                     const TpDims& d, const GPTConfig& config, const TpContext& c) {
  const Exec& ex = c.ex;
  const int64_t N = d.N();
  const int C = d.C, E = config.n_expert, K = config.top_k, Fl = d.Fl();
  // route (replicated)
  model::linear_forward(a.logits.data(), inp, p.router, static_cast<const float*>(nullptr), N, C,
                        E);
  ex.op("moe.router.fwd", model::linear_forward_cost(N, C, E, false, ex.elem));
  a.aux = model::router_forward(a.probs.data(), a.expert.data(), a.slot.data(), a.gates.data(),
                                a.frac.data(), a.logits.data(), N, E, K, config.capacity_factor);
  ex.op("moe.topk.fwd", model::router_forward_cost(N, E, K, ex.elem));
  // Under data parallelism f_i must count the whole global batch (as in
  // model/layers.cc): every TP rank averages the same fractions over its dp group.
  if (ex.sink && ex.sink->average_over_replicas(a.frac.data(), E))
    a.aux = moe_aux(a.frac.data(), a.probs.data(), N, E);
  a.M = model::moe_plan(a.src.data(), a.offsets.data(), a.expert.data(), a.slot.data(), N, E, K);
  // dispatch
  model::moe_dispatch_forward(a.xe.data(), inp, a.src.data(), a.M, K, C);
  ex.op("moe.dispatch.fwd", model::moe_dispatch_cost(a.M, C, ex.elem));
  // experts: column-parallel c_fc, row-parallel c_proj (partial sums)
  for (int e = 0; e < E; ++e) {
    const int64_t r0 = a.offsets[e], rows = a.offsets[e + 1] - r0;
    tp_mlp_partial_forward(a.ye.data() + r0 * C, a.fc.data() + r0 * Fl, a.fc_gelu.data() + r0 * Fl,
                           p.experts[e], a.xe.data() + r0 * C, rows, C, Fl, ex);
  }
  reduce_from_tp_region_fwd(c, a.ye.data(), a.ye.data(), a.M * C);
  for (int e = 0; e < E; ++e) {
    const int64_t r0 = a.offsets[e], rows = a.offsets[e + 1] - r0;
    add_bias_rows(a.ye.data() + r0 * C, p.experts[e].c_proj.bias, rows, C, "mlp.c_proj.bias.fwd",
                  ex);
  }
  // combine
  model::moe_combine_forward(out, a.ye.data(), a.gates.data(), a.src.data(), N, a.M, K, C);
  ex.op("moe.combine.fwd", model::moe_combine_forward_cost(N, a.M, C, ex.elem));
  return a.aux;
}

void tp_moe_backward(float* dexperts, float* drouter, const BlockView<float>& g, TpScratch& s,
                     const float* dout, float daux, const TpMoeActs& a, const float* inp,
                     const BlockView<float>& p, const TpDims& d, const GPTConfig& config,
                     const TpContext& c) {
  const Exec& ex = c.ex;
  const int64_t N = d.N();
  const int C = d.C, E = config.n_expert, K = config.top_k, Fl = d.Fl();
  // combine (ye and dout are complete on every rank: dgates is replicated)
  std::fill(s.dye.begin(), s.dye.begin() + a.M * C, 0.0f);
  std::fill(s.dgates.begin(), s.dgates.begin() + N * K, 0.0f);
  model::moe_combine_backward(s.dye.data(), s.dgates.data(), dout, a.ye.data(), a.gates.data(),
                              a.src.data(), a.M, K, C);
  ex.op("moe.combine.bwd", model::moe_combine_backward_cost(a.M, C, ex.elem));
  // experts: partial input gradients (copy_to_tp_region's all-reduce is left
  // to the caller, after dispatch, on N rows instead of M)
  std::fill(s.dxe.begin(), s.dxe.begin() + a.M * C, 0.0f);
  for (int e = 0; e < E; ++e) {
    const int64_t r0 = a.offsets[e], rows = a.offsets[e + 1] - r0;
    tp_mlp_backward(s.dxe.data() + r0 * C, g.experts[e], s.dfc.data() + r0 * Fl,
                    s.dfc_gelu.data() + r0 * Fl, s.dye.data() + r0 * C, a.xe.data() + r0 * C,
                    a.fc.data() + r0 * Fl, a.fc_gelu.data() + r0 * Fl, p.experts[e], rows, C, Fl,
                    ex);
  }
  // dispatch
  model::moe_dispatch_backward(dexperts, s.dxe.data(), a.src.data(), a.M, K, C);
  ex.op("moe.dispatch.bwd", model::moe_dispatch_cost(a.M, C, ex.elem));
  // route (replicated)
  std::fill(s.dlogits.begin(), s.dlogits.begin() + N * E, 0.0f);
  model::router_backward(s.dlogits.data(), s.dgates.data(), daux, a.probs.data(), a.expert.data(),
                         a.frac.data(), N, E, K);
  ex.op("moe.topk.bwd", model::router_backward_cost(N, E, K, ex.elem));
  model::linear_backward(drouter, g.router, static_cast<float*>(nullptr), s.dlogits.data(), inp,
                         p.router, N, C, E);
  ex.op("moe.router.bwd", model::linear_backward_cost(N, C, E, false, ex.elem));
}

}  // namespace shardlab::parallel
