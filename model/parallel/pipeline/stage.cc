#include "model/parallel/pipeline/stage.h"

#include <algorithm>
#include <numeric>

#include <fmt/format.h>

#include "runtime/errors.h"
#include "runtime/parse_number.h"

namespace shardlab::parallel {

std::vector<int> balanced_stage_layers(int n_layer, int stages) {
  std::vector<int> out(size_t(std::max(stages, 0)), stages > 0 ? n_layer / stages : 0);
  for (int s = 0; s < stages && s < n_layer % stages; ++s) ++out[size_t(s)];
  return out;
}

std::vector<int> parse_stage_layers(const std::string& text) {
  std::vector<int> out;
  size_t at = 0;
  while (at <= text.size()) {
    const size_t comma = std::min(text.find(',', at), text.size());
    const std::string item = text.substr(at, comma - at);
    const std::optional<int> value = parse_number<int>(item);
    if (!value)
      throw ConfigError(fmt::format("`stage_layers` \"{}\": expected comma-separated layer counts like 3,3,2", text));
    out.push_back(*value);
    at = comma + 1;
  }
  return out;
}

void check_stage_layers(const model::GPTConfig& config, int pp, int vpp,
                        const std::vector<int>& stage_layers) {
  const int stages = pp * vpp;
  // An explicit list may leave the first and the last stage without blocks.
  const int spare = stage_layers.empty() ? 0 : std::min(stages, 2);
  if (stages > config.n_layer + spare) {
    throw ConfigError(vpp > 1 ? fmt::format("`pp` {} x `vpp` {} = {} stages is more than `n_layer` {} "
                                            "(every stage needs a block)", pp, vpp, stages, config.n_layer)
                              : fmt::format("`pp` {} is more than `n_layer` {} (every stage needs a block)",
                                            pp, config.n_layer));
  }
  if (stage_layers.empty()) return;
  if (int(stage_layers.size()) != stages)
    throw ConfigError(fmt::format("`stage_layers` has {} entries but there are {} stages (`pp` x `vpp`)",
                                  stage_layers.size(), stages));
  // The first stage may hold only the embedding and the last only the head
  // (Llama 3's pipeline; Megatron-core's account-for-embedding/loss split):
  // zero blocks there; every other stage needs one.
  for (int s = 0; s < stages; ++s) {
    const int least = s == 0 || s == stages - 1 ? 0 : 1;
    if (stage_layers[size_t(s)] < least)
      throw ConfigError(least == 1 ? "`stage_layers`: every stage but the first and the last needs at least one block"
                                   : "`stage_layers`: a stage cannot hold a negative number of blocks");
  }
  const int64_t sum = std::accumulate(stage_layers.begin(), stage_layers.end(), int64_t{0});  // no int overflow
  if (sum != config.n_layer)
    throw ConfigError(fmt::format("`stage_layers` sums to {} but the model has `n_layer` {}", sum, config.n_layer));
}

int StagePlacement::first_layer(int chunk) const {
  return std::accumulate(stage_layers.begin(), stage_layers.begin() + stage(chunk), 0);
}

int StagePlacement::end_layer(int chunk) const {
  return first_layer(chunk) + stage_layers[size_t(stage(chunk))];
}

bool StagePlacement::holds_first() const {
  for (int c = 0; c < vpp; ++c)
    if (first(c)) return true;
  return false;
}

bool StagePlacement::holds_last() const {
  for (int c = 0; c < vpp; ++c)
    if (last(c)) return true;
  return false;
}

StagePlacement StagePlacement::resolved(const model::GPTConfig& config) const {
  check_stage_layers(config, pp, vpp, stage_layers);
  SHARDLAB_CHECK(rank >= 0 && rank < pp, "pipeline rank out of range");
  StagePlacement p = *this;
  if (p.stage_layers.empty()) p.stage_layers = balanced_stage_layers(config.n_layer, stages());
  return p;
}

}  // namespace shardlab::parallel
