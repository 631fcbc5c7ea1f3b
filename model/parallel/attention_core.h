// The attention core of a block, behind an interface so that variants plug in
// without touching the block: softmax(q·kᵀ/√HS + causal mask)·v over this
// rank's heads, from the fused [q | k | v] rows to the heads' outputs.
//
//   LocalAttention   every key of the sequence is on this rank (TP splits
//                    heads, not time): the kernels of model/kernels.h
//                    (tensor/attention.h).
//   CpAttention      context parallelism (context/cp_attention.h): this rank
//                    holds two chunks of every sequence, the keys of the
//                    others come around the cp ring (or by an all-gather).
//
// A core is set through BlockContext::attention (block.h); the block, its
// projections and the schedules stay as they are.
//
// Shapes (letters of dims.h): qkv (N, 3·Cl), atty (N, Cl), att the core's
// saved state, ShardDims::att_elements(): the probabilities (B, NHl, T, T) for
// LocalAttention, the log-sum-exp of every query row (B, NHl, T) under
// context parallelism.
#pragma once

#include "model/parallel/dims.h"
#include "model/parallel/layer_context.h"

namespace shardlab::parallel {

class AttentionCore {
 public:
  virtual ~AttentionCore() = default;
  // atty = attention(qkv); `att` keeps what backward needs.
  virtual void forward(float* atty, float* att, const float* qkv, const ShardDims& d,
                       const LayerContext& c) const = 0;
  // dqkv (N, 3·Cl) += the gradient of qkv given datty; atty is forward's output.
  virtual void backward(float* dqkv, const float* datty, const float* qkv, const float* atty,
                        const float* att, const ShardDims& d, const LayerContext& c) const = 0;
  // A fused kernel reads GQA's K/V heads in place: the qkv it is given has
  // them repeated for the host's math only (block.cc core_qkv charges that
  // copy nothing).
  virtual bool fused() const { return false; }
};

}  // namespace shardlab::parallel
