// ParallelContext: the process groups one device takes part in, by name.
//
// Every group comes from the device mesh (collectives/mesh.h) by the names of
// the dimensions it spans — "tp", "dp", "pp", "ep", "edp", "tp-dp", "tp-ep-pp"
// ... — or from an explicit member list (the embedding group of a pipeline).
// Groups are cached by member list: asking twice, or asking for two specs
// that happen to have the same members ("dp" and "edp" when ep = 1, "tp" and
// "tp-cp"), gives the same ProcessGroup object, so one member set has one
// collective sequence counter on this device and tags can never collide.
//
// The references stay valid for the context's lifetime.
// Thread safety: one context per device thread, like the groups it holds.
#pragma once

#include <map>
#include <memory>
#include <string_view>
#include <vector>

#include "collectives/group.h"
#include "collectives/mesh.h"

namespace shardlab::parallel {

class ParallelContext {
 public:
  ParallelContext(const collectives::DeviceMesh& mesh, int rank);
  ParallelContext(const ParallelContext&) = delete;
  ParallelContext& operator=(const ParallelContext&) = delete;

  int rank() const { return rank_; }
  const collectives::Coords& coords() const { return coords_; }
  const collectives::DeviceMesh& mesh() const { return mesh_; }

  // The group along `dims` that holds this device.
  const collectives::ProcessGroup& group(std::string_view dims);
  // The group of `members` (global ranks in ring order; this device among
  // them), named `name` if it is new.
  const collectives::ProcessGroup& group(const std::vector<int>& members, std::string_view name);
  // Pipeline parallelism: rank 0 of this device's pipeline (the first stage)
  // and `last_stage_rank` (the last stage's), which hold the two copies of
  // the tied embedding (Megatron's embedding group). Null when one rank holds
  // both stages (pp = 1, or a V) or this device is neither.
  const collectives::ProcessGroup* embedding(int last_stage_rank);

  // How many distinct groups were built (a test hook for the cache).
  size_t size() const { return groups_.size(); }

 private:
  const collectives::DeviceMesh& mesh_;
  int rank_;
  collectives::Coords coords_;
  std::map<std::vector<int>, std::unique_ptr<collectives::ProcessGroup>> groups_;
};

}  // namespace shardlab::parallel
