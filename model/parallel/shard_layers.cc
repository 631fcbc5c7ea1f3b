// The local math of column- and row-parallel layers (shard_layers.h).
#include "model/parallel/shard_layers.h"

#include <algorithm>

#include "model/kernels.h"

namespace shardlab::parallel {

using model::Exec;
using model::MlpView;

namespace {

// Phantom buffers have no storage: nothing to clear.
void zero(float* p, int64_t n) {
  if (p) std::fill(p, p + n, 0.0f);
}

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
                            const float* inp, int64_t rows, int C, int Fl, const Exec& ex, bool swiglu) {
  const int width = swiglu ? 2 * Fl : Fl;  // SwiGLU: the fused [gate | up] rows
  if (ex.math()) model::linear_forward(fc, inp, p.c_fc.weight, p.c_fc.bias, rows, C, width);
  ex.op("mlp.c_fc.fwd", model::linear_forward_cost(rows, C, width, !swiglu, ex.elem));
  if (swiglu) {
    if (ex.math()) model::swiglu_forward(fc_gelu, fc, rows, Fl);
    ex.op("mlp.swiglu.fwd", model::swiglu_forward_cost(rows, Fl, ex.elem));
  } else {
    if (ex.math()) model::gelu_forward(fc_gelu, fc, rows * Fl);
    ex.op("mlp.gelu.fwd", model::gelu_forward_cost(rows * Fl, ex.elem));
  }
  if (ex.math())
    model::linear_forward(partial, fc_gelu, p.c_proj.weight, static_cast<const float*>(nullptr),
                          rows, Fl, C);
  ex.op("mlp.c_proj.fwd", model::linear_forward_cost(rows, Fl, C, false, ex.elem));
}

void linear_backward_split(float* dinp, float* dweight, float* dbias, const float* dout,
                           const float* inp, const float* weight, int64_t N, int C, int OC,
                           LinearNames names, WeightGrads& wg, const Exec& ex) {
  if (ex.math()) model::linear_backward_input(dinp, dout, weight, N, C, OC);
  ex.op(names.dgrad, model::linear_backward_input_cost(N, C, OC, ex.elem));
  wg.linear(names.wgrad, dweight, dbias, names.bias, dout, inp, N, C, OC, ex);
}

// dinp (rows,C) += this rank's partial; dout (rows,C) is complete, so the
// replicated c_proj bias gets its whole gradient here.
void tp_mlp_backward(float* dinp, const MlpView<float>& g, float* dfc, float* dfc_gelu,
                     const float* dout, const float* inp, const float* fc, const float* fc_gelu,
                     const MlpView<float>& p, int64_t rows, int C, int Fl, WeightGrads& wg,
                     const Exec& ex, bool swiglu) {
  const int width = swiglu ? 2 * Fl : Fl;
  zero(dfc_gelu, rows * Fl);
  linear_backward_split(dfc_gelu, g.c_proj.weight, g.c_proj.bias, dout, fc_gelu, p.c_proj.weight,
                        rows, Fl, C, {"mlp.c_proj.dgrad", "mlp.c_proj.wgrad", !swiglu}, wg, ex);
  zero(dfc, rows * width);
  if (swiglu) {
    if (ex.math()) model::swiglu_backward(dfc, dfc_gelu, fc, rows, Fl);
    ex.op("mlp.swiglu.bwd", model::swiglu_backward_cost(rows, Fl, ex.elem));
  } else {
    if (ex.math()) model::gelu_backward(dfc, dfc_gelu, fc, rows * Fl);
    ex.op("mlp.gelu.bwd", model::gelu_backward_cost(rows * Fl, ex.elem));
  }
  linear_backward_split(dinp, g.c_fc.weight, g.c_fc.bias, dfc, inp, p.c_fc.weight, rows, C, width,
                        {"mlp.c_fc.dgrad", "mlp.c_fc.wgrad", !swiglu}, wg, ex);
}

}  // namespace shardlab::parallel
