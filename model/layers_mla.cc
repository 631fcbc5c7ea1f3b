// Multi-head latent attention in the unsharded model (layers.h; DeepSeek-V2
// sec. 2.1, Megatron-core's MLASelfAttention): the hidden state goes down to
// q's latent (q_a_proj, RMSNorm q_a_layernorm) and to k/v's latent with the
// shared rotated key (kv_a_proj_with_mqa, RMSNorm kv_a_layernorm over the
// latent only), up per head (q_b_proj; kv_b_proj to [k without position |
// v]), through RoPE on the rotated features (kernels_mla.h mla_rope, which
// also lays the heads out for the core), the causal core on heads of
// HS = Dn + Dr (v padded to HS on the host only) and o_proj from the values'
// Dv a head. Backward mirrors it in reverse. Letters as in layers.h.
#include <algorithm>

#include "model/kernels_mla.h"
#include "model/layers.h"

namespace shardlab::model {

namespace {

MlaHeads heads_of(const Dims& d, const GPTConfig& c) { return {d.NH, c.head_size(), c.qk_rope_head_dim, d.HV()}; }

}  // namespace

template <typename Real>
void mla_attention_forward(Real* out, BlockActs<Real>& a, MlaScratch<Real>& s, const BlockView<Real>& p,
                           const Real* inp, const Dims& d, const GPTConfig& config, const Exec& ex) {
  const int64_t N = d.N();
  const int C = d.C, Lq = config.q_lora_rank, Lkv = config.kv_lora_rank, Dr = config.qk_rope_head_dim;
  const MlaHeads h = heads_of(d, config);
  const double eps = config.norm_eps;
  MlaActs<Real>& m = a.mla;
  const Real* q_in = inp;  // q_b_proj's input: q's normalized latent, or the hidden state (q_proj)
  if (Lq > 0) {
    linear_forward(ex, "attn.q_down.fwd", m.cq.data(), inp, p.mla.q_down.weight, N, C, Lq);
    rmsnorm_forward(ex, "attn.q_norm.fwd", m.cq_n.data(), m.cq_rstd.data(), m.cq.data(), p.mla.q_norm, N, Lq, eps);
    q_in = m.cq_n.data();
  }
  linear_forward(ex, "attn.q_up.fwd", s.q.data(), q_in, p.c_attn.weight, N, Lq > 0 ? Lq : C, int(h.q_width()));
  linear_forward(ex, "attn.kv_down.fwd", s.down.data(), inp, p.mla.kv_down.weight, N, C, Lkv + Dr);
  if (ex.math()) split_columns(m.ckv.data(), m.kpe.data(), s.down.data(), N, Lkv, Dr);
  rmsnorm_forward(ex, "attn.kv_norm.fwd", m.ckv_n.data(), m.ckv_rstd.data(), m.ckv.data(), p.mla.kv_norm, N, Lkv,
                  eps);
  linear_forward(ex, "attn.kv_up.fwd", s.kv.data(), m.ckv_n.data(), p.mla.kv_up.weight, N, Lkv, int(h.kv_width()));
  const int64_t* t = nullptr;  // positions 0..T-1
  mla_rope_forward(ex, "attn.mla_rope.fwd", a.qkv.data(), s.q.data(), s.kv.data(), m.kpe.data(), t, d.B, d.T, h,
                   config.rope_theta);
  ex.run("attn.softmax.fwd", attention_forward_cost(d.B, d.T, d.NH, d.HS(), ex.elem, d.HV()), [&] {
    attention_forward(s.atty_pad.data(), static_cast<Real*>(nullptr), a.qkv.data(), d.B, d.T, d.NH, d.HS());
  });
  if (ex.math()) mla_unpad(a.atty.data(), s.atty_pad.data(), N, h);
  linear_forward(ex, "attn.c_proj.fwd", out, a.atty.data(), p.attn_proj.weight, N, d.A(), C);
}

template <typename Real>
void mla_attention_backward(Real* dinp, const BlockView<Real>& g, BlockScratch<Real>& s, const Real* dout,
                            const Real* inp, const BlockActs<Real>& a, const BlockView<Real>& p, const Dims& d,
                            const GPTConfig& config, const Exec& ex) {
  const int64_t N = d.N();
  const int C = d.C, Lq = config.q_lora_rank, Lkv = config.kv_lora_rank, Dr = config.qk_rope_head_dim;
  const MlaHeads h = heads_of(d, config);
  const MlaActs<Real>& m = a.mla;
  MlaScratch<Real>& x = s.mla;
  Real* none = nullptr;  // no biases
  std::fill_n(s.datty.data(), N * d.A(), Real(0));
  linear_backward(ex, "attn.c_proj.bwd", false, s.datty.data(), g.attn_proj.weight, none, dout, a.atty.data(),
                  p.attn_proj.weight, N, d.A(), C);
  if (ex.math()) mla_pad(x.atty_pad.data(), s.datty.data(), N, h);
  std::fill_n(s.dqkv.data(), N * h.core_width(), Real(0));
  ex.run("attn.softmax.bwd", attention_backward_cost(d.B, d.T, d.NH, d.HS(), ex.elem, d.HV()), [&] {
    attention_backward(s.dqkv.data(), x.atty_pad.data(), a.qkv.data(), static_cast<const Real*>(nullptr), d.B, d.T,
                       d.NH, d.HS());
  });
  const int64_t* t = nullptr;
  mla_rope_backward(ex, "attn.mla_rope.bwd", x.q.data(), x.kv.data(), x.dkpe.data(), s.dqkv.data(), t, d.B, d.T, h,
                    config.rope_theta);
  // k/v: kv_b_proj, kv_a_layernorm, then kv_a_proj_with_mqa from [dlatent | dkpe].
  std::fill_n(x.dlat.data(), N * Lkv, Real(0));
  linear_backward(ex, "attn.kv_up.bwd", false, x.dlat.data(), g.mla.kv_up.weight, none, x.kv.data(), m.ckv_n.data(),
                  p.mla.kv_up.weight, N, Lkv, int(h.kv_width()));
  std::fill_n(x.dlat_in.data(), N * Lkv, Real(0));
  rmsnorm_backward(ex, "attn.kv_norm.bwd", x.dlat_in.data(), g.mla.kv_norm, x.dlat.data(), m.ckv.data(),
                   p.mla.kv_norm, m.ckv_rstd.data(), N, Lkv);
  if (ex.math()) join_columns(x.down.data(), x.dlat_in.data(), x.dkpe.data(), N, Lkv, Dr);
  linear_backward(ex, "attn.kv_down.bwd", false, dinp, g.mla.kv_down.weight, none, x.down.data(), inp,
                  p.mla.kv_down.weight, N, C, Lkv + Dr);
  // q: q_b_proj (or q_proj), then q_a_layernorm and q_a_proj.
  if (Lq == 0) {
    linear_backward(ex, "attn.q_up.bwd", false, dinp, g.c_attn.weight, none, x.q.data(), inp, p.c_attn.weight, N, C,
                    int(h.q_width()));
    return;
  }
  std::fill_n(x.dlat.data(), N * Lq, Real(0));
  linear_backward(ex, "attn.q_up.bwd", false, x.dlat.data(), g.c_attn.weight, none, x.q.data(), m.cq_n.data(),
                  p.c_attn.weight, N, Lq, int(h.q_width()));
  std::fill_n(x.dlat_in.data(), N * Lq, Real(0));
  rmsnorm_backward(ex, "attn.q_norm.bwd", x.dlat_in.data(), g.mla.q_norm, x.dlat.data(), m.cq.data(), p.mla.q_norm,
                   m.cq_rstd.data(), N, Lq);
  linear_backward(ex, "attn.q_down.bwd", false, dinp, g.mla.q_down.weight, none, x.dlat_in.data(), inp,
                  p.mla.q_down.weight, N, C, Lq);
}

#define SHARDLAB_INSTANTIATE_MLA_LAYERS(Real)                                                                    \
  template void mla_attention_forward(Real*, BlockActs<Real>&, MlaScratch<Real>&, const BlockView<Real>&,       \
                                      const Real*, const Dims&, const GPTConfig&, const Exec&);                 \
  template void mla_attention_backward(Real*, const BlockView<Real>&, BlockScratch<Real>&, const Real*,         \
                                       const Real*, const BlockActs<Real>&, const BlockView<Real>&, const Dims&, \
                                       const GPTConfig&, const Exec&);

SHARDLAB_INSTANTIATE_MLA_LAYERS(float)
SHARDLAB_INSTANTIATE_MLA_LAYERS(double)
#undef SHARDLAB_INSTANTIATE_MLA_LAYERS

}  // namespace shardlab::model
