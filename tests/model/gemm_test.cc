// The GEMMs' row split over idle cores (model/gemm.h): split or not, on one
// core or two, every output is the same bit pattern, and all are the product
// (against a double-precision loop, a different summation order).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include <Eigen/Core>
#include <gtest/gtest.h>
#include <oneapi/tbb/global_control.h>

#include "model/arithmetic.h"
#include "model/gemm.h"
#include "model/host_split.h"
#include "runtime/host_cores.h"

namespace shardlab::model {
namespace {

namespace tbb = oneapi::tbb;

struct Shape {
  int64_t N, M, K;
};
// Rows past whole 48-row chunks, a tail under one panel, K past Eigen's depth
// block (so partial sums cross blocks), and the tiny model's shapes. Eigen's
// lhs rows are M (kNT, kNNAcc) or K (kTNAcc); a count of 32 to 47 past the
// 48-row panels packs a 32-row panel (gebp_wide's 32 × 12 blocks), whose
// columns (N, or M for kTNAcc) end on 12s, 8 more, 4 more and single ones:
// {100, 130, 64} (rows 96 + 32 + 2; 8 × 12 + 4 columns), {107, 80, 176}
// (48 + 32; 8 × 12 + 8 + 3; kTNAcc 144 + 32), {21, 45, 80} (no 48-row
// panel: 32 + 13; 12 + 8 + 1). Where the wide blocks take every output
// (rows 48·i or 48·i + 32, columns 4·j) the rhs is read unpacked:
// {512, 384, 128}, {512, 128, 512}, {68, 80, 1536} (kNT and kNNAcc across
// three depth blocks) and {1000, 64, 96} (kTNAcc, whose depth is N).
const Shape kShapes[] = {{512, 384, 128}, {512, 128, 512}, {145, 77, 33}, {97, 130, 1536}, {200, 9, 700},
                         {96, 5, 3},      {100, 130, 64},  {107, 80, 176}, {21, 45, 80},  {68, 80, 1536},
                         {1000, 64, 96}};

std::vector<float> randoms(int64_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = u(gen);
  return v;
}

enum class Op { kNT, kNNAcc, kTNAcc };

// y of `op` on fixed inputs (y starts at 0.5 for the accumulating ones),
// split or not, with at most `threads` threads.
std::vector<float> run(Arithmetic arith, Op op, const Shape& s, bool split, int threads) {
  const tbb::global_control limit(tbb::global_control::max_allowed_parallelism, size_t(threads));
  const ArithmeticScope scope(arith);
  set_host_split_for_test(split);
  const auto [N, M, K] = s;
  std::vector<float> y;
  if (op == Op::kNT) {  // y (N×M) = a (N×K) · bᵀ, b (M×K)
    const auto a = randoms(N * K, 1), b = randoms(M * K, 2);
    y.assign(size_t(N * M), 0.0f);
    gemm_nt(y.data(), M, a.data(), K, b.data(), K, N, M, K);
  } else if (op == Op::kNNAcc) {  // y (N×M) += a (N×K) · b (K×M)
    const auto a = randoms(N * K, 3), b = randoms(K * M, 4);
    y.assign(size_t(N * M), 0.5f);
    gemm_nn_acc(y.data(), a.data(), b.data(), N, M, K);
  } else {  // y (M×K) += aᵀ · b, a (N×M), b (N×K)
    const auto a = randoms(N * M, 5), b = randoms(N * K, 6);
    y.assign(size_t(M * K), 0.5f);
    gemm_tn_acc(y.data(), a.data(), b.data(), N, M, K);
  }
  set_host_split_for_test(std::nullopt);
  return y;
}

// The same product in double, in the plain i-j-k order.
std::vector<double> reference(Op op, const Shape& s) {
  const auto [N, M, K] = s;
  std::vector<double> y;
  if (op == Op::kNT) {
    const auto a = randoms(N * K, 1), b = randoms(M * K, 2);
    y.assign(size_t(N * M), 0.0);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t m = 0; m < M; ++m)
        for (int64_t k = 0; k < K; ++k) y[size_t(n * M + m)] += double(a[size_t(n * K + k)]) * b[size_t(m * K + k)];
  } else if (op == Op::kNNAcc) {
    const auto a = randoms(N * K, 3), b = randoms(K * M, 4);
    y.assign(size_t(N * M), 0.5);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t m = 0; m < M; ++m)
        for (int64_t k = 0; k < K; ++k) y[size_t(n * M + m)] += double(a[size_t(n * K + k)]) * b[size_t(k * M + m)];
  } else {
    const auto a = randoms(N * M, 5), b = randoms(N * K, 6);
    y.assign(size_t(M * K), 0.5);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t k = 0; k < K; ++k)
        for (int64_t n = 0; n < N; ++n) y[size_t(m * K + k)] += double(a[size_t(n * M + m)]) * b[size_t(n * K + k)];
  }
  return y;
}

