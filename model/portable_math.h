// Host-independent arithmetic for the kernels (model/arithmetic.h says why):
// reductions in a fixed number of lanes, and the project's own exp, tanh,
// log, cos and integer powers. Each is a fixed sequence of IEEE-754
// operations (+, -, *, /, sqrt, exact bit manipulation), so with the build's
// -ffp-contract=off its result is the same on every machine, whatever vector
// units the compiler targets: a vectorised loop runs the same operations per
// element, and a 16-lane sum is one AVX-512 register, two AVX2 or four SSE
// registers with the same additions in the same order.
//
//   float  exp(float)    ~1 ulp; x < -87 gives 0, x > 88 gives +inf
//   float  tanh(float)   ~1.5 ulp
//   double log(double)   ~2 ulp on positive normal numbers
//   double cos_2pi(double u)  cos(2πu) for u in [0, 1], abs error ~2^-52
//   double pow_int(double b, int64_t n)  b^n, n >= 0, in double-double: the
//          correctly rounded value except in rare near-halfway cases
//   lane_sum(n, term)    Σ term(i) in 16 lanes, then a fixed pairwise tree
//
// exp and tanh are branch-free (both sides computed, one selected), so loops
// over them vectorise. NaN inputs give NaN.
//
// Thread safety: pure functions.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

namespace shardlab::model::pm {

inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// e^x = 2^n · e^r, n = round(x / ln 2), |r| <= ln2 / 2; e^r by Cephes'
// degree-7 polynomial (expf.c, public domain).
inline float exp(float x) {
  constexpr float kMagic = 0x1.8p23f;  // adding it rounds to an integer held in the mantissa
  const float xc = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);  // NaN passes through
  const float shifted = xc * 1.44269504088896341f + kMagic;
  const float fn = shifted - kMagic;
  const float r = (xc - fn * 0.693359375f) - fn * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float er = p * (r * r) + r + 1.0f;
  // n in [-126, 127]: 2^n is a normal float built from its exponent bits.
  const uint32_t n = float_bits(shifted) - float_bits(kMagic);
  const float scaled = er * bits_float((n + 127u) << 23);
  const float inf = std::numeric_limits<float>::infinity();
  return x < -87.0f ? 0.0f : (x > 88.0f ? inf : scaled);
}

// Cephes' tanhf: an odd polynomial below 0.625, 1 - 2 / (e^{2|x|} + 1) above.
inline float tanh(float x) {
  const float ax = x < 0.0f ? -x : x;
  const float z = x * x;
  const float small =
      ((((-5.70498872745e-3f * z + 2.06390887954e-2f) * z - 5.37397155531e-2f) * z +
        1.33314422036e-1f) * z - 3.33332819422e-1f) * z * x + x;
  const float a = ax > 10.0f ? 10.0f : ax;  // tanh(10) is 1 in float; NaN passes through
  const float big_abs = 1.0f - 2.0f / (exp(2.0f * a) + 1.0f);
  const float big = x < 0.0f ? -big_abs : big_abs;
  return ax < 0.625f ? small : big;
}

// log x = e·ln2 + 2·atanh(f), x = m·2^e, m in [√½, √2), f = (m-1)/(m+1).
inline double log(double x) {
  if (!(x >= std::numeric_limits<double>::min() && x <= std::numeric_limits<double>::max()))
    return std::log(x);  // 0, negative, subnormal, inf, NaN: exact special values
  int e = 0;
  double m = std::frexp(x, &e);  // exact: m in [0.5, 1)
  if (m < 0.70710678118654752) m *= 2, --e;
  const double f = (m - 1.0) / (m + 1.0);
  const double s = f * f;
  double p = 1.0 / 23;
  for (int k = 21; k >= 3; k -= 2) p = p * s + 1.0 / k;
  const double two_f = 2.0 * f;
  const double ln2_hi = 0x1.62e42fee00000p-1, ln2_lo = 0x1.a39ef35793c76p-33;
  return e * ln2_hi + (two_f * s * p + e * ln2_lo + two_f);
}

// 1/n!, folded at compile time (the same double on every build).
constexpr double inv_factorial(int n) {
  double f = 1.0;
  for (int i = 2; i <= n; ++i) f *= i;
  return 1.0 / f;
}

