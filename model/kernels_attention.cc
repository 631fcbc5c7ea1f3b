// Causal multi-head self-attention on the fused [q | k | v] layout.
// Shapes use the letters declared in kernels.h. Per (b, h): the score blocks
// (q·kᵀ, and dout·vᵀ in backward) are small GEMMs over strided rows
// (model/gemm.h, gemm_nt_lower: the causal half, in whole kernel panels, with
// the full product's bits), with the causal mask applied in the softmax
// (entries above the diagonal of `att` are exactly 0). The products with att and its
// gradient (out, dv, dq, dk) then sum only the causal rows (model/row_sums.h,
// six output rows at a time): half the work of a full GEMM and no packing.
// Summation orders are fixed (sum_rows' four accumulators, 16-lane softmax sums), so results are
// deterministic, and the same on every host but for the GEMMs' (gemm.h).
#include <algorithm>
#include <cmath>

#include "model/eigen_maps.h"
#include "model/gemm.h"
#include "model/host_split.h"
#include "model/kernel_cost.h"
#include "model/kernels.h"
#include "model/portable_math.h"
#include "model/row_sums.h"

namespace shardlab::model {
namespace {

using row_sums::sum_rows_prefix;
using row_sums::sum_rows_suffix;

// Row-wise masked softmax of a (T,T) score block, in place: row t keeps
// columns 0..t, scaled by `scale` before the exponent; the rest become 0.
// The exponentials run over whole groups of 16 columns (up to T): the
// vectorised loop then has no scalar tail, and the columns past t it
// computes (from whatever the block holds there) are zeroed before the sum.
template <typename Real>
void causal_softmax_rows(Real* a, int T, Real scale) {
  for (int t = 0; t < T; ++t) {
    Real* row = a + static_cast<int64_t>(t) * T;
    const Real vmax = pm::max(row, t + 1) * scale;  // scale > 0
    const int whole = std::min(T, (t + 16) / 16 * 16);
    for (int u = 0; u < whole; ++u) row[u] = pm::exp_of(row[u] * scale - vmax);
    std::fill(row + t + 1, row + whole, Real(0));
    const Real inv = Real(1) / pm::sum(row, t + 1);
    for (int u = 0; u <= t; ++u) row[u] *= inv;
    std::fill(row + t + 1, row + T, Real(0));
  }
}

// Softmax backward of one (T,T) block, into `dpre` (holding datt on entry):
// dpre = att * (datt - sum_u att*datt) * scale on the causal part, 0 above.
template <typename Real>
void causal_softmax_rows_backward(Real* dpre, const Real* a, int T, Real scale) {
  for (int t = 0; t < T; ++t) {
    Real* d = dpre + static_cast<int64_t>(t) * T;
    const Real* row = a + static_cast<int64_t>(t) * T;
    const Real dot = pm::dot(row, d, t + 1);
    for (int u = 0; u <= t; ++u) d[u] = row[u] * (d[u] - dot) * scale;
    for (int u = t + 1; u < T; ++u) d[u] = 0;
  }
}

// Head h's causal softmax probabilities of one sequence (qkv rows at base),
// into the (T,T) block a.
template <typename Real>
void causal_scores(Real* a, const Real* base, int64_t C, int T, int64_t h, int HS, Real scale) {
  gemm_nt_lower(a, T, base + h * HS, 3 * C, base + C + h * HS, 3 * C, T, HS);  // q·kᵀ, the causal half
  causal_softmax_rows(a, T, scale);
}

// Head h's context of one sequence: out[t] = Σ_{u<=t} att[t,u] · v[u], the
// causal half only.
template <typename Real>
void context(Real* out, const Real* a, const Real* base, int64_t C, int T, int64_t h, int HS) {
  sum_rows_prefix(out + h * HS, C, a, T, base + 2 * C + h * HS, 3 * C, 1, T, HS, false);
}

// Pair (b, h) of the backward, given its probabilities a (T×T) and a T×T
// scratch block dpre.
template <typename Real>
void backward_pair(Real* dqkv, const Real* dout, const Real* qkv, const Real* a, Real* dpre_buf, int64_t b,
                   int64_t h, int T, int64_t C, int HS, Real scale) {
  const Eigen::OuterStride<> s3(3 * C), s1(C);
  Eigen::Map<RowMajorMat<Real>> dpre(dpre_buf, T, T);
  const Real* base = qkv + b * T * 3 * C;
  Real* dbase = dqkv + b * T * 3 * C;
  ConstStridedMap<Real> q(base + h * HS, T, HS, s3);
  ConstStridedMap<Real> k(base + C + h * HS, T, HS, s3);
  ConstStridedMap<Real> v(base + 2 * C + h * HS, T, HS, s3);
  StridedMap<Real> dq(dbase + h * HS, T, HS, s3);
  StridedMap<Real> dk(dbase + C + h * HS, T, HS, s3);
  StridedMap<Real> dv(dbase + 2 * C + h * HS, T, HS, s3);
  ConstStridedMap<Real> dout_h(dout + b * T * C + h * HS, T, HS, s1);
  // out = att · v:  dv[u] += Σ_{t>=u} att[t,u] · dout[t]
  sum_rows_suffix(dv.data(), 3 * C, a, T, dout_h.data(), C, T, T, HS, true);
  gemm_nt_lower(dpre.data(), T, dout_h.data(), C, v.data(), 3 * C, T, HS);  // datt = dout·vᵀ, the causal half
  // att = softmax(scale · q kᵀ)
  causal_softmax_rows_backward(dpre.data(), a, T, scale);
  // dq[t] += Σ_{u<=t} dpre[t,u] · k[u],  dk[u] += Σ_{t>=u} dpre[t,u] · q[t]
  sum_rows_prefix(dq.data(), 3 * C, dpre.data(), T, k.data(), 3 * C, 1, T, HS, true);
  sum_rows_suffix(dk.data(), 3 * C, dpre.data(), T, q.data(), 3 * C, T, T, HS, true);
}

}  // namespace

// (batch, head) pairs are independent: on idle cores they split (host_split.h),
// each pair computed as on one core.
template <typename Real>
void attention_forward(Real* out, Real* att, const Real* qkv, int B, int T, int NH, int HS) {
  const int64_t C = static_cast<int64_t>(NH) * HS;
  const Real scale = Real(1) / std::sqrt(static_cast<Real>(HS));
  const double work = 2.0 * B * NH * T * T * HS;
  for_chunks(int64_t{B} * NH, 1, work, [=](int64_t bh0, int64_t bh1) {
    for (int64_t bh = bh0; bh < bh1; ++bh) {
      const int64_t b = bh / NH, h = bh % NH;
      const Real* base = qkv + b * T * 3 * C;
      Real* a_ptr = att ? att + bh * T * T : thread_scratch<Real, 1>(size_t(T) * T).data();
      causal_scores(a_ptr, base, C, T, h, HS, scale);
      context(out + b * T * C, a_ptr, base, C, T, h, HS);
    }
  });
}

template <typename Real>
void attention_backward(Real* dqkv, const Real* dout, const Real* qkv, const Real* att, int B,
                        int T, int NH, int HS) {
  const int64_t C = static_cast<int64_t>(NH) * HS;
  const Real scale = Real(1) / std::sqrt(static_cast<Real>(HS));
  const double work = 4.0 * B * NH * T * T * HS;
  for_chunks(int64_t{B} * NH, 1, work, [=](int64_t bh0, int64_t bh1) {
    // one scratch block per thread, reused for every (b, h)
    Real* dpre = thread_scratch<Real>(size_t(T) * T).data();
    for (int64_t bh = bh0; bh < bh1; ++bh) {
      const int64_t b = bh / NH, h = bh % NH;
      const Real* a_ptr = att ? att + bh * T * T : nullptr;
      if (!att) {  // the forward's probabilities again, bit for bit
        Real* again = thread_scratch<Real, 1>(size_t(T) * T).data();
        causal_scores(again, qkv + b * T * 3 * C, C, T, h, HS, scale);
        a_ptr = again;
      }
      backward_pair(dqkv, dout, qkv, a_ptr, dpre, b, h, T, C, HS, scale);
    }
  });
}

template <typename Real>
void attention_forward_backward(Real* out, Real* dqkv, const Real* dout, const Real* qkv, int B, int T,
                                int NH, int HS) {
  const int64_t C = static_cast<int64_t>(NH) * HS;
  const Real scale = Real(1) / std::sqrt(static_cast<Real>(HS));
  const double work = 6.0 * B * NH * T * T * HS;
  for_chunks(int64_t{B} * NH, 1, work, [=](int64_t bh0, int64_t bh1) {
    Real* dpre = thread_scratch<Real>(size_t(T) * T).data();
    Real* a = thread_scratch<Real, 1>(size_t(T) * T).data();
    for (int64_t bh = bh0; bh < bh1; ++bh) {
      const int64_t b = bh / NH, h = bh % NH;
      const Real* base = qkv + b * T * 3 * C;
      causal_scores(a, base, C, T, h, HS, scale);  // once for both
      context(out + b * T * C, a, base, C, T, h, HS);
      backward_pair(dqkv, dout, qkv, a, dpre, b, h, T, C, HS, scale);
    }
  });
}

using cost_terms::cost;
using cost_terms::gemm_cost;

// HV: the values' head size (MLA's v_head_dim; 0: HS). NCs counts q's or
// k's elements (HS a head), NCv v's or the output's (HV a head).
OpCost attention_forward_cost(int64_t B, int64_t T, int64_t NH, int64_t HS, int elem, int64_t HV) {
  if (HV <= 0) HV = HS;
  const double bh = static_cast<double>(B) * NH;
  const double tt = static_cast<double>(T) * T;
  const double NCs = static_cast<double>(B) * T * NH * HS, NCv = static_cast<double>(B) * T * NH * HV;
  // per (batch, head): q·kᵀ [T,T] over HS, then att·v [T,HV] over T; the softmax in between.
  const int64_t BH = B * NH;
  return gemm_cost(cost(2 * bh * tt * (HS + HV) + 5 * bh * tt, 2 * NCs + NCv + bh * tt + NCv, elem),
                   {T, T, HS, BH}, {T, HV, T, BH});
}
OpCost attention_backward_cost(int64_t B, int64_t T, int64_t NH, int64_t HS, int elem, int64_t HV) {
  if (HV <= 0) HV = HS;
  const double bh = static_cast<double>(B) * NH;
  const double tt = static_cast<double>(T) * T;
  const double NCs = static_cast<double>(B) * T * NH * HS, NCv = static_cast<double>(B) * T * NH * HV;
  // per (batch, head): datt = dout·vᵀ [T,T] over HV; dv = attᵀ·dout [T,HV] over T,
  // dq = dpre·k and dk = dpreᵀ·q, two [T,HS] over T. (With HV = HS: one
  // batch of three [T,HS] GEMMs; else dv rides with datt's shape.)
  const int64_t BH = B * NH;
  const OpCost c = cost(4 * bh * tt * (HS + HV) + 5 * bh * tt,
                        NCv + 2 * NCs + NCv + bh * tt + 2 * (2 * NCs + NCv), elem);
  if (HV == HS) return gemm_cost(c, {T, T, HS, BH}, {T, HS, T, 3 * BH});
  return gemm_cost(c, {T, T, HV, 2 * BH}, {T, HS, T, 2 * BH});
}

AttentionCosts attention_forward_costs(int64_t B, int64_t T, int64_t NH, int64_t HS, int elem, int64_t HV) {
  if (HV <= 0) HV = HS;
  const double bh = static_cast<double>(B) * NH, tt = static_cast<double>(T) * T;
  const double NCs = static_cast<double>(B) * T * NH * HS, NCv = static_cast<double>(B) * T * NH * HV;
  const int64_t BH = B * NH;
  return {
      // scores = q·kᵀ: read q and k, write the T×T scores
      gemm_cost(cost(2 * bh * tt * HS, 2 * NCs + bh * tt, elem), {T, T, HS, BH}),
      // scale, causal mask, max, exp, sum, normalize: read and write T×T
      cost(5 * bh * tt, 2 * bh * tt, elem),
      // context = att·v: read att and v, write (T, HV) per head
      gemm_cost(cost(2 * bh * tt * HV, bh * tt + 2 * NCv, elem), {T, HV, T, BH}),
  };
}

AttentionCosts attention_backward_costs(int64_t B, int64_t T, int64_t NH, int64_t HS, int elem, int64_t HV) {
  if (HV <= 0) HV = HS;
  const double bh = static_cast<double>(B) * NH, tt = static_cast<double>(T) * T;
  const double NCs = static_cast<double>(B) * T * NH * HS, NCv = static_cast<double>(B) * T * NH * HV;
  const int64_t BH = B * NH;
  return {
      // dq = dpre·k, dk = dpreᵀ·q: read dpre, q, k; write dq, dk
      gemm_cost(cost(4 * bh * tt * HS, bh * tt + 4 * NCs, elem), {T, HS, T, 2 * BH}),
      // dpre = att ⊙ (datt − rowsum(datt ⊙ att)) · scale: read att, datt; write dpre
      cost(5 * bh * tt, 3 * bh * tt, elem),
      // datt = dout·vᵀ, dv = attᵀ·dout: read dout, v, att; write datt, dv
      gemm_cost(cost(4 * bh * tt * HV, 3 * NCv + 2 * bh * tt, elem), {T, T, HV, BH},
                {T, HV, T, BH}),
  };
}

OpCost attention_mask_cost(int64_t B, int64_t T, int64_t NH, int elem) {
  const double bhtt = static_cast<double>(B) * NH * T * T;
  return cost(bhtt, 2 * bhtt, elem);
}

template void attention_forward(float*, float*, const float*, int, int, int, int);
template void attention_forward(double*, double*, const double*, int, int, int, int);
template void attention_backward(float*, const float*, const float*, const float*, int, int, int,
                                 int);
template void attention_backward(double*, const double*, const double*, const double*, int, int,
                                 int, int);
template void attention_forward_backward(float*, float*, const float*, const float*, int, int, int, int);
template void attention_forward_backward(double*, double*, const double*, const double*, int, int, int,
                                         int);

}  // namespace shardlab::model