// The same product by Eigen's own GEMM (the expressions gemm.cc would run
// without its blocked loop), for the native bits.
std::vector<float> eigen_product(Op op, const Shape& s) {
  const auto [N, M, K] = s;
  using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  using Map = Eigen::Map<RowMat>;
  using ConstMap = Eigen::Map<const RowMat>;
  std::vector<float> y;
  if (op == Op::kNT) {
    const auto a = randoms(N * K, 1), b = randoms(M * K, 2);
    y.assign(size_t(N * M), 0.0f);
    Map(y.data(), N, M).noalias() = ConstMap(a.data(), N, K) * ConstMap(b.data(), M, K).transpose();
  } else if (op == Op::kNNAcc) {
    const auto a = randoms(N * K, 3), b = randoms(K * M, 4);
    y.assign(size_t(N * M), 0.5f);
    Map(y.data(), N, M).noalias() += ConstMap(a.data(), N, K) * ConstMap(b.data(), K, M);
  } else {
    const auto a = randoms(N * M, 5), b = randoms(N * K, 6);
    y.assign(size_t(M * K), 0.5f);
    Map(y.data(), M, K).noalias() += ConstMap(a.data(), N, M).transpose() * ConstMap(b.data(), N, K);
  }
  return y;
}

bool same_bits(const std::vector<float>& x, const std::vector<float>& y) {
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
}

void expect_split_keeps_bits(Arithmetic arith) {
  for (Op op : {Op::kNT, Op::kNNAcc, Op::kTNAcc}) {
    for (const Shape& s : kShapes) {
      SCOPED_TRACE(testing::Message() << "op " << int(op) << " N " << s.N << " M " << s.M << " K " << s.K);
      const auto whole = run(arith, op, s, false, 1);
      // unsplit, the blocked loop (model/gemm.cc, split_gemm) gives Eigen's own bits
      if (arith == Arithmetic::kNative) {
        EXPECT_TRUE(same_bits(whole, eigen_product(op, s)));
      }
      EXPECT_TRUE(same_bits(whole, run(arith, op, s, true, 1)));
      EXPECT_TRUE(same_bits(whole, run(arith, op, s, true, 2)));
      // fp32 against double: random signs make the rounding error grow like
      // √K · 2^-24 · |y| (|y| ~ √K/3 here), ~1e-5 at K 1536; the tolerance
      // 2e-6·K is far above that and far below a misplaced chunk's O(1).
      const auto want = reference(op, s);
      double worst = 0;
      for (size_t i = 0; i < want.size(); ++i) worst = std::max(worst, std::abs(whole[i] - want[i]));
      std::printf("op %d %ldx%ldx%ld: max |fp32 - double| %.3g\n", int(op), long(s.N), long(s.M),
                  long(s.K), worst);
      EXPECT_LE(worst, 2e-6 * double(s.K));
    }
  }
}

TEST(GemmSplit, EigenSameBitsSplitOrNotOnOneOrTwoThreadsAndEqualToTheProduct) {
  expect_split_keeps_bits(Arithmetic::kNative);
}

