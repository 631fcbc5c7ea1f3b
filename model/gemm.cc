// GEMMs: Eigen (kNative) or fixed-order loops (kPortable). See gemm.h.
#include "model/gemm.h"

#include <Eigen/Core>

#include "model/arithmetic.h"
#include "model/eigen_maps.h"
#include "model/portable_math.h"

namespace shardlab::model {

namespace {

// Eigen sizes its GEMM blocks from the cache sizes it reads off the CPU, and
// the blocking decides the summation order: fixed sizes make the bits a
// function of the vector units alone. Typical of today's x86 and ARM cores.
void fix_eigen_blocking() {
  static const bool fixed = [] {
    Eigen::setCpuCacheSizes(32 * 1024, 1024 * 1024, 8 * 1024 * 1024);
    return true;
  }();
  (void)fixed;
}

// y[0..n) += s · x[0..n): vectorised per element, so the same bits on any host.
template <typename Real>
inline void axpy(Real* y, Real s, const Real* x, int64_t n) {
  for (int64_t j = 0; j < n; ++j) y[j] += s * x[j];
}

}  // namespace

template <typename Real>
void gemm_nt(Real* y, int64_t ldy, const Real* a, int64_t lda, const Real* b, int64_t ldb,
             int64_t N, int64_t M, int64_t K) {
  if (portable_arithmetic()) {
    for (int64_t n = 0; n < N; ++n)
      for (int64_t m = 0; m < M; ++m) y[n * ldy + m] = pm::dot(a + n * lda, b + m * ldb, K);
    return;
  }
  fix_eigen_blocking();
  StridedMap<Real>(y, N, M, Eigen::OuterStride<>(ldy)).noalias() =
      ConstStridedMap<Real>(a, N, K, Eigen::OuterStride<>(lda)) *
      ConstStridedMap<Real>(b, M, K, Eigen::OuterStride<>(ldb)).transpose();
}

template <typename Real>
void gemm_nn_acc(Real* y, const Real* a, const Real* b, int64_t N, int64_t M, int64_t K) {
  if (portable_arithmetic()) {
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < K; ++k) axpy(y + n * M, a[n * K + k], b + k * M, M);
    return;
  }
  fix_eigen_blocking();
  MatMap<Real>(y, N, M).noalias() += ConstMatMap<Real>(a, N, K) * ConstMatMap<Real>(b, K, M);
}

template <typename Real>
void gemm_tn_acc(Real* y, const Real* a, const Real* b, int64_t N, int64_t M, int64_t K) {
  if (portable_arithmetic()) {
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) axpy(y + m * K, a[n * M + m], b + n * K, K);
    return;
  }
  fix_eigen_blocking();
  MatMap<Real>(y, M, K).noalias() += ConstMatMap<Real>(a, N, M).transpose() * ConstMatMap<Real>(b, N, K);
}

#define SHARDLAB_INSTANTIATE_GEMM(Real)                                                          \
  template void gemm_nt(Real*, int64_t, const Real*, int64_t, const Real*, int64_t, int64_t,      \
                        int64_t, int64_t);                                                        \
  template void gemm_nn_acc(Real*, const Real*, const Real*, int64_t, int64_t, int64_t);          \
  template void gemm_tn_acc(Real*, const Real*, const Real*, int64_t, int64_t, int64_t);
SHARDLAB_INSTANTIATE_GEMM(float)
SHARDLAB_INSTANTIATE_GEMM(double)
#undef SHARDLAB_INSTANTIATE_GEMM

}  // namespace shardlab::model
