#include "model/engine/fold.h"

#include <fmt/format.h>

namespace shardlab::engine {

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

FoldPlan plan_for(const collectives::MeshShape& shape, bool dp, bool tp) {
  FoldPlan plan;
  plan.dp = dp;
  plan.tp = tp;
  if (!plan.dp && !plan.tp) return plan;
  const collectives::DeviceMesh mesh(shape);
  plan.representative.resize(size_t(mesh.size()));
  for (int r = 0; r < mesh.size(); ++r) {
    collectives::Coords c = mesh.coords(r);
    if (plan.tp) c.tp = 0;
    if (plan.dp) c.dp = c.ep = c.edp = 0;
    plan.representative[size_t(r)] = mesh.rank(c);
  }
  return plan;
}

}  // namespace

FoldPlan fold_plan(const FoldInput& in, const HardwareProfile& profile) {
  const collectives::MeshShape& m = in.mesh;
  if (m.cp > 1) return {};
  const collectives::DeviceMesh mesh(m);
  const bool dp = m.dp > 1 && !in.uneven_chunks && (m.ep == 1 || in.uniform_experts) &&
                  uniform_links(mesh, profile, "dp");
  const bool tp = m.tp > 1 && !in.moe && uniform_links(mesh, profile, "tp");
  return plan_for(m, dp, tp);
}

FoldPlan weaker(const FoldPlan& plan, const collectives::MeshShape& mesh) {
  return plan_for(mesh, false, plan.dp && plan.tp);
}

}  // namespace shardlab::engine
