// LocalAttention: the default attention core (attention_core.h). Every key
// of the sequence is on this rank (TP splits heads, not time): the causal
// attention kernels of model/kernels.h over this rank's NHl heads.
#pragma once

#include "model/parallel/attention_core.h"

namespace shardlab::parallel {

class LocalAttention final : public AttentionCore {
 public:
  void forward(float* atty, float* att, const float* qkv, const ShardDims& d,
               const LayerContext& c) const override;
  void backward(float* dqkv, const float* datty, const float* qkv, const float* atty,
                const float* att, const ShardDims& d, const LayerContext& c) const override;
  // The one instance every block uses by default (stateless: every thread shares it).
  static const LocalAttention& instance();
};

}  // namespace shardlab::parallel
