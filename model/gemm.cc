// GEMMs: Eigen (kNative) or fixed-order loops (kPortable). See gemm.h.
#include "model/gemm.h"

#include <Eigen/Core>

#include "model/arithmetic.h"
#include "model/eigen_maps.h"
#include "model/host_split.h"
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

// Output rows per chunk when a GEMM splits over idle cores (host_split.h).
// Each output row is computed alone, so a split over rows only changes the
// bits if it moves a row into another of Eigen's row kernels: Eigen runs rows
// in panels of 3 vector registers from each row block's start (48 floats or
// 24 doubles on AVX-512, 24 or 12 on AVX2, 12 or 6 on SSE and NEON), its row
// blocks are whole panels (its depth blocking depends on K alone), and only
// the rows past the last whole panel take narrower kernels. Chunks of a
// multiple of every panel, the last one taking the remainder (never a one-row
// chunk, which Eigen would run as a GEMV), give every row the kernel it has
// in one call: the same bits split or not, on any number of cores
// (tests/model/gemm_test.cc checks it).
constexpr int64_t kSplitRows = 48;

template <typename F>
void over_row_chunks(int64_t rows, double macs, const F& f) {
  for_chunks(rows, kSplitRows, macs, f);
}

double macs(int64_t N, int64_t M, int64_t K) { return double(N) * double(M) * double(K); }

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
    over_row_chunks(N, macs(N, M, K), [=](int64_t r0, int64_t r1) {
      for (int64_t n = r0; n < r1; ++n)
        for (int64_t m = 0; m < M; ++m) y[n * ldy + m] = pm::dot(a + n * lda, b + m * ldb, K);
    });
    return;
  }
  fix_eigen_blocking();
  over_row_chunks(N, macs(N, M, K), [=](int64_t r0, int64_t r1) {
    StridedMap<Real>(y + r0 * ldy, r1 - r0, M, Eigen::OuterStride<>(ldy)).noalias() =
        ConstStridedMap<Real>(a + r0 * lda, r1 - r0, K, Eigen::OuterStride<>(lda)) *
        ConstStridedMap<Real>(b, M, K, Eigen::OuterStride<>(ldb)).transpose();
  });
}

namespace {
// Whether Eigen's `y = a·bᵀ` on a chunk of `rows` rows is a GEMM whose every
// output is one depth block's sum added to Eigen's zero-fill (0 + Σ): then a
// fill with the bias (b + 0, so -0 turns +0 as 0 + Σ would) and `+=` give
// (b + 0) + Σ, bit for bit Eigen's (0 + Σ) followed by + b. Not so when
// Eigen blocks the depth ((0 + Σ₁) + Σ₂ ...: its kc, a function of K alone
// once the cache sizes are fixed; K up to 624 floats is one block on
// AVX-512), nor on its GEMV
// (one row or column) and coefficient-wise (tiny) paths.
template <typename Real>
bool bias_fill_keeps_bits(int64_t rows, int64_t M, int64_t K) {
  if (rows < 2 || M < 2 || rows + M + K < EIGEN_GEMM_TO_COEFFBASED_THRESHOLD) return false;
  // Eigen's view of a row-major y: yᵀ = b · aᵀ, M rows, `rows` columns.
  Eigen::Index kc = K, mc = M, nc = rows;
  Eigen::internal::computeProductBlockingSizes<Real, Real, 1>(kc, mc, nc, Eigen::Index(1));
  return kc >= K;
}
}  // namespace

