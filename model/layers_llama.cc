// The llama family's layers (attention with RoPE and GQA, the SwiGLU MLP)
// and the norms both families share; backward mirrors forward in reverse.
// Shapes use the letters declared in layers.h and kernels_llama.h.
#include <algorithm>

#include "model/layers.h"

namespace shardlab::model {

// ---- Norms --------------------------------------------------------------------

template <typename Real>
void norm_forward(Real* out, Real* mean, Real* rstd, const Real* inp, const LayerNormView<Real>& p, int64_t N,
                  int C, const GPTConfig& config, const char* name, const Exec& ex) {
  if (config.is_llama()) {
    rmsnorm_forward(ex, name, out, rstd, inp, p.weight, N, C, config.norm_eps);
  } else {
    layernorm_forward(ex, name, out, mean, rstd, inp, p.weight, p.bias, N, C);
  }
}

template <typename Real>
void norm_backward(Real* dinp, const LayerNormView<Real>& g, const Real* dout, const Real* inp,
                   const LayerNormView<Real>& p, const Real* mean, const Real* rstd, int64_t N, int C,
                   const GPTConfig& config, const char* name, const Exec& ex) {
  if (config.is_llama()) {
    rmsnorm_backward(ex, name, dinp, g.weight, dout, inp, p.weight, rstd, N, C);
  } else {
    layernorm_backward(ex, name, dinp, g.weight, g.bias, dout, inp, p.weight, mean, rstd, N, C);
  }
}

// ---- Attention ------------------------------------------------------------------

namespace {

GqaHeads unsharded_heads(const Dims& d, const GPTConfig& c) {
  return {d.NH, c.kv_heads(), d.HS(), d.NH / c.kv_heads(), 0, 0};
}


}  // namespace

template <typename Real>
void llama_attention_forward(Real* out, BlockActs<Real>& a, const BlockView<Real>& p, const Real* inp,
                             const Dims& d, const GPTConfig& config, const Exec& ex) {
  const int64_t N = d.N();
  const GqaHeads g = unsharded_heads(d, config);
  const int W = static_cast<int>(g.in_width());
  const int64_t* t = nullptr;  // positions 0..T-1
  linear_forward(ex, "attn.c_attn.fwd", a.qkv.data(), inp, p.c_attn.weight, N, d.C, W);
  if (p.q_norm)
    qk_norm_forward(ex, a.qkv.data(), a.qk_pre.data(), a.qk_rstd.data(), p.q_norm, p.k_norm, N, g, config.norm_eps);
  // q's NH heads and k's KV heads are adjacent in a row: one rotation.
  rope_forward(ex, "attn.rope.fwd", a.qkv.data(), a.qkv.data(), t, d.B, d.T, g.NHq + g.KVl, g.HS, W,
               config.rope_theta);
  repeat_kv_forward(ex, "attn.repeat_kv.fwd", a.qkv_rep.data(), a.qkv.data(), N, g);
  attention_forward(ex, "attn.softmax.fwd", a.atty.data(), static_cast<Real*>(nullptr), a.qkv_rep.data(), d.B, d.T, d.NH,
                    d.HS());
  linear_forward(ex, "attn.c_proj.fwd", out, a.atty.data(), p.attn_proj.weight, N, d.A(), d.C);
}

template <typename Real>
void llama_attention_backward(Real* dinp, const BlockView<Real>& g, BlockScratch<Real>& s, const Real* dout,
                              const Real* inp, const BlockActs<Real>& a, const BlockView<Real>& p,
                              const Dims& d, const GPTConfig& config, const Exec& ex) {
  const int64_t N = d.N();
  const GqaHeads h = unsharded_heads(d, config);
  const int W = static_cast<int>(h.in_width());
  const int64_t* t = nullptr;
  Real* none = nullptr;  // no biases
  std::fill_n(s.datty.data(), N * d.A(), Real(0));
  linear_backward(ex, "attn.c_proj.bwd", false, s.datty.data(), g.attn_proj.weight, none, dout, a.atty.data(),
                  p.attn_proj.weight, N, d.A(), d.C);
  std::fill_n(s.dqkv.data(), N * 3 * d.A(), Real(0));
  attention_backward(ex, "attn.softmax.bwd", s.dqkv.data(), s.datty.data(), a.qkv_rep.data(), static_cast<const Real*>(nullptr), d.B,
                     d.T, d.NH, d.HS());
  std::fill_n(s.dqkv_c.data(), N * W, Real(0));
  repeat_kv_backward(ex, "attn.repeat_kv.bwd", s.dqkv_c.data(), s.dqkv.data(), N, h);
  rope_backward(ex, "attn.rope.bwd", s.dqkv_c.data(), s.dqkv_c.data(), t, d.B, d.T, h.NHq + h.KVl, h.HS, W,
                config.rope_theta);
  if (p.q_norm)
    qk_norm_backward(ex, s.dqkv_c.data(), g.q_norm, g.k_norm, a.qk_pre.data(), p.q_norm, p.k_norm,
                     a.qk_rstd.data(), N, h);
  linear_backward(ex, "attn.c_attn.bwd", false, dinp, g.c_attn.weight, none, s.dqkv_c.data(), inp,
                  p.c_attn.weight, N, d.C, W);
}

// ---- SwiGLU MLP -----------------------------------------------------------------

template <typename Real>
void swiglu_mlp_forward(Real* out, Real* gate_up, Real* h, const MlpView<Real>& p, const Real* inp, int64_t N,
                        int C, const Exec& ex) {
  const int F = p.c_proj.in;
  linear_forward(ex, "mlp.c_fc.fwd", gate_up, inp, p.c_fc.weight, N, C, 2 * F);
  swiglu_forward(ex, "mlp.swiglu.fwd", h, gate_up, N, F);
  linear_forward(ex, "mlp.c_proj.fwd", out, h, p.c_proj.weight, N, F, C);
}

template <typename Real>
void swiglu_mlp_backward(Real* dinp, const MlpView<Real>& g, Real* dgate_up, Real* dh, const Real* dout,
                         const Real* inp, const Real* gate_up, const Real* h, const MlpView<Real>& p,
                         int64_t N, int C, const Exec& ex) {
  const int F = p.c_proj.in;
  Real* none = nullptr;  // no biases
  std::fill_n(dh, N * F, Real(0));
  linear_backward(ex, "mlp.c_proj.bwd", false, dh, g.c_proj.weight, none, dout, h, p.c_proj.weight, N, F, C);
  std::fill_n(dgate_up, N * 2 * F, Real(0));
  swiglu_backward(ex, "mlp.swiglu.bwd", dgate_up, dh, gate_up, N, F);
  linear_backward(ex, "mlp.c_fc.bwd", false, dinp, g.c_fc.weight, none, dgate_up, inp, p.c_fc.weight, N, C, 2 * F);
}

#define SHARDLAB_INSTANTIATE_LLAMA_LAYERS(Real)                                                              \
  template void norm_forward(Real*, Real*, Real*, const Real*, const LayerNormView<Real>&, int64_t, int,      \
                             const GPTConfig&, const char*, const Exec&);                                     \
  template void norm_backward(Real*, const LayerNormView<Real>&, const Real*, const Real*,                    \
                              const LayerNormView<Real>&, const Real*, const Real*, int64_t, int,             \
                              const GPTConfig&, const char*, const Exec&);                                    \
  template void llama_attention_forward(Real*, BlockActs<Real>&, const BlockView<Real>&, const Real*,         \
                                        const Dims&, const GPTConfig&, const Exec&);                          \
  template void llama_attention_backward(Real*, const BlockView<Real>&, BlockScratch<Real>&, const Real*,     \
                                         const Real*, const BlockActs<Real>&, const BlockView<Real>&,         \
                                         const Dims&, const GPTConfig&, const Exec&);                         \
  template void swiglu_mlp_forward(Real*, Real*, Real*, const MlpView<Real>&, const Real*, int64_t, int,      \
                                   const Exec&);                                                              \
  template void swiglu_mlp_backward(Real*, const MlpView<Real>&, Real*, Real*, const Real*, const Real*,      \
                                    const Real*, const Real*, const MlpView<Real>&, int64_t, int, const Exec&);

SHARDLAB_INSTANTIATE_LLAMA_LAYERS(float)
SHARDLAB_INSTANTIATE_LLAMA_LAYERS(double)
#undef SHARDLAB_INSTANTIATE_LLAMA_LAYERS

}  // namespace shardlab::model
