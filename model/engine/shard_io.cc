#include "model/engine/shard_io.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "runtime/errors.h"

namespace shardlab::engine {

using parallel::LocalModel;
using parallel::ShardSpec;

bool canonical_copy(const ShardSpec& s, const collectives::Coords& coords) {
  if (s.tp_replicated && coords.tp != 0) return false;
  return coords.pp == 0 || s.role != model::ParamRole::kTokenEmbedding;  // the first stage's wte
}

void scatter_to_global(const LocalModel& model, std::span<const float> local,
                       const collectives::Coords& coords, const model::ParamTable& table,
                       std::span<float> global, const std::vector<Range>* only, ScatterWhat what) {
  for (const ShardSpec& s : model.shards()) {
    if (what == kExpertsOnly && !s.expert) continue;
    if (!canonical_copy(s, coords)) continue;
    const int64_t base = table.at(s.name).offset;
    for (int64_t i = 0; i < s.numel; ++i) {
      const int64_t at = s.offset + i;
      if (only && std::none_of(only->begin(), only->end(),
                               [at](const Range& r) { return at >= r.begin && at < r.begin + r.size; }))
        continue;
      global[size_t(base + parallel::global_index(s, i))] = local[size_t(at)];
    }
  }
}

void slice_from_global(const ShardSpec& s, std::span<const float> tensor, int64_t begin, int64_t end, float* out) {
  for (int64_t i = begin; i < end; ++i) out[i - begin] = tensor[size_t(parallel::global_index(s, i))];
}

void load_shards(LocalModel& model, const model::SafetensorsFile& f) {
  auto params = model.params();
  for (const ShardSpec& s : model.shards())
    slice_from_global(s, f.get(s.name, s.global_shape), 0, s.numel, params.data() + s.offset);
}

void corrupt_shard(LocalModel& model, const std::string& name, double rel) {
  auto params = model.params();
  for (const ShardSpec& s : model.shards()) {
    if (s.name != name) continue;
    int64_t changed = 0;
    for (int64_t i = 0; i < s.numel; ++i) {
      float& x = params[size_t(s.offset + i)];
      changed += std::isfinite(x);
      x = rel == 0 ? x + 1e-2f * (1 + std::abs(x)) : float(x * (1 + rel));
    }
    if (changed == 0)  // ZeRO-3 before the first step: the values are another dp rank's (NaN here)
      throw ConfigError(fmt::format("`corrupt_shard`: this rank holds no value of \"{}\" yet (ZeRO-3 keeps it on "
                                    "another dp rank; pick another rank or parameter)", name));
    return;
  }
  throw ConfigError(fmt::format("`corrupt_shard`: no parameter \"{}\"", name));
}

}  // namespace shardlab::engine
