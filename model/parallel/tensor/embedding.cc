#include "model/parallel/tensor/embedding.h"

#include <algorithm>
#include <cmath>

#include "model/portable_math.h"

namespace shardlab::parallel {

namespace coll = collectives;
using model::Token;

namespace {
bool owned(Token tok, int64_t v0, int Vl) { return tok >= v0 && tok < v0 + Vl; }

// Bytes per logit of the cast to fp32 and back (none when the logits are fp32).
double cast_bytes(int elem) { return elem < 4 ? elem + 4.0 : 0.0; }
}  // namespace

OpCost vocab_parallel_cross_entropy_forward_cost(int64_t N, int64_t Vl, int elem) {
  const double nv = static_cast<double>(N) * Vl;
  // max 4, subtract 4 + 4, exp 4 + 4, sum 4, divide 4 + 4; the row statistics.
  return OpCost{4 * nv, (32 + cast_bytes(elem)) * nv + 4.0 * N};
}
OpCost vocab_parallel_cross_entropy_backward_cost(int64_t N, int64_t Vl, int elem) {
  const double nv = static_cast<double>(N) * Vl;
  // softmax x dloss in place 4 + 4; the target's entries.
  return OpCost{2 * nv, (8 + cast_bytes(elem)) * nv + 4.0 * N};
}

void vocab_parallel_embedding_forward(float* encoded, float* partial, const Token* inp,
                                      const float* wte, const float* wpe, int64_t v0, int Vl,
                                      const ShardDims& d, const TpContext& c) {
  const model::Exec& ex = c.ex;
  const int64_t N = d.N(), Nr = d.rows(), row0 = d.row0(c.rank());
  const int C = d.C;
  ex.run("embedding.fwd", model::embedding_forward_cost(d.B, d.T, C, ex.elem), [&] {
    for (int64_t n = 0; n < N; ++n) {
      float* o = partial + n * C;
      if (owned(inp[n], v0, Vl)) {
        const float* we = wte + (inp[n] - v0) * C;
        std::copy(we, we + C, o);
      } else {
        std::fill(o, o + C, 0.0f);
      }
    }
  });
  exit_row_parallel(c, partial, encoded, Nr, C);  // reduce_from_tp / reduce_scatter_to_sp
  if (d.rope) return;  // rotary positions (llama): no table to add
  ex.run("embedding.wpe.fwd", model::residual_forward_cost(Nr * C, ex.elem), [&] {
    for (int64_t i = 0; i < Nr; ++i) {
      const float* pe = wpe + d.position((row0 + i) % d.T) * C;  // global positions under CP
      float* o = encoded + i * C;
      for (int j = 0; j < C; ++j) o[j] += pe[j];
    }
  });
}

void vocab_parallel_embedding_backward(float* dwte, float* dwpe, float* dfull, const float* dx,
                                       const Token* inp, int64_t v0, int Vl, const ShardDims& d,
                                       const TpContext& c) {
  const model::Exec& ex = c.ex;
  const int64_t N = d.N(), Nr = d.rows(), row0 = d.row0(c.rank());
  const int C = d.C;
  // The gather first: both loops below are then one kernel (the wpe loop
  // reads only this rank's rows dx, which the gather leaves as they are).
  const float* dx_full = exit_row_parallel_bwd(c, dx, dfull, Nr, C);
  ex.run("embedding.bwd", model::embedding_backward_cost(d.B, d.T, C, ex.elem), [&] {
    for (int64_t i = 0; !d.rope && i < Nr; ++i) {
      float* dpe = dwpe + d.position((row0 + i) % d.T) * C;
      const float* g = dx + i * C;
      for (int j = 0; j < C; ++j) dpe[j] += g[j];
    }
    for (int64_t n = 0; n < N; ++n) {
      if (!owned(inp[n], v0, Vl)) continue;
      float* dwe = dwte + (inp[n] - v0) * C;
      const float* g = dx_full + n * C;
      for (int j = 0; j < C; ++j) dwe[j] += g[j];
    }
  });
}

float vocab_parallel_cross_entropy_forward(float* probs, float* losses, float* stats,
                                           const float* logits, const Token* targets, int64_t N,
                                           int Vl, int64_t v0, const TpContext& c, bool unfused) {
  const model::Exec& ex = c.ex;
  float* zmax = stats;        // (N)
  float* sums = stats + N;    // (N) Σ exp(z - max)
  float* ztarget = sums + N;  // (N) the target's logit, from its owner
  // One kernel split by two all-reduces (sink.h): its loops run on math(),
  // its cost is charged once after the last.
  for (int64_t n = 0; ex.math() && n < N; ++n) {
    const float* z = logits + n * Vl;
    zmax[n] = model::pm::max(z, Vl);
  }
  coll::all_reduce(*c.dev, *c.group, coll::Buffer(zmax, static_cast<size_t>(N)),
                   coll::ReduceOp::kMax, c.on_compute());
  for (int64_t n = 0; ex.math() && n < N; ++n) {
    const float* z = logits + n * Vl;
    float* p = probs + n * Vl;
    for (int v = 0; v < Vl; ++v) p[v] = model::pm::exp(z[v] - zmax[n]);
    sums[n] = model::pm::sum(p, Vl);
    ztarget[n] = owned(targets[n], v0, Vl) ? logits[n * Vl + (targets[n] - v0)] : 0.0f;
  }
  coll::all_reduce(*c.dev, *c.group, coll::Buffer(sums, static_cast<size_t>(2 * N)), coll::ReduceOp::kSum,
                   c.on_compute());
  double total = 0;
  for (int64_t n = 0; ex.math() && n < N; ++n) {
    float* p = probs + n * Vl;
    const float inv = 1.0f / sums[n];
    for (int v = 0; v < Vl; ++v) p[v] *= inv;
    losses[n] = float(model::pm::log(double(sums[n]))) + zmax[n] - ztarget[n];
    total += losses[n];
  }
  ex.op("cross_entropy.fwd", unfused ? vocab_parallel_cross_entropy_forward_cost(N, Vl, ex.elem)
                                     : model::crossentropy_forward_cost(N, Vl, ex.elem));
  return static_cast<float>(total / static_cast<double>(N));
}

void vocab_parallel_cross_entropy_backward(float* dlogits, const float* probs, const Token* targets,
                                           float dloss, int64_t N, int Vl, int64_t v0,
                                           const model::Exec& ex, bool unfused) {
  const float scale = dloss / static_cast<float>(N);
  const OpCost cost = unfused ? vocab_parallel_cross_entropy_backward_cost(N, Vl, ex.elem)
                               : model::crossentropy_backward_cost(N, Vl, ex.elem);
  ex.run("cross_entropy.bwd", cost, [&] {
    for (int64_t n = 0; n < N; ++n) {
      const float* p = probs + n * Vl;
      float* d = dlogits + n * Vl;
      for (int v = 0; v < Vl; ++v) d[v] += p[v] * scale;
      if (owned(targets[n], v0, Vl)) d[targets[n] - v0] -= scale;
    }
  });
}

}  // namespace shardlab::parallel
