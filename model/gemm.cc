// GEMMs: Eigen (kNative) or fixed-order loops (kPortable). See gemm.h.
#include "model/gemm.h"

#include <algorithm>
#include <type_traits>
#include <utility>
#include <vector>

#include <Eigen/Core>

#include "model/arithmetic.h"
#include "model/eigen_maps.h"
#include "model/gebp_wide.h"
#include "model/host_split.h"
#include "model/portable_math.h"
#include "runtime/fiber.h"

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

// ---- The split, with the shared operand packed once ---------------------------
//
// Eigen computes a row-major y as yᵀ in column major, res (rows × cols) +=
// lhs (rows × depth) · rhs (depth × cols), so a split over y's rows is a split
// over res's columns, and every chunk's own Eigen call packed the whole lhs
// again (W in the forward and dx, x in dW): 10 packings of it for 512 rows,
// 11% of a split tiny step (perf). split_gemm packs each of the lhs's Eigen
// blocks (mc × kc, from the whole product's blocking) once, and on each block
// every chunk packs its rhs columns and runs Eigen's gebp kernel: per output the same
// depth blocks (kc depends on K alone), summed in the same order by the same
// kernel (row panels from the same block starts, column panels of 4 from the
// chunk's start, a multiple of 4), so the bits of the unsplit call
// (gemm_test).
namespace ei = Eigen::internal;
using Index = Eigen::Index;
using detail::gebp_wide;
using detail::kWide;

// A 64-byte aligned scratch per thread and slot (Eigen's packed blocks are
// read with aligned loads), grown on first use and then reused.
template <typename Real, int Slot>
Real* aligned_scratch(Index n) {
  struct Buffer {
    Real* p = nullptr;
    Index size = 0;
    ~Buffer() { ei::aligned_free(p); }
  };
  thread_local Buffer buf;
  if (buf.size < n) {
    ei::aligned_free(buf.p);
    buf.p = static_cast<Real*>(ei::aligned_malloc(size_t(n) * sizeof(Real)));
    buf.size = n;
  }
  return buf.p;
}

// Whether Eigen runs `rows × depth` times `depth × cols` as a GEMM (not as a
// GEMV or coefficient by coefficient), whatever chunk of columns it gets.
bool is_eigen_gemm(Index rows, Index depth, Index chunk_cols) {
  return rows >= 2 && depth >= 1 && chunk_cols >= 2 &&
         rows + depth + chunk_cols >= EIGEN_GEMM_TO_COEFFBASED_THRESHOLD;
}

}  // namespace

// W (M×K) as Eigen packs the lhs of yᵀ = W·xᵀ: depth block b (kc deep, the
// last one shorter) holds all M rows in gebp's panel layout, 64-byte aligned.
struct PackedWeights::Packed {
  int64_t rows = 0, depth = 0, ld = 0;  // W's shape and row stride
  Index kc = 0;
  std::vector<Index> offsets;  // of each depth block in `data`
  float* data = nullptr;
  Packed() = default;
  Packed(const Packed&) = delete;
  Packed& operator=(const Packed&) = delete;
  ~Packed() { ei::aligned_free(data); }
  const float* block(Index b) const { return data + offsets[size_t(b)]; }
};

