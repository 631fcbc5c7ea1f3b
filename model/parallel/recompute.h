#pragma once

#include <string>
#include <string_view>

namespace shardlab::parallel {

// Activation recomputation (Korthikanti et al. 2022, "Reducing Activation
// Recomputation in Large Transformer Models"):
//   kSelective  the modules of RecomputeModule below are not kept (by
//               default the attention core: q·kᵀ, softmax, ·v, whose
//               B·NH·T² probabilities are the largest activation at long
//               sequences); backward re-runs them from what the block kept;
//   kFull       a block keeps only its input; backward re-runs the whole
//               block's forward (its collectives too) before its backward.
// The recomputed kernels charge the clock as "<kernel>.recompute"; the math,
// and so every loss and parameter, is bit-identical to kNone.
enum class Recompute { kNone, kSelective, kFull };
Recompute parse_recompute(std::string_view name);  // ConfigError naming --recompute
const char* recompute_name(Recompute r);

// Which blocks kFull re-runs (Megatron's --recompute-method with
// --recompute-num-layers N), counted within each model chunk:
//   kUniform  groups of N consecutive blocks keep only the group's input;
//             the backward of the group's last block first re-runs the
//             whole group's forward (N 1, the default: every block keeps its
//             own input and is re-run alone);
//   kBlock    the chunk's first N blocks are re-run as above (each keeps its
//             input), the others keep everything (no recomputation).
enum class RecomputeMethod { kUniform, kBlock };
RecomputeMethod parse_recompute_method(std::string_view name);  // ConfigError naming --recompute-method
const char* recompute_method_name(RecomputeMethod m);

// What kSelective re-runs: Megatron-core's recompute_modules (with
// recompute_granularity "selective"), by the same names. A module checkpointed
// whole keeps its input and re-runs its forward, collectives included; an
// output-discarding one (layernorm, moe_act) frees one output and re-runs the
// one kernel that made it.
enum RecomputeModule : unsigned {
  kRecomputeCoreAttn = 1u << 0,       // core_attn: the attention core (kept: q, k, v)
  kRecomputeLayerNorm = 1u << 1,      // layernorm: an MoE layer's pre-MLP norm output (the other
                                      // norms are fused into the next GEMM, which keeps its input)
  kRecomputeMlp = 1u << 2,            // mlp: a dense block's MLP, from ln_2's output
  kRecomputeMoe = 1u << 3,            // moe: an MoE layer: router, dispatch, experts, combine
  kRecomputeMoeAct = 1u << 4,         // moe_act: the routed experts' activation (GELU or SwiGLU)
  kRecomputeSharedExperts = 1u << 5,  // shared_experts: the shared experts' MLP
  kRecomputeMlaUpProj = 1u << 6,      // mla_up_proj: MLA's up-projections and RoPE, from the kept latents
                                      // (the core's q, k, v are not kept)
};
inline constexpr unsigned kRecomputeModulesAll = (kRecomputeMlaUpProj << 1) - 1;
// "core_attn,mlp" (or "core_attn+mlp", for a sweep's axis) -> a
// RecomputeModule mask; ConfigError naming --recompute-modules on an
// unknown, repeated or missing name.
unsigned parse_recompute_modules(std::string_view list);
std::string recompute_modules_name(unsigned modules);  // "core_attn,mlp"; "" for none

}  // namespace shardlab::parallel
