// Attention, MLP, MoE and block layers; backward mirrors forward in reverse.
// Shapes use the letters declared in layers.h.
#include "model/layers.h"

#include <algorithm>
#include <type_traits>
#include <vector>

#include "model/host_split.h"

namespace shardlab::model {
namespace {

template <typename Real>
void zero(Buffer<Real>& v, int64_t n) {
  fill_split(v.data(), n, Real(0));
}

// An expert's MLP: SwiGLU for the llama family (fc holds [gate | up], 2F
// per row), GELU otherwise (F per row).
template <typename Real>
void expert_forward(Real* out, Real* fc, Real* h, const MlpView<Real>& p, const Real* inp, int64_t N, int C,
                    const GPTConfig& config, const Exec& ex) {
  if (config.is_llama()) {
    swiglu_mlp_forward(out, fc, h, p, inp, N, C, ex);
  } else {
    mlp_forward(out, fc, h, p, inp, N, C, ex);
  }
}

template <typename Real>
void expert_backward(Real* dinp, const MlpView<Real>& g, Real* dfc, Real* dh, const Real* dout, const Real* inp,
                     const Real* fc, const Real* h, const MlpView<Real>& p, int64_t N, int C,
                     const GPTConfig& config, const Exec& ex) {
  if (config.is_llama()) {
    swiglu_mlp_backward(dinp, g, dfc, dh, dout, inp, fc, h, p, N, C, ex);
  } else {
    mlp_backward(dinp, g, dfc, dh, dout, inp, fc, h, p, N, C, ex);
  }
}

// Elements per row of an expert MLP's saved pre-activation fc (F wide).
int fc_width(const GPTConfig& config, int F) { return config.is_llama() ? 2 * F : F; }

}  // namespace

// ---- Attention ----------------------------------------------------------------

template <typename Real>
void attention_layer_forward(Real* out, Real* qkv, Real* att, Real* atty, const BlockView<Real>& p,
                             const Real* inp, const Dims& d, const Exec& ex) {
  const int64_t N = d.N();
  linear_forward(ex, "attn.c_attn.fwd", qkv, inp, p.c_attn.weight, p.c_attn.bias, N, d.C, 3 * d.C);
  attention_forward(ex, "attn.softmax.fwd", atty, att, qkv, d.B, d.T, d.NH, d.HS());
  linear_forward(ex, "attn.c_proj.fwd", out, atty, p.attn_proj.weight, p.attn_proj.bias, N, d.C,
                 d.C);
}

template <typename Real>
void attention_layer_backward(Real* dinp, const BlockView<Real>& g, Real* dqkv, Real* datty,
                              const Real* dout, const Real* inp, const Real* qkv, const Real* att,
                              const Real* atty, const BlockView<Real>& p, const Dims& d,
                              const Exec& ex) {
  const int64_t N = d.N();
  std::fill(datty, datty + N * d.C, Real(0));
  linear_backward(ex, "attn.c_proj.bwd", true, datty, g.attn_proj.weight, g.attn_proj.bias, dout,
                  atty, p.attn_proj.weight, N, d.C, d.C);
  std::fill(dqkv, dqkv + N * 3 * d.C, Real(0));
  attention_backward(ex, "attn.softmax.bwd", dqkv, datty, qkv, att, d.B, d.T, d.NH, d.HS());
  linear_backward(ex, "attn.c_attn.bwd", true, dinp, g.c_attn.weight, g.c_attn.bias, dqkv, inp,
                  p.c_attn.weight, N, d.C, 3 * d.C);
}

namespace {
// attention_layer_backward when the forward kept qkv but neither the
// probabilities nor atty: the scores and softmax are computed once per
// (batch, head) for both atty (c_proj's weight gradient) and the attention
// backward (attention_forward_backward). The bits and the charged ops are
// attention_layer_backward's after a host-only attention_forward: c_proj's
// input gradient first (it needs no atty), then atty and dqkv, then c_proj's
// weight gradient. atty is scratch (N, C).
template <typename Real>
void attention_layer_backward_from_qkv(Real* dinp, const BlockView<Real>& g, Real* dqkv, Real* datty, Real* atty,
                                       const Real* dout, const Real* inp, const Real* qkv,
                                       const BlockView<Real>& p, const Dims& d, const Exec& ex) {
  const int64_t N = d.N();
  const int C = d.C;
  ex.run("attn.c_proj.bwd", te_linear_cost(ex, linear_backward_cost(N, C, C, true, ex.elem), N * C), [&] {
    fill_split(datty, N * C, Real(0));
    linear_backward_input(datty, dout, p.attn_proj.weight, N, C, C);
    fill_split(dqkv, N * 3 * C, Real(0));
    attention_forward_backward(atty, dqkv, datty, qkv, d.B, d.T, d.NH, d.HS());
    linear_backward_weight(g.attn_proj.weight, g.attn_proj.bias, dout, atty, N, C, C);
  });
  ex.op("attn.softmax.bwd", attention_backward_cost(d.B, d.T, d.NH, d.HS(), ex.elem));  // computed above
  linear_backward(ex, "attn.c_attn.bwd", true, dinp, g.c_attn.weight, g.c_attn.bias, dqkv, inp, p.c_attn.weight, N,
                  C, 3 * C);
}
}  // namespace

// ---- MLP ----------------------------------------------------------------------

template <typename Real>
void mlp_forward(Real* out, Real* fc, Real* fc_gelu, const MlpView<Real>& p, const Real* inp,
                 int64_t N, int C, const Exec& ex) {
  const int F = p.c_fc.out;  // the MLP width
  linear_forward(ex, "mlp.c_fc.fwd", fc, inp, p.c_fc.weight, p.c_fc.bias, N, C, F);
  gelu_forward(ex, "mlp.gelu.fwd", fc_gelu, fc, N * F);
  linear_forward(ex, "mlp.c_proj.fwd", out, fc_gelu, p.c_proj.weight, p.c_proj.bias, N, F, C);
}

template <typename Real>
void mlp_backward(Real* dinp, const MlpView<Real>& g, Real* dfc, Real* dfc_gelu, const Real* dout,
                  const Real* inp, const Real* fc, const Real* fc_gelu, const MlpView<Real>& p,
                  int64_t N, int C, const Exec& ex) {
  const int F = p.c_fc.out;  // the MLP width
  std::fill(dfc_gelu, dfc_gelu + N * F, Real(0));
  linear_backward(ex, "mlp.c_proj.bwd", true, dfc_gelu, g.c_proj.weight, g.c_proj.bias, dout,
                  fc_gelu, p.c_proj.weight, N, F, C);
  std::fill(dfc, dfc + N * F, Real(0));
  gelu_backward(ex, "mlp.gelu.bwd", dfc, dfc_gelu, fc, N * F);
  linear_backward(ex, "mlp.c_fc.bwd", true, dinp, g.c_fc.weight, g.c_fc.bias, dfc, inp,
                  p.c_fc.weight, N, C, F);
}

namespace {
// mlp_backward when the forward kept fc but not GELU(fc): dGELU, and GELU(fc)
// for c_proj's weight gradient, come from one tanh per element
// (gelu_forward_backward). The bits and the charged ops are mlp_backward's
// after a host-only gelu_forward: c_proj's input gradient first (it needs no
// GELU(fc)), then the fused pass turns it into dfc in place and fc into
// GELU(fc) in place (fc is dead after it), then c_proj's weight gradient.
template <typename Real>
void mlp_backward_from_fc(Real* dinp, const MlpView<Real>& g, Real* dfc, const Real* dout, const Real* inp,
                          Real* fc, const MlpView<Real>& p, int64_t N, int C, const Exec& ex) {
  const int F = p.c_fc.out;  // the MLP width
  ex.run("mlp.c_proj.bwd", te_linear_cost(ex, linear_backward_cost(N, F, C, true, ex.elem), N * C), [&] {
    fill_split(dfc, N * F, Real(0));
    linear_backward_input(dfc, dout, p.c_proj.weight, N, F, C);
    gelu_forward_backward(fc, dfc, N * F);
    linear_backward_weight(g.c_proj.weight, g.c_proj.bias, dout, fc, N, F, C);
  });
  ex.op("mlp.gelu.bwd", gelu_backward_cost(N * F, ex.elem));  // computed above
  linear_backward(ex, "mlp.c_fc.bwd", true, dinp, g.c_fc.weight, g.c_fc.bias, dfc, inp, p.c_fc.weight, N, C,
                  F);
}
}  // namespace

// ---- MoE ----------------------------------------------------------------------

template <typename Real>
Real moe_forward(Real* out, MoeActs<Real>& a, const BlockView<Real>& p, const Real* inp, int64_t N,
                 const GPTConfig& config, const Exec& ex) {
  const int C = config.n_embd, E = config.n_expert, K = config.top_k, F = config.moe_ffn_hidden();
  // route
  linear_forward(ex, "moe.router.fwd", a.logits.data(), inp, p.router, N, C, E);
  ex.run("moe.topk.fwd", router_forward_cost(N, E, K, ex.elem, RouterSpec::of(config)), [&] {
    a.aux = router_forward(a.probs.data(), a.expert.data(), a.slot.data(), a.gates.data(), a.frac.data(),
                           a.logits.data(), p.router_bias, N, E, K,
                           config.capacity_factor, RouterSpec::of(config));
  });
  if constexpr (std::is_same_v<Real, float>) {
    // aux = E * sum_i f_i * P_i with f_i over the global batch, P_i local.
    if (average_fractions_over_replicas(a.frac.data(), E, config, ex))
      a.aux = moe_aux_loss(a.frac.data(), a.probs.data(), N, E, config.router);
  }
  a.M = moe_plan(a.src.data(), a.offsets.data(), a.expert.data(), a.slot.data(), N, E, K);
  // dispatch
  moe_dispatch_forward(ex, "moe.dispatch.fwd", a.xe.data(), inp, a.src.data(), a.M, K, C);
  // experts, each on its contiguous rows
  const int W = fc_width(config, F);
  bool launched = false;  // grouped kernels, one launch for all experts (sink.h Exec::Grouped)
  for (int e = 0; e < E; ++e) {
    const int64_t r0 = a.offsets[e], rows = a.offsets[e + 1] - r0;
    expert_forward(a.ye.data() + r0 * C, a.fc.data() + r0 * W, a.fc_gelu.data() + r0 * F, p.experts[e],
                   a.xe.data() + r0 * C, rows, C, config, ex.expert_of_group(rows, launched));
  }
  // combine
  moe_combine_forward(ex, "moe.combine.fwd", out, a.ye.data(), a.gates.data(), a.src.data(), N, a.M,
                      K, C);
  if (p.shared.c_fc.weight) {  // shared experts: every token, added to the routed output
    expert_forward(a.shared_out.data(), a.shared_fc.data(), a.shared_fc_gelu.data(), p.shared, inp, N, C, config,
                   ex);
    residual_forward(ex, "moe.shared.add", out, out, a.shared_out.data(), N * C);
  }
  return a.aux;
}

template <typename Real>
void moe_backward(Real* dinp, const BlockView<Real>& g, BlockScratch<Real>& s, const Real* dout,
                  Real daux, const MoeActs<Real>& a, const Real* inp, const BlockView<Real>& p,
                  int64_t N, const GPTConfig& config, const Exec& ex) {
  const int C = config.n_embd, E = config.n_expert, K = config.top_k, F = config.moe_ffn_hidden();
  if (p.shared.c_fc.weight)
    expert_backward(dinp, g.shared, s.dfc.data(), s.dfc_gelu.data(), dout, inp, a.shared_fc.data(),
                    a.shared_fc_gelu.data(), p.shared, N, C, config, ex);
  // combine
  zero(s.dye, a.M * C);
  zero(s.dgates, N * K);
  moe_combine_backward(ex, "moe.combine.bwd", s.dye.data(), s.dgates.data(), dout, a.ye.data(),
                       a.gates.data(), a.src.data(), a.M, K, C);
  // experts
  zero(s.dxe, a.M * C);
  const int W = fc_width(config, F);
  bool launched = false;  // grouped kernels
  for (int e = 0; e < E; ++e) {
    const int64_t r0 = a.offsets[e], rows = a.offsets[e + 1] - r0;
    expert_backward(s.dxe.data() + r0 * C, g.experts[e], s.dfc.data() + r0 * W, s.dfc_gelu.data() + r0 * F,
                    s.dye.data() + r0 * C, a.xe.data() + r0 * C, a.fc.data() + r0 * W,
                    a.fc_gelu.data() + r0 * F, p.experts[e], rows, C, config, ex.expert_of_group(rows, launched));
  }
  // dispatch
  moe_dispatch_backward(ex, "moe.dispatch.bwd", dinp, s.dxe.data(), a.src.data(), a.M, K, C);
  // route
  zero(s.dlogits, N * E);
  router_backward(ex, "moe.topk.bwd", s.dlogits.data(), s.dgates.data(), daux, a.probs.data(),
                  a.expert.data(), a.frac.data(), N, E, K, RouterSpec::of(config));
  linear_backward(ex, "moe.router.bwd", false, dinp, g.router, static_cast<Real*>(nullptr),
                  s.dlogits.data(), inp, p.router, N, C, E);
  if (config.router_bias()) router_bias_load(ex, "moe.bias_load", g.router_bias, a.expert.data(), N, E, K);
}

// ---- Block --------------------------------------------------------------------

// The host keeps less than the modeled program (BlockActs in layers.h): the
// attention and MLP outputs go straight into res1 and res2 and the residual
// adds in place (inp + out is out + inp, bit for bit); the norms write into
// scratch, and the GPT's attention output and dense GELU into s.dqkv and
// s.dfc (the backward's GELU(fc) overwrites a.fc: no buffer of its own).
template <typename Real>
Real block_forward(BlockActs<Real>& a, BlockScratch<Real>& s, const BlockView<Real>& p, const Real* inp,
                   const Dims& d, const GPTConfig& config, const Exec& ex) {
  const int64_t N = d.N();
  const int C = d.C;
  Real* ln = s.ln.data();
  norm_forward(ln, a.ln1_mean.data(), a.ln1_rstd.data(), inp, p.ln_1, N, C, config, "ln_1.fwd", ex);
  if (config.is_mla()) {
    mla_attention_forward(a.res1.data(), a, s.mla, p, ln, d, config, ex);
  } else if (config.is_llama()) {
    llama_attention_forward(a.res1.data(), a, p, ln, d, config, ex);
  } else {
    attention_layer_forward(a.res1.data(), a.qkv.data(), static_cast<Real*>(nullptr), s.dqkv.data(), p, ln, d,
                            ex);  // atty in scratch
  }
  residual_forward(ex, "residual.fwd", a.res1.data(), inp, a.res1.data(), N * C);
  norm_forward(ln, a.ln2_mean.data(), a.ln2_rstd.data(), a.res1.data(), p.ln_2, N, C, config, "ln_2.fwd", ex);
  Real aux = 0;
  if (p.moe) {
    aux = moe_forward(a.res2.data(), a.moe, p, ln, N, config, ex);
  } else if (config.is_llama()) {
    swiglu_mlp_forward(a.res2.data(), a.fc.data(), a.fc_gelu.data(), p.mlp, ln, N, C, ex);
  } else {
    mlp_forward(a.res2.data(), a.fc.data(), s.dfc.data(), p.mlp, ln, N, C, ex);
  }
  residual_forward(ex, "residual.fwd", a.res2.data(), a.res1.data(), a.res2.data(), N * C);
  return aux;
}

template <typename Real>
void block_backward(Real* dinp, const BlockView<Real>& g, BlockScratch<Real>& s, const Real* dout,
                    Real daux, BlockActs<Real>& a, const Real* inp, const BlockView<Real>& p,
                    const Dims& d, const GPTConfig& config, const Exec& ex) {
  const int64_t N = d.N();
  const int C = d.C;
  // What the forward did not keep, recomputed as it computed it, charged to no one (host only).
  Exec host = ex;
  host.sink = nullptr;
  Real* ln = s.ln.data();
  // res2 = res1 + mlp_out: both receive dout unchanged (dmlp_out is dout itself)
  copy_split(s.dres1.data(), dout, N * C);
  zero(s.dln2, N * C);
  norm_forward(ln, s.ln_mean.data(), s.ln_rstd.data(), a.res1.data(), p.ln_2, N, C, config, "ln_2.fwd", host);
  if (p.moe) {
    moe_backward(s.dln2.data(), g, s, dout, daux, a.moe, ln, p, N, config, ex);
  } else if (config.is_llama()) {
    swiglu_mlp_backward(s.dln2.data(), g.mlp, s.dfc.data(), s.dfc_gelu.data(), dout, ln, a.fc.data(),
                        a.fc_gelu.data(), p.mlp, N, C, ex);
  } else {
    mlp_backward_from_fc(s.dln2.data(), g.mlp, s.dfc.data(), dout, ln, a.fc.data(), p.mlp, N, C, ex);
  }
  norm_backward(s.dres1.data(), g.ln_2, s.dln2.data(), a.res1.data(), p.ln_2, a.ln2_mean.data(),
                a.ln2_rstd.data(), N, C, config, "ln_2.bwd", ex);
  // res1 = inp + attproj: dinp += dres1, dattproj = dres1
  ex.run("residual.bwd", residual_backward_cost(N * C, ex.elem), [&] {
    const Real* dres1 = s.dres1.data();
    for_chunks(N * C, kFillChunk, double(N * C), [=](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) dinp[i] += dres1[i];
    });
  });
  zero(s.dln1, N * C);
  norm_forward(ln, s.ln_mean.data(), s.ln_rstd.data(), inp, p.ln_1, N, C, config, "ln_1.fwd", host);
  if (config.is_mla()) {
    mla_attention_backward(s.dln1.data(), g, s, s.dres1.data(), ln, a, p, d, config, ex);
  } else if (config.is_llama()) {
    llama_attention_backward(s.dln1.data(), g, s, s.dres1.data(), ln, a, p, d, config, ex);
  } else {
    // atty into s.dln2, dead since ln_2's backward
    attention_layer_backward_from_qkv(s.dln1.data(), g, s.dqkv.data(), s.datty.data(), s.dln2.data(), s.dres1.data(),
                                      ln, a.qkv.data(), p, d, ex);
  }
  norm_backward(dinp, g.ln_1, s.dln1.data(), inp, p.ln_1, a.ln1_mean.data(), a.ln1_rstd.data(), N, C, config,
                "ln_1.bwd", ex);
}

