// Ring algorithms: reduce_scatter and all_gather around the group order, and
// the pipelined chain used by ring broadcast and reduce.
//
// Ring reduce_scatter, step k (0..n-2): member r sends chunk r-k-1 to r+1 and
// receives chunk r-k-2 from r-1, adding its own contribution. Chunk c's sum
// therefore starts at member c+1 and goes round to member c, which owns it:
// ((x[c+1] + x[c+2]) + ...) + x[c]. Ring all_gather, step k: member r sends
// chunk r-k to r+1 and receives chunk r-k-1 from r-1. Every step is one
// message per member to its neighbour, so with uniform links each step lasts
// exactly a + w(chunk).
#include "collectives/detail.h"

namespace shardlab::collectives::detail {

void ring_reduce_scatter(Ctx& c, float* work, size_t count, ReduceOp op, int phase) {
  const int n = c.n();
  for (int k = 0; k < n - 1; ++k) {
    const Range out = chunk_range(count, n, c.rel(-k - 1));
    const Range in = chunk_range(count, n, c.rel(-k - 2));
    c.send(c.rel(1), work ? work + out.begin : nullptr, out.size, phase, c.slice(count));
    Message m = c.recv(c.rel(-1), in.size, phase, c.slice(count));
    reduce_into(work ? work + in.begin : nullptr, floats(m), in.size, op);
  }
}

void ring_all_gather(Ctx& c, float* work, size_t count, int phase) {
  const int n = c.n();
  for (int k = 0; k < n - 1; ++k) {
    const Range out = chunk_range(count, n, c.rel(-k));
    const Range in = chunk_range(count, n, c.rel(-k - 1));
    c.send(c.rel(1), work ? work + out.begin : nullptr, out.size, phase, c.slice(count));
    Message m = c.recv(c.rel(-1), in.size, phase, c.slice(count));
    copy(work ? work + in.begin : nullptr, floats(m), in.size);
  }
}

// Channels (tuner.h RingPlan): channel ch moves sub-chunk ch of every
// member's chunk around its own ring order. Step k on ring position q:
// send the piece owned by position q-k-1 (reduce_scatter) or q-k
// (all_gather) to the successor; receive the piece of q-k-2 (q-k-1) from
// the predecessor. Every step posts all channels' sends, then takes all
// channels' receives, in channel order, each on its channel's lane
// (Ctx::open_lanes): a channel's step k+1 waits for its own step k only.
namespace {
Range piece(size_t count, int n, int channels, int owner, int ch) {
  const Range chunk = chunk_range(count, n, owner);
  const Range sub = chunk_range(static_cast<size_t>(chunk.size), channels, ch);
  return {chunk.begin + sub.begin, sub.size};
}

template <class Take>
void channel_ring(Ctx& c, const RingPlan& plan, float* work, size_t count, int phase, int first, Take take) {
  const int n = c.n(), C = plan.channels;
  const size_t charged = (c.slice(count) + size_t(C) - 1) / size_t(C);
  c.open_lanes(C);
  for (int k = 0; k < n - 1; ++k) {
    for (int ch = 0; ch < C; ++ch) {
      c.on_lane(ch);
      const int q = plan.position(ch, c.me(), n);
      const Range out = piece(count, n, C, plan.at(ch, q - k + first, n), ch);
      c.send(plan.at(ch, q + 1, n), work ? work + out.begin : nullptr, size_t(out.size), phase * kMaxChannels + ch,
             charged);
    }
    for (int ch = 0; ch < C; ++ch) {
      c.on_lane(ch);
      const int q = plan.position(ch, c.me(), n);
      const Range in = piece(count, n, C, plan.at(ch, q - k + first - 1, n), ch);
      Message m = c.recv(plan.at(ch, q - 1, n), size_t(in.size), phase * kMaxChannels + ch, charged);
      take(work ? work + in.begin : nullptr, floats(m), size_t(in.size));
    }
  }
  c.on_lane(-1);
}
}  // namespace

void channel_ring_reduce_scatter(Ctx& c, const RingPlan& plan, float* work, size_t count, ReduceOp op,
                                 int phase) {
  channel_ring(c, plan, work, count, phase, -1,
               [&](float* acc, const float* x, size_t m) { reduce_into(acc, x, m, op); });
}

void channel_ring_all_gather(Ctx& c, const RingPlan& plan, float* work, size_t count, int phase) {
  channel_ring(c, plan, work, count, phase, 0, [](float* dst, const float* x, size_t m) { copy(dst, x, m); });
}

// Pipeline chunks of about 512 KiB modeled: a chain of n members moving S
// bytes in k chunks takes (n-1)a + (n+k-2)·w(S/k), so more chunks only help;
// the cap bounds the host's per-message overhead.
int chain_chunks(size_t count, int elem_size) {
  constexpr uint64_t kChunkBytes = 512 * 1024;
  constexpr uint64_t kMaxChunks = 1024;
  const uint64_t bytes = count * static_cast<uint64_t>(elem_size);
  const uint64_t k = std::clamp<uint64_t>((bytes + kChunkBytes - 1) / kChunkBytes, 1, kMaxChunks);
  return static_cast<int>(std::max<uint64_t>(1, std::min<uint64_t>(k, count)));
}

// Chain root -> root+1 -> ... -> root+n-1, pipelined chunk by chunk.
void chain_broadcast(Ctx& c, float* data, size_t count, int root) {
  const int n = c.n();
  const int pos = (c.me() - root + n) % n;
  const int k = chain_chunks(count, c.esize());
  for (int i = 0; i < k; ++i) {
    const Range r = chunk_range(count, k, i);
    float* p = data ? data + r.begin : nullptr;
    if (pos > 0) copy(p, floats(c.recv(c.rel(-1), r.size)), r.size);
    if (pos < n - 1) c.send(c.rel(1), p, r.size);
  }
}

// Chain root+n-1 -> ... -> root+1 -> root; each member adds its contribution:
// x[root+n-1] + x[root+n-2] + ... + x[root]. `acc` holds my input on entry
// and the partial (root: the result) on exit.
void chain_reduce(Ctx& c, float* acc, size_t count, ReduceOp op, int root) {
  const int n = c.n();
  const int pos = (c.me() - root + n) % n;
  const int k = chain_chunks(count, c.esize());
  for (int i = 0; i < k; ++i) {
    const Range r = chunk_range(count, k, i);
    float* p = acc ? acc + r.begin : nullptr;
    if (pos < n - 1) reduce_into(p, floats(c.recv(c.rel(1), r.size)), r.size, op);
    if (pos > 0) c.send(c.rel(-1), p, r.size);
  }
}

// Channels (tuner.h RingPlan): channel ch moves piece ch of the buffer
// (chunk_range over C) along its own ring order as a chain from (to) the
// root, pipelined in chain_chunks of that piece, as NCCL runs broadcast and
// reduce on every channel's ring. broadcast: the root, then its successors
// on channel ch; reduce: the root's predecessors, summed down to the root,
// so piece ch is summed in channel ch's order.
//
// The program order, as dbtree_ops: ports serve a stream's transfers in
// program order (runtime/port.h), and a member sits at another depth on
// every channel (the root's successors on one channel are its predecessors
// on another), so taking the channels chunk by chunk would hold every
// channel's hop behind the latest one's. Each step gets its slot in a
// pipeline advancing one hop per slot: chunk j at depth d (hops from the
// chain's head) at slot j + d; a member takes its steps in slot order,
// channels in order within a slot. A receive at slot t waits for a send at
// slot t - 1, so the program cannot deadlock.
void chain_ops(const RingPlan& plan, int n, size_t count, int elem_size, int root, bool to_root, int me,
               std::vector<TreeOp>& out) {
  out.clear();
  const int C = plan.channels;
  std::vector<std::pair<int, size_t>> slot;  // (slot, index in `ops`): sorted stably below
  std::vector<TreeOp> ops;
  for (int ch = 0; ch < C; ++ch) {
    const Range piece = chunk_range(count, C, ch);
    const int k = chain_chunks(size_t(piece.size), elem_size);
    const int pos = ((plan.position(ch, me, n) - plan.position(ch, root, n)) % n + n) % n;
    const int depth = to_root ? n - 1 - pos : pos;
    const int from = to_root ? plan.next(ch, me, n) : plan.prev(ch, me, n);
    const int to = to_root ? plan.prev(ch, me, n) : plan.next(ch, me, n);
    for (int j = 0; j < k; ++j) {
      const Range r = chunk_range(size_t(piece.size), k, j);
      const Range at{piece.begin + r.begin, r.size};
      if (depth > 0) {
        slot.emplace_back(j + depth, ops.size());
        ops.push_back({to_root ? TreeOp::kRecvReduce : TreeOp::kRecvCopy, from, ch, at});
      }
      if (depth < n - 1) {
        slot.emplace_back(j + depth, ops.size());
        ops.push_back({TreeOp::kSend, to, ch, at});
      }
    }
  }
  // Channel-major above, so a stable sort by slot keeps channels in order within a slot.
  std::stable_sort(slot.begin(), slot.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  out.reserve(ops.size());
  for (const auto& [t, i] : slot) out.push_back(ops[i]);
}

void channel_chain_broadcast(Ctx& c, const RingPlan& plan, float* data, size_t count, int root) {
  std::vector<TreeOp> ops;
  chain_ops(plan, c.n(), count, c.esize(), root, /*to_root=*/false, c.me(), ops);
  run_ops(c, ops, plan.channels, data, ReduceOp::kSum, 0);
}

void channel_chain_reduce(Ctx& c, const RingPlan& plan, float* acc, size_t count, ReduceOp op, int root) {
  std::vector<TreeOp> ops;
  chain_ops(plan, c.n(), count, c.esize(), root, /*to_root=*/true, c.me(), ops);
  run_ops(c, ops, plan.channels, acc, op, 0);
}

}  // namespace shardlab::collectives::detail
