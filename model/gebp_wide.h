// gebp_wide: a 48 × 8 register block for Eigen's GEMM kernel on AVX-512
// float, the same bits as Eigen's own (model/gemm.cc's split_gemm runs it;
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
// columns j..j+7 are two panels. The rows past the last whole 48-row panel
// and the columns past the last pair of panels run in gebp itself, which
// reads the same packed blocks from those offsets (gemm_test: every split
// and packed product memcmp-equal to Eigen's own).
template <typename Real, typename ResMapper>
void gebp_wide(Real* res, Index ldres, const Real* block_a, const Real* block_b, Index rows, Index depth, Index cols) {
  using Traits = ei::gebp_traits<Real, Real>;
  ei::gebp_kernel<Real, Real, Index, ResMapper, Traits::mr, Traits::nr, false, false> gebp;
  Index rows48 = 0, cols8 = 0;
#if defined(__AVX512F__)
  if constexpr (kWide<Real>) {
    rows48 = rows / 48 * 48;
    cols8 = cols / 8 * 8;
    for (Index j = 0; j < cols8; j += 8) {
      const float* b0 = block_b + j * depth;        // columns j..j+3, [k][4]
      const float* b1 = block_b + (j + 4) * depth;  // columns j+4..j+7
      for (Index i = 0; i < rows48; i += 48) {
        const float* a = block_a + i * depth;  // rows i..i+47, [k][48]
        __m512 acc[8][3];
        for (auto& column : acc)
          for (__m512& v : column) v = _mm512_setzero_ps();
        for (Index k = 0; k < depth; ++k) {
          const __m512 a0 = _mm512_load_ps(a + 48 * k), a1 = _mm512_load_ps(a + 48 * k + 16),
                       a2 = _mm512_load_ps(a + 48 * k + 32);
#pragma GCC unroll 8
          for (int q = 0; q < 8; ++q) {
            const __m512 b = _mm512_set1_ps(q < 4 ? b0[4 * k + q] : b1[4 * k + q - 4]);
            acc[q][0] = _mm512_fmadd_ps(a0, b, acc[q][0]);
            acc[q][1] = _mm512_fmadd_ps(a1, b, acc[q][1]);
            acc[q][2] = _mm512_fmadd_ps(a2, b, acc[q][2]);
          }
        }
        for (int q = 0; q < 8; ++q) {
          float* r = res + (j + q) * ldres + i;
          for (int p = 0; p < 3; ++p) _mm512_storeu_ps(r + 16 * p, _mm512_add_ps(_mm512_loadu_ps(r + 16 * p), acc[q][p]));
        }
      }
    }
  }
#endif
  if (cols8 < cols && rows48 > 0)  // the last columns of the whole panels
    gebp(ResMapper(res + cols8 * ldres, ldres), block_a, block_b + cols8 * depth, rows48, depth, cols - cols8, Real(1));
  if (rows48 < rows)  // the narrower panels past them, every column
    gebp(ResMapper(res + rows48, ldres), block_a + rows48 * depth, block_b, rows - rows48, depth, cols, Real(1));
}

}  // namespace shardlab::model::detail
