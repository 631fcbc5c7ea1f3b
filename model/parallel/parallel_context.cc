#include "model/parallel/parallel_context.h"

#include <string>

namespace shardlab::parallel {

ParallelContext::ParallelContext(const collectives::DeviceMesh& mesh, int rank)
    : mesh_(mesh), rank_(rank), coords_(mesh.coords(rank)) {}

const collectives::ProcessGroup& ParallelContext::group(std::string_view dims) {
  return group(mesh_.group_ranks(rank_, dims), dims);
}

const collectives::ProcessGroup& ParallelContext::group(const std::vector<int>& members,
                                                        std::string_view name) {
  auto it = groups_.find(members);
  if (it == groups_.end()) {
    auto g = std::make_unique<collectives::ProcessGroup>(members, rank_, std::string(name));
    it = groups_.emplace(members, std::move(g)).first;
  }
  return *it->second;
}

const collectives::ProcessGroup* ParallelContext::embedding(int last_stage_rank) {
  if (last_stage_rank == 0 || (coords_.pp != 0 && coords_.pp != last_stage_rank)) return nullptr;
  const collectives::ProcessGroup& line = group("pp");
  return &group({line.global_rank(0), line.global_rank(last_stage_rank)}, "embedding");
}

}  // namespace shardlab::parallel
