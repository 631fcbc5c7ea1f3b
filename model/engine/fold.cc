#include "model/engine/fold.h"

#include <string>
#include <vector>

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
  std::vector<std::string> dims;
  if (dp) dims.push_back(by_place ? "dp (by place in the node)" : "dp");
  if (cp) dims.push_back(cp_by_place ? "cp (by place in the node)" : "cp");
  if (tp) dims.push_back("tp");
  std::string what = dims.front();
  for (size_t i = 1; i < dims.size(); ++i) what += (i + 1 == dims.size() ? " and " : ", ") + dims[i];
  return fmt::format("{} folded: {} of {} devices run, each folded device reports its "
                     "representative's figures", what, running(), representative.size());
}

namespace {

// Every group along `dim`: its member at position i is played by the one at
// position i mod m, m its members on its first node (spread: the same places
// on every node), so a member and its representative differ by whole nodes
// only.
std::vector<int> by_place(const collectives::DeviceMesh& mesh, const HardwareProfile& p, const char* dim) {
  std::vector<int> rep(size_t(mesh.size()));
  for (const auto& group : mesh.all_group_ranks(dim)) {
    size_t m = 0;
    while (m < group.size() && p.node_of(group[m]) == p.node_of(group.front())) ++m;
    for (size_t i = 0; i < group.size(); ++i) rep[size_t(group[i])] = group[i % m];
  }
  return rep;
}

// The plan that folds `fold`'s dimensions (its dp, by_place, cp,
// cp_by_place, tp, tp_held and spans_nodes), with its representatives.
FoldPlan plan_for(const collectives::MeshShape& shape, FoldPlan fold, const HardwareProfile& profile) {
  FoldPlan plan;
  plan.dp = fold.dp;
  plan.tp = fold.tp;
  plan.cp = fold.cp;
  plan.spans_nodes = fold.spans_nodes;
  plan.by_place = fold.dp && fold.by_place;
  plan.cp_by_place = fold.cp && fold.cp_by_place;
  plan.tp_held = fold.tp_held;
  if (!plan.dp && !plan.tp && !plan.cp) return plan;
  const collectives::DeviceMesh mesh(shape);
  plan.representative.resize(size_t(mesh.size()));
  const std::vector<int> dp_place = plan.by_place ? by_place(mesh, profile, "dp") : std::vector<int>{};
  const std::vector<int> cp_place = plan.cp_by_place ? by_place(mesh, profile, "cp") : std::vector<int>{};
  for (int r = 0; r < mesh.size(); ++r) {
    collectives::Coords c = mesh.coords(r);
    if (plan.tp) c.tp = 0;
    if (plan.dp && !plan.by_place) c.dp = c.ep = c.edp = 0;
    if (plan.cp && !plan.cp_by_place) c.cp = 0;
    int rep = mesh.rank(c);
    // Each by-place map moves only its own coordinate, so they compose.
    if (plan.cp_by_place) rep = cp_place[size_t(rep)];
    if (plan.by_place) rep = dp_place[size_t(rep)];
    plan.representative[size_t(r)] = rep;
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
  const Spread cp_spread = m.cp > 1 ? spread(mesh, profile, "cp") : Spread::kUniform;
  FoldPlan want;
  want.dp = m.dp > 1 && !in.uneven_chunks && (m.ep == 1 || in.uniform_experts) && dp_spread != Spread::kAsymmetric;
  want.tp = m.tp > 1 && !in.moe && spread(mesh, profile, "tp") == Spread::kUniform;
  // The cp ranks share the gradients' cp-dp group (and its ZeRO chunks) with dp.
  want.cp = m.cp > 1 && !in.uneven_chunks && !in.moe && !in.cp_gathers && cp_spread != Spread::kAsymmetric;
  want.cp_by_place = cp_spread == Spread::kPlaces;
  want.spans_nodes = want.dp && dp_spread == Spread::kPlaces;
  return plan_for(m, want, profile);
}

FoldPlan weaker(const FoldPlan& plan, const collectives::MeshShape& mesh, const HardwareProfile& profile) {
  FoldPlan next = plan;
  if (plan.dp && plan.spans_nodes && !plan.by_place) {
    next.by_place = true;
  } else if (plan.cp && plan.tp) {  // tp peers first (cp's ring is checked before the run)
    next.tp = false;
    next.tp_held = true;
  } else if (plan.cp) {  // then cp, with tp as it was
    next.cp = false;
    next.tp = plan.tp_held;
    next.tp_held = false;
  } else if (plan.dp && plan.tp) {  // a representative per place in the node: tp peers first
    next.tp = false;
    next.tp_held = true;
  } else if (plan.dp) {  // then dp, with tp as it was
    next.tp = plan.tp_held;
    next.tp_held = false;
    next.dp = next.spans_nodes = next.by_place = false;
  } else {
    next.tp = false;
  }
  return plan_for(mesh, next, profile);
}

}  // namespace shardlab::engine