TEST(GemmSplit, PortableSameBitsSplitOrNotOnOneOrTwoThreadsAndEqualToTheProduct) {
  expect_split_keeps_bits(Arithmetic::kPortable);
}

// gemm_nt_bias against what it replaces, gemm_nt then y += bias, memcmp:
// with depth in one Eigen block (the bias fill) and past it (K 700, 1536:
// the fallback), split or not, one or two threads, with a -0 in the bias and
// an all-zero row of a (zero sums: the signs of zeros must match too).
void expect_bias_fill_keeps_bits(Arithmetic arith) {
  for (const Shape& s : kShapes) {
    const auto [N, M, K] = s;
    SCOPED_TRACE(testing::Message() << "N " << N << " M " << M << " K " << K);
    auto a = randoms(N * K, 7);
    std::fill(a.begin(), a.begin() + K, 0.0f);
    const auto b = randoms(M * K, 8);
    auto bias = randoms(M, 9);
    bias[0] = -0.0f;
    const ArithmeticScope scope(arith);
    std::vector<float> want(size_t(N * M));
    set_host_split_for_test(false);
    gemm_nt(want.data(), M, a.data(), K, b.data(), K, N, M, K);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t m = 0; m < M; ++m) want[size_t(n * M + m)] += bias[size_t(m)];
    for (const auto& [split, threads] : {std::pair{false, 1}, std::pair{true, 1}, std::pair{true, 2}}) {
      const tbb::global_control limit(tbb::global_control::max_allowed_parallelism, size_t(threads));
      set_host_split_for_test(split);
      std::vector<float> got(size_t(N * M), 7.0f);  // garbage: the kernel must overwrite it
      gemm_nt_bias(got.data(), a.data(), b.data(), bias.data(), N, M, K);
      EXPECT_TRUE(same_bits(want, got)) << "split " << split << " threads " << threads;
    }
    set_host_split_for_test(std::nullopt);
  }
}

TEST(GemmBias, EigenBiasFillSameBitsAsGemmThenBiasAdd) { expect_bias_fill_keeps_bits(Arithmetic::kNative); }

TEST(GemmBias, PortableBiasSameBitsAsGemmThenBiasAdd) { expect_bias_fill_keeps_bits(Arithmetic::kPortable); }

