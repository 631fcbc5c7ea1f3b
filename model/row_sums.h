// Row sums of attention's causal products (model/kernels_attention.cc):
// y[0..w) (= or +=) Σ_{i<n} a[i·lda] · x[i·ldx + 0..w), the half of att·v,
// attᵀ·dout, dpre·k and dpreᵀ·q that the causal mask leaves, without
// packing.
//
// sum_rows fixes each column's order of operations: row i goes to partial
// sum i mod 4 (a product rounded, then an add; the build has no FMA
// contraction), and y gets (s0 + s1) + (s2 + s3). Every pinned run's bits
// depend on it.
//
// sum_rows_prefix and sum_rows_suffix compute many consecutive outputs with
// exactly those operations, each output's, in its order, but several
// outputs share every row of x they load: one output at a time streams the
// whole head of x (T rows) from L2 for a single multiply-add per element
// (about 40 GFLOP/s on the AVX-512 box); six at a time, about 2x that
// (bench/README.md). Only the interleaving changes, never one
// output's sums (tests/model/row_sums_test.cc: memcmp against sum_rows).
//
// Thread safety: pure functions of their arguments.
#pragma once

#include <cstdint>

#include <Eigen/Core>

namespace shardlab::model::row_sums {

// y[0..W) (= or +=) Σ_{i<n} a[i·lda] · x[i·ldx + 0..W). Fixed-size Eigen
// arrays make each partial sum a vector register.
template <int W, typename Real>
inline void sum_rows_w(Real* y, const Real* a, int64_t lda, const Real* x, int64_t ldx, int n, bool accumulate) {
  using Run = Eigen::Array<Real, W, 1>;
  using ConstRunMap = Eigen::Map<const Run>;
  Run acc0 = Run::Zero(), acc1 = Run::Zero(), acc2 = Run::Zero(), acc3 = Run::Zero();
  int i = 0;
  for (; i + 4 <= n; i += 4) {
    acc0 += a[i * lda] * ConstRunMap(x + i * ldx);
    acc1 += a[(i + 1) * lda] * ConstRunMap(x + (i + 1) * ldx);
    acc2 += a[(i + 2) * lda] * ConstRunMap(x + (i + 2) * ldx);
    acc3 += a[(i + 3) * lda] * ConstRunMap(x + (i + 3) * ldx);
  }
  if (i < n) acc0 += a[i * lda] * ConstRunMap(x + i * ldx);
  if (i + 1 < n) acc1 += a[(i + 1) * lda] * ConstRunMap(x + (i + 1) * ldx);
  if (i + 2 < n) acc2 += a[(i + 2) * lda] * ConstRunMap(x + (i + 2) * ldx);
  Eigen::Map<Run> yr(y);
  if (accumulate) {
    yr += (acc0 + acc1) + (acc2 + acc3);
  } else {
    yr = (acc0 + acc1) + (acc2 + acc3);
  }
}

// One output, in runs of 64, 32, 16, 8, 4, 1 columns. Every column sums the
// same way in any run (four row accumulators, then (0+1)+(2+3)), so the run
// widths only decide how many columns share one pass over a and x.
template <typename Real>
void sum_rows(Real* y, const Real* a, int64_t lda, const Real* x, int64_t ldx, int n, int w, bool accumulate) {
  int j = 0;
  for (; j + 64 <= w; j += 64) sum_rows_w<64>(y + j, a, lda, x + j, ldx, n, accumulate);
  for (; j + 32 <= w; j += 32) sum_rows_w<32>(y + j, a, lda, x + j, ldx, n, accumulate);
  for (; j + 16 <= w; j += 16) sum_rows_w<16>(y + j, a, lda, x + j, ldx, n, accumulate);
  for (; j + 8 <= w; j += 8) sum_rows_w<8>(y + j, a, lda, x + j, ldx, n, accumulate);
  for (; j + 4 <= w; j += 4) sum_rows_w<4>(y + j, a, lda, x + j, ldx, n, accumulate);
  for (; j < w; ++j) sum_rows_w<1>(y + j, a, lda, x + j, ldx, n, accumulate);
}

namespace detail {

// One vector register of the build, and how many outputs share a row of x:
// R outputs hold 4·R partial sums in registers (24 of AVX-512's 32, 12 of
// the 16 elsewhere).
#if defined(__AVX512F__)
inline constexpr int kVectorBytes = 64, kOutputs = 6;
#elif defined(__AVX__)
inline constexpr int kVectorBytes = 32, kOutputs = 3;
#else
inline constexpr int kVectorBytes = 16, kOutputs = 3;
#endif

template <typename Real>
struct Lanes {
  static constexpr int L = kVectorBytes / int(sizeof(Real));
  typedef Real Vec __attribute__((vector_size(kVectorBytes)));
  typedef Real UVec __attribute__((vector_size(kVectorBytes), aligned(alignof(Real))));
  static Vec load(const Real* p) { return *reinterpret_cast<const UVec*>(p); }
  static void store(Real* p, Vec v) { *reinterpret_cast<UVec*>(p) = v; }
};

// R outputs r = 0..R-1, columns [0, W) with W a multiple of the lanes:
// y + r·ldy (= or +=) Σ_i a[r·so + i·sa] · x[i·ldx + 0..W), over rows
// [0, n + r) (Suffix false) or [r, n) (Suffix true). A row's partial sum is
// its index among its output's rows, mod 4, as in sum_rows_w. The rows all
// R outputs take (from c0) run unrolled by 4, where each output's partial
// sum for row c0 + 4m + k is a constant.
template <int R, bool Suffix, typename Real>
void rows_block(Real* y, int64_t ldy, const Real* a, int64_t sa, int64_t so, const Real* x, int64_t ldx, int n,
                int W, bool accumulate) {
  using P = Lanes<Real>;
  using Vec = typename P::Vec;
  constexpr int c0 = Suffix ? R - 1 : 0;
  const int c1 = n;  // rows [c0, c1) are every output's
  for (int j = 0; j < W; j += P::L) {
    Vec acc[R][4];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
      for (int k = 0; k < 4; ++k) acc[r][k] = Vec{};
    const auto one = [&](int r, int i) {  // row i of output r, alone
      const Vec xv = P::load(x + int64_t(i) * ldx + j);
      const Real s = a[r * so + int64_t(i) * sa];
      switch ((Suffix ? i - r : i) & 3) {
        case 0: acc[r][0] += s * xv; break;
        case 1: acc[r][1] += s * xv; break;
        case 2: acc[r][2] += s * xv; break;
        default: acc[r][3] += s * xv; break;
      }
    };
    if constexpr (Suffix) {
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r)
        for (int i = r; i < c0; ++i) one(r, i);
    }
    int i = c0;
    for (; i + 4 <= c1; i += 4) {
#pragma GCC unroll 4
      for (int k = 0; k < 4; ++k) {
        const Vec xv = P::load(x + int64_t(i + k) * ldx + j);
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) acc[r][((Suffix ? c0 - r : 0) + k) & 3] += a[r * so + int64_t(i + k) * sa] * xv;
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      for (int ii = i; ii < (Suffix ? c1 : c1 + r); ++ii) one(r, ii);
      const Vec s = (acc[r][0] + acc[r][1]) + (acc[r][2] + acc[r][3]);
      Real* yr = y + r * ldy + j;
      P::store(yr, accumulate ? P::load(yr) + s : s);
    }
  }
}

// Outputs o = 0..outs-1 of sum_rows_prefix (Suffix false) or
// sum_rows_suffix: blocks of R outputs over the columns in whole vectors,
// then sum_rows for the rest of the columns and the last outputs.
template <bool Suffix, typename Real>
void sum_rows_many(Real* y, int64_t ldy, const Real* a, int64_t lda, const Real* x, int64_t ldx, int n, int outs,
                   int w, bool accumulate) {
  constexpr int R = kOutputs, L = Lanes<Real>::L;
  const int wv = w / L * L;
  // output p's a, its step per row, its x and its rows, as sum_rows takes them
  const auto a_of = [&](int p) { return a + p * lda + (Suffix ? p : 0); };
  const int64_t a_step = Suffix ? lda : 1;
  const auto x_of = [&](int p) { return x + (Suffix ? p * ldx : 0); };
  const auto rows_of = [&](int p) { return Suffix ? n - p : n + p; };
  int o = 0;
  if (wv > 0)
    for (; o + R <= outs && rows_of(o) >= (Suffix ? R : 0); o += R)
      rows_block<R, Suffix>(y + o * ldy, ldy, a_of(o), a_step, Suffix ? 1 : lda, x_of(o), ldx, rows_of(o), wv,
                            accumulate);
  for (int p = 0; p < outs; ++p) {
    const int j = p < o ? wv : 0;  // columns the blocks did not take
    sum_rows(y + p * ldy + j, a_of(p), a_step, x_of(p) + j, ldx, rows_of(p), w - j, accumulate);
  }
}

}  // namespace detail

