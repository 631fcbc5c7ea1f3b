// Which rings a collective runs over the topology (ring_plan: channels over
// every NIC of the node, as NCCL lays them out) and which algorithms and
// protocols the tuner weighs (tuner.h has the rules).
#include <algorithm>
#include <vector>

#include "collectives/detail.h"
#include "collectives/tuner.h"

namespace shardlab::collectives {
namespace {
constexpr Algo kAll[] = {Algo::kRing, Algo::kTree, Algo::kDirect};
// dbtree and nvls last: each runs only where it applies (select skips them elsewhere).
constexpr Algo kAllReduce[] = {Algo::kRing, Algo::kTree, Algo::kDirect, Algo::kDbtree, Algo::kNvls};
constexpr Algo kBarrierOnly[] = {Algo::kTree};
}  // namespace

int RingPlan::next(int c, int i, int n) const { return at(c, position(c, i, n) + 1, n); }
int RingPlan::prev(int c, int i, int n) const { return at(c, position(c, i, n) - 1, n); }

namespace detail {
std::vector<std::vector<int>> members_by_node(const HardwareProfile& p, std::span<const int> members) {
  std::vector<int> node_ids;
  std::vector<std::vector<int>> local;
  for (int i = 0; i < static_cast<int>(members.size()); ++i) {
    const int node = p.node_of(members[static_cast<size_t>(i)]);
    auto it = std::find(node_ids.begin(), node_ids.end(), node);
    if (it == node_ids.end()) {
      node_ids.push_back(node);
      local.emplace_back();
      it = node_ids.end() - 1;
    }
    local[static_cast<size_t>(it - node_ids.begin())].push_back(i);
  }
  return local;
}

int rails_of(const HardwareProfile& p, std::span<const int> members, std::span<const int> local) {
  std::vector<int> nics;
  for (int i : local) {
    const int nic = p.nic_of(members[static_cast<size_t>(i)]);
    if (std::find(nics.begin(), nics.end(), nic) == nics.end()) nics.push_back(nic);
  }
  return static_cast<int>(nics.size());
}
}  // namespace detail

RingPlan ring_plan(const HardwareProfile& p, std::span<const int> members) {
  RingPlan plan;
  const int n = static_cast<int>(members.size());
  const std::vector<std::vector<int>> local = detail::members_by_node(p, members);
  if (local.size() < 2) return plan;
  const size_t k = local.front().size();
  for (const auto& l : local)
    if (l.size() != k) return plan;
  if (k < 2) return plan;
  const int rails = detail::rails_of(p, members, local.front());
  const int ki = static_cast<int>(k);
  int C = std::min(2 * rails, kMaxChannels);
  if (C % ki != 0) C = (C + ki - 1) / ki * ki;
  plan.channels = C;
  plan.rails = rails;
  plan.order.reserve(static_cast<size_t>(C * n));
  for (int c = 0; c < C; ++c)
    for (const auto& l : local)
      for (int t = 0; t < ki; ++t) plan.order.push_back(l[static_cast<size_t>((c + 1 + t) % ki)]);
  plan.pos.assign(static_cast<size_t>(C * n), 0);
  for (int c = 0; c < C; ++c)
    for (int q = 0; q < n; ++q) plan.pos[static_cast<size_t>(c * n + plan.order[static_cast<size_t>(c * n + q)])] = q;
  return plan;
}

std::span<const Algo> candidate_algos(OpKind op) {
  if (op == OpKind::kBarrier) return kBarrierOnly;
  if (op == OpKind::kAllReduce) return kAllReduce;
  return kAll;
}

std::vector<Proto> candidate_protos(const HardwareProfile& p, std::span<const int> members) {
  if (p.protocols.empty()) return {Proto::kPlain};
  std::vector<int> nodes;
  nodes.reserve(members.size());
  for (int m : members) nodes.push_back(p.node_of(m));
  std::sort(nodes.begin(), nodes.end());
  const bool intra = std::adjacent_find(nodes.begin(), nodes.end()) != nodes.end();
  const bool inter = !nodes.empty() && nodes.front() != nodes.back();
  std::vector<Proto> out;
  for (int q = 0; q < kNumProtocols; ++q) {
    const ProtocolSpec& spec = p.protocols[static_cast<size_t>(q)];
    if ((intra && !spec.usable(LinkClass::kIntra)) || (inter && !spec.usable(LinkClass::kInter))) continue;
    out.push_back(static_cast<Proto>(q + 1));
  }
  return out;
}

}  // namespace shardlab::collectives