namespace {
thread_local const PackedWeights* t_packed = nullptr;
// Each device fiber keeps its own (runtime/fiber.h).
[[maybe_unused]] const bool kept_per_fiber = keep_per_fiber({[]() -> void* { return &t_packed; }, sizeof(t_packed)});

template <typename Real>
const PackedWeights::Packed* packed_for(const Real* b, int64_t M, int64_t K, int64_t ldb) {
  if constexpr (std::is_same_v<Real, float>) {
    if (t_packed) return t_packed->find(b, M, K, ldb);
  }
  return nullptr;
}

// res (column major, ldres) += lhs · rhs over res's columns in kSplitRows
// chunks; before(c0, c1) runs on a chunk's columns first (Eigen's zero-fill
// for `=`), after(c0, c1) last. Only for shapes is_eigen_gemm accepts.
//
// `split` false: one chunk, on this thread. `packed`: the lhs already packed
// (PackedWeights, float), used when its blocks are this product's.
//
// `lower`: only res(r, c) with r <= c is wanted (a causal score block, rows ==
// cols). Each column panel (kSplitRows columns) then runs gebp on the rows
// from its block's start up to its last column, rounded up to whole row
// panels (mr), or on the whole block when that reaches past the block's last
// whole panel: every wanted output keeps the kernel, depth blocks and order
// it has in the full product, so its bits; the rows no one asked for are
// neither zeroed nor computed (their entries are left as they were).
template <typename Real, int LhsOrder, int RhsOrder, typename Before, typename After>
void split_gemm(Real* res, Index ldres, const Real* lhs, Index ldlhs, const Real* rhs, Index ldrhs,
                Index rows, Index cols, Index depth, const Before& before, const After& after,
                bool split = true, const PackedWeights::Packed* packed = nullptr, bool lower = false) {
  using Traits = ei::gebp_traits<Real, Real>;
  using LhsMapper = ei::const_blas_data_mapper<Real, Index, LhsOrder>;
  using RhsMapper = ei::const_blas_data_mapper<Real, Index, RhsOrder>;
  using ResMapper = ei::blas_data_mapper<Real, Index, Eigen::ColMajor, Eigen::Unaligned, 1>;
  Index kc = depth, mc = rows, nc = cols;
  ei::computeProductBlockingSizes<Real, Real, 1>(kc, mc, nc, Index(1));
  mc = std::min(rows, mc);
  // A packed lhs holds whole rows per depth block: a row block's panels are
  // its panels when the block starts at a whole panel.
  if (packed && (packed->kc != kc || (mc < rows && mc % Traits::mr != 0))) packed = nullptr;
  // One (mc × kc) block of the lhs packed at a time, as Eigen does (the whole
  // lhs packed at once took 25 MB for small's c_proj weight gradient), and the
  // chunks run on it; a column's blocks still come in Eigen's k order.
  Real* const scratch_a = packed ? nullptr : lower ? aligned_scratch<Real, 2>(mc * kc) : aligned_scratch<Real, 0>(mc * kc);
  const LhsMapper lhs_map(lhs, ldlhs);
  ei::gemm_pack_lhs<Real, Index, LhsMapper, Traits::mr, Traits::LhsProgress,
                    typename Traits::LhsPacket4Packing, LhsOrder>
      pack_lhs;
  // `lower`: the rows of the block at i2 (amc rows) that columns before j_end
  // want, as gebp runs them in the full product.
  const auto wanted_rows = [&](Index i2, Index amc, Index j_end) -> Index {
    if (!lower) return amc;
    const Index need = j_end - i2;
    if (need <= 0) return 0;
    const Index panels = (need + Traits::mr - 1) / Traits::mr * Traits::mr;
    return panels <= amc / Traits::mr * Traits::mr ? panels : amc;
  };
  // `lower`: res's rows [0, n) of the columns before j_end that some block computes
  const auto wanted_extent = [&](Index j_end) {
    Index n = 0;
    for (Index i2 = 0; i2 < rows; i2 += mc) n = std::max(n, i2 + wanted_rows(i2, std::min(mc, rows - i2), j_end));
    return n;
  };
  for (Index i2 = 0; i2 < rows; i2 += mc)
    for (Index k2 = 0; k2 < depth; k2 += kc) {
      const Index amc = std::min(mc, rows - i2), akc = std::min(kc, depth - k2);
      const bool first = i2 == 0 && k2 == 0, last = i2 + amc == rows && k2 + akc == depth;
      const Real* block_a = scratch_a;
      if constexpr (std::is_same_v<Real, float>) {
        if (packed) block_a = packed->block(k2 / kc) + i2 * akc;
      }
      // The block's packing splits over its rows too: panels of mr rows from
      // the block's start, the narrower ones past the last whole panel, so
      // rows [r0, r1) from a multiple of kSplitRows (of every mr) pack to
      // exactly the whole packing's [r0·akc, r1·akc) (gemm_test checks).
      // A packed element costs about what gebp's 16 multiply-adds a cycle do.
      const auto pack_rows = [&](int64_t r0, int64_t r1) {
        pack_lhs(scratch_a + r0 * akc, lhs_map.getSubMapper(i2 + r0, k2), akc, r1 - r0);
      };
      // A column-major lhs (Wᵀ of dx += dy·W, xᵀ of dW += dyᵀ·x) is read in
      // place where the wide blocks take every output of every chunk
      const bool direct_a = LhsOrder == Eigen::ColMajor && !packed && !lower &&
                            detail::wide_covers<Real>(amc, cols / 4 * 4) && cols % 4 == 0 && nc % 4 == 0;
      if (!packed && !direct_a && split)
        over_row_chunks(amc, 16.0 * double(amc) * double(akc), pack_rows);
      else if (!packed && !direct_a)
        pack_rows(0, amc);
      const auto chunk = [&](int64_t c0, int64_t c1) {
        if (first && !lower) before(c0, c1);
        const Index chunk_nc = std::min<Index>(lower ? std::min<Index>(nc, kSplitRows) : nc, c1 - c0);
        // `lower` runs in its own scratch slot: it is called inside split
        // kernels (attention's (batch, head) chunks)
        Real* const block_b = lower ? aligned_scratch<Real, 3>(kc * chunk_nc) : aligned_scratch<Real, 1>(kc * chunk_nc);
        const RhsMapper rhs_map(rhs, ldrhs);
        ei::gemm_pack_rhs<Real, Index, RhsMapper, Traits::nr, RhsOrder> pack_rhs;
        for (Index j2 = c0; j2 < c1; j2 += chunk_nc) {
          const Index anc = std::min<Index>(chunk_nc, c1 - j2);
          if (lower && first) {
            const Index n = wanted_extent(j2 + anc);
            for (Index c = j2; c < j2 + anc; ++c) std::fill(res + c * ldres, res + c * ldres + n, Real(0));
          }
          const Index arows = wanted_rows(i2, amc, j2 + anc);
          if (arows == 0) continue;
          // The rhs is read in place where the wide blocks take every output:
          // no packing
          const bool rows = RhsOrder == Eigen::RowMajor;
          const Real* direct = nullptr;
          if (detail::wide_covers<Real>(arows, anc)) direct = rows ? rhs + k2 * ldrhs + j2 : rhs + k2 + j2 * ldrhs;
          if (!direct) pack_rhs(block_b, rhs_map.getSubMapper(k2, j2), akc, anc);
          gebp_wide<Real, ResMapper>(res + i2 + j2 * ldres, ldres, block_a, block_b, arows, akc, anc, direct, ldrhs,
                                     rows, direct_a ? lhs + i2 + k2 * ldlhs : nullptr, ldlhs);
        }
        if (last) after(c0, c1);
      };
      if (split)
        over_row_chunks(cols, double(amc) * double(cols) * double(akc), chunk);
      else
        chunk(0, cols);
    }
}

// Rows y[r0, r1) of an N×M row-major y with row stride ldy to zero.
template <typename Real>
void zero_rows(Real* y, int64_t ldy, int64_t M, int64_t r0, int64_t r1) {
  for (int64_t n = r0; n < r1; ++n) std::fill(y + n * ldy, y + n * ldy + M, Real(0));
}

// Split sums (arithmetic.h): the two halves run as plain GEMMs on the
// calling thread (no host split: a thread waiting for its workers may steal
// another split-sums kernel's chunk, which would reuse this scratch), the
// second half's product in a scratch of the thread (no fiber switches inside
// a GEMM).
struct SplitHalves {
  SplitSumsScope whole{false};
  bool outer = std::exchange(t_in_chunk, true);
  ~SplitHalves() { t_in_chunk = outer; }
};
template <typename Real>
Real* split_scratch(size_t n) {
  static thread_local std::vector<Real> scratch;
  if (scratch.size() < n) scratch.resize(n);
  return scratch.data();
}
// y[n][m] += t[n][m] (t dense, N x M), m <= n only when `lower`: the second
// half's product added to the first's.
template <typename Real>
void add_half(Real* y, int64_t ldy, const Real* t, int64_t N, int64_t M, bool lower) {
  for (int64_t n = 0; n < N; ++n)
    for (int64_t m = 0, end = lower ? n + 1 : M; m < end; ++m) y[n * ldy + m] += t[n * M + m];
}

}  // namespace

