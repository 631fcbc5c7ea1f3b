#include "model/engine/fold.h"

#include <cstdint>
#include <map>
#include <string>
#include <utility>
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

// How `group` sits on the hardware, up to renaming nodes, PCIe switches,
// sockets, NICs and fabric domains: per member, the first-seen index of its
// node, of its (node, switch), (node, socket), (node, NIC) and of its node's
// domain at every fabric tier below the top, and how many GPUs share its
// NIC. Two groups with equal placements see the same links between every
// pair of members (one node or two; one switch, socket or NIC or not; the
// same tier between their nodes), so their collectives take the same times.
std::vector<int64_t> placement(const std::vector<int>& group, const HardwareProfile& p) {
  using Key = std::pair<int64_t, int64_t>;
  const size_t tiers = p.fabric.tiers.empty() ? 0 : p.fabric.tiers.size() - 1;
  std::vector<std::map<Key, int64_t>> seen(4 + tiers);  // node, switch, socket, NIC, then a domain per tier
  std::vector<Key> keys(seen.size());
  std::vector<int64_t> out;
  out.reserve(group.size() * (seen.size() + 1));
  for (const int r : group) {
    const int64_t node = p.node_of(r);
    const int sw = p.pcie.empty() ? 0 : p.pcie.switch_of(r % p.devices_per_node);
    keys[0] = {node, 0};
    keys[1] = {node, sw};
    keys[2] = {node, p.pcie.empty() ? 0 : p.pcie.socket_of_switch(sw)};
    keys[3] = {node, p.nic_of(r)};
    for (size_t t = 0; t < tiers; ++t) keys[4 + t] = {node / p.fabric.tiers[t].nodes, 0};
    for (size_t k = 0; k < seen.size(); ++k) out.push_back(seen[k].emplace(keys[k], int64_t(seen[k].size())).first->second);
    out.push_back(p.nic_sharers(r));
  }
  return out;
}

// Whether every folded rank's groups (along each dimension, its own group
// where it is not its representative's) sit on the hardware as its
// representative's do. The replay checks only the collectives the
// representatives run: a folded replica's other groups are never run, so
// they must be placed alike (tp 3 x pp 2 x dp 2 on 8-GPU nodes: dp rank
// 0's second-stage tp group {6,7,8} spans two nodes, dp rank 1's {9,10,11}
// one; folding dp reported the first's times for the second, 426 ps off in
// a step; found by tools/fuzz_configs.py --mode fold).
bool placed_alike(const FoldPlan& plan, const collectives::MeshShape& shape, const HardwareProfile& profile) {
  if (plan.representative.empty()) return true;
  const collectives::DeviceMesh mesh(shape);
  const size_t world = size_t(mesh.size());
  std::vector<int> group_of(world), class_of(world);
  for (const char* dim : {"tp", "cp", "ep", "edp", "dp", "pp"}) {
    std::map<std::vector<int64_t>, int> classes;
    const auto groups = mesh.all_group_ranks(dim);
    if (groups.size() == world) continue;  // groups of one
    for (size_t g = 0; g < groups.size(); ++g) {
      const int c = classes.emplace(placement(groups[g], profile), int(classes.size())).first->second;
      for (const int r : groups[g]) {
        group_of[size_t(r)] = int(g);
        class_of[size_t(r)] = c;
      }
    }
    for (size_t r = 0; r < world; ++r) {
      const size_t rep = size_t(plan.representative[r]);
      if (group_of[r] != group_of[rep] && class_of[r] != class_of[rep]) return false;
    }
  }
  return true;
}

// The first plan from `plan` on (itself, then weaker steps) whose folded
// ranks are placed alike.
FoldPlan placed(FoldPlan plan, const collectives::MeshShape& mesh, const HardwareProfile& profile);

}  // namespace

FoldPlan fold_plan(const FoldInput& in, const HardwareProfile& profile) {
  const collectives::MeshShape& m = in.mesh;
  const collectives::DeviceMesh mesh(m);
  Spread dp_spread = m.dp > 1 ? spread(mesh, profile, "dp") : Spread::kUniform;
  if (m.ep > 1)
    for (const char* dim : {"ep", "edp"}) dp_spread = std::max(dp_spread, spread(mesh, profile, dim));
  const Spread cp_spread = m.cp > 1 ? spread(mesh, profile, "cp") : Spread::kUniform;
  FoldPlan want;
  want.dp = m.dp > 1 && !in.uneven_chunks && ((!in.moe && m.ep == 1) || in.routes_alike) && dp_spread != Spread::kAsymmetric;
  want.tp = m.tp > 1 && !in.moe && spread(mesh, profile, "tp") == Spread::kUniform;
  // The cp ranks share the gradients' cp-dp group (and its ZeRO chunks) with dp.
  want.cp = m.cp > 1 && !in.uneven_chunks && !in.moe && !in.cp_gathers && cp_spread != Spread::kAsymmetric;
  want.cp_by_place = cp_spread == Spread::kPlaces;
  want.spans_nodes = want.dp && dp_spread == Spread::kPlaces;
  return placed(plan_for(m, want, profile), m, profile);
}

namespace {

FoldPlan weaker_step(const FoldPlan& plan, const collectives::MeshShape& mesh, const HardwareProfile& profile) {
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

FoldPlan placed(FoldPlan plan, const collectives::MeshShape& mesh, const HardwareProfile& profile) {
  while (!placed_alike(plan, mesh, profile)) plan = weaker_step(plan, mesh, profile);
  return plan;
}

}  // namespace

FoldPlan weaker(const FoldPlan& plan, const collectives::MeshShape& mesh, const HardwareProfile& profile) {
  return placed(weaker_step(plan, mesh, profile), mesh, profile);
}

}  // namespace shardlab::engine
