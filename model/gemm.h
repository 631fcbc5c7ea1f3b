// The GEMMs under the kernels, in one place, in the calling thread's
// arithmetic (model/arithmetic.h): Eigen's host-tuned kernels (kNative), or
// the project's own loops in one fixed summation order (kPortable).
//
// All matrices are row-major; ld* are row strides in elements.
//   gemm_nt      y (N×M)  = a (N×K) · bᵀ, b (M×K)      (y = x·Wᵀ, q·kᵀ)
//   gemm_nt_bias y (N×M)  = a (N×K) · bᵀ + bias (M)   (y = x·Wᵀ + b, contiguous rows)
//                the bits of gemm_nt then y += bias, in one pass over y where
//                Eigen sums K in one depth block (its zero-fill becomes the bias)
//   gemm_nn_acc  y (N×M) += a (N×K) · b,  b (K×M)      (dx += dy·W)
//   gemm_tn_acc  y (M×K) += aᵀ · b, a (N×M), b (N×K)   (dW += dyᵀ·x)
//
// kNative fixes Eigen's cache sizes once per process (its blocking, and so
// its bits, would otherwise follow the host's caches), so two machines with
// the same vector units get the same bits too.
//
// Idle cores: when a lone device thread leaves cores idle
// (runtime/host_cores.h), a big kNative GEMM splits over its output rows
// with oneTBB (model/host_split.h), in fixed chunks that give the same bits
// as one call.
//
// Thread safety: reentrant; the one-time cache setting is a magic static.
#pragma once

#include <cstdint>

namespace shardlab::model {

template <typename Real>
void gemm_nt(Real* y, int64_t ldy, const Real* a, int64_t lda, const Real* b, int64_t ldb,
             int64_t N, int64_t M, int64_t K);
template <typename Real>
void gemm_nt_bias(Real* y, const Real* a, const Real* b, const Real* bias, int64_t N, int64_t M,
                  int64_t K);
template <typename Real>
void gemm_nn_acc(Real* y, const Real* a, const Real* b, int64_t N, int64_t M, int64_t K);
template <typename Real>
void gemm_tn_acc(Real* y, const Real* a, const Real* b, int64_t N, int64_t M, int64_t K);

}  // namespace shardlab::model