template <typename Real>
void gemm_nt(Real* y, int64_t ldy, const Real* a, int64_t lda, const Real* b, int64_t ldb,
             int64_t N, int64_t M, int64_t K) {
  if (split_sums() && K > 1) {  // y = a₁·b₁ᵀ, then + a₂·b₂ᵀ
    const SplitHalves halves;
    const int64_t K1 = K / 2;
    Real* t = split_scratch<Real>(size_t(N * M));
    gemm_nt(y, ldy, a, lda, b, ldb, N, M, K1);
    gemm_nt(t, M, a + K1, lda, b + K1, ldb, N, M, K - K1);
    add_half(y, ldy, t, N, M, false);
    return;
  }
  if (portable_arithmetic()) {
    over_row_chunks(N, macs(N, M, K), [=](int64_t r0, int64_t r1) {
      for (int64_t n = r0; n < r1; ++n)
        for (int64_t m = 0; m < M; ++m) y[n * ldy + m] = pm::dot(a + n * lda, b + m * ldb, K);
    });
    return;
  }
  fix_eigen_blocking();
  const bool split = split_wanted(N, kSplitRows, macs(N, M, K)) && is_eigen_gemm(M, K, kSplitRows);
  const PackedWeights::Packed* packed = packed_for(b, M, K, ldb);
  if (split || ((kWide<Real> || packed) && is_eigen_gemm(M, K, N))) {
    // yᵀ = b · aᵀ: lhs b (M×K, row major), rhs aᵀ (K×N, column major).
    split_gemm<Real, Eigen::RowMajor, Eigen::ColMajor>(
        y, ldy, b, ldb, a, lda, M, N, K, [=](int64_t r0, int64_t r1) { zero_rows(y, ldy, M, r0, r1); },
        [](int64_t, int64_t) {}, split, packed);
    return;
  }
  StridedMap<Real>(y, N, M, Eigen::OuterStride<>(ldy)).noalias() =
      ConstStridedMap<Real>(a, N, K, Eigen::OuterStride<>(lda)) *
      ConstStridedMap<Real>(b, M, K, Eigen::OuterStride<>(ldb)).transpose();
}

