// FusedAttention (fused_attention.h): FlashAttention's cost, LocalAttention's host math.
#include "model/parallel/tensor/fused_attention.h"

#include <fmt/format.h>

#include "model/kernels.h"
#include "model/parallel/attention_kernel.h"
#include "runtime/errors.h"

namespace shardlab::parallel {

AttentionKernel parse_attention_kernel(std::string_view name) {
  if (name == "auto") return AttentionKernel::kAuto;
  if (name == "unfused") return AttentionKernel::kUnfused;
  if (name == "fused") return AttentionKernel::kFused;
  throw ConfigError(fmt::format("`attention` \"{}\": expected auto, fused or unfused", name));
}

const char* attention_kernel_name(AttentionKernel k) {
  return k == AttentionKernel::kFused ? "fused" : k == AttentionKernel::kUnfused ? "unfused" : "auto";
}

bool fused_attention(AttentionKernel k, bool llama) {
  return k == AttentionKernel::kFused || (k == AttentionKernel::kAuto && llama);
}

OpCost attention_gemms(double flops, double bytes, GemmShape scores, GemmShape values, bool on_chip) {
  OpCost c{flops, bytes};
  c.op_class = OpClass::kGemm;
  c.gemm = scores;
  c.gemm2 = values;
  c.on_chip = on_chip;
  return c;
}

namespace {

struct Causal {
  double pairs;     // (query, key) pairs over the B·NH heads: T(T+1)/2 each
  double rows;      // query rows over the heads
  double NCs, NCv;  // elements of Q or K (B·T·NH·HS); of V, O or dO (B·T·NH·HV)
  GemmShape scores;  // QKᵀ of a head over the causal half of the keys
  GemmShape values;  // P·V
};

Causal causal(int64_t B, int64_t T, int64_t NH, int64_t HS, int64_t HV) {
  if (HV <= 0) HV = HS;
  const int64_t BH = B * NH, keys = (T + 1) / 2;
  return {double(BH) * double(T) * double(T + 1) / 2, double(BH) * double(T), double(B) * T * NH * HS,
          double(B) * T * NH * HV, {T, keys, HS, BH}, {T, HV, keys, BH}};
}

}  // namespace

OpCost fused_attention_forward_cost(int64_t B, int64_t T, int64_t NH, int64_t HS, int elem, int64_t HV) {
  const Causal k = causal(B, T, NH, HS, HV);
  const double hv = k.values.n;
  // read Q, K, V; write O; write the fp32 log-sum-exp.
  OpCost c = attention_gemms(2 * k.pairs * (HS + hv) + 5 * k.pairs, (2 * k.NCs + 2 * k.NCv) * elem + 4 * k.rows,
                             k.scores, k.values, /*on_chip=*/true);
  c.attention = OpCost::Attention::kForward;
  c.attention_seq = T;
  return c;
}

OpCost fused_attention_preprocess_cost(int64_t B, int64_t T, int64_t NH, int64_t HS, int elem, int64_t HV) {
  const Causal k = causal(B, T, NH, HS, HV);
  // D = rowsum(dO ⊙ O): read dO and O, write D in fp32; a multiply and an add per element.
  return {2 * k.NCv, 2 * k.NCv * elem + 4 * k.rows};
}

OpCost fused_attention_backward_cost(int64_t B, int64_t T, int64_t NH, int64_t HS, int elem, int64_t HV) {
  const Causal k = causal(B, T, NH, HS, HV);
  const double hv = k.values.n;
  GemmShape twice = k.scores, thrice = k.values;
  twice.batch *= 2;   // S = QKᵀ and dP = dO·Vᵀ
  thrice.batch *= 3;  // dV, dQ, dK
  // S, dQ and dK over HS, dP and dV over HV; read Q, K, V, dO, the
  // log-sum-exp and D; write dQ, dK, dV.
  OpCost c = attention_gemms(2 * k.pairs * (3 * HS + 2 * hv) + 6 * k.pairs,
                             (4 * k.NCs + 3 * k.NCv) * elem + 8 * k.rows, twice, thrice, /*on_chip=*/true);
  c.attention = OpCost::Attention::kBackward;
  c.attention_seq = T;
  return c;
}

void FusedAttention::forward(float* atty, float* /*lse*/, const float* qkv, const ShardDims& d,
                             const LayerContext& c) const {
  const int64_t B = d.B, T = d.T, NH = d.NHl(), HS = d.HS();
  c.ex.run("attn.flash.fwd", fused_attention_forward_cost(B, T, NH, HS, c.ex.elem, d.HV()), [&] {
    probs_.resize(size_t(B * NH * T * T));
    model::attention_forward(atty, probs_.data(), qkv, d.B, d.T, d.NHl(), d.HS());
  });
}

void FusedAttention::backward(float* dqkv, const float* datty, const float* qkv, const float* /*atty*/,
                              const float* /*lse*/, const ShardDims& d, const LayerContext& c) const {
  const int64_t B = d.B, T = d.T, NH = d.NHl(), HS = d.HS();
  c.ex.op("attn.flash.bwd_preprocess", fused_attention_preprocess_cost(B, T, NH, HS, c.ex.elem, d.HV()));
  c.ex.run("attn.flash.bwd", fused_attention_backward_cost(B, T, NH, HS, c.ex.elem, d.HV()), [&] {
    // The probabilities again (the kernel recomputes them from the log-sum-exp).
    probs_.resize(size_t(B * NH * T * T));
    out_.resize(size_t(B * T * NH * HS));
    model::attention_forward(out_.data(), probs_.data(), qkv, d.B, d.T, d.NHl(), d.HS());
    model::attention_backward(dqkv, datty, qkv, probs_.data(), d.B, d.T, d.NHl(), d.HS());
  });
}

}  // namespace shardlab::parallel