// outs outputs o: y + o·ldy (= or +=) Σ_{i < n0 + o} a[o·lda + i] · x[i·ldx + 0..w),
// each bit for bit sum_rows(y + o·ldy, a + o·lda, 1, x, ldx, n0 + o, w, accumulate)
// (att·v and dpre·k: output t sums rows 0..t).
template <typename Real>
void sum_rows_prefix(Real* y, int64_t ldy, const Real* a, int64_t lda, const Real* x, int64_t ldx, int n0, int outs,
                     int w, bool accumulate) {
  detail::sum_rows_many<false>(y, ldy, a, lda, x, ldx, n0, outs, w, accumulate);
}

// outs outputs o: y + o·ldy (= or +=) Σ_{o ≤ i < n} a[i·lda + o] · x[i·ldx + 0..w),
// each bit for bit sum_rows(y + o·ldy, a + o·lda + o, lda, x + o·ldx, ldx, n - o, w,
// accumulate) (attᵀ·dout and dpreᵀ·q: output u sums rows u..T-1).
template <typename Real>
void sum_rows_suffix(Real* y, int64_t ldy, const Real* a, int64_t lda, const Real* x, int64_t ldx, int n, int outs,
                     int w, bool accumulate) {
  detail::sum_rows_many<true>(y, ldy, a, lda, x, ldx, n, outs, w, accumulate);
}

}  // namespace shardlab::model::row_sums
