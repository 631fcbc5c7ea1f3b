// Pipeline stages as a description: which blocks a rank's model chunks hold,
// and whether a chunk holds the embedding (first stage) or the head (last).
//
// The n_layer blocks are split over S = pp·v virtual stages (stage_layers[s]
// blocks each, in order); pipeline rank r holds the chunks c = 0..v-1 of
// virtual stages s = stage_of(order, pp, r, c): c·pp + r (v = 1: stage r
// only) as Megatron's interleaved schedule places them, or in a V (ZB-V,
// DualPipeV: rank r holds stages r and 2·pp - 1 - r). The sharded model (sharded_gpt.h) reads
// this description; it owns nothing.
#pragma once

#include <string>
#include <vector>

#include "model/config.h"
#include "model/parallel/pipeline/schedule.h"

namespace shardlab::parallel {

// Blocks per virtual stage when the user gives none: as even as possible,
// the extra blocks on the earliest stages (the last stage also has the head).
std::vector<int> balanced_stage_layers(int n_layer, int stages);
// "3,3,2" -> {3, 3, 2}; ConfigError naming `stage_layers` otherwise.
std::vector<int> parse_stage_layers(const std::string& text);
// Throws ConfigError naming the option field: pp·vpp stages must not exceed the
// layers, and an explicit list must have pp·vpp entries, each >= 1, summing to
// the layers. Empty `stage_layers` = balanced.
void check_stage_layers(const model::GPTConfig& config, int pp, int vpp,
                        const std::vector<int>& stage_layers);

struct StagePlacement {
  int pp = 1, vpp = 1, rank = 0;
  std::vector<int> stage_layers;  // (pp·vpp) blocks per virtual stage; empty = balanced
  StageOrder order = StageOrder::kLoop;

  int stages() const { return pp * vpp; }
  int stage(int chunk) const { return stage_of(order, pp, rank, chunk); }
  int first_layer(int chunk) const;
  int end_layer(int chunk) const;
  bool first(int chunk) const { return stage(chunk) == 0; }  // holds wte, wpe
  bool last(int chunk) const { return stage(chunk) == stages() - 1; }  // holds ln_f, the head
  bool holds_first() const;  // any chunk is the first stage
  bool holds_last() const;   // any chunk is the last stage
  // The same placement with `stage_layers` filled in (balanced when empty);
  // throws ConfigError like check_stage_layers.
  StagePlacement resolved(const model::GPTConfig& config) const;
};

}  // namespace shardlab::parallel