template <typename Real>
void gemm_nt_lower(Real* y, int64_t ldy, const Real* a, int64_t lda, const Real* b, int64_t ldb, int64_t N,
                   int64_t K) {
  if (split_sums() && K > 1) {
    const SplitHalves halves;
    const int64_t K1 = K / 2;
    Real* t = split_scratch<Real>(size_t(N * N));
    gemm_nt_lower(y, ldy, a, lda, b, ldb, N, K1);
    gemm_nt_lower(t, N, a + K1, lda, b + K1, ldb, N, K - K1);
    add_half(y, ldy, t, N, N, true);
    return;
  }
  if (portable_arithmetic()) {
    over_row_chunks(N, macs(N, N, K) / 2, [=](int64_t r0, int64_t r1) {
      for (int64_t n = r0; n < r1; ++n)
        for (int64_t m = 0; m <= n; ++m) y[n * ldy + m] = pm::dot(a + n * lda, b + m * ldb, K);
    });
    return;
  }
  fix_eigen_blocking();
  if (!is_eigen_gemm(N, K, N) || split_wanted(N, kSplitRows, macs(N, N, K) / 2)) {
    gemm_nt(y, ldy, a, lda, b, ldb, N, N, K);
    return;
  }
  // yᵀ = b · aᵀ as in gemm_nt, on one thread: y[n][m] is res(m, n), wanted for m <= n.
  split_gemm<Real, Eigen::RowMajor, Eigen::ColMajor>(y, ldy, b, ldb, a, lda, N, N, K, [](int64_t, int64_t) {},
                                                     [](int64_t, int64_t) {}, false, nullptr, true);
}