// Weights packed once (PackedWeights): gemm_nt (strided) and gemm_nt_bias
// under a PackedWeightsScope give the unpacked call's bits, memcmp, over
// decode-like and training shapes (N 1 takes Eigen's GEMV and tiny products
// its coefficient-wise path: unpacked, still equal), split or not, one or
// two threads. That the packed copy is what they read: W is overwritten
// after packing, and a product Eigen runs as a GEMM still gives the old W's
// result.
TEST(GemmPacked, PackedWeightsSameBitsAsPackingEachCall) {
  const int64_t Ns[] = {1, 2, 3, 16, 17, 100, 256}, Ms[] = {2, 5, 16, 47, 48, 64, 100, 577},
                Ks[] = {3, 16, 64, 128, 152, 153, 700};
  int products = 0, packed_runs = 0;
  for (const int64_t N : Ns)
    for (const int64_t M : Ms)
      for (const int64_t K : Ks) {
        if (N * M * K > 8'000'000) continue;
        SCOPED_TRACE(testing::Message() << "N " << N << " M " << M << " K " << K);
        const int64_t lda = K + 3, ldb = K + 5, ldy = M + 2;  // strided, as attention's views
        const auto a = randoms(N * lda, 11), w = randoms(M * ldb, 12), bias = randoms(M, 13);
        std::vector<float> want(size_t(N * ldy), 3.0f), want_bias(size_t(N * M));
        set_host_split_for_test(false);
        gemm_nt(want.data(), ldy, a.data(), lda, w.data(), ldb, N, M, K);
        std::vector<float> wc(size_t(M * K));  // W contiguous, for gemm_nt_bias
        for (int64_t m = 0; m < M; ++m) std::copy_n(w.data() + m * ldb, K, wc.data() + m * K);
        gemm_nt_bias(want_bias.data(), a.data(), wc.data(), bias.data(), N, M, K);
        // Registered copies, overwritten once packed where a GEMM will read the packs.
        auto reg = w, reg_c = wc;
        PackedWeights packs;
        packs.add(reg.data(), M, K, ldb);
        packs.add(reg_c.data(), M, K, K);
        const bool gemm = N >= 2 && M + K + N >= 20;  // Eigen's GEMM, not GEMV or coefficient-wise
        if (gemm) {
          for (float& x : reg) x = 2 * x + 1;
          for (float& x : reg_c) x = 2 * x + 1;
          ++packed_runs;
        }
        ++products;
        for (const auto& [split, threads] : {std::pair{false, 1}, std::pair{true, 1}, std::pair{true, 2}}) {
          const tbb::global_control limit(tbb::global_control::max_allowed_parallelism, size_t(threads));
          set_host_split_for_test(split);
          const PackedWeightsScope scope(&packs);
          std::vector<float> got(size_t(N * ldy), 3.0f), got_bias(size_t(N * M), 7.0f);
          gemm_nt(got.data(), ldy, a.data(), lda, reg.data(), ldb, N, M, K);
          gemm_nt_bias(got_bias.data(), a.data(), reg_c.data(), bias.data(), N, M, K);
          EXPECT_TRUE(same_bits(want, got)) << "gemm_nt, split " << split << " threads " << threads;
          EXPECT_TRUE(same_bits(want_bias, got_bias)) << "gemm_nt_bias, split " << split << " threads " << threads;
        }
        set_host_split_for_test(std::nullopt);
      }
  std::printf("packed weights: %d shapes, %d of them on the packed copy (tolerance 0 bits)\n", products,
              packed_runs);
  // Without a scope, and after it, the registered W is read again.
  const auto a = randoms(16 * 64, 14);
  auto w = randoms(48 * 64, 15);
  PackedWeights packs;
  packs.add(w.data(), 48, 64, 64);
  EXPECT_EQ(packs.bytes(), int64_t(48 * 64 * sizeof(float)));
  for (float& x : w) x = -x;
  std::vector<float> with(16 * 48), without(16 * 48);
  {
    const PackedWeightsScope scope(&packs);
    gemm_nt(with.data(), 48, a.data(), 64, w.data(), 64, 16, 48, 64);
  }
  gemm_nt(without.data(), 48, a.data(), 64, w.data(), 64, 16, 48, 64);
  for (size_t i = 0; i < with.size(); ++i) ASSERT_EQ(with[i], -without[i]) << i;  // negating W negates y exactly
}

TEST(HostCores, IdleCoresFollowTheRunningDeviceThreads) {
  {
    const tbb::global_control one(tbb::global_control::max_allowed_parallelism, 1);
    EXPECT_EQ(idle_host_cores(), 0);  // a one-core limit leaves nothing to borrow
  }
  const tbb::global_control two(tbb::global_control::max_allowed_parallelism, 2);
  const int base = running_device_threads();
  std::vector<std::unique_ptr<DeviceThreadCount>> devices;
  devices.push_back(std::make_unique<DeviceThreadCount>());
  devices.push_back(std::make_unique<DeviceThreadCount>());
  EXPECT_EQ(running_device_threads(), base + 2);
  EXPECT_EQ(idle_host_cores(), 0);  // two devices on at most two cores
  devices.clear();
  EXPECT_EQ(running_device_threads(), base);
}

