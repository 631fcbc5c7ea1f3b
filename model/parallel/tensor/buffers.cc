// Activation and scratch sizing for the tensor-parallel blocks (tensor/layers.h).
#include <algorithm>

#include "model/parallel/expert/moe.h"
#include "model/parallel/tensor/layers.h"

namespace shardlab::parallel {

void TpBlockActs::resize(const TpDims& d, const model::GPTConfig& config, bool moe_block) {
  const int64_t N = d.N(), Nr = d.rows(), C = d.C, Cl = d.Cl(), Fl = d.Fl();
  for (auto* v : {&ln1, &ln2, &attproj, &res1, &mlp_out, &res2}) v->assign(Nr * C, 0);
  for (auto* v : {&ln1_mean, &ln1_rstd, &ln2_mean, &ln2_rstd}) v->assign(Nr, 0);
  qkv.assign(N * 3 * Cl, 0);
  att.assign(d.att_elements(), 0);
  atty.assign(N * Cl, 0);
  fc.clear();
  fc_gelu.clear();
  if (!moe_block) {
    fc.assign(N * Fl, 0);
    fc_gelu.assign(N * Fl, 0);
    return;
  }
  moe.resize(d, config);
}

void add_moe_stats(MoeStepStats& step, int layer, const MoeStats& forward) {
  if (step.layer != layer || step.received.size() != forward.received.size()) {
    step.layer = layer;
    step.received.assign(forward.received.size(), 0);
  }
  step.expert_begin = forward.expert_begin;
  for (size_t e = 0; e < forward.received.size(); ++e) step.received[e] += forward.received[e];
  step.dropped += forward.dropped;
  step.a2a_sent_bytes += forward.a2a_sent_bytes;
  step.a2a_recv_bytes += forward.a2a_recv_bytes;
}

int64_t expert_rows_max(const TpDims& d, const model::GPTConfig& config) {
  const int64_t N = d.N(), K = config.top_k;
  if (d.ep <= 1) return N * K;
  return d.ep * N * std::min<int64_t>(K, config.n_expert / d.ep);
}

void TpMoeActs::resize(const TpDims& d, const model::GPTConfig& config) {
  const int64_t N = d.N(), C = d.C, Fl = d.Fl(), Rx = expert_rows_max(d, config);
  const int E = config.n_expert, K = config.top_k, El = E / d.ep;
  for (auto* v : {&logits, &probs}) v->assign(N * E, 0);
  for (auto* v : {&expert, &slot}) v->assign(N * K, 0);
  gates.assign(N * K, 0);
  src.assign(N * K, 0);
  frac.assign_real(E, 0);  // real in phantom runs too: it goes through collectives
  for (auto* v : {&counts, &earlier}) v->assign(E, 0);
  offsets.assign(E + 1, 0);
  for (auto* v : {&xe, &ye}) v->assign(N * K * C, 0);
  for (auto* v : {&fc, &fc_gelu}) v->assign(Rx * Fl, 0);
  gathered.clear();  // sized by the first global routing (the dp size)
  stats.received.assign(El, 0);
  if (d.ep <= 1) return;
  ep.send_rows.assign_real(E, 0);  // counts steer the exchange: real in phantom runs too
  ep.recv_rows.assign_real(E, 0);
  ep.send_elems.assign(size_t(d.ep), 0);
  ep.recv_elems.assign(size_t(d.ep), 0);
  ep.offsets.assign(El + 1, 0);
  ep.perm.assign(Rx, 0);
  ep.xl.assign(Rx * C, 0);
  ep.row_elems = C + 2 * Fl;
}

int64_t TpBlockActs::saved_elements() const {
  int64_t n = 0;
  for (const Buf<float>* b :
       {&ln1, &ln2, &ln1_mean, &ln1_rstd, &ln2_mean, &ln2_rstd, &qkv, &att, &atty, &attproj,
        &res1, &fc, &fc_gelu, &mlp_out, &res2, &moe.logits, &moe.probs, &moe.gates, &moe.ye}) {
    n += static_cast<int64_t>(b->size());
  }
  // With EP the experts keep their inputs and activations for the rows they
  // received in the last forward (xl, fc, fc_gelu); otherwise xe, fc, fc_gelu.
  if (moe.ep.row_elems > 0) return n + moe.ep.R * moe.ep.row_elems;
  for (const Buf<float>* b : {&moe.xe, &moe.fc, &moe.fc_gelu}) n += static_cast<int64_t>(b->size());
  return n;
}

void TpScratch::resize(const TpDims& d, const model::GPTConfig& config) {
  const int64_t N = d.N(), Nr = d.rows(), C = d.C, Cl = d.Cl(), Fl = d.Fl();
  const int64_t K = config.is_moe() ? config.top_k : 0;
  for (auto* v : {&full_in, &full_dout, &partial, &rep, &moe_out}) v->assign(N * C, 0);
  for (auto* v : {&dres1, &dln}) v->assign(Nr * C, 0);
  datty.assign(N * Cl, 0);
  dqkv.assign(N * 3 * Cl, 0);
  const int64_t rows = std::max(N, config.is_moe() ? expert_rows_max(d, config) : 0);
  dfc.assign(rows * Fl, 0);
  dfc_gelu.assign(rows * Fl, 0);
  dlogits.assign(N * config.n_expert, 0);
  dgates.assign(N * K, 0);
  dxe.assign(N * K * C, 0);
  dye.assign(N * K * C, 0);
  const int64_t Rx = d.ep > 1 ? expert_rows_max(d, config) : 0;
  ep_xr.assign(Rx * C, 0);
  ep_yl.assign(Rx * C, 0);
}

}  // namespace shardlab::parallel
