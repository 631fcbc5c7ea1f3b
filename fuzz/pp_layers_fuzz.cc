// The text flags of the pipeline: --pp-layers (parse_stage_layers, then
// check_stage_layers and the placement it allows) and --schedule
// (parse_schedule), model/parallel/pipeline. The input is the flag's text.
#include <algorithm>
#include <string>

#include "fuzz/fuzz_util.h"
#include "model/config.h"
#include "model/parallel/pipeline/schedule.h"
#include "model/parallel/pipeline/stage.h"
#include "runtime/errors.h"

namespace {

using shardlab::fuzz::finding;

// A list check_stage_layers accepts for a model of n_layer blocks places
// every block on exactly one stage, in order; only the first and the last
// stage may hold none (the embedding alone, the head alone).
void check_placement(const std::vector<int>& layers, int n_layer) {
  shardlab::model::GPTConfig config;
  config.n_layer = n_layer;
  const int pp = static_cast<int>(layers.size());
  try {
    shardlab::parallel::check_stage_layers(config, pp, /*vpp=*/1, layers);
  } catch (const shardlab::ConfigError&) {
    return;  // a list that does not suit this model: the expected outcome
  }
  int next = 0;
  for (int rank = 0; rank < pp; ++rank) {
    shardlab::parallel::StagePlacement p{pp, 1, rank, layers};
    p = p.resolved(config);
    const bool end_stage = rank == 0 || rank == pp - 1;
    if (p.first_layer(0) != next || p.end_layer(0) < next || (p.end_layer(0) == next && !end_stage))
      finding("stages do not tile the blocks in order");
    next = p.end_layer(0);
  }
  if (next != n_layer) finding("stages do not cover every block");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(shardlab::fuzz::as_text(data, size));
  try {
    const std::vector<int> layers = shardlab::parallel::parse_stage_layers(text);
    if (layers.size() != size_t(std::count(text.begin(), text.end(), ',')) + 1)
      finding("--pp-layers: the list has another length than its comma-separated items");
    for (int n_layer : {8, 64}) check_placement(layers, n_layer);
  } catch (const shardlab::ConfigError&) {
    // Not a layer list: the expected outcome, one line naming the flag.
  }
  try {
    (void)shardlab::parallel::parse_schedule(text);
  } catch (const shardlab::ConfigError&) {
  }
  return 0;
}
