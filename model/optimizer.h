// AdamW with torch.optim.AdamW semantics, and the global-norm helpers used for
// gradient clipping. Included from kernels.h.
//
// One step on a tensor of n elements (step counts from 1, this step included):
//   p  <- p · (1 − lr·wd)                                 decoupled decay
//   m  <- m + (1 − β1)·(g − m)                            (torch lerp)
//   v  <- β2·v + (1 − β2)·g²
//   p  <- p − (lr / (1 − β1^t)) · m / (sqrt(v) / sqrt(1 − β2^t) + eps)
// The caller decides weight decay per tensor (nanoGPT: 2+-dim tensors only).
#pragma once

#include <cstdint>

#include "runtime/cost_model.h"

namespace shardlab::model {

struct AdamWHyper {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  // Aux-loss-free balancing (GPTConfig::router_bias_rate): the router
  // biases (ParamRole::kRouterBias) take b −= rate · sign(their gradient
  // slot's load signal) instead of AdamW (kernels_moe.h).
  double router_bias_rate = 0;
};

template <typename Real>
void adamw_update(Real* param,       // (n)
                  Real* m, Real* v,  // (n) first and second moments
                  const Real* grad,  // (n)
                  int64_t n, const AdamWHyper& hyper, double weight_decay, int64_t step);
OpCost adamw_update_cost(int64_t n, int elem);

// Σ x², accumulated in double (for the global gradient norm).
template <typename Real>
double sum_squares(const Real* x, int64_t n);
// x *= s (gradient clipping).
template <typename Real>
void scale_inplace(Real* x, Real s, int64_t n);
OpCost sum_squares_cost(int64_t n, int elem);
OpCost scale_inplace_cost(int64_t n, int elem);

}  // namespace shardlab::model
