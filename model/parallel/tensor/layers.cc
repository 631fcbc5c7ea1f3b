// Tensor-parallel attention, MLP and block: forward and backward side by side.
// Shapes use the letters declared in tensor/layers.h.
#include "model/parallel/tensor/layers.h"

#include <algorithm>

#include "model/kernels.h"
#include "model/parallel/tensor/attention.h"
#include "model/parallel/expert/ep_dispatch.h"

namespace shardlab::parallel {

using model::BlockView;
using model::Exec;
using model::GPTConfig;
using model::MlpView;

namespace {

// Phantom buffers have no storage: nothing to clear.
void zero(float* p, int64_t n) {
  if (p) std::fill(p, p + n, 0.0f);
}

// Dropout's cost when the model has dropout (its arithmetic is not run: phantom runs only).
void dropout_forward(int64_t n, const char* name, const TpContext& c) {
  if (c.dropout) c.ex.op(name, model::dropout_forward_cost(n, c.ex.elem));
}
void dropout_backward(int64_t n, const char* name, const TpContext& c) {
  if (c.dropout) c.ex.op(name, model::dropout_backward_cost(n, c.ex.elem));
}

// The attention probabilities: B·(NH/tp)·T·T (this rank's heads).
int64_t attention_probs(const TpDims& d) { return int64_t{d.B} * d.NHl() * d.T * d.T; }

}  // namespace

void add_bias_rows(float* out, const float* bias, int64_t N, int OC, const char* name,
                   const Exec& ex) {
  for (int64_t n = 0; ex.math() && n < N; ++n) {
    float* o = out + n * OC;
    for (int j = 0; j < OC; ++j) o[j] += bias[j];
  }
  const double n = static_cast<double>(N);
  ex.op(name, OpCost{n * OC, (2 * n * OC + OC) * ex.elem});
}

// ---- MLP: c_fc column-parallel, GELU, c_proj row-parallel (partial, no bias) ----

void tp_mlp_partial_forward(float* partial, float* fc, float* fc_gelu, const MlpView<float>& p,
                            const float* inp, int64_t rows, int C, int Fl, const Exec& ex) {
  if (ex.math()) model::linear_forward(fc, inp, p.c_fc.weight, p.c_fc.bias, rows, C, Fl);
  ex.op("mlp.c_fc.fwd", model::linear_forward_cost(rows, C, Fl, true, ex.elem));
  if (ex.math()) model::gelu_forward(fc_gelu, fc, rows * Fl);
  ex.op("mlp.gelu.fwd", model::gelu_forward_cost(rows * Fl, ex.elem));
  if (ex.math())
    model::linear_forward(partial, fc_gelu, p.c_proj.weight, static_cast<const float*>(nullptr),
                          rows, Fl, C);
  ex.op("mlp.c_proj.fwd", model::linear_forward_cost(rows, Fl, C, false, ex.elem));
}

// dinp (rows,C) += this rank's partial; dout (rows,C) is complete, so the
// replicated c_proj bias gets its whole gradient here.
void linear_backward_split(float* dinp, float* dweight, float* dbias, const float* dout,
                           const float* inp, const float* weight, int64_t N, int C, int OC,
                           LinearNames names, WeightGrads& wg, const Exec& ex) {
  if (ex.math()) model::linear_backward_input(dinp, dout, weight, N, C, OC);
  ex.op(names.dgrad, model::linear_backward_input_cost(N, C, OC, ex.elem));
  wg.linear(names.wgrad, dweight, dbias, names.bias, dout, inp, N, C, OC, ex);
}

void tp_mlp_backward(float* dinp, const MlpView<float>& g, float* dfc, float* dfc_gelu,
                     const float* dout, const float* inp, const float* fc, const float* fc_gelu,
                     const MlpView<float>& p, int64_t rows, int C, int Fl, WeightGrads& wg,
                     const Exec& ex) {
  zero(dfc_gelu, rows * Fl);
  linear_backward_split(dfc_gelu, g.c_proj.weight, g.c_proj.bias, dout, fc_gelu, p.c_proj.weight,
                        rows, Fl, C, {"mlp.c_proj.dgrad", "mlp.c_proj.wgrad"}, wg, ex);
  zero(dfc, rows * Fl);
  if (ex.math()) model::gelu_backward(dfc, dfc_gelu, fc, rows * Fl);
  ex.op("mlp.gelu.bwd", model::gelu_backward_cost(rows * Fl, ex.elem));
  linear_backward_split(dinp, g.c_fc.weight, g.c_fc.bias, dfc, inp, p.c_fc.weight, rows, C, Fl,
                        {"mlp.c_fc.dgrad", "mlp.c_fc.wgrad"}, wg, ex);
}

namespace {

// ---- Attention: c_attn column-parallel by heads, c_proj row-parallel ----------

// out (Nr,C) = exit(c_proj_partial(attention(c_attn(inp_full)))) + bias.
void tp_attention_forward(float* out, TpBlockActs& a, const BlockView<float>& p,
                          const float* inp_full, const TpDims& d, TpScratch& s,
                          const TpContext& c) {
  const Exec& ex = c.ex;
  const int64_t N = d.N();
  const int C = d.C, Cl = d.Cl();
  if (ex.math())
    model::linear_forward(a.qkv.data(), inp_full, p.c_attn.weight, p.c_attn.bias, N, C, 3 * Cl);
  ex.op("attn.c_attn.fwd", model::linear_forward_cost(N, C, 3 * Cl, true, ex.elem));
  attention_core(c).forward(a.atty.data(), a.att.data(), a.qkv.data(), d, c);
  dropout_forward(attention_probs(d), "attn.dropout.fwd", c);
  if (ex.math())
    model::linear_forward(s.partial.data(), a.atty.data(), p.attn_proj.weight,
                          static_cast<const float*>(nullptr), N, Cl, C);
  ex.op("attn.c_proj.fwd", model::linear_forward_cost(N, Cl, C, false, ex.elem));
  exit_row_parallel(c, s.partial.data(), out, d.rows(), C);
  add_bias_rows(out, p.attn_proj.bias, d.rows(), C, "attn.c_proj.bias.fwd", ex);
  dropout_forward(d.rows() * C, "attn.hidden_dropout.fwd", c);
}

// dinp_partial (N,C) += this rank's share of d/d inp_full; dout_full (N,C) complete.
void tp_attention_backward(float* dinp_partial, const BlockView<float>& g, TpScratch& s,
                           const float* dout_full, const float* inp_full, const TpBlockActs& a,
                           const BlockView<float>& p, const TpDims& d, WeightGrads& wg,
                           const TpContext& c) {
  const Exec& ex = c.ex;
  const int64_t N = d.N();
  const int C = d.C, Cl = d.Cl();
  zero(s.datty.data(), N * Cl);
  linear_backward_split(s.datty.data(), g.attn_proj.weight, g.attn_proj.bias, dout_full,
                        a.atty.data(), p.attn_proj.weight, N, Cl, C,
                        {"attn.c_proj.dgrad", "attn.c_proj.wgrad"}, wg, ex);
  dropout_backward(attention_probs(d), "attn.dropout.bwd", c);
  zero(s.dqkv.data(), N * 3 * Cl);
  attention_core(c).backward(s.dqkv.data(), s.datty.data(), a.qkv.data(), a.atty.data(), a.att.data(),
                             d, c);
  linear_backward_split(dinp_partial, g.c_attn.weight, g.c_attn.bias, s.dqkv.data(), inp_full,
                        p.c_attn.weight, N, C, 3 * Cl, {"attn.c_attn.dgrad", "attn.c_attn.wgrad"},
                        wg, ex);
}

}  // namespace

// ---- Block ----------------------------------------------------------------------

float tp_block_forward(TpBlockActs& a, const BlockView<float>& p, const float* x, const TpDims& d,
                       const GPTConfig& config, TpScratch& s, const TpContext& c) {
  const Exec& ex = c.ex;
  const int64_t Nr = d.rows();
  const int C = d.C;
  if (ex.math())
    model::layernorm_forward(a.ln1.data(), a.ln1_mean.data(), a.ln1_rstd.data(), x, p.ln_1.weight,
                             p.ln_1.bias, Nr, C);
  ex.op("ln_1.fwd", model::layernorm_forward_cost(Nr, C, ex.elem));
  const float* ln1_full = enter_column_parallel(c, a.ln1.data(), s.full_in.data(), Nr, C);
  tp_attention_forward(a.attproj.data(), a, p, ln1_full, d, s, c);
  if (ex.math()) model::residual_forward(a.res1.data(), x, a.attproj.data(), Nr * C);
  ex.op("residual.fwd", model::residual_forward_cost(Nr * C, ex.elem));
  if (ex.math())
    model::layernorm_forward(a.ln2.data(), a.ln2_mean.data(), a.ln2_rstd.data(), a.res1.data(),
                             p.ln_2.weight, p.ln_2.bias, Nr, C);
  ex.op("ln_2.fwd", model::layernorm_forward_cost(Nr, C, ex.elem));
  const float* ln2_full = enter_column_parallel(c, a.ln2.data(), s.full_in.data(), Nr, C);
  float aux = 0;
  if (p.moe) {
    float* out_full = c.sp ? s.moe_out.data() : a.mlp_out.data();
    aux = c.expert_parallel() ? ep_moe_forward(out_full, a.moe, s, p, ln2_full, d, config, c)
                              : tp_moe_forward(out_full, a.moe, p, ln2_full, d, config, c);
    if (c.sp) scatter_to_sequence_parallel_fwd(c, out_full, a.mlp_out.data(), Nr * C);
  } else {
    tp_mlp_partial_forward(s.partial.data(), a.fc.data(), a.fc_gelu.data(), p.mlp, ln2_full, d.N(),
                           C, d.Fl(), ex);
    exit_row_parallel(c, s.partial.data(), a.mlp_out.data(), Nr, C);
    add_bias_rows(a.mlp_out.data(), p.mlp.c_proj.bias, Nr, C, "mlp.c_proj.bias.fwd", ex);
  }
  dropout_forward(Nr * C, "mlp.hidden_dropout.fwd", c);
  if (ex.math()) model::residual_forward(a.res2.data(), a.res1.data(), a.mlp_out.data(), Nr * C);
  ex.op("residual.fwd", model::residual_forward_cost(Nr * C, ex.elem));
  return aux;
}

void tp_block_backward(float* dinp, const BlockView<float>& g, TpScratch& s, const float* dout,
                       float daux, const TpBlockActs& a, const float* inp,
                       const BlockView<float>& p, const TpDims& d, const GPTConfig& config,
                       WeightGrads& wg, const TpContext& c) {
  const Exec& ex = c.ex;
  const int64_t N = d.N(), Nr = d.rows();
  const int C = d.C;
  // res2 = res1 + mlp_out: both receive dout
  if (ex.math()) std::copy(dout, dout + Nr * C, s.dres1.begin());
  dropout_backward(Nr * C, "mlp.hidden_dropout.bwd", c);
  const float* dout_full = exit_row_parallel_bwd(c, dout, s.full_dout.data(), Nr, C);
  const float* ln2_full = enter_column_parallel(c, a.ln2.data(), s.full_in.data(), Nr, C);
  zero(s.partial.data(), N * C);
  if (p.moe) {
    zero(s.rep.data(), N * C);
    auto moe_backward = c.expert_parallel() ? ep_moe_backward : tp_moe_backward;
    moe_backward(s.partial.data(), s.rep.data(), g, s, dout_full, daux, a.moe, ln2_full, p, d,
                 config, wg, c);
    enter_column_parallel_bwd(c, s.partial.data(), s.dln.data(), Nr, C);
    // The router's gradient is complete on every rank: take this rank's rows.
    const float* rep = model::shifted(s.rep.data(), d.row0(c.rank()) * C);
    for (int64_t i = 0; ex.math() && i < Nr * C; ++i) s.dln[i] += rep[i];
    ex.op("moe.router.dinp.add", model::residual_forward_cost(Nr * C, ex.elem));
  } else {
    tp_mlp_backward(s.partial.data(), g.mlp, s.dfc.data(), s.dfc_gelu.data(), dout_full, ln2_full,
                    a.fc.data(), a.fc_gelu.data(), p.mlp, N, C, d.Fl(), wg, ex);
    enter_column_parallel_bwd(c, s.partial.data(), s.dln.data(), Nr, C);
  }
  if (ex.math())
    model::layernorm_backward(s.dres1.data(), g.ln_2.weight, g.ln_2.bias, s.dln.data(),
                              a.res1.data(), p.ln_2.weight, a.ln2_mean.data(), a.ln2_rstd.data(),
                              Nr, C);
  ex.op("ln_2.bwd", model::layernorm_backward_cost(Nr, C, ex.elem));
  // res1 = inp + attproj: dinp += dres1, dattproj = dres1
  for (int64_t i = 0; ex.math() && i < Nr * C; ++i) dinp[i] += s.dres1[i];
  ex.op("residual.bwd", model::residual_backward_cost(Nr * C, ex.elem));
  dropout_backward(Nr * C, "attn.hidden_dropout.bwd", c);
  const float* dres1_full = exit_row_parallel_bwd(c, s.dres1.data(), s.full_dout.data(), Nr, C);
  const float* ln1_full = enter_column_parallel(c, a.ln1.data(), s.full_in.data(), Nr, C);
  zero(s.partial.data(), N * C);
  tp_attention_backward(s.partial.data(), g, s, dres1_full, ln1_full, a, p, d, wg, c);
  enter_column_parallel_bwd(c, s.partial.data(), s.dln.data(), Nr, C);
  if (ex.math())
    model::layernorm_backward(dinp, g.ln_1.weight, g.ln_1.bias, s.dln.data(), inp, p.ln_1.weight,
                              a.ln1_mean.data(), a.ln1_rstd.data(), Nr, C);
  ex.op("ln_1.bwd", model::layernorm_backward_cost(Nr, C, ex.elem));
}

}  // namespace shardlab::parallel