namespace {
// Whether Eigen's `y = a·bᵀ` on a chunk of `rows` rows is a GEMM whose every
// output is one depth block's sum added to Eigen's zero-fill (0 + Σ): then a
// fill with the bias (b + 0, so -0 turns +0 as 0 + Σ would) and `+=` give
// (b + 0) + Σ, bit for bit Eigen's (0 + Σ) followed by + b. Not so when
// Eigen blocks the depth ((0 + Σ₁) + Σ₂ ...: its kc, a function of K alone
// once the cache sizes are fixed; with Eigen 3.4 on AVX-512, K up to 624
// floats is one block), nor on its GEMV
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
  if (split_sums() && K > 1) {  // (a₁·b₁ᵀ + a₂·b₂ᵀ) + bias, as a row-parallel layer adds its bias
    gemm_nt(y, M, a, K, b, K, N, M, K);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t m = 0; m < M; ++m) y[n * M + m] += bias[m];
    return;
  }
  if (portable_arithmetic()) {
    over_row_chunks(N, macs(N, M, K), [=](int64_t r0, int64_t r1) {
      for (int64_t n = r0; n < r1; ++n)
        for (int64_t m = 0; m < M; ++m) y[n * M + m] = pm::dot(a + n * K, b + m * K, K) + bias[m];
    });
    return;
  }
  fix_eigen_blocking();
  const auto fill_bias = [=](int64_t r0, int64_t r1) {
    for (int64_t n = r0; n < r1; ++n)
      for (int64_t m = 0; m < M; ++m) y[n * M + m] = bias[m] + Real(0);
  };
  const auto add_bias = [=](int64_t r0, int64_t r1) {
    for (int64_t n = r0; n < r1; ++n)
      for (int64_t m = 0; m < M; ++m) y[n * M + m] += bias[m];
  };
  // The bias takes the place of Eigen's zero-fill where that keeps the bits:
  // one pass over y, not two.
  const bool split = split_wanted(N, kSplitRows, macs(N, M, K)) && is_eigen_gemm(M, K, kSplitRows);
  const PackedWeights::Packed* packed = packed_for(b, M, K, K);
  if (split || ((kWide<Real> || packed) && is_eigen_gemm(M, K, N))) {
    const bool fill = bias_fill_keeps_bits<Real>(split ? kSplitRows : N, M, K);
    split_gemm<Real, Eigen::RowMajor, Eigen::ColMajor>(
        y, M, b, K, a, K, M, N, K,
        [=](int64_t r0, int64_t r1) { fill ? fill_bias(r0, r1) : zero_rows(y, M, M, r0, r1); },
        [=](int64_t r0, int64_t r1) { if (!fill) add_bias(r0, r1); }, split, packed);
    return;
  }
  MatMap<Real> out(y, N, M);
  const auto product = ConstMatMap<Real>(a, N, K) * ConstMatMap<Real>(b, M, K).transpose();
  if (bias_fill_keeps_bits<Real>(N, M, K)) {
    fill_bias(0, N);
    out.noalias() += product;
  } else {
    out.noalias() = product;
    add_bias(0, N);
  }
}

template <typename Real>
void gemm_nn_acc(Real* y, const Real* a, const Real* b, int64_t N, int64_t M, int64_t K) {
  if (split_sums() && K > 1) {  // y += a₁·b₁, then y += a₂·b₂ (a's column halves copied)
    const SplitHalves halves;
    const int64_t K1 = K / 2, K2 = K - K1;
    Real* half = split_scratch<Real>(size_t(N * K2));
    for (const auto& [k0, kn] : {std::pair{int64_t{0}, K1}, std::pair{K1, K2}}) {
      for (int64_t n = 0; n < N; ++n) std::copy(a + n * K + k0, a + n * K + k0 + kn, half + n * kn);
      gemm_nn_acc(y, half, b + k0 * M, N, M, kn);
    }
    return;
  }
  if (portable_arithmetic()) {
    over_row_chunks(N, macs(N, M, K), [=](int64_t r0, int64_t r1) {
      for (int64_t n = r0; n < r1; ++n)
        for (int64_t k = 0; k < K; ++k) axpy(y + n * M, a[n * K + k], b + k * M, M);
    });
    return;
  }
  fix_eigen_blocking();
  const bool split = split_wanted(N, kSplitRows, macs(N, M, K)) && is_eigen_gemm(M, K, kSplitRows);
  if (split || (kWide<Real> && is_eigen_gemm(M, K, N))) {
    // yᵀ += bᵀ · aᵀ: lhs bᵀ (M×K, column major), rhs aᵀ (K×N, column major).
    split_gemm<Real, Eigen::ColMajor, Eigen::ColMajor>(y, M, b, M, a, K, M, N, K, [](int64_t, int64_t) {},
                                                       [](int64_t, int64_t) {}, split);
    return;
  }
  MatMap<Real>(y, N, M).noalias() += ConstMatMap<Real>(a, N, K) * ConstMatMap<Real>(b, K, M);
}