// cos(2πu) for u in [0, 1]: u = q/4 + r exactly, |r| <= 1/8, x = 2πr in
// double-double's first two terms; then ±cos x or ±sin x by Taylor series.
inline double cos_2pi(double u) {
  const double q = std::round(4.0 * u);
  const double r = u - 0.25 * q;  // exact
  const double x = r * 0x1.921fb54442d18p+2 + r * 0x1.1a62633145c07p-52;  // 2π = hi + lo
  const double s = x * x;
  double c = inv_factorial(18), sn = inv_factorial(19);
  for (int k = 16; k >= 0; k -= 2) c = inv_factorial(k) - s * c;       // Σ (-1)^j x^2j / (2j)!
  for (int k = 17; k >= 1; k -= 2) sn = inv_factorial(k) - s * sn;     // Σ (-1)^j x^2j / (2j+1)!
  const double cos_x = c, sin_x = x * sn;
  switch (static_cast<int>(q) & 3) {
    case 0: return cos_x;
    case 1: return -sin_x;
    case 2: return -cos_x;
    default: return sin_x;
  }
}

namespace detail {
// a·b = p + e exactly (Dekker's product: no fused multiply-add needed).
inline void two_prod(double a, double b, double& p, double& e) {
  constexpr double kSplit = 134217729.0;  // 2^27 + 1
  const double ca = kSplit * a, cb = kSplit * b;
  const double ah = ca - (ca - a), al = a - ah;
  const double bh = cb - (cb - b), bl = b - bh;
  p = a * b;
  e = ((ah * bh - p) + ah * bl + al * bh) + al * bl;
}
// (xh + xl) · (yh + yl) in double-double, into (xh, xl).
inline void dd_mul(double& xh, double& xl, double yh, double yl) {
  double p, e;
  two_prod(xh, yh, p, e);
  e += xh * yl + xl * yh;
  xh = p + e;
  xl = e - (xh - p);
}
}  // namespace detail

inline double pow_int(double b, int64_t n) {
  double rh = 1.0, rl = 0.0, bh = b, bl = 0.0;
  for (; n > 0; n >>= 1) {
    if (n & 1) detail::dd_mul(rh, rl, bh, bl);
    if (n > 1) detail::dd_mul(bh, bl, bh, bl);
  }
  return rh + rl;
}

inline constexpr int kLanes = 16;

// Σ_{i<n} term(i) with lane i % 16 accumulating in order, then lanes summed
// pairwise (8, 4, 2, 1): the same bits on every host.
template <typename Real, typename Term>
inline Real lane_sum(int64_t n, Term&& term) {
  Real acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] += term(i + l);
  for (int l = 0; i + l < n; ++l) acc[l] += term(i + l);
  for (int w = kLanes / 2; w >= 1; w /= 2)
    for (int l = 0; l < w; ++l) acc[l] += acc[l + w];
  return acc[0];
}

template <typename Real>
inline Real sum(const Real* x, int64_t n) {
  return lane_sum<Real>(n, [x](int64_t i) { return x[i]; });
}

template <typename Real>
inline Real dot(const Real* a, const Real* b, int64_t n) {
  return lane_sum<Real>(n, [a, b](int64_t i) { return a[i] * b[i]; });
}

// max_{i<n} x[i] (n >= 1), in 16 lanes so the loop vectorises; exact in any
// order. A NaN in x[0] gives NaN; one elsewhere may be skipped, but the
// softmax that follows turns it into NaN all the same.
template <typename Real>
inline Real max(const Real* x, int64_t n) {
  Real acc[kLanes];
  for (int l = 0; l < kLanes; ++l) acc[l] = x[0];
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] = x[i + l] > acc[l] ? x[i + l] : acc[l];
  for (int l = 0; i + l < n; ++l) acc[l] = x[i + l] > acc[l] ? x[i + l] : acc[l];
  for (int w = kLanes / 2; w >= 1; w /= 2)
    for (int l = 0; l < w; ++l) acc[l] = acc[l + w] > acc[l] ? acc[l + w] : acc[l];
  return acc[0];
}

// Typed front doors for the kernels templated on Real: float takes the
// project's routines, double (the gradient checks) the C library's, whose
// last bits do not matter there.
template <typename Real>
inline Real exp_of(Real x) {
  if constexpr (std::is_same_v<Real, float>) return exp(x); else return std::exp(x);
}
template <typename Real>
inline Real tanh_of(Real x) {
  if constexpr (std::is_same_v<Real, float>) return tanh(x); else return std::tanh(x);
}

}  // namespace shardlab::model::pm