// The causal half (gemm_nt_lower): on and below the diagonal, the bits of
// gemm_nt's full product, memcmp, for sides around Eigen's 48-row panels
// (one panel, a tail, a block past the last whole panel), depths within and
// past one depth block, strided operands, native and portable, float and
// double, and inside a split kernel's chunk (attention's case) or not. The
// entries above the diagonal are not compared (left undefined).
template <typename Real>
void expect_lower_keeps_bits(Arithmetic arith, int64_t& compared, int64_t& differing) {
  const int64_t Ns[] = {2, 5, 47, 48, 49, 77, 96, 130, 256, 300};
  const int64_t Ks[] = {3, 17, 64, 700};
  for (const int64_t N : Ns)
    for (const int64_t K : Ks) {
      SCOPED_TRACE(testing::Message() << "N " << N << " K " << K << " arith " << int(arith));
      const int64_t lda = K + 3, ldb = K + 5, ldy = N + 2;
      const auto fa = randoms(N * lda, 21), fb = randoms(N * ldb, 22);
      const std::vector<Real> a(fa.begin(), fa.end()), b(fb.begin(), fb.end());
      const ArithmeticScope scope(arith);
      set_host_split_for_test(false);
      std::vector<Real> want(size_t(N * ldy), Real(3));
      gemm_nt(want.data(), ldy, a.data(), lda, b.data(), ldb, N, N, K);
      for (const bool in_chunk : {false, true}) {
        std::vector<Real> got(size_t(N * ldy), Real(7));
        t_in_chunk = in_chunk;
        gemm_nt_lower(got.data(), ldy, a.data(), lda, b.data(), ldb, N, K);
        t_in_chunk = false;
        for (int64_t n = 0; n < N; ++n)
          for (int64_t m = 0; m <= n; ++m) {
            ++compared;
            if (std::memcmp(&got[size_t(n * ldy + m)], &want[size_t(n * ldy + m)], sizeof(Real)) != 0) ++differing;
          }
      }
      set_host_split_for_test(std::nullopt);
    }
}

TEST(GemmLower, CausalHalfSameBitsAsTheFullProduct) {
  int64_t compared = 0, differing = 0;
  for (const Arithmetic arith : {Arithmetic::kNative, Arithmetic::kPortable}) {
    expect_lower_keeps_bits<float>(arith, compared, differing);
    expect_lower_keeps_bits<double>(arith, compared, differing);
  }
  std::printf("gemm_nt_lower: %lld of %lld values differ from gemm_nt (tolerance 0)\n", (long long)differing,
              (long long)compared);
  EXPECT_GT(compared, 500000);
  EXPECT_EQ(differing, 0);
}

