#include "model/infer/infer_plan.h"

#include <fmt/format.h>

#include "model/engine/fold.h"
#include "model/parallel/config_check.h"
#include "runtime/errors.h"

namespace shardlab::infer {

namespace coll = collectives;

namespace {

// The split checked before the mesh is built from it.
coll::MeshShape checked_shape(const model::GPTConfig& model, int tp, int pp, int ep) {
  parallel::check_parallel_shape(model, {tp, false, pp, 1, {}, ep, ep});
  return {tp, 1, ep, ep, pp};
}

int first_sampler(const coll::DeviceMesh& mesh) {
  for (int rank = 0; rank < mesh.size(); ++rank) {
    const coll::Coords c = mesh.coords(rank);
    if (c.tp == 0 && c.dp == 0 && c.pp == mesh.shape().pp - 1) return rank;
  }
  return 0;
}

}  // namespace

InferPlan::InferPlan(const model::GPTConfig& model, int tp_, int pp_, int ep_, bool kv_fp8_)
    : tp(tp_), pp(pp_), ep(ep_), world(tp_ * pp_ * ep_),
      mesh(checked_shape(model, tp_, pp_, ep_)),
      sampler(first_sampler(mesh)), moe(model.is_moe()), kv_fp8(kv_fp8_) {}

void InferPlan::check_cluster(const Cluster& cluster, const char* what) const {
  if (cluster.world_size() != world)
    throw ConfigError(fmt::format("{} needs {} devices (tp {} x pp {} x ep {}), the cluster has {}", what,
                                  world, tp, pp, ep, cluster.world_size()));
}

std::vector<int> InferPlan::fold_representatives(const HardwareProfile& profile) const {
  return engine::fold_plan({mesh.shape(), false, moe}, profile).representative;
}

}  // namespace shardlab::infer
