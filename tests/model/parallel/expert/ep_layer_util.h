// Runs one MoE layer (ep_moe_forward / ep_moe_backward, or tp_moe_* when
// ep = 1) on dp virtual devices, each with its block of the global rows, and
// the unsharded reference (model::moe_forward / moe_backward) on all rows.
#pragma once

#include <cstdint>
#include <vector>

#include "model/config.h"
#include "model/parallel/expert/moe.h"
#include "runtime/time.h"

namespace shardlab::parallel::testing {

struct LayerRun {
  int dp = 1, ep = 1;
  int B = 1, T = 16;  // global batch rows (split over dp) and sequence length
  std::vector<float> params;  // unsharded parameters (ParamTable layout)
  std::vector<float> x;       // (B·T, C) input of the MoE layer
  std::vector<float> dout;    // (B·T, C) gradient of its output
  float daux = 0.5f;          // gradient of the global aux loss
};

struct LayerResult {
  std::vector<float> out, dinp;  // (B·T, C) gathered from the ranks' rows
  float aux = 0;                 // mean of the ranks' aux (= the global batch's)
  std::vector<MoeStats> stats;   // (dp)
  std::vector<Time> compute_busy, end_time;  // (dp) transfers excluded / last stream time
};

// Layer 0 of `config` must be an MoE block.
LayerResult run_moe_layer(const model::GPTConfig& config, const LayerRun& run);
// The unsharded reference on the same rows (stats, times empty).
LayerResult reference_moe_layer(const model::GPTConfig& config, const LayerRun& run);

}  // namespace shardlab::parallel::testing
