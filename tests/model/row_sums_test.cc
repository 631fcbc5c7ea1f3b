// Attention's causal row sums (model/row_sums.h): many outputs at a time give
// every output the bits of one sum_rows call, and sum_rows sums in its
// documented order (row i into partial sum i mod 4, then (0 + 1) + (2 + 3)),
// against a scalar loop here. Tolerance 0 (memcmp); the max difference is
// printed.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "model/row_sums.h"

namespace shardlab::model {
namespace {

template <typename Real>
std::vector<Real> randoms(size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<Real> u(-1, 1);
  std::vector<Real> v(n);
  for (Real& x : v) x = u(gen);
  return v;
}

// The order sum_rows documents, one scalar at a time: rows [r0, r1) of a
// (a[i·sa]) and x, partial sum (i - r0) mod 4.
template <typename Real>
void reference(Real* y, const Real* a, int64_t sa, const Real* x, int64_t ldx, int r0, int r1, int w, bool acc) {
  for (int j = 0; j < w; ++j) {
    Real s[4] = {0, 0, 0, 0};
    for (int i = r0; i < r1; ++i) {
      const Real p = a[i * sa] * x[int64_t(i) * ldx + j];
      s[(i - r0) & 3] = s[(i - r0) & 3] + p;
    }
    const Real v = (s[0] + s[1]) + (s[2] + s[3]);
    y[j] = acc ? y[j] + v : v;
  }
}

struct Counts {
  int64_t compared = 0, differing = 0;
  double max_diff = 0;
};

template <typename Real>
void compare(const std::vector<Real>& got, const std::vector<Real>& want, Counts& c) {
  for (size_t i = 0; i < got.size(); ++i) {
    ++c.compared;
    if (std::memcmp(&got[i], &want[i], sizeof(Real)) != 0) ++c.differing;
    c.max_diff = std::max(c.max_diff, std::abs(double(got[i]) - double(want[i])));
  }
}

// Prefix (output o sums rows [0, n0 + o) of a's row o) and suffix (output o
// sums rows [o, n) of a's column o): block kernels, sum_rows per output and
// the scalar order, over widths with and without whole vectors, output
// counts around the block of 6 (or 3), short and long rows, = and +=.
template <typename Real>
Counts check_all() {
  Counts c;
  const int widths[] = {1, 5, 8, 16, 17, 32, 40, 64, 80};
  const int outs_list[] = {1, 5, 6, 7, 12, 13, 37};
  unsigned seed = 1;
  for (const int w : widths)
    for (const int outs : outs_list)
      for (const int extra : {0, 1, 3, 30})
        for (const bool acc : {false, true}) {
          const int rows = outs + extra;  // x's rows
          const int64_t ldx = w + 3, ldy = w + 2, lda = rows + 1;
          const auto x = randoms<Real>(size_t(rows) * ldx, seed++);
          const auto a = randoms<Real>(size_t(rows) * lda, seed++);
          const auto y0 = randoms<Real>(size_t(outs) * ldy, seed++);
          // prefix: n0 = extra rows before the first output's last
          {
            const int n0 = std::min(extra, rows - outs + 1);
            auto got = y0, one = y0, want = y0;
            row_sums::sum_rows_prefix(got.data(), ldy, a.data(), lda, x.data(), ldx, n0, outs, w, acc);
            for (int o = 0; o < outs; ++o) {
              row_sums::sum_rows(one.data() + o * ldy, a.data() + o * lda, 1, x.data(), ldx, n0 + o, w, acc);
              reference(want.data() + o * ldy, a.data() + o * lda, 1, x.data(), ldx, 0, n0 + o, w, acc);
            }
            compare(got, want, c);
            compare(one, want, c);
          }
          // suffix: n = rows
          {
            auto got = y0, one = y0, want = y0;
            row_sums::sum_rows_suffix(got.data(), ldy, a.data(), lda, x.data(), ldx, rows, outs, w, acc);
            for (int o = 0; o < outs; ++o) {
              row_sums::sum_rows(one.data() + o * ldy, a.data() + o * lda + o, lda, x.data() + o * ldx, ldx, rows - o, w,
                                 acc);
              reference(want.data() + o * ldy, a.data() + o, lda, x.data(), ldx, o, rows, w, acc);
            }
            compare(got, want, c);
            compare(one, want, c);
          }
        }
  return c;
}

template <typename Real>
void expect_same_bits(const char* name) {
  const Counts c = check_all<Real>();
  std::printf("%s: %lld of %lld values differ, max |difference| %g (tolerance 0)\n", name, (long long)c.differing,
              (long long)c.compared, c.max_diff);
  EXPECT_GT(c.compared, 100000);
  EXPECT_EQ(c.differing, 0);
}

TEST(RowSums, ManyOutputsAtATimeSameBitsAsOneAtATimeFloat) { expect_same_bits<float>("float"); }
TEST(RowSums, ManyOutputsAtATimeSameBitsAsOneAtATimeDouble) { expect_same_bits<double>("double"); }

}  // namespace
}  // namespace shardlab::model