template <typename Real>
void gemm_nt_bias(Real* y, const Real* a, const Real* b, const Real* bias, int64_t N, int64_t M,
                  int64_t K) {
  if (portable_arithmetic()) {
    over_row_chunks(N, macs(N, M, K), [=](int64_t r0, int64_t r1) {
      for (int64_t n = r0; n < r1; ++n)
        for (int64_t m = 0; m < M; ++m) y[n * M + m] = pm::dot(a + n * K, b + m * K, K) + bias[m];
    });
    return;
  }
  fix_eigen_blocking();
  over_row_chunks(N, macs(N, M, K), [=](int64_t r0, int64_t r1) {
    MatMap<Real> out(y + r0 * M, r1 - r0, M);
    const auto product = ConstMatMap<Real>(a + r0 * K, r1 - r0, K) * ConstMatMap<Real>(b, M, K).transpose();
    if (bias_fill_keeps_bits<Real>(r1 - r0, M, K)) {
      // The bias takes the place of Eigen's zero-fill: one pass over y, not two.
      for (int64_t n = r0; n < r1; ++n)
        for (int64_t m = 0; m < M; ++m) y[n * M + m] = bias[m] + Real(0);
      out.noalias() += product;
    } else {
      out.noalias() = product;
      for (int64_t n = r0; n < r1; ++n)
        for (int64_t m = 0; m < M; ++m) y[n * M + m] += bias[m];
    }
  });
}

template <typename Real>
void gemm_nn_acc(Real* y, const Real* a, const Real* b, int64_t N, int64_t M, int64_t K) {
  if (portable_arithmetic()) {
    over_row_chunks(N, macs(N, M, K), [=](int64_t r0, int64_t r1) {
      for (int64_t n = r0; n < r1; ++n)
        for (int64_t k = 0; k < K; ++k) axpy(y + n * M, a[n * K + k], b + k * M, M);
    });
    return;
  }
  fix_eigen_blocking();
  over_row_chunks(N, macs(N, M, K), [=](int64_t r0, int64_t r1) {
    MatMap<Real>(y + r0 * M, r1 - r0, M).noalias() +=
        ConstMatMap<Real>(a + r0 * K, r1 - r0, K) * ConstMatMap<Real>(b, K, M);
  });
}

template <typename Real>
void gemm_tn_acc(Real* y, const Real* a, const Real* b, int64_t N, int64_t M, int64_t K) {
  if (portable_arithmetic()) {
    over_row_chunks(M, macs(N, M, K), [=](int64_t m0, int64_t m1) {
      for (int64_t m = m0; m < m1; ++m)
        for (int64_t n = 0; n < N; ++n) axpy(y + m * K, a[n * M + m], b + n * K, K);
    });
    return;
  }
  fix_eigen_blocking();
  // y's rows are a's columns: a chunk reads a column block of a.
  over_row_chunks(M, macs(N, M, K), [=](int64_t m0, int64_t m1) {
    MatMap<Real>(y + m0 * K, m1 - m0, K).noalias() +=
        ConstStridedMap<Real>(a + m0, N, m1 - m0, Eigen::OuterStride<>(M)).transpose() *
        ConstMatMap<Real>(b, N, K);
  });
}

namespace {
thread_local std::optional<bool> t_split_for_test;
}  // namespace

void set_host_split_for_test(std::optional<bool> split) { t_split_for_test = split; }
std::optional<bool> host_split_for_test() { return t_split_for_test; }

#define SHARDLAB_INSTANTIATE_GEMM(Real)                                                          \
  template void gemm_nt(Real*, int64_t, const Real*, int64_t, const Real*, int64_t, int64_t,      \
                        int64_t, int64_t);                                                        \
  template void gemm_nt_bias(Real*, const Real*, const Real*, const Real*, int64_t, int64_t,       \
                             int64_t);                                                             \
  template void gemm_nn_acc(Real*, const Real*, const Real*, int64_t, int64_t, int64_t);          \
  template void gemm_tn_acc(Real*, const Real*, const Real*, int64_t, int64_t, int64_t);
SHARDLAB_INSTANTIATE_GEMM(float)
SHARDLAB_INSTANTIATE_GEMM(double)
#undef SHARDLAB_INSTANTIATE_GEMM

}  // namespace shardlab::model
