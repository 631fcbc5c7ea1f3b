// NCCL's peer order for point-to-point exchanges (tuner.h p2p_order): the
// direct all_to_all (all_to_all.cc) and its replay (tuner.cc) both follow it.
#include <algorithm>
#include <vector>

#include "collectives/tuner.h"

namespace shardlab::collectives {

namespace {

// L > 1 members per node in whole blocks of group order, on G >= 2 distinct
// nodes: L, else 0 (the flat order applies).
int node_blocks(const HardwareProfile& p, std::span<const int> members) {
  const int n = static_cast<int>(members.size());
  int L = 0;  // the first node's contiguous block
  while (L < n && p.node_of(members[size_t(L)]) == p.node_of(members[0])) ++L;
  if (L < 2 || L == n || n % L != 0) return 0;
  thread_local std::vector<int> nodes;  // each block's node
  nodes.clear();
  for (int i = 0; i < n; ++i) {
    const int node = p.node_of(members[size_t(i)]);
    if (i % L == 0) {
      nodes.push_back(node);
    } else if (node != nodes.back()) {
      return 0;  // a block spans two nodes
    }
  }
  std::sort(nodes.begin(), nodes.end());
  return std::adjacent_find(nodes.begin(), nodes.end()) == nodes.end() ? L : 0;  // a node in two blocks: flat
}

}  // namespace

void p2p_order(const HardwareProfile& p, std::span<const int> members, int me, std::vector<int>& send,
               std::vector<int>& recv) {
  const int n = static_cast<int>(members.size());
  send.resize(size_t(n));
  recv.resize(size_t(n));
  const int L = node_blocks(p, members);
  if (L == 0) {
    for (int k = 0; k < n; ++k) {
      send[size_t(k)] = (me + k) % n;
      recv[size_t(k)] = (me - k + n) % n;
    }
    return;
  }
  const int G = n / L, g = me / L, l = me % L;
  int pow2 = 1;
  while (pow2 < G) pow2 <<= 1;
  int round = 0, node_round = 0, gd = 0;
  do {  // node deltas 0, 1, 3, 6, ... mod pow2, those below G
    if (gd < G) {
      for (int d = 0; d < L; ++d, ++round) {
        send[size_t(round)] = ((g + gd) % G) * L + (l + d) % L;
        recv[size_t(round)] = ((g - gd + G) % G) * L + (l - d + L) % L;
      }
    }
    node_round += 1;
    gd = (gd + node_round) & (pow2 - 1);
  } while (node_round != pow2);
}

}  // namespace shardlab::collectives
