// gebp_wide: 48 × 8 and 32 × 12 register blocks for Eigen's GEMM kernel on
// AVX-512 float, the same bits as Eigen's own (model/gemm.cc's split_gemm runs it;
// nothing else includes this header: it pulls in Eigen's internals).
#pragma once

#include <type_traits>

#include <Eigen/Core>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace shardlab::model::detail {

namespace ei = Eigen::internal;
using Index = Eigen::Index;

// Where gebp_wide runs: then every GEMM Eigen would run takes split_gemm's
// loop (the same blocks in the same order as Eigen's), split or not.
template <typename Real>
inline constexpr bool kWide =
#if defined(__AVX512F__)
    std::is_same_v<Real, float> && ei::gebp_traits<float, float>::mr == 48 && ei::gebp_traits<float, float>::nr == 4;
#else
    false;
#endif

// ---- A wider register block for gebp's full panels -------------------------
//
// Eigen 3.4's float kernel on AVX-512 holds a 48 × 4 block of res in 12
// registers (its 3pX4 kernel): per depth step 3 lhs loads and 4 broadcasts
// feed 12 multiply-adds. With 32 registers a 48 × 8 block fits (24
// accumulators), 11 loads for 24 multiply-adds: 117 against gebp's 92
// GFLOP/s on one core of the development box (a 1536 × 384 block times 48
// columns, bench/README.md). Every output is computed exactly as gebp's
// 3pX4 kernel computes it: an accumulator from zero, one fused multiply-add
// per depth step in k order, then res + acc (gebp's pmadd(acc, 1, res), the
// same rounding). It reads Eigen's packed blocks as they are: lhs panels of
// 48 rows ([k][48]), rhs panels of 4 columns ([k][4]) one after another, so
// columns j..j+7 are two panels. The 32-row panel Eigen packs past the
// 48-row ones (a row count of 32 mod 48: tiny's 128 and 512) runs 32 × 12
// blocks the same way (gebp's 2pX4 kernel sums each output alike); what is
// left runs in gebp itself, which reads the same packed blocks from those
// offsets (gemm_test: every split and packed product memcmp-equal to Eigen's
// own, and the 32-row panel's shapes among them).
#if defined(__AVX512F__)
// One (16·P) × Q block of res += the packed lhs panel `a` ([k][16·P]) times
// Q columns of the rhs: P·Q accumulators from zero, one fused multiply-add
// per depth step in k order, then res + acc, as gebp's kernels for P row
// packets do. The rhs is Eigen's packed block, Q/4 panels of 4 columns from
// `b` ([k][4] each, one after another), or the rhs unpacked where it is:
// column-major (kColumns: column q at b + q·ldb, contiguous in k) or
// row-major (kRows: depth step k at b + k·ldb, contiguous in q). The lhs
// likewise: the packed panel, or (A) a column-major lhs where it is, depth
// step k at a + k·lda.
enum Rhs { kPacked, kColumns, kRows };
template <int P, int Q, Rhs R, bool A>
inline void wide_block(float* res, Index ldres, const float* a, Index lda, const float* b, Index ldb, Index depth) {
  static_assert(Q % 4 == 0 && P * Q + P <= 32, "the block must fit in the 32 vector registers");
  __m512 acc[Q][P];
  for (auto& column : acc)
    for (__m512& v : column) v = _mm512_setzero_ps();
  for (Index k = 0; k < depth; ++k) {
    __m512 av[P];
    for (int p = 0; p < P; ++p) av[p] = A ? _mm512_loadu_ps(a + k * lda + 16 * p) : _mm512_load_ps(a + 16 * P * k + 16 * p);
#pragma GCC unroll 12
    for (int q = 0; q < Q; ++q) {
      const __m512 bq = _mm512_set1_ps(R == kColumns ? b[q * ldb + k]
                                       : R == kRows  ? b[k * ldb + q]
                                                     : b[(q / 4) * 4 * depth + 4 * k + q % 4]);
      for (int p = 0; p < P; ++p) acc[q][p] = _mm512_fmadd_ps(av[p], bq, acc[q][p]);
    }
  }
  for (int q = 0; q < Q; ++q) {
    float* r = res + q * ldres;
    for (int p = 0; p < P; ++p) _mm512_storeu_ps(r + 16 * p, _mm512_add_ps(_mm512_loadu_ps(r + 16 * p), acc[q][p]));
  }
}

