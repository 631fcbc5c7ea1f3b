// Moving parameters between a rank's shards and unsharded tensors: gathers
// for verify and checkpoints, loading a checkpoint, verify's corruption aid.
#pragma once

#include <algorithm>
#include <span>
#include <string>
#include <vector>

#include "collectives/mesh.h"
#include "model/io/safetensors.h"
#include "model/params.h"
#include "model/parallel/local_model.h"

namespace shardlab::engine {

// Whether the rank at `coords` holds the copy of local tensor `s` that is
// written out (gathers, sharded checkpoints): tensors held whole by every
// tensor-parallel rank count on tp rank 0 only, the tied wte on the first
// pipeline stage only. (Data-parallel replicas are the caller's to choose.)
bool canonical_copy(const parallel::ShardSpec& s, const collectives::Coords& coords);

// Copies this rank's shards into unsharded tensors laid out by the table,
// the canonical copies only (canonical_copy).
// With `only` (flat local ranges, sorted), elements outside them are skipped;
// with kExpertsOnly only expert tensors are copied (under EP a rank's experts
// belong to every replica of its ep group).
enum ScatterWhat { kAll, kExpertsOnly };
void scatter_to_global(const parallel::LocalModel& model, std::span<const float> local,
                       const collectives::Coords& coords, const model::ParamTable& table,
                       std::span<float> global, const std::vector<Range>* only = nullptr,
                       ScatterWhat what = kAll);

// Local elements [begin, end) of shard `s` (row-major in its local shape)
// from the unsharded tensor `tensor` (row-major in s.global_shape).
void slice_from_global(const parallel::ShardSpec& s, std::span<const float> tensor, int64_t begin, int64_t end,
                       float* out);

// Calls f(shard, begin, end, state) for the part [begin, end) (local
// elements of the shard) of every local tensor inside the flat `owned`
// ranges, `state` numbering the owned elements in order, as AdamW's moments
// (ShardedAdamW::exp_avg) hold them.
template <typename F>
void for_owned(const std::vector<parallel::ShardSpec>& shards, const std::vector<Range>& owned, F&& f) {
  int64_t state = 0;
  for (const Range& r : owned) {
    for (const parallel::ShardSpec& s : shards) {
      const int64_t lo = std::max(r.begin, s.offset), hi = std::min(r.end(), s.offset + s.numel);
      if (hi > lo) f(s, lo - s.offset, hi - s.offset, state + (lo - r.begin));
    }
    state += r.size;
  }
}

// Fills the local shards from an unsharded checkpoint.
void load_shards(parallel::LocalModel& model, const model::SafetensorsFile& f);

// Perturbs this rank's shard of parameter `name` (verify's can-it-fail test):
// x += 1e-2·(1+|x|), or with `rel` x *= 1+rel; ConfigError if the rank holds
// no such parameter.
void corrupt_shard(parallel::LocalModel& model, const std::string& name, double rel = 0);

}  // namespace shardlab::engine
