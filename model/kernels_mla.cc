// MLA's kernels (kernels_mla.h).
#include "model/kernels_mla.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace shardlab::model {

namespace {

// cos and sin of every (t, i < Dr/2) angle, as rope_rotate computes them.
template <typename Real>
void angles(std::vector<Real>& cs, const int64_t* positions, int T, int Dr, double theta, double sign) {
  const int half = Dr / 2;
  cs.resize(size_t(2) * T * half);
  for (int t = 0; t < T; ++t) {
    const double pos = static_cast<double>(positions ? positions[t] : t);
    for (int i = 0; i < half; ++i) {
      const double angle = pos * std::pow(theta, -2.0 * i / Dr);
      cs[2 * (size_t(t) * half + i)] = static_cast<Real>(std::cos(angle));
      cs[2 * (size_t(t) * half + i) + 1] = static_cast<Real>(sign * std::sin(angle));
    }
  }
}

// out[0, Dr) = the rotation of in[0, Dr) by the (c, s) pairs of one token.
template <typename Real>
void rotate(Real* out, const Real* in, const Real* cs, int Dr) {
  const int half = Dr / 2;
  for (int i = 0; i < half; ++i) {
    const Real c = cs[2 * i], s = cs[2 * i + 1], x1 = in[i], x2 = in[i + half];
    out[i] = x1 * c - x2 * s;
    out[i + half] = x2 * c + x1 * s;
  }
}

}  // namespace

template <typename Real>
void mla_rope_forward(Real* qkv, const Real* q, const Real* kv, const Real* kpe, const int64_t* positions, int B,
                      int T, const MlaHeads& h, double theta) {
  thread_local std::vector<Real> cs;
  angles(cs, positions, T, h.Dr, theta, 1.0);
  const int HS = h.HS(), half = h.Dr / 2;
  const int64_t W = h.core_width(), Cq = h.q_width();
  for (int64_t n = 0; n < int64_t{B} * T; ++n) {
    const Real* c = cs.data() + 2 * size_t(n % T) * half;
    Real* row = qkv + n * W;
    const Real* qr = q + n * h.q_width();
    const Real* kvr = kv + n * h.kv_width();
    for (int hd = 0; hd < h.NH; ++hd) {
      Real* qo = row + int64_t{hd} * HS;
      Real* ko = row + Cq + int64_t{hd} * HS;
      Real* vo = row + 2 * Cq + int64_t{hd} * HS;
      const Real* qi = qr + int64_t{hd} * HS;
      const Real* kvi = kvr + int64_t{hd} * (h.Dn + h.Dv);
      std::copy_n(qi, h.Dn, qo);
      rotate(qo + h.Dn, qi + h.Dn, c, h.Dr);
      std::copy_n(kvi, h.Dn, ko);
      rotate(ko + h.Dn, kpe + n * h.Dr, c, h.Dr);
      std::copy_n(kvi + h.Dn, h.Dv, vo);
      std::fill(vo + h.Dv, vo + HS, Real(0));
    }
  }
}

template <typename Real>
void mla_rope_backward(Real* dq, Real* dkv, Real* dkpe, const Real* dqkv, const int64_t* positions, int B, int T,
                       const MlaHeads& h, double theta) {
  thread_local std::vector<Real> cs, back;
  angles(cs, positions, T, h.Dr, theta, -1.0);  // the inverse rotation
  back.resize(size_t(h.Dr));
  const int HS = h.HS(), half = h.Dr / 2;
  const int64_t W = h.core_width(), Cq = h.q_width();
  for (int64_t n = 0; n < int64_t{B} * T; ++n) {
    const Real* c = cs.data() + 2 * size_t(n % T) * half;
    const Real* row = dqkv + n * W;
    Real* qr = dq + n * h.q_width();
    Real* kvr = dkv + n * h.kv_width();
    Real* kp = dkpe + n * h.Dr;
    std::fill_n(kp, h.Dr, Real(0));
    for (int hd = 0; hd < h.NH; ++hd) {
      const Real* qi = row + int64_t{hd} * HS;
      const Real* ki = row + Cq + int64_t{hd} * HS;
      const Real* vi = row + 2 * Cq + int64_t{hd} * HS;
      Real* qo = qr + int64_t{hd} * HS;
      Real* kvo = kvr + int64_t{hd} * (h.Dn + h.Dv);
      std::copy_n(qi, h.Dn, qo);
      rotate(qo + h.Dn, qi + h.Dn, c, h.Dr);
      std::copy_n(ki, h.Dn, kvo);
      std::copy_n(vi, h.Dv, kvo + h.Dn);
      rotate(back.data(), ki + h.Dn, c, h.Dr);
      for (int i = 0; i < h.Dr; ++i) kp[i] += back[size_t(i)];
    }
  }
}

