// Activation and scratch sizing for the tensor-parallel blocks (tp_layers.h).
#include <algorithm>

#include "model/parallel/tp_layers.h"

namespace shardlab::parallel {

void TpBlockActs::resize(const TpDims& d, const model::GPTConfig& config, bool moe_block) {
  const int64_t N = d.N(), Nr = d.rows(), C = d.C, Cl = d.Cl(), Fl = d.Fl();
  for (auto* v : {&ln1, &ln2, &attproj, &res1, &mlp_out, &res2}) v->assign(Nr * C, 0);
  for (auto* v : {&ln1_mean, &ln1_rstd, &ln2_mean, &ln2_rstd}) v->assign(Nr, 0);
  qkv.assign(N * 3 * Cl, 0);
  att.assign(static_cast<int64_t>(d.B) * d.NHl() * d.T * d.T, 0);
  atty.assign(N * Cl, 0);
  fc.clear();
  fc_gelu.clear();
  if (!moe_block) {
    fc.assign(N * Fl, 0);
    fc_gelu.assign(N * Fl, 0);
    return;
  }
  const int E = config.n_expert, K = config.top_k;
  moe.logits.assign(N * E, 0);
  moe.probs.assign(N * E, 0);
  moe.expert.assign(N * K, 0);
  moe.slot.assign(N * K, 0);
  moe.gates.assign(N * K, 0);
  moe.frac.assign(E, 0);
  moe.src.assign(N * K, 0);
  moe.offsets.assign(E + 1, 0);
  moe.xe.assign(N * K * C, 0);
  moe.ye.assign(N * K * C, 0);
  moe.fc.assign(N * K * Fl, 0);
  moe.fc_gelu.assign(N * K * Fl, 0);
}

int64_t TpBlockActs::saved_elements() const {
  int64_t n = 0;
  for (const Buf<float>* b :
       {&ln1,       &ln2,       &ln1_mean, &ln1_rstd, &ln2_mean, &ln2_rstd,   &qkv,  &att,
        &atty,      &attproj,   &res1,     &fc,       &fc_gelu,  &mlp_out,    &res2, &moe.logits,
        &moe.probs, &moe.gates, &moe.xe,   &moe.ye,   &moe.fc,   &moe.fc_gelu}) {
    n += static_cast<int64_t>(b->size());
  }
  return n;
}

void TpScratch::resize(const TpDims& d, const model::GPTConfig& config) {
  const int64_t N = d.N(), Nr = d.rows(), C = d.C, Cl = d.Cl(), Fl = d.Fl();
  const int64_t K = config.is_moe() ? config.top_k : 0;
  for (auto* v : {&full_in, &full_dout, &partial, &rep, &moe_out}) v->assign(N * C, 0);
  for (auto* v : {&dres1, &dln}) v->assign(Nr * C, 0);
  datty.assign(N * Cl, 0);
  dqkv.assign(N * 3 * Cl, 0);
  dfc.assign(std::max(N, N * K) * Fl, 0);
  dfc_gelu.assign(std::max(N, N * K) * Fl, 0);
  dlogits.assign(N * config.n_expert, 0);
  dgates.assign(N * K, 0);
  dxe.assign(N * K * C, 0);
  dye.assign(N * K * C, 0);
}

}  // namespace shardlab::parallel