// The whole panels of one gebp call in wide blocks: the 48-row panels 8
// columns at a time, then 4; the 32-row panel 12 at a time, then 8, then 4.
// Column j of the rhs is at b + j·ldb (kColumns), b + j (kRows) or in its
// packed panel; row i of the lhs at block_a + i (A) or in its packed panel.
template <Rhs R, bool A>
void wide_panels(float* res, Index ldres, const float* block_a, Index lda, const float* b, Index ldb, Index rows48,
                 Index rows32, Index depth, Index cols4) {
  const auto column = [&](Index j) { return b + j * (R == kColumns ? ldb : R == kRows ? 1 : depth); };
  const auto panel = [&](Index i) { return block_a + i * (A ? 1 : depth); };
  const Index cols8 = cols4 / 8 * 8;
  for (Index i = 0; i < rows48; i += 48) {
    const float* a = panel(i);
    for (Index j = 0; j < cols8; j += 8)
      wide_block<3, 8, R, A>(res + j * ldres + i, ldres, a, lda, column(j), ldb, depth);
    if (cols8 < cols4) wide_block<3, 4, R, A>(res + cols8 * ldres + i, ldres, a, lda, column(cols8), ldb, depth);
  }
  if (rows32 == 0) return;
  const float* a = panel(rows48);
  float* r = res + rows48;
  Index j = 0;
  for (; j + 12 <= cols4; j += 12) wide_block<2, 12, R, A>(r + j * ldres, ldres, a, lda, column(j), ldb, depth);
  if (j + 8 <= cols4) {
    wide_block<2, 8, R, A>(r + j * ldres, ldres, a, lda, column(j), ldb, depth);
    j += 8;
  }
  if (j < cols4) wide_block<2, 4, R, A>(r + j * ldres, ldres, a, lda, column(j), ldb, depth);
}
#endif

// Eigen packs the rows of an lhs block in panels of 48 (3 packets), then at
// most one of 32 (2 packets: the remainder is under 48), then narrower ones;
// gebp runs each width with its own kernel (3pX4, 2pX4, 1pX4, ...) over the
// rhs's panels of 4 columns, then its single columns. gebp_wide runs the
// 48- and 32-row panels on the panels of 4 columns (wide_panels), each
// output summed as gebp's kernel for its panel sums it; gebp itself runs the
// single columns past them and the rows past the 32-row panel.
template <typename Real>
struct WideSplit {
  Index rows48 = 0, rows32 = 0, cols4 = 0;
  WideSplit(Index rows, Index cols) {
    if constexpr (kWide<Real>) {
      rows48 = rows / 48 * 48;
      rows32 = rows - rows48 >= 32 ? 32 : 0;
      cols4 = cols / 4 * 4;
    }
  }
};

// Whether gebp_wide covers every output of a rows × cols call: then it can
// read the rhs's columns where they are (`direct`) instead of packed.
template <typename Real>
bool wide_covers(Index rows, Index cols) {
  const WideSplit<Real> w(rows, cols);
  return kWide<Real> && w.rows48 + w.rows32 == rows && w.cols4 == cols;
}

// res += block_a (packed) · the rhs: Eigen's packed block_b, or where
// wide_covers(rows, cols), `direct` (column j at direct + j·ld_direct,
// contiguous in k, or with `direct_rows` depth step k at direct + k·ld_direct,
// contiguous in j; block_b is then not read); and with a `direct` rhs,
// `direct_a` may stand for block_a: lhs row i at depth step k at
// direct_a[i + k·ld_a].
template <typename Real, typename ResMapper>
void gebp_wide(Real* res, Index ldres, const Real* block_a, const Real* block_b, Index rows, Index depth, Index cols,
               const Real* direct = nullptr, Index ld_direct = 0, bool direct_rows = false,
               const Real* direct_a = nullptr, Index ld_a = 0) {
  using Traits = ei::gebp_traits<Real, Real>;
  ei::gebp_kernel<Real, Real, Index, ResMapper, Traits::mr, Traits::nr, false, false> gebp;
  const WideSplit<Real> w(rows, cols);
#if defined(__AVX512F__)
  if constexpr (kWide<Real>) {
    const Index r48 = w.rows48, r32 = w.rows32, c4 = w.cols4;
    if (direct_a && direct_rows)
      wide_panels<kRows, true>(res, ldres, direct_a, ld_a, direct, ld_direct, r48, r32, depth, c4);
    else if (direct_a)
      wide_panels<kColumns, true>(res, ldres, direct_a, ld_a, direct, ld_direct, r48, r32, depth, c4);
    else if (direct && direct_rows)
      wide_panels<kRows, false>(res, ldres, block_a, 0, direct, ld_direct, r48, r32, depth, c4);
    else if (direct)
      wide_panels<kColumns, false>(res, ldres, block_a, 0, direct, ld_direct, r48, r32, depth, c4);
    else
      wide_panels<kPacked, false>(res, ldres, block_a, 0, block_b, 0, r48, r32, depth, c4);
  }
#endif
  const Index done = w.rows48 + w.rows32;
  if (w.cols4 < cols && done > 0)  // the single columns of the wide panels
    gebp(ResMapper(res + w.cols4 * ldres, ldres), block_a, block_b + w.cols4 * depth, done, depth, cols - w.cols4,
         Real(1));
  if (done < rows)  // the narrower panels past them, every column
    gebp(ResMapper(res + done, ldres), block_a + done * depth, block_b, rows - done, depth, cols, Real(1));
}

}  // namespace shardlab::model::detail
