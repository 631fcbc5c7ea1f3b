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
    if (ex.math()) rmsnorm_forward(out, rstd, inp, p.weight, N, C, config.norm_eps);
    ex.op(name, rmsnorm_forward_cost(N, C, ex.elem));
    return;
  }
  if (ex.math()) layernorm_forward(out, mean, rstd, inp, p.weight, p.bias, N, C);
  ex.op(name, layernorm_forward_cost(N, C, ex.elem));
}

template <typename Real>
void norm_backward(Real* dinp, const LayerNormView<Real>& g, const Real* dout, const Real* inp,
                   const LayerNormView<Real>& p, const Real* mean, const Real* rstd, int64_t N, int C,
                   const GPTConfig& config, const char* name, const Exec& ex) {
  if (config.is_llama()) {
    if (ex.math()) rmsnorm_backward(dinp, g.weight, dout, inp, p.weight, rstd, N, C);
    ex.op(name, rmsnorm_backward_cost(N, C, ex.elem));
    return;
  }
  if (ex.math()) layernorm_backward(dinp, g.weight, g.bias, dout, inp, p.weight, mean, rstd, N, C);
  ex.op(name, layernorm_backward_cost(N, C, ex.elem));
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
  linear_forward(a.qkv.data(), inp, p.c_attn.weight, static_cast<const Real*>(nullptr), N, d.C, W);
  ex.op("attn.c_attn.fwd", linear_forward_cost(N, d.C, W, false, ex.elem));
  // q's NH heads and k's KV heads are adjacent in a row: one rotation.
  rope_forward(a.qkv.data(), a.qkv.data(), static_cast<const int64_t*>(nullptr), d.B, d.T, g.NHq + g.KVl,
               g.HS, W, config.rope_theta);
  ex.op("attn.rope.fwd", rope_cost(N, g.NHq + g.KVl, g.HS, ex.elem));
  repeat_kv_forward(a.qkv_rep.data(), a.qkv.data(), N, g);
  ex.op("attn.repeat_kv.fwd", repeat_kv_cost(N, g, ex.elem));
  attention_forward(a.atty.data(), a.att.data(), a.qkv_rep.data(), d.B, d.T, d.NH, d.HS());
  ex.op("attn.softmax.fwd", attention_forward_cost(d.B, d.T, d.NH, d.HS(), ex.elem));
  linear_forward(out, a.atty.data(), p.attn_proj.weight, static_cast<const Real*>(nullptr), N, d.C, d.C);
  ex.op("attn.c_proj.fwd", linear_forward_cost(N, d.C, d.C, false, ex.elem));
}

template <typename Real>
void llama_attention_backward(Real* dinp, const BlockView<Real>& g, BlockScratch<Real>& s, const Real* dout,
                              const Real* inp, const BlockActs<Real>& a, const BlockView<Real>& p,
                              const Dims& d, const GPTConfig& config, const Exec& ex) {
  const int64_t N = d.N();
  const GqaHeads h = unsharded_heads(d, config);
  const int W = static_cast<int>(h.in_width());
  std::fill_n(s.datty.data(), N * d.C, Real(0));
  linear_backward(s.datty.data(), g.attn_proj.weight, static_cast<Real*>(nullptr), dout, a.atty.data(),
                  p.attn_proj.weight, N, d.C, d.C);
  ex.op("attn.c_proj.bwd", linear_backward_cost(N, d.C, d.C, false, ex.elem));
  std::fill_n(s.dqkv.data(), N * 3 * d.C, Real(0));
  attention_backward(s.dqkv.data(), s.datty.data(), a.qkv_rep.data(), a.att.data(), d.B, d.T, d.NH, d.HS());
  ex.op("attn.softmax.bwd", attention_backward_cost(d.B, d.T, d.NH, d.HS(), ex.elem));
  std::fill_n(s.dqkv_c.data(), N * W, Real(0));
  repeat_kv_backward(s.dqkv_c.data(), s.dqkv.data(), N, h);
  ex.op("attn.repeat_kv.bwd", repeat_kv_cost(N, h, ex.elem));
  rope_backward(s.dqkv_c.data(), s.dqkv_c.data(), static_cast<const int64_t*>(nullptr), d.B, d.T,
                h.NHq + h.KVl, h.HS, W, config.rope_theta);
  ex.op("attn.rope.bwd", rope_cost(N, h.NHq + h.KVl, h.HS, ex.elem));
  linear_backward(dinp, g.c_attn.weight, static_cast<Real*>(nullptr), s.dqkv_c.data(), inp, p.c_attn.weight, N,
                  d.C, W);
  ex.op("attn.c_attn.bwd", linear_backward_cost(N, d.C, W, false, ex.elem));
}

// ---- SwiGLU MLP -----------------------------------------------------------------

template <typename Real>
void swiglu_mlp_forward(Real* out, Real* gate_up, Real* h, const MlpView<Real>& p, const Real* inp, int64_t N,
                        int C, const Exec& ex) {
  const int F = p.c_proj.in;
  linear_forward(gate_up, inp, p.c_fc.weight, static_cast<const Real*>(nullptr), N, C, 2 * F);
  ex.op("mlp.c_fc.fwd", linear_forward_cost(N, C, 2 * F, false, ex.elem));
  swiglu_forward(h, gate_up, N, F);
  ex.op("mlp.swiglu.fwd", swiglu_forward_cost(N, F, ex.elem));
  linear_forward(out, h, p.c_proj.weight, static_cast<const Real*>(nullptr), N, F, C);
  ex.op("mlp.c_proj.fwd", linear_forward_cost(N, F, C, false, ex.elem));
}

template <typename Real>
void swiglu_mlp_backward(Real* dinp, const MlpView<Real>& g, Real* dgate_up, Real* dh, const Real* dout,
                         const Real* inp, const Real* gate_up, const Real* h, const MlpView<Real>& p,
                         int64_t N, int C, const Exec& ex) {
  const int F = p.c_proj.in;
  std::fill_n(dh, N * F, Real(0));
  linear_backward(dh, g.c_proj.weight, static_cast<Real*>(nullptr), dout, h, p.c_proj.weight, N, F, C);
  ex.op("mlp.c_proj.bwd", linear_backward_cost(N, F, C, false, ex.elem));
  std::fill_n(dgate_up, N * 2 * F, Real(0));
  swiglu_backward(dgate_up, dh, gate_up, N, F);
  ex.op("mlp.swiglu.bwd", swiglu_backward_cost(N, F, ex.elem));
  linear_backward(dinp, g.c_fc.weight, static_cast<Real*>(nullptr), dgate_up, inp, p.c_fc.weight, N, C, 2 * F);
  ex.op("mlp.c_fc.bwd", linear_backward_cost(N, C, 2 * F, false, ex.elem));
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
