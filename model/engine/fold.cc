#include "model/engine/fold.h"

#include <fmt/format.h>

namespace shardlab::engine {

namespace {

// How the groups along `dim` sit on the nodes.
enum class Spread {
  kUniform,    // every group in one node, or each member on a node of its own
  kPlaces,     // some group spans several nodes with several members on each,
               // the same local devices (so the same NICs and rails) on each
  kAsymmetric  // anything else: members see different links
};

Spread spread(const collectives::DeviceMesh& mesh, const HardwareProfile& p, const char* dim) {
  Spread out = Spread::kUniform;
  for (const auto& group : mesh.all_group_ranks(dim)) {
    const int node = p.node_of(group.front());
    bool one_node = true, distinct = true;
    for (size_t i = 0; i < group.size(); ++i) {
      one_node = one_node && p.node_of(group[i]) == node;
      for (size_t j = 0; j < i; ++j) distinct = distinct && p.node_of(group[i]) != p.node_of(group[j]);
    }
    if (one_node || distinct) continue;
    // The group is sorted, so a node's members are adjacent: blocks of the
    // first node's member count, each on a node of its own, at the first
    // node's local places.
    size_t m = 0;
    while (m < group.size() && p.node_of(group[m]) == node) ++m;
    if (group.size() % m != 0) return Spread::kAsymmetric;
    for (size_t i = 0; i < group.size(); ++i) {
      const int n = p.node_of(group[i - i % m]);
      if (p.node_of(group[i]) != n || group[i] - n * p.devices_per_node != group[i % m] - node * p.devices_per_node)
        return Spread::kAsymmetric;
      if (i >= m && i % m == 0 && n == p.node_of(group[i - m])) return Spread::kAsymmetric;
    }
    out = Spread::kPlaces;
  }
  return out;
}

}  // namespace

int FoldPlan::running() const {
  int n = 0;
  for (size_t r = 0; r < representative.size(); ++r) n += representative[r] == int(r) ? 1 : 0;
  return n;
}

std::string FoldPlan::describe() const {
  if (representative.empty()) return "nothing folded";
  const std::string dps = by_place ? "dp (by place in the node)" : "dp";
  std::string what = dp && tp ? dps + " and tp" : (dp ? dps : "tp");
  return fmt::format("{} folded: {} of {} devices run, each folded device reports its "
                     "representative's figures", what, running(), representative.size());
}

namespace {

FoldPlan plan_for(const collectives::MeshShape& shape, bool dp, bool tp, bool spans_nodes, bool by_place,
                  const HardwareProfile* profile) {
  FoldPlan plan;
  plan.dp = dp;
  plan.tp = tp;
  plan.spans_nodes = spans_nodes;
  plan.by_place = dp && by_place;
  if (!plan.dp && !plan.tp) return plan;
  const collectives::DeviceMesh mesh(shape);
  plan.representative.resize(size_t(mesh.size()));
  // By place: every dp group's member at position i is played by the one at
  // position i mod m, m its members on its first node (spread: same places
  // on every node), so a member and its representative differ by whole
  // nodes only.
  std::vector<int> place_rep;
  if (plan.by_place) {
    place_rep.resize(size_t(mesh.size()));
    for (const auto& group : mesh.all_group_ranks("dp")) {
      size_t m = 0;
      while (m < group.size() && profile->node_of(group[m]) == profile->node_of(group.front())) ++m;
      for (size_t i = 0; i < group.size(); ++i) place_rep[size_t(group[i])] = group[i % m];
    }
  }
  for (int r = 0; r < mesh.size(); ++r) {
    collectives::Coords c = mesh.coords(r);
    if (plan.tp) c.tp = 0;
    if (plan.dp && !plan.by_place) c.dp = c.ep = c.edp = 0;
    const int rep = mesh.rank(c);
    plan.representative[size_t(r)] = plan.by_place ? place_rep[size_t(rep)] : rep;
  }
  return plan;
}

}  // namespace

FoldPlan fold_plan(const FoldInput& in, const HardwareProfile& profile) {
  const collectives::MeshShape& m = in.mesh;
  const collectives::DeviceMesh mesh(m);
  Spread dp_spread = m.dp > 1 ? spread(mesh, profile, "dp") : Spread::kUniform;
  if (m.ep > 1)
    for (const char* dim : {"ep", "edp"}) dp_spread = std::max(dp_spread, spread(mesh, profile, dim));
  const bool dp = m.dp > 1 && !in.uneven_chunks && (m.ep == 1 || in.uniform_experts) &&
                  dp_spread != Spread::kAsymmetric;
  const bool tp = m.tp > 1 && !in.moe && spread(mesh, profile, "tp") == Spread::kUniform;
  return plan_for(m, dp, tp, dp && dp_spread == Spread::kPlaces, false, &profile);
}

FoldPlan weaker(const FoldPlan& plan, const collectives::MeshShape& mesh, const HardwareProfile& profile) {
  if (plan.dp && plan.spans_nodes && !plan.by_place)
    return plan_for(mesh, true, plan.tp, true, true, &profile);
  return plan_for(mesh, false, plan.dp && plan.tp, false, false, &profile);
}

}  // namespace shardlab::engine