// Split sums (verify's noise floor for tp and cp): every GEMM sums its K
// in two halves, the second half's product added to the first's, bit for
// bit the sum of two GEMMs over the halves, in either arithmetic; the bits
// differ from one GEMM's somewhere, by rounding only (tolerance 1e-5
// relative to the product's scale); oneTBB's workers take the caller's
// split sums (a forced host split gives the same bits).
TEST(GemmSplitSums, EachGemmIsItsTwoHalvesAdded) {
  for (const Arithmetic arith : {Arithmetic::kNative, Arithmetic::kPortable}) {
    const ArithmeticScope scope(arith);
    set_host_split_for_test(false);
    const int64_t N = 67, M = 45, K = 301, K1 = K / 2;
    const std::vector<float> a = randoms(N * K, 1), b = randoms(M * K, 2), bias = randoms(M, 3);
    std::vector<float> whole(size_t(N * M)), split(size_t(N * M)), h1(size_t(N * M)), h2(size_t(N * M));
    gemm_nt(whole.data(), M, a.data(), K, b.data(), K, N, M, K);
    gemm_nt(h1.data(), M, a.data(), K, b.data(), K, N, M, K1);
    gemm_nt(h2.data(), M, a.data() + K1, K, b.data() + K1, K, N, M, K - K1);
    std::vector<float> bsplit(split.size());
    {
      const SplitSumsScope on(true);
      EXPECT_TRUE(split_sums());
      gemm_nt(split.data(), M, a.data(), K, b.data(), K, N, M, K);
      gemm_nt_bias(bsplit.data(), a.data(), b.data(), bias.data(), N, M, K);
    }
    EXPECT_FALSE(split_sums());
    int64_t differ = 0;
    double worst = 0;
    for (size_t i = 0; i < whole.size(); ++i) {
      EXPECT_EQ(split[i], h1[i] + h2[i]) << i;
      EXPECT_EQ(bsplit[i], (h1[i] + h2[i]) + bias[i % size_t(M)]) << i;
      differ += split[i] != whole[i];
      worst = std::max(worst, double(std::abs(split[i] - whole[i])));
    }
    std::printf("%s: split sums change %lld of %zu outputs, max |diff| %.3e (tolerance 1e-5 x sqrt(K) = %.3e)\n",
                arithmetic_name(arith), (long long)differ, whole.size(), worst, 1e-5 * std::sqrt(double(K)));
    EXPECT_GT(differ, 0) << "the split changed no bit: the floor run would perturb nothing";
    EXPECT_LE(worst, 1e-5 * std::sqrt(double(K)));
    // y += a·b over K's column halves and dW += aᵀ·b over N's row halves.
    std::vector<float> acc(size_t(N * M), 0.5f), acc_halves(size_t(N * M), 0.5f);
    const std::vector<float> bb = randoms(K * M, 4);
    std::vector<float> a1(size_t(N * K1)), a2(size_t(N * (K - K1)));
    for (int64_t n = 0; n < N; ++n) {
      std::copy(a.begin() + n * K, a.begin() + n * K + K1, a1.begin() + n * K1);
      std::copy(a.begin() + n * K + K1, a.begin() + (n + 1) * K, a2.begin() + n * (K - K1));
    }
    gemm_nn_acc(acc_halves.data(), a1.data(), bb.data(), N, M, K1);
    gemm_nn_acc(acc_halves.data(), a2.data(), bb.data() + K1 * M, N, M, K - K1);
    {
      const SplitSumsScope on(true);
      gemm_nn_acc(acc.data(), a.data(), bb.data(), N, M, K);
    }
    EXPECT_EQ(acc, acc_halves);
    std::vector<float> dw(size_t(M * K), 0.25f), dw_halves(size_t(M * K), 0.25f);
    const std::vector<float> dy = randoms(N * M, 5);
    const int64_t N1 = N / 2;
    gemm_tn_acc(dw_halves.data(), dy.data(), a.data(), N1, M, K);
    gemm_tn_acc(dw_halves.data(), dy.data() + N1 * M, a.data() + N1 * K, N - N1, M, K);
    {
      const SplitSumsScope on(true);
      gemm_tn_acc(dw.data(), dy.data(), a.data(), N, M, K);
    }
    EXPECT_EQ(dw, dw_halves);
    // for_chunks hands the split sums to its workers with the arithmetic.
    std::vector<float> chunked(size_t(N * M));
    {
      const SplitSumsScope on(true);
      set_host_split_for_test(true);
      for_chunks(N, 8, 1e9, [&](int64_t r0, int64_t r1) {
        gemm_nt(chunked.data() + r0 * M, M, a.data() + r0 * K, K, b.data(), K, r1 - r0, M, K);
      });
      // Every chunk, whichever thread runs it, sees the split sums (4,096
      // chunks: the workers take some).
      std::atomic<int> without{0}, chunks{0};
      for_chunks(4096, 1, 1e9, [&](int64_t, int64_t) {
        without += !split_sums();
        ++chunks;
      });
      EXPECT_EQ(chunks.load(), 4096);
      EXPECT_EQ(without.load(), 0);
      set_host_split_for_test(false);
    }
    EXPECT_EQ(chunked, split);
    set_host_split_for_test(std::nullopt);
  }
}

}  // namespace
}  // namespace shardlab::model

TEST(HostCores, HostThreadsCapParsesOnlyPositiveIntegers) {
  EXPECT_EQ(shardlab::parse_host_threads(nullptr), 0);  // unset: no cap
  EXPECT_EQ(shardlab::parse_host_threads("1"), 1);
  EXPECT_EQ(shardlab::parse_host_threads("16"), 16);
  EXPECT_EQ(shardlab::parse_host_threads("4096"), shardlab::kMaxHostThreads);
  for (const char* bad : {"", "0", "-2", "2x", "x", "1.5", " 2", "+2", "4097", "99999999999"})
    EXPECT_EQ(shardlab::parse_host_threads(bad), std::nullopt) << bad;
}
