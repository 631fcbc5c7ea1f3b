// Causal multi-head self-attention on the fused [q | k | v] layout.
// Shapes use the letters declared in kernels.h. Per (b, h) the work is three
// small GEMMs over strided Eigen views; the T×T products are computed in full
// and the causal mask is applied in the softmax (entries above the diagonal
// of `att` are exactly 0).
#include <algorithm>
#include <cmath>

#include "model/eigen_maps.h"
#include "model/kernels.h"

namespace shardlab::model {
namespace {

// Row-wise masked softmax of a (T,T) score block, in place: row t keeps
// columns 0..t, scaled by `scale` before the exponent; the rest become 0.
template <typename Real>
void causal_softmax_rows(Real* a, int T, Real scale) {
  for (int t = 0; t < T; ++t) {
    Real* row = a + static_cast<int64_t>(t) * T;
    ArrayMap<Real> r(row, t + 1);
    const Real vmax = r.maxCoeff() * scale;  // scale > 0
    r = (r * scale - vmax).exp();
    r *= Real(1) / r.sum();
    std::fill(row + t + 1, row + T, Real(0));
  }
}

// Softmax backward of one (T,T) block, into `dpre` (holding datt on entry):
// dpre = att * (datt - sum_u att*datt) * scale on the causal part, 0 above.
template <typename Real>
void causal_softmax_rows_backward(Real* dpre, const Real* a, int T, Real scale) {
  for (int t = 0; t < T; ++t) {
    Real* d = dpre + static_cast<int64_t>(t) * T;
    const Real* row = a + static_cast<int64_t>(t) * T;
    Real dot = 0;
    for (int u = 0; u <= t; ++u) dot += row[u] * d[u];
    for (int u = 0; u <= t; ++u) d[u] = row[u] * (d[u] - dot) * scale;
    for (int u = t + 1; u < T; ++u) d[u] = 0;
  }
}

}  // namespace

template <typename Real>
void attention_forward(Real* out, Real* att, const Real* qkv, int B, int T, int NH, int HS) {
  const int64_t C = static_cast<int64_t>(NH) * HS;
  const Real scale = Real(1) / std::sqrt(static_cast<Real>(HS));
  const Eigen::OuterStride<> s3(3 * C), s1(C);
  for (int b = 0; b < B; ++b) {
    const Real* base = qkv + static_cast<int64_t>(b) * T * 3 * C;
    for (int h = 0; h < NH; ++h) {
      ConstStridedMap<Real> q(base + h * HS, T, HS, s3);
      ConstStridedMap<Real> k(base + C + h * HS, T, HS, s3);
      ConstStridedMap<Real> v(base + 2 * C + h * HS, T, HS, s3);
      Real* a_ptr = att + (static_cast<int64_t>(b) * NH + h) * T * T;
      MatMap<Real> a(a_ptr, T, T);
      a.noalias() = q * k.transpose();
      causal_softmax_rows(a_ptr, T, scale);
      StridedMap<Real> o(out + static_cast<int64_t>(b) * T * C + h * HS, T, HS, s1);
      o.noalias() = a * v;
    }
  }
}

template <typename Real>
void attention_backward(Real* dqkv, const Real* dout, const Real* qkv, const Real* att, int B,
                        int T, int NH, int HS) {
  const int64_t C = static_cast<int64_t>(NH) * HS;
  const Real scale = Real(1) / std::sqrt(static_cast<Real>(HS));
  const Eigen::OuterStride<> s3(3 * C), s1(C);
  RowMajorMat<Real> dpre(T, T);  // one scratch block per call, reused for every (b, h)
  for (int b = 0; b < B; ++b) {
    const Real* base = qkv + static_cast<int64_t>(b) * T * 3 * C;
    Real* dbase = dqkv + static_cast<int64_t>(b) * T * 3 * C;
    for (int h = 0; h < NH; ++h) {
      ConstStridedMap<Real> q(base + h * HS, T, HS, s3);
      ConstStridedMap<Real> k(base + C + h * HS, T, HS, s3);
      ConstStridedMap<Real> v(base + 2 * C + h * HS, T, HS, s3);
      StridedMap<Real> dq(dbase + h * HS, T, HS, s3);
      StridedMap<Real> dk(dbase + C + h * HS, T, HS, s3);
      StridedMap<Real> dv(dbase + 2 * C + h * HS, T, HS, s3);
      const Real* a_ptr = att + (static_cast<int64_t>(b) * NH + h) * T * T;
      ConstMatMap<Real> a(a_ptr, T, T);
      ConstStridedMap<Real> dout_h(dout + static_cast<int64_t>(b) * T * C + h * HS, T, HS, s1);
      // out = att · v
      dv.noalias() += a.transpose() * dout_h;
      dpre.noalias() = dout_h * v.transpose();  // datt
      // att = softmax(scale · q kᵀ)
      causal_softmax_rows_backward(dpre.data(), a_ptr, T, scale);
      dq.noalias() += dpre * k;
      dk.noalias() += dpre.transpose() * q;
    }
  }
}

template void attention_forward(float*, float*, const float*, int, int, int, int);
template void attention_forward(double*, double*, const double*, int, int, int, int);
template void attention_backward(float*, const float*, const float*, const float*, int, int, int,
                                 int);
template void attention_backward(double*, const double*, const double*, const double*, int, int,
                                 int, int);

}  // namespace shardlab::model
