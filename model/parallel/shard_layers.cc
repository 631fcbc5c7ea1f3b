// The local math of column- and row-parallel layers (shard_layers.h).
#include "model/parallel/shard_layers.h"

#include <algorithm>

#include "model/kernels.h"

namespace shardlab::parallel {

using model::Exec;
using model::MlpView;


void add_bias_rows(float* out, const float* bias, int64_t N, int OC, const char* name,
                   const Exec& ex) {
  const double n = static_cast<double>(N);
  ex.run(name, OpCost{n * OC, (2 * n * OC + OC) * ex.elem}, [&] {
    for (int64_t r = 0; r < N; ++r) {
      float* o = out + r * OC;
      for (int j = 0; j < OC; ++j) o[j] += bias[j];
    }
  });
}

// ---- MLP: c_fc column-parallel, GELU, c_proj row-parallel (partial, no bias) ----

void tp_mlp_partial_forward(float* partial, float* fc, float* fc_gelu, const MlpView<float>& p,
                            const float* inp, int64_t rows, int C, int Fl, const Exec& any, bool swiglu) {
  const Exec ex = any.te_linear();  // FP8 GEMMs under --precision fp8 (experts' too)
  if (swiglu) {  // the fused [gate | up] rows, no biases
    model::linear_forward(ex, "mlp.c_fc.fwd", fc, inp, p.c_fc.weight, rows, C, 2 * Fl);
    model::swiglu_forward(ex, "mlp.swiglu.fwd", fc_gelu, fc, rows, Fl);
  } else {
    model::linear_forward(ex, "mlp.c_fc.fwd", fc, inp, p.c_fc.weight, p.c_fc.bias, rows, C, Fl);
    model::gelu_forward(ex, "mlp.gelu.fwd", fc_gelu, fc, rows * Fl);
  }
  model::linear_forward(ex, "mlp.c_proj.fwd", partial, fc_gelu, p.c_proj.weight, rows, Fl, C);
}

void linear_backward_split(float* dinp, float* dweight, float* dbias, const float* dout,
                           const float* inp, const float* weight, int64_t N, int C, int OC,
                           LinearNames names, WeightGrads& wg, const Exec& ex) {
  model::linear_backward_input(ex, names.dgrad, dinp, dout, weight, N, C, OC);
  wg.linear(names.wgrad, dweight, dbias, names.bias, dout, inp, N, C, OC, ex);
}

// dinp (rows,C) += this rank's partial; dout (rows,C) is complete, so the
// replicated c_proj bias gets its whole gradient here.
void tp_mlp_backward(float* dinp, const MlpView<float>& g, float* dfc, float* dfc_gelu,
                     const float* dout, const float* inp, const float* fc, const float* fc_gelu,
                     const MlpView<float>& p, int64_t rows, int C, int Fl, WeightGrads& wg,
                     const Exec& any, bool swiglu) {
  const Exec ex = any.te_linear();
  const int width = swiglu ? 2 * Fl : Fl;
  zero(dfc_gelu, rows * Fl);
  linear_backward_split(dfc_gelu, g.c_proj.weight, g.c_proj.bias, dout, fc_gelu, p.c_proj.weight,
                        rows, Fl, C, {"mlp.c_proj.dgrad", "mlp.c_proj.wgrad", !swiglu}, wg, ex);
  zero(dfc, rows * width);
  if (swiglu) {
    model::swiglu_backward(ex, "mlp.swiglu.bwd", dfc, dfc_gelu, fc, rows, Fl);
  } else {
    model::gelu_backward(ex, "mlp.gelu.bwd", dfc, dfc_gelu, fc, rows * Fl);
  }
  linear_backward_split(dinp, g.c_fc.weight, g.c_fc.bias, dfc, inp, p.c_fc.weight, rows, C, width,
                        {"mlp.c_fc.dgrad", "mlp.c_fc.wgrad", !swiglu}, wg, ex);
}

}  // namespace shardlab::parallel