template <typename Real>
void gemm_tn_acc(Real* y, const Real* a, const Real* b, int64_t N, int64_t M, int64_t K) {
  if (split_sums() && N > 1) {  // the sum over N's rows: y += a₁ᵀ·b₁, then y += a₂ᵀ·b₂
    const SplitHalves halves;
    const int64_t N1 = N / 2;
    gemm_tn_acc(y, a, b, N1, M, K);
    gemm_tn_acc(y, a + N1 * M, b + N1 * K, N - N1, M, K);
    return;
  }
  if (portable_arithmetic()) {
    over_row_chunks(M, macs(N, M, K), [=](int64_t m0, int64_t m1) {
      for (int64_t m = m0; m < m1; ++m)
        for (int64_t n = 0; n < N; ++n) axpy(y + m * K, a[n * M + m], b + n * K, K);
    });
    return;
  }
  fix_eigen_blocking();
  const bool split = split_wanted(M, kSplitRows, macs(N, M, K)) && is_eigen_gemm(K, N, kSplitRows);
  if (split || (kWide<Real> && is_eigen_gemm(K, N, M))) {
    // yᵀ (K×M) += bᵀ · a: lhs bᵀ (K×N, column major), rhs a (N×M, row major);
    // y's rows are a's columns.
    split_gemm<Real, Eigen::ColMajor, Eigen::RowMajor>(y, K, b, K, a, M, K, M, N, [](int64_t, int64_t) {},
                                                       [](int64_t, int64_t) {}, split);
    return;
  }
  MatMap<Real>(y, M, K).noalias() += ConstMatMap<Real>(a, N, M).transpose() * ConstMatMap<Real>(b, N, K);
}

PackedWeights::PackedWeights() = default;
PackedWeights::~PackedWeights() = default;
PackedWeights::PackedWeights(PackedWeights&&) noexcept = default;
PackedWeights& PackedWeights::operator=(PackedWeights&&) noexcept = default;

void PackedWeights::add(const float* w, int64_t M, int64_t K, int64_t ldw) {
  if (w == nullptr || M < 1 || K < 1 || packed_.count(w)) return;
  fix_eigen_blocking();
  using Traits = ei::gebp_traits<float, float>;
  using LhsMapper = ei::const_blas_data_mapper<float, Index, Eigen::RowMajor>;
  // Eigen's depth block for K (a function of K alone: split_gemm checks it
  // against each product's, whose other sizes do not move it).
  Index kc = K, mc = M, nc = 16;
  ei::computeProductBlockingSizes<float, float, 1>(kc, mc, nc, Index(1));
  auto p = std::make_unique<Packed>();
  p->kc = kc;
  Index size = 0;
  for (Index k2 = 0; k2 < K; k2 += kc) {
    p->offsets.push_back(size);
    size += (std::min<Index>(kc, K - k2) * M + 15) / 16 * 16;  // each block 64-byte aligned
  }
  p->data = static_cast<float*>(ei::aligned_malloc(size_t(size) * sizeof(float)));
  const LhsMapper map(w, ldw);
  ei::gemm_pack_lhs<float, Index, LhsMapper, Traits::mr, Traits::LhsProgress, typename Traits::LhsPacket4Packing,
                    Eigen::RowMajor>
      pack_lhs;
  for (Index k2 = 0, b = 0; k2 < K; k2 += kc, ++b)
    pack_lhs(p->data + p->offsets[size_t(b)], map.getSubMapper(0, k2), std::min<Index>(kc, K - k2), M);
  p->rows = M;
  p->depth = K;
  p->ld = ldw;
  bytes_ += size * int64_t(sizeof(float));
  packed_.emplace(w, std::move(p));
}

const PackedWeights::Packed* PackedWeights::find(const float* w, int64_t M, int64_t K, int64_t ldw) const {
  const auto it = packed_.find(w);
  if (it == packed_.end()) return nullptr;
  const Packed& p = *it->second;
  return p.rows == M && p.depth == K && p.ld == ldw ? &p : nullptr;
}

PackedWeightsScope::PackedWeightsScope(const PackedWeights* weights) : previous_(t_packed) { t_packed = weights; }
PackedWeightsScope::~PackedWeightsScope() { t_packed = previous_; }

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
  template void gemm_nt_lower(Real*, int64_t, const Real*, int64_t, const Real*, int64_t, int64_t,  \
                              int64_t);                                                           \
  template void gemm_nn_acc(Real*, const Real*, const Real*, int64_t, int64_t, int64_t);          \
  template void gemm_tn_acc(Real*, const Real*, const Real*, int64_t, int64_t, int64_t);
SHARDLAB_INSTANTIATE_GEMM(float)
SHARDLAB_INSTANTIATE_GEMM(double)
#undef SHARDLAB_INSTANTIATE_GEMM

}  // namespace shardlab::model