void mla_rope_inplace(float* q, int64_t ldq, float* kpe, int64_t ldk, const int64_t* positions, int T,
                      const MlaHeads& h, double theta) {
  thread_local std::vector<float> cs;
  angles(cs, positions, T, h.Dr, theta, 1.0);
  const int half = h.Dr / 2;
  for (int t = 0; t < T; ++t) {
    const float* c = cs.data() + 2 * size_t(t) * half;
    float* row = q + int64_t{t} * ldq;
    for (int hd = 0; hd < h.NH; ++hd) {
      float* qpe = row + int64_t{hd} * h.HS() + h.Dn;
      rotate(qpe, qpe, c, h.Dr);  // in place: each pair is read before it is written
    }
    float* k = kpe + int64_t{t} * ldk;
    rotate(k, k, c, h.Dr);
  }
}

OpCost mla_rope_inplace_cost(int64_t N, const MlaHeads& h, int elem) {
  const double n = static_cast<double>(N) * (h.NH + 1) * h.Dr;
  return {3 * n, 2 * n * elem};
}

OpCost mla_rope_forward_cost(int64_t N, const MlaHeads& h, int elem) {
  const double n = static_cast<double>(N), NH = h.NH;
  const double read = n * (h.q_width() + h.kv_width() + h.Dr);
  const double write = n * NH * (2.0 * h.HS() + h.Dv);
  return {3 * n * (NH + 1) * h.Dr, (read + write) * elem};
}

OpCost mla_rope_backward_cost(int64_t N, const MlaHeads& h, int elem) {
  const double n = static_cast<double>(N), NH = h.NH;
  const double read = n * NH * (2.0 * h.HS() + h.Dv);
  const double write = n * (h.q_width() + h.kv_width() + h.Dr);
  return {3 * n * 2 * NH * h.Dr + n * NH * h.Dr, (read + write) * elem};
}

template <typename Real>
void mla_unpad(Real* out, const Real* padded, int64_t N, const MlaHeads& h) {
  const int HS = h.HS();
  for (int64_t r = 0; r < N * h.NH; ++r) std::copy_n(padded + r * HS, h.Dv, out + r * h.Dv);
}

template <typename Real>
void mla_pad(Real* padded, const Real* in, int64_t N, const MlaHeads& h) {
  const int HS = h.HS();
  for (int64_t r = 0; r < N * h.NH; ++r) {
    std::copy_n(in + r * h.Dv, h.Dv, padded + r * HS);
    std::fill(padded + r * HS + h.Dv, padded + (r + 1) * HS, Real(0));
  }
}

template <typename Real>
void split_columns(Real* left, Real* right, const Real* in, int64_t N, int a, int b) {
  for (int64_t n = 0; n < N; ++n) {
    std::copy_n(in + n * (a + b), a, left + n * a);
    std::copy_n(in + n * (a + b) + a, b, right + n * b);
  }
}

template <typename Real>
void join_columns(Real* out, const Real* left, const Real* right, int64_t N, int a, int b) {
  for (int64_t n = 0; n < N; ++n) {
    std::copy_n(left + n * a, a, out + n * (a + b));
    std::copy_n(right + n * b, b, out + n * (a + b) + a);
  }
}

#define SHARDLAB_INSTANTIATE_MLA(Real)                                                                            \
  template void mla_rope_forward(Real*, const Real*, const Real*, const Real*, const int64_t*, int, int,         \
                                 const MlaHeads&, double);                                                       \
  template void mla_rope_backward(Real*, Real*, Real*, const Real*, const int64_t*, int, int, const MlaHeads&,   \
                                  double);                                                                       \
  template void mla_unpad(Real*, const Real*, int64_t, const MlaHeads&);                                        \
  template void mla_pad(Real*, const Real*, int64_t, const MlaHeads&);                                          \
  template void split_columns(Real*, Real*, const Real*, int64_t, int, int);                                    \
  template void join_columns(Real*, const Real*, const Real*, int64_t, int, int);

SHARDLAB_INSTANTIATE_MLA(float)
SHARDLAB_INSTANTIATE_MLA(double)
#undef SHARDLAB_INSTANTIATE_MLA

}  // namespace shardlab::model
