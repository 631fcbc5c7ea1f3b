// LocalAttention: the kernels of model/kernels.h over this rank's heads.
#include "model/parallel/tensor/attention.h"

#include "model/kernels.h"

namespace shardlab::parallel {

void LocalAttention::forward(float* atty, float* att, const float* qkv, const ShardDims& d,
                             const LayerContext& c) const {
  // One fused kernel here, charged as the three an unfused attention runs.
  const model::AttentionCosts k =
      model::attention_forward_costs(d.B, d.T, d.NHl(), d.HS(), c.ex.elem, d.HV());
  c.ex.run("attn.scores.fwd", k.scores,
           [&] { model::attention_forward(atty, att, qkv, d.B, d.T, d.NHl(), d.HS()); });
  if (c.ex.fusions.softmax) {
    c.ex.op("attn.softmax.fwd", k.softmax);
  } else {  // masked_fill, then the softmax without the mask's op
    const OpCost mask = model::attention_mask_cost(d.B, d.T, d.NHl(), c.ex.elem);
    c.ex.op("attn.mask.fwd", mask);
    c.ex.op("attn.softmax.fwd", OpCost{k.softmax.flops - mask.flops, k.softmax.bytes});
  }
  c.ex.op("attn.context.fwd", k.context);
}

void LocalAttention::backward(float* dqkv, const float* datty, const float* qkv,
                              const float* /*atty*/, const float* att, const ShardDims& d,
                              const LayerContext& c) const {
  const model::AttentionCosts k =
      model::attention_backward_costs(d.B, d.T, d.NHl(), d.HS(), c.ex.elem, d.HV());
  c.ex.run("attn.context.bwd", k.context,
           [&] { model::attention_backward(dqkv, datty, qkv, att, d.B, d.T, d.NHl(), d.HS()); });
  c.ex.op("attn.softmax.bwd", k.softmax);
  if (!c.ex.fusions.softmax) c.ex.op("attn.mask.bwd", model::attention_mask_cost(d.B, d.T, d.NHl(), c.ex.elem));
  c.ex.op("attn.scores.bwd", k.scores);
}

const LocalAttention& LocalAttention::instance() {
  static const LocalAttention kInstance;
  return kInstance;
}

}  // namespace shardlab::parallel
