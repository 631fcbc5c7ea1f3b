// The GEMMs under the kernels, in one place, in the calling thread's
// arithmetic (model/arithmetic.h): Eigen's host-tuned kernels (kNative), or
// the project's own loops in one fixed summation order (kPortable).
//
// All matrices are row-major; ld* are row strides in elements.
//   gemm_nt      y (N×M)  = a (N×K) · bᵀ, b (M×K)      (y = x·Wᵀ, q·kᵀ)
//   gemm_nt_bias y (N×M)  = a (N×K) · bᵀ + bias (M)   (y = x·Wᵀ + b, contiguous rows)
//                the bits of gemm_nt then y += bias, in one pass over y where
//                Eigen sums K in one depth block (its zero-fill becomes the bias)
//   gemm_nt_lower y (N×N) = a (N×K) · bᵀ, b (N×K), on and below the diagonal
//                only (causal scores q·kᵀ): there the bits of gemm_nt, about
//                60% of its work at T 256; the entries above are left undefined
//   gemm_nn_acc  y (N×M) += a (N×K) · b,  b (K×M)      (dx += dy·W)
//   gemm_tn_acc  y (M×K) += aᵀ · b, a (N×M), b (N×K)   (dW += dyᵀ·x)
//
// kNative fixes Eigen's cache sizes once per process (its blocking, and so
// its bits, would otherwise follow the host's caches), so two machines with
// the same vector units get the same bits too.
//
// The kernel: on AVX-512, every float product Eigen would run as a GEMM
// runs Eigen's blocking and packing in gemm.cc's own loop (split_gemm), with
// a 48 × 8 register block for the full panels (gebp_wide, 1.20x
// Eigen's 48 × 4 in bench_train's BM_GemmNt/512) and 32 × 12 for the 32-row
// panel past them; each output is summed exactly as in Eigen's kernel, so
// the bits are Eigen's (tests/model/gemm_test.cc). Where those blocks take
// every output, the rhs and a column-major lhs are read in place, unpacked.
//
// Idle cores: when a lone device thread leaves cores idle
// (runtime/host_cores.h), a big kNative GEMM splits over its output rows
// with oneTBB (model/host_split.h), in fixed chunks that give the same bits
// as one call.
//
// Weights packed once (serving): while serving, the weights do not change,
// and a decode step's GEMMs (y = x·Wᵀ over a few rows of x: 16 at tp 8 in
// bench_serve) spent more time packing W into Eigen's panel layout than
// multiplying (gemm_pack_lhs 19% of perf's samples, gebp 14%).
// PackedWeights holds each registered W as Eigen packs it (the lhs of
// yᵀ = W·xᵀ: its depth blocks, whole rows), and while a PackedWeightsScope
// holds it on the calling device program (kept per fiber, runtime/fiber.h),
// gemm_nt and gemm_nt_bias whose b is a registered W run Eigen's gebp
// kernel on those blocks instead of packing W again. Every output is the
// same kernel's sum over the same depth blocks (gebp's row panels start at
// whole panels, its depth blocking is a function of K once the cache sizes
// are fixed, both checked at each call), so the bits are the unpacked
// call's (tests/model/gemm_test.cc: many shapes, split or not). Portable
// arithmetic, Eigen's GEMV and coefficient-wise shapes (one row of x, tiny
// products) and unregistered operands take the usual path.
//
// Split sums (model/arithmetic.h SplitSumsScope, verify's noise floor for tp
// and cp): each GEMM sums its K (gemm_tn_acc its N) in two halves, the
// second half's product added to the first's (the accumulating ones add
// both into y in turn), in the thread's arithmetic: bit for bit two GEMMs
// over the halves. The halves run on the calling thread (no host split) and
// the second half's product in a scratch of that thread.
//
// Thread safety: reentrant; the one-time cache setting is a magic static; a
// PackedWeights is read-only once built (register before the scope).
#pragma once

#include <cstdint>
#include <memory>
#include <unordered_map>

namespace shardlab::model {

template <typename Real>
void gemm_nt(Real* y, int64_t ldy, const Real* a, int64_t lda, const Real* b, int64_t ldb,
             int64_t N, int64_t M, int64_t K);
template <typename Real>
void gemm_nt_lower(Real* y, int64_t ldy, const Real* a, int64_t lda, const Real* b, int64_t ldb, int64_t N,
                   int64_t K);
template <typename Real>
void gemm_nt_bias(Real* y, const Real* a, const Real* b, const Real* bias, int64_t N, int64_t M,
                  int64_t K);
template <typename Real>
void gemm_nn_acc(Real* y, const Real* a, const Real* b, int64_t N, int64_t M, int64_t K);
template <typename Real>
void gemm_tn_acc(Real* y, const Real* a, const Real* b, int64_t N, int64_t M, int64_t K);

class PackedWeights {
 public:
  PackedWeights();
  ~PackedWeights();
  PackedWeights(PackedWeights&&) noexcept;
  PackedWeights& operator=(PackedWeights&&) noexcept;
  // W (M×K, row-major, row stride ldw), packed now; it must not change
  // while registered. Registering the same W again does nothing.
  void add(const float* w, int64_t M, int64_t K, int64_t ldw);
  struct Packed;
  // W's packed blocks if it was registered with this shape, else null.
  const Packed* find(const float* w, int64_t M, int64_t K, int64_t ldw) const;
  int64_t bytes() const { return bytes_; }  // host bytes of the packed copies

 private:
  std::unordered_map<const float*, std::unique_ptr<Packed>> packed_;
  int64_t bytes_ = 0;
};

// The calling program's registered weights until the scope ends (nests:
// restores the previous; null: none).
class PackedWeightsScope {
 public:
  explicit PackedWeightsScope(const PackedWeights* weights);
  ~PackedWeightsScope();
  PackedWeightsScope(const PackedWeightsScope&) = delete;
  PackedWeightsScope& operator=(const PackedWeightsScope&) = delete;

 private:
  const PackedWeights* previous_;
};

}  // namespace shardlab::model
