// AdamW and norm helpers. See optimizer.h for the exact update.
#include "model/optimizer.h"

#include <cmath>

#include "model/host_split.h"
#include "model/kernel_cost.h"
#include "model/portable_math.h"

namespace shardlab::model {

namespace {
// torch.lerp on CPU: two formulas depending on the weight, for accuracy.
template <typename Real>
Real lerp(Real start, Real end, Real weight) {
  return weight < Real(0.5) ? start + weight * (end - start)
                            : end - (end - start) * (Real(1) - weight);
}
}  // namespace

template <typename Real>
void adamw_update(Real* param, Real* m, Real* v, const Real* grad, int64_t n,
                  const AdamWHyper& hyper, double weight_decay, int64_t step) {
  // Scalars in double as torch computes them in Python, then rounded once;
  // beta^step in double-double (the C library's pow differs by CPU).
  const double bias_correction1 = 1.0 - pm::pow_int(hyper.beta1, step);
  const double bias_correction2 = 1.0 - pm::pow_int(hyper.beta2, step);
  const Real decay = static_cast<Real>(1.0 - hyper.lr * weight_decay);
  const Real w1 = static_cast<Real>(1.0 - hyper.beta1);
  const Real b2 = static_cast<Real>(hyper.beta2);
  const Real w2 = static_cast<Real>(1.0 - hyper.beta2);
  const Real step_size = static_cast<Real>(hyper.lr / bias_correction1);
  const Real bc2_sqrt = static_cast<Real>(std::sqrt(bias_correction2));
  const Real eps = static_cast<Real>(hyper.eps);
  // elements are independent: split on idle cores (host_split.h), same bits
  for_chunks(n, 16384, 14.0 * n, [=](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const Real g = grad[i];
      param[i] *= decay;
      m[i] = lerp(m[i], g, w1);
      v[i] = v[i] * b2 + w2 * g * g;
      const Real denom = std::sqrt(v[i]) / bc2_sqrt + eps;
      param[i] -= step_size * (m[i] / denom);
    }
  });
}

template <typename Real>
double sum_squares(const Real* x, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * x[i];
  return s;
}

template <typename Real>
void scale_inplace(Real* x, Real s, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] *= s;
}

template void adamw_update(float*, float*, float*, const float*, int64_t, const AdamWHyper&, double,
                           int64_t);
template void adamw_update(double*, double*, double*, const double*, int64_t, const AdamWHyper&,
                           double, int64_t);
template double sum_squares(const float*, int64_t);
template double sum_squares(const double*, int64_t);
template void scale_inplace(float*, float, int64_t);
template void scale_inplace(double*, double, int64_t);

using cost_terms::cost;

OpCost adamw_update_cost(int64_t n, int elem) {
  // read p, m, v, g; write p, m, v, each of `elem` bytes (the optimizer keeps
  // them in fp32 in every precision: optimizer_step.cc passes 4)
  return cost(14.0 * n, 7.0 * n, elem);
}
OpCost sum_squares_cost(int64_t n, int elem) { return cost(2.0 * n, 1.0 * n, elem); }
OpCost scale_inplace_cost(int64_t n, int elem) { return cost(1.0 * n, 2.0 * n, elem); }

}  // namespace shardlab::model
