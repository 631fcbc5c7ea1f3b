#pragma once

#include <string_view>

namespace shardlab::parallel {

// Activation recomputation (Korthikanti et al. 2022, "Reducing Activation
// Recomputation in Large Transformer Models"):
//   kSelective  the attention core (q·kᵀ, softmax, ·v) is not kept: backward
//               re-runs it from the kept q, k, v (the B·NH·T² probabilities
//               are the largest activation at long sequences);
//   kFull       a block keeps only its input; backward re-runs the whole
//               block's forward (its collectives too) before its backward.
// The recomputed kernels charge the clock as "<kernel>.recompute"; the math,
// and so every loss and parameter, is bit-identical to kNone.
enum class Recompute { kNone, kSelective, kFull };
Recompute parse_recompute(std::string_view name);  // ConfigError naming --recompute
const char* recompute_name(Recompute r);

}  // namespace shardlab::parallel
