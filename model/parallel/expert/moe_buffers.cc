// Sizing of the MoE layers' buffers (moe_buffers.h) and their statistics.
#include "model/parallel/expert/moe_buffers.h"

#include <algorithm>

namespace shardlab::parallel {

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
  step.a2a_internode_sent_bytes += forward.a2a_internode_sent_bytes;
}

int64_t expert_rows_max(const ShardDims& d, const model::GPTConfig& config) {
  const int64_t N = d.moe_rows(), K = config.top_k;
  if (d.ep <= 1) return N * K;
  return d.ep * N * std::min<int64_t>(K, config.n_expert / d.ep);
}

int expert_fl(const ShardDims& d, const model::GPTConfig& config) {
  return config.moe_ffn_hidden() / (d.experts_whole ? 1 : d.tp);
}
int shared_fl(const ShardDims& d, const model::GPTConfig& config) { return config.shared_ffn_hidden() / d.tp; }
int fc_width(const model::GPTConfig& config, int Fl) { return config.is_llama() ? 2 * Fl : Fl; }

void TpMoeActs::resize(const ShardDims& d, const model::GPTConfig& config) {
  // The routed rows (N, or Nr with whole experts); the shared experts see all N.
  const int64_t N = d.moe_rows(), Ns = d.N(), C = d.C, Fl = expert_fl(d, config),
                Rx = expert_rows_max(d, config);
  const int64_t Fsl = shared_fl(d, config);
  const int E = config.n_expert, K = config.top_k, El = E / d.ep;
  for (auto* v : {&logits, &probs}) v->assign(N * E, 0);
  // A phantom run routes into one scratch per thread (moe.cc: routing_of).
  const int64_t NK = model::phantom_allocation() ? 0 : N * K;
  for (auto* v : {&expert, &slot}) v->assign(NK, 0);
  gates.assign(N * K, 0);
  src.assign(NK, 0);
  frac.assign_real(E, 0);  // real in phantom runs too: it goes through collectives
  for (auto* v : {&counts, &earlier}) v->assign(E, 0);
  offsets.assign(E + 1, 0);
  for (auto* v : {&xe, &ye}) v->assign(N * K * C, 0);
  fc.assign(Rx * fc_width(config, Fl), 0);
  fc_gelu.assign(Rx * Fl, 0);
  shared_fc.assign(Ns * fc_width(config, Fsl), 0);
  shared_fc_gelu.assign(Ns * Fsl, 0);
  shared_out.assign(Fsl > 0 ? Ns * C : 0, 0);
  gathered.clear();  // sized by the first global routing (the dp size)
  stats.received.assign(El, 0);
  if (d.ep <= 1) return;
  ep.send_rows.assign_real(E, 0);  // counts steer the exchange: real in phantom runs too
  ep.recv_rows.assign_real(E, 0);
  ep.send_elems.assign(size_t(d.ep), 0);
  ep.recv_elems.assign(size_t(d.ep), 0);
  ep.offsets.assign(El + 1, 0);
  // The expert-major order moves rows (permute_rows' math only): a phantom
  // run keeps none (at ep 64 and top-8 of 256 experts, Rx = 64·N·4 rows:
  // 8 MiB per layer and micro-batch in flight at N = 4096).
  if (model::phantom_allocation())
    ep.perm.clear();
  else
    ep.perm.assign(Rx, 0);
  ep.xl.assign(Rx * C, 0);
  ep.row_elems = C + fc_width(config, Fl) + Fl;
  ep.row_gemm_inputs = C + Fl;
  if (d.ep_nodes <= 0) return;
  const int64_t Nn = d.ep_nodes, En = int64_t{El} * (d.ep / d.ep_nodes);
  const int64_t sent_max = N * std::min<int64_t>(K, Nn), relayed_max = Nn * N * std::min<int64_t>(K, En);
  const bool phantom = model::phantom_allocation();  // counts only: no per-token lists
  node.send_counts.assign_real(Nn * (1 + En), 0);  // counts steer the exchange: real in phantom runs too
  node.recv_counts.assign_real(Nn * (1 + En), 0);
  node.rail_send.assign(size_t(Nn), 0);
  node.rail_recv.assign(size_t(Nn), 0);
  node.node_send.assign(size_t(d.ep / d.ep_nodes), 0);
  node.node_recv.assign(size_t(d.ep / d.ep_nodes), 0);
  node.tokens.assign(phantom ? 0 : sent_max, 0);
  node.token_offsets.assign(Nn + 1, 0);
  node.row_token.assign(phantom ? 0 : relayed_max, 0);
  node.row_slot.assign(phantom ? 0 : relayed_max, 0);
  node.row_gate.assign(relayed_max, 0);
  node.y.assign(relayed_max * C, 0);
  node.C = int(C);
}

int64_t TpMoeActs::saved_elements(bool fp8) const {
  const auto size = [](const auto& b) { return static_cast<int64_t>(b.size()); };
  const auto gemm_input = [&](int64_t n) { return fp8 ? (n + 1) / 2 : n; };
  int64_t n = size(logits) + size(probs) + size(gates) + size(ye) + size(shared_fc) + gemm_input(size(shared_fc_gelu));
  // With EP the experts keep their inputs and activations for the rows they
  // received in the last forward (xl, fc, fc_gelu); otherwise xe, fc, fc_gelu.
  const int64_t experts = ep.row_elems > 0
                              ? ep.R * (ep.row_elems - ep.row_gemm_inputs) + gemm_input(ep.R * ep.row_gemm_inputs)
                              : size(fc) + gemm_input(size(xe)) + gemm_input(size(fc_gelu));
  // DeepEP's dispatcher: the relay keeps the outputs and gates of the rows
  // it relayed (ye is unused).
  if (node.C > 0) return n - size(ye) + node.Rn * (node.C + 1) + experts;
  return n + experts;
}

void MoeScratch::resize(const ShardDims& d, const model::GPTConfig& config) {
  const int64_t N = d.moe_rows(), Ns = d.N(), C = d.C, Rx = expert_rows_max(d, config);
  const int64_t K = config.top_k;
  const int64_t Fl = expert_fl(d, config), Fsl = shared_fl(d, config);
  dfc.assign(std::max(Rx * fc_width(config, Fl), Ns * fc_width(config, Fsl)), 0);
  dfc_gelu.assign(std::max(Rx * Fl, Ns * Fsl), 0);
  dlogits.assign(N * config.n_expert, 0);
  dgates.assign(N * K, 0);
  dxe.assign(N * K * C, 0);
  dye.assign(N * K * C, 0);
  const int64_t Rep = d.ep > 1 ? Rx : 0;
  ep_xr.assign(Rep * C, 0);
  ep_yl.assign(Rep * C, 0);
  const int64_t Nn = d.ep_nodes, W = C + 2 * K;
  node_src.assign(Nn > 0 ? N * std::min<int64_t>(K, Nn) * W : 0, 0);
  node_relay.assign(Nn > 0 ? Nn * N * W : 0, 0);
}

}  // namespace shardlab::parallel
