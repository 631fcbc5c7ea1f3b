#include "model/train/fold.h"

#include <fmt/format.h>

#include "collectives/mesh.h"

namespace shardlab::train {

namespace {

// Every group along `dim` sits in one node or has each member on its own node.
bool uniform_links(const collectives::DeviceMesh& mesh, const HardwareProfile& p,
                   const char* dim) {
  for (const auto& group : mesh.all_group_ranks(dim)) {
    const int node = p.node_of(group.front());
    bool one_node = true, distinct = true;
    for (size_t i = 0; i < group.size(); ++i) {
      one_node = one_node && p.node_of(group[i]) == node;
      for (size_t j = 0; j < i; ++j) distinct = distinct && p.node_of(group[i]) != p.node_of(group[j]);
    }
    if (!one_node && !distinct) return false;
  }
  return true;
}

}  // namespace

int FoldPlan::running() const {
  int n = 0;
  for (size_t r = 0; r < representative.size(); ++r) n += representative[r] == int(r) ? 1 : 0;
  return n;
}

std::string FoldPlan::describe() const {
  if (representative.empty()) return "nothing folded";
  std::string what = dp && tp ? "dp and tp" : (dp ? "dp" : "tp");
  return fmt::format("{} folded: {} of {} devices run, each folded device reports its "
                     "representative's figures", what, running(), representative.size());
}

namespace {

FoldPlan plan_for(const TrainOptions& o, bool dp, bool tp) {
  FoldPlan plan;
  plan.dp = dp;
  plan.tp = tp;
  if (!plan.dp && !plan.tp) return plan;
  const collectives::DeviceMesh mesh(o.parallel.mesh_shape());
  plan.representative.resize(size_t(mesh.size()));
  for (int r = 0; r < mesh.size(); ++r) {
    collectives::Coords c = mesh.coords(r);
    if (plan.tp) c.tp = 0;
    if (plan.dp) c.dp = c.edp = 0;
    plan.representative[size_t(r)] = mesh.rank(c);
  }
  return plan;
}

}  // namespace

FoldPlan fold_plan(const TrainOptions& o, const HardwareProfile& profile) {
  const ParallelOptions& par = o.parallel;
  // Context parallelism: the cp ranks' rings are not replayed for folded members.
  if (!o.phantom || !o.fold || par.cp > 1) return {};
  const collectives::DeviceMesh mesh(par.mesh_shape());
  const bool dp = par.dp > 1 && par.zero == 0 && par.ep == 1 && uniform_links(mesh, profile, "dp");
  const bool tp = par.tp > 1 && !o.model.is_moe() && uniform_links(mesh, profile, "tp");
  return plan_for(o, dp, tp);
}

FoldPlan weaker(const FoldPlan& plan, const TrainOptions& o) {
  return plan_for(o, false, plan.dp && plan.tp);
}

void unfold_results(const FoldPlan& plan, TrainResult& r) {
  for (size_t rank = 0; rank < plan.representative.size(); ++rank) {
    const auto rep = size_t(plan.representative[rank]);
    if (rep == rank) continue;
    r.phases[rank] = r.phases[rep];
    r.moe[rank] = r.moe[rep];
    r.a2a_time[rank] = r.a2a_time[rep];
    r.first_step_spans[rank] = r.first_step_spans[rep];
    if (!r.fsdp.empty()) r.fsdp[rank] = r.fsdp[rep];
  }
}

}  // namespace shardlab::train