#define SHARDLAB_INSTANTIATE_LAYERS(Real)                                                          \
  template void attention_layer_forward(Real*, Real*, Real*, Real*, const BlockView<Real>&,        \
                                        const Real*, const Dims&, const Exec&);                    \
  template void attention_layer_backward(Real*, const BlockView<Real>&, Real*, Real*, const Real*, \
                                         const Real*, const Real*, const Real*, const Real*,       \
                                         const BlockView<Real>&, const Dims&, const Exec&);        \
  template void mlp_forward(Real*, Real*, Real*, const MlpView<Real>&, const Real*, int64_t, int,  \
                            const Exec&);                                                          \
  template void mlp_backward(Real*, const MlpView<Real>&, Real*, Real*, const Real*, const Real*,  \
                             const Real*, const Real*, const MlpView<Real>&, int64_t, int,         \
                             const Exec&);                                                         \
  template Real moe_forward(Real*, MoeActs<Real>&, const BlockView<Real>&, const Real*, int64_t,   \
                            const GPTConfig&, const Exec&);                                        \
  template void moe_backward(Real*, const BlockView<Real>&, BlockScratch<Real>&, const Real*,      \
                             Real, const MoeActs<Real>&, const Real*, const BlockView<Real>&,      \
                             int64_t, const GPTConfig&, const Exec&);                              \
  template Real block_forward(BlockActs<Real>&, BlockScratch<Real>&, const BlockView<Real>&,       \
                              const Real*, const Dims&, const GPTConfig&, const Exec&);            \
  template void block_backward(Real*, const BlockView<Real>&, BlockScratch<Real>&, const Real*,    \
                               Real, BlockActs<Real>&, const Real*, const BlockView<Real>&,        \
                               const Dims&, const GPTConfig&, const Exec&);

SHARDLAB_INSTANTIATE_LAYERS(float)
SHARDLAB_INSTANTIATE_LAYERS(double)
#undef SHARDLAB_INSTANTIATE_LAYERS

}  // namespace shardlab::model
