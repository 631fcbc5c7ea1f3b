// NCCL's double binary tree all_reduce across nodes (Algo::kDbtree; the
// plan's rules are in tuner.h TreePlan).
//
// Each channel c moves its part chunk_range(count, C, c) of the buffer over
// its tree in `chunks` pipeline chunks (dbtree_chunks): first the reduce,
// up the tree, chunk by chunk (a member adds its children's partials to its
// own in the order of its children and sends the sum to its parent), then
// the broadcast down it (the root divides for avg, then every member passes
// the root's bits on to its children). This is NCCL's "up then down" tree
// kernel (runTreeUpDown): a channel's broadcast starts when its reduce is
// done, not chunk by chunk behind it as NCCL's split kernel does. Every
// channel steps on its own lane (Ctx::open_lanes); a member takes its
// channels' steps in pipeline-slot order (dbtree_ops), so its ports serve
// them about in the order a real GPU's channels would reach them, and no
// blocking receive can deadlock, whatever the host scheduling.
//
// Results: each element is summed along its channel's tree in a fixed order
// and every member ends with its root's bits, so sums are deterministic;
// integer-valued sums are exact in fp32 and equal the ring's.
#include <algorithm>

#include "collectives/detail.h"

namespace shardlab::collectives {

BtreeNode btree(int nranks, int rank) {
  BtreeNode b;
  int bit = 1;
  while (bit < nranks && !(bit & rank)) bit <<= 1;
  if (rank == 0) {
    // The root's one child is bit >> 1 (> 0), so its child 1, as NCCL counts.
    b.d1 = nranks > 1 ? bit >> 1 : -1;
    return b;
  }
  b.up = (rank ^ bit) | (bit << 1);
  if (b.up >= nranks) b.up = rank ^ bit;
  b.child_type = rank < b.up ? 0 : 1;
  int low = bit >> 1;
  b.d0 = low == 0 ? -1 : rank - low;
  b.d1 = low == 0 ? -1 : rank + low;
  // The highest rank + 2^j below `low` that exists.
  while (b.d1 >= nranks) {
    b.d1 = low == 0 ? -1 : rank + low;
    low >>= 1;
  }
  return b;
}

BtreeNode dtree(int nranks, int rank, int t) {
  if (t == 0) return btree(nranks, rank);
  BtreeNode b;
  if (nranks % 2 == 1) {  // shifted by one: rank plays rank - 1
    b = btree(nranks, (rank - 1 + nranks) % nranks);
    for (int* v : {&b.up, &b.d0, &b.d1})
      if (*v >= 0) *v = (*v + 1) % nranks;
  } else {  // mirrored: rank plays nranks - 1 - rank
    b = btree(nranks, nranks - 1 - rank);
    for (int* v : {&b.up, &b.d0, &b.d1})
      if (*v >= 0) *v = nranks - 1 - *v;
  }
  return b;
}

TreePlan tree_plan(const HardwareProfile& p, std::span<const int> members) {
  TreePlan plan;
  const std::vector<std::vector<int>> local = detail::members_by_node(p, members);
  if (local.size() < 2) return plan;
  const size_t k = local.front().size();
  for (const auto& l : local)
    if (l.size() != k) return plan;
  const int ki = static_cast<int>(k), N = static_cast<int>(local.size()), n = static_cast<int>(members.size());
  const int rails = detail::rails_of(p, members, local.front());
  int h = std::max(1, std::min(2 * rails, kMaxChannels) / 2);
  h = (h + ki - 1) / ki * ki;
  if (2 * h > kMaxChannels) return plan;
  plan.channels = 2 * h;
  plan.nodes = N;
  plan.per_node = ki;
  plan.up.assign(static_cast<size_t>(plan.channels * n), -1);
  plan.down.assign(static_cast<size_t>(plan.channels * n * TreePlan::kArity), -1);
  // Chain position i of node v on a channel starting at s.
  auto at = [&](int v, int s, int i) { return local[size_t(v)][size_t((s + i) % ki)]; };
  const int child0 = ki > 1 ? 1 : 0, child1 = 0;  // chain positions where child nodes 0 and 1 enter
  for (int c = 0; c < plan.channels; ++c) {
    const int t = c / h, s = c % h;
    for (int v = 0; v < N; ++v) {
      const BtreeNode b = dtree(N, v, t);
      for (int i = 0; i < ki; ++i) {
        const int me = at(v, s, i);
        int* kids = plan.down.data() + static_cast<size_t>((c * n + me) * TreePlan::kArity);
        int nk = 0;
        if (i > 0) {
          plan.up[size_t(c * n + me)] = at(v, s, i - 1);
        } else if (b.up >= 0) {
          plan.up[size_t(c * n + me)] = at(b.up, s, b.child_type == 0 ? child0 : child1);
        }
        if (i + 1 < ki) kids[nk++] = at(v, s, i + 1);
        if (i == child0 && b.d0 >= 0) kids[nk++] = at(b.d0, s, 0);
        if (i == child1 && b.d1 >= 0) kids[nk++] = at(b.d1, s, 0);
      }
    }
  }
  // Heights and depths, by walking each channel's tree from its root.
  plan.height.assign(static_cast<size_t>(plan.channels * n), 0);
  plan.depth.assign(static_cast<size_t>(plan.channels * n), 0);
  plan.root_height.assign(static_cast<size_t>(plan.channels), 0);
  std::vector<int> order;
  order.reserve(static_cast<size_t>(n));
  for (int c = 0; c < plan.channels; ++c) {
    order.clear();
    for (int i = 0; i < n; ++i)
      if (plan.parent(c, i, n) < 0) order.push_back(i);
    SHARDLAB_CHECK(order.size() == 1);
    for (size_t q = 0; q < order.size(); ++q)  // breadth first: parents before children
      for (int d : plan.children(c, order[q], n))
        if (d >= 0) {
          plan.depth[size_t(c * n + d)] = plan.depth[size_t(c * n + order[q])] + 1;
          order.push_back(d);
        }
    SHARDLAB_CHECK(order.size() == size_t(n));
    for (size_t q = order.size(); q-- > 0;) {
      const int i = order[q];
      for (int d : plan.children(c, i, n))
        if (d >= 0) plan.height[size_t(c * n + i)] = std::max(plan.height[size_t(c * n + i)], plan.height[size_t(c * n + d)] + 1);
    }
    plan.root_height[size_t(c)] = plan.height[size_t(c * n + order[0])];
  }
  return plan;
}

// About 512 KiB per chunk as the chain algorithms (NCCL pipelines in
// chunkSize steps, 128-512 KiB for the tree's Simple protocol); at most 64
// per channel, which bounds the messages a call posts.
int dbtree_chunks(size_t count, int channels, int elem_size) {
  constexpr uint64_t kChunkBytes = 512 * 1024;
  constexpr uint64_t kMaxChunks = 64;
  const uint64_t per = (count + size_t(channels) - 1) / size_t(channels);
  const uint64_t k = std::clamp<uint64_t>((per * uint64_t(elem_size) + kChunkBytes - 1) / kChunkBytes, 1, kMaxChunks);
  return static_cast<int>(std::max<uint64_t>(1, std::min<uint64_t>(k, per)));
}

bool dbtree_applies(const HardwareProfile& p, std::span<const int> members, const CollShape& s) {
  return s.op == OpKind::kAllReduce && tree_plan(p, members).applies();
}

namespace detail {

size_t dbtree_charged(size_t count, int channels, int chunks) {
  const size_t per = (count + size_t(channels) - 1) / size_t(channels);
  return (per + size_t(chunks) - 1) / size_t(chunks);
}

// The program order. Ports serve a stream's transfers in program order
// (runtime/port.h), so the order in which a member takes its channels'
// steps decides how long a channel waits behind another on a shared port.
// Each step gets the time slot it has in a pipeline advancing one hop per
// slot: channel c's reduce of chunk j happens at slot j + height (a member
// sends up once its subtree's partials are in), its broadcast at slot
// chunks + H_c + j + depth (H_c: the tree's height; the root starts the
// broadcast when its reduce is done). A member takes its steps in slot
// order, channels in order within a slot. That is also why the program
// cannot deadlock: a receive at slot t waits for a send at slot t - 1.
void dbtree_ops(const TreePlan& plan, int n, size_t count, int chunks, int me, std::vector<TreeOp>& out) {
  out.clear();
  const int C = plan.channels;
  auto piece = [&](int c, int j) {
    const Range part = chunk_range(count, C, c);
    const Range r = chunk_range(static_cast<size_t>(part.size), chunks, j);
    return Range{part.begin + r.begin, r.size};
  };
  std::vector<std::pair<int, size_t>> slot;  // (slot, index in `ops`): sorted stably below
  std::vector<TreeOp> ops;
  auto add = [&](int t, TreeOp o) {
    slot.emplace_back(t, ops.size());
    ops.push_back(o);
  };
  for (int c = 0; c < C; ++c) {
    const int up = plan.parent(c, me, n), h = plan.height[size_t(c * n + me)];
    const int down_slot = chunks + plan.root_height[size_t(c)] + plan.depth[size_t(c * n + me)];
    for (int j = 0; j < chunks; ++j) {  // reduce, up the tree
      const Range r = piece(c, j);
      for (int d : plan.children(c, me, n))
        if (d >= 0) add(j + h, {TreeOp::kRecvReduce, d, c, r});
      if (up >= 0) add(j + h, {TreeOp::kSend, up, c, r});
    }
    for (int j = 0; j < chunks; ++j) {  // broadcast, down it
      const Range r = piece(c, j);
      add(down_slot + j, {up >= 0 ? TreeOp::kRecvCopy : TreeOp::kFinalize, up, c, r});
      for (int d : plan.children(c, me, n))
        if (d >= 0) add(down_slot + j, {TreeOp::kSend, d, c, r});
    }
  }
  // Channel-major above, so a stable sort by slot keeps channels in order within a slot.
  std::stable_sort(slot.begin(), slot.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  out.reserve(ops.size());
  for (const auto& [t, i] : slot) out.push_back(ops[i]);
}

void run_ops(Ctx& c, const std::vector<TreeOp>& ops, int channels, float* work, ReduceOp op, size_t charged) {
  c.open_lanes(channels);
  for (const TreeOp& o : ops) {
    c.on_lane(o.lane);
    float* p = work ? work + o.range.begin : nullptr;
    const auto size = static_cast<size_t>(o.range.size);
    const size_t modeled = charged ? charged : Ctx::kAsCount;
    switch (o.kind) {
      case TreeOp::kRecvReduce:
        reduce_into(p, floats(c.recv(o.peer, size, o.lane, modeled)), size, op);
        break;
      case TreeOp::kRecvCopy:
        copy(p, floats(c.recv(o.peer, size, o.lane, modeled)), size);
        break;
      case TreeOp::kSend:
        c.send(o.peer, p, size, o.lane, modeled);
        break;
      case TreeOp::kFinalize:
        finalize(p, size, op, c.n());
        break;
    }
  }
  c.on_lane(-1);
}

void dbtree_all_reduce(Ctx& c, const TreePlan& plan, float* work, size_t count, ReduceOp op) {
  const int chunks = dbtree_chunks(count, plan.channels, c.esize());
  std::vector<TreeOp> ops;
  dbtree_ops(plan, c.n(), count, chunks, c.me(), ops);
  run_ops(c, ops, plan.channels, work, op, dbtree_charged(count, plan.channels, chunks));
}

}  // namespace detail
}  // namespace shardlab::collectives
