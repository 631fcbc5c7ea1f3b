// KernelFusions: which element-wise kernels a run charges fused.
//
// Megatron-LM and Transformer Engine fuse chains of memory-bound ops into one
// kernel; PyTorch eager runs each op as its own kernel, reading and writing
// HBM every time. The choice moves time only: the host math is the same
// either way (the losses are bit for bit those of the other choice), and
// each unfused chain is charged as the kernels its ops launch (kernels.h,
// kernels_llama.h and kernels_attention.cc have the counts).
#pragma once

#include <string>
#include <string_view>

namespace shardlab::model {

struct KernelFusions {
  // RMSNorm as one kernel (TE / Apex); off: the ops of Llama's reference
  // RMSNorm (square, mean, +eps, rsqrt, two products), each a kernel.
  // LayerNorm is one kernel in PyTorch too: the choice does not move it.
  bool norm = true;
  // silu(gate) * up as one kernel (Megatron's bias_swiglu); off: silu, then the product.
  bool swiglu = true;
  // Scale, causal mask and softmax of the unfused attention core in one
  // kernel (Megatron's scaled_masked_softmax); off: masked_fill, then softmax.
  bool softmax = true;
  // Bias, dropout and residual add after each projection in one kernel
  // (Megatron's bias_dropout_add_fused_train); off: three kernels.
  bool bias_dropout_add = false;
  // The loss as one fused kernel; off: Megatron-LM's vocab-parallel
  // cross-entropy in unfused fp32 kernels (tensor/embedding.h).
  bool cross_entropy = true;

  bool operator==(const KernelFusions&) const = default;
};

// "norm,swiglu,softmax,cross-entropy": the fused ones, in the order above ("none" if none).
std::string to_string(const KernelFusions& f);
// A comma-separated list applied in order to `base`: a name turns that
// fusion on, "no-NAME" off, "all" and "none" set every one. Returns false
// with `error` set on an unknown or empty item.
bool parse_fusions(std::string_view list, KernelFusions& base, std::string& error);

}  // namespace shardlab::model
