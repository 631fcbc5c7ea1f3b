// --attention: which attention kernels a run charges (parallel/attention_core.h).
//   kUnfused  Megatron-LM's core attention: a batched GEMM for the scores, a
//             fused scale-mask-softmax, a batched GEMM for the context; the
//             B·NH·T² probabilities go through HBM and are kept for backward
//             (LocalAttention).
//   kFused    one FlashAttention-2/3-style kernel each way (FusedAttention,
//             tensor/fused_attention.h): no T×T matrix in HBM, the
//             log-sum-exp kept.
//   kAuto     unfused for the GPT family (as Megatron-LM ran GPT-3 in
//             2021-2022, the A100 calibration), fused for the llama family
//             (as Megatron-core with Transformer Engine runs it today).
// Context parallelism has its own flash-style core whatever the choice
// (context/cp_attention.h); fused, its chunk pairs' scores stay on chip too.
#pragma once

#include <cstdint>
#include <string_view>

#include "runtime/cost_model.h"

namespace shardlab::parallel {

enum class AttentionKernel : uint8_t { kAuto, kUnfused, kFused };
AttentionKernel parse_attention_kernel(std::string_view name);  // ConfigError naming --attention
const char* attention_kernel_name(AttentionKernel k);
bool fused_attention(AttentionKernel k, bool llama);  // kAuto resolved by the family

// An attention kernel's cost as its two GEMM families (the scores' and the
// context's, runtime/cost_model.h: OpCost::gemm and gemm2) plus `flops`
// beyond them (the softmax) and `bytes` through HBM. `on_chip`: a fused
// kernel, whose scores and probabilities never leave the SMs, so the GEMMs'
// own operand traffic is not charged (only `bytes`).
OpCost attention_gemms(double flops, double bytes, GemmShape scores, GemmShape values, bool on_chip);

}  // namespace shardlab::parallel
