// FusedAttention: the attention core as one FlashAttention-2/3-style kernel
// (--attention fused; attention_core.h). Forward streams K/V tiles past each
// query tile with an online softmax and writes only the output O and the
// log-sum-exp of every query row; backward first computes D = rowsum(dO ⊙ O)
// (a small preprocessing kernel), then recomputes the scores from Q, K and
// the log-sum-exp and runs the five GEMMs (S = QKᵀ, dP = dO·Vᵀ, dV = Pᵀ·dO,
// dQ = dS·K, dK = dSᵀ·Q). No T×T matrix touches HBM; the causal mask skips
// the tiles above the diagonal, so query t costs t+1 keys (T(T+1)/2 pairs
// per head, against T² for the unfused kernels).
//
// Cost (fused_attention_*_cost; HV the values' head size under MLA, else HS): FLOPs 4·HS per pair forward (QKᵀ, P·V)
// plus 5 per pair of softmax; backward 10·HS per pair (the five GEMMs, QKᵀ
// recomputed) plus 6. HBM: forward reads Q, K, V and writes O and the fp32
// log-sum-exp; backward reads Q, K, V, dO, the log-sum-exp and D and writes
// dQ, dK, dV. The GEMMs run at the profile's tile/wave efficiency (their
// shapes with the causal half of the keys), whose maximum is the profile's
// GEMM maximum: README "Scale" compares it with FlashAttention's published
// throughput.
//
// The saved state (ShardDims::att_elements with flash): the log-sum-exp,
// B·NHl·T. Real math runs the same host kernels as LocalAttention (the
// probabilities in a scratch buffer of this core, recomputed in backward as
// the kernel does), so a fused run's numbers equal an unfused run's bit for
// bit; only the charged time and the kept memory differ.
//
// Thread safety: one instance per device thread (the scratch).
#pragma once

#include <vector>

#include "model/parallel/attention_core.h"
#include "runtime/cost_model.h"

namespace shardlab::parallel {

OpCost fused_attention_forward_cost(int64_t B, int64_t T, int64_t NH, int64_t HS, int elem, int64_t HV = 0);
OpCost fused_attention_preprocess_cost(int64_t B, int64_t T, int64_t NH, int64_t HS, int elem, int64_t HV = 0);
OpCost fused_attention_backward_cost(int64_t B, int64_t T, int64_t NH, int64_t HS, int elem, int64_t HV = 0);

class FusedAttention final : public AttentionCore {
 public:
  void forward(float* atty, float* att, const float* qkv, const ShardDims& d,
               const LayerContext& c) const override;
  void backward(float* dqkv, const float* datty, const float* qkv, const float* atty,
                const float* att, const ShardDims& d, const LayerContext& c) const override;
  bool fused() const override { return true; }

 private:
  mutable std::vector<float> probs_, out_;  // host scratch of real math
};

}  // namespace shardlab::parallel
