// The message schedule of every algorithm, played on the tuner's Replay
// (replay.h). Every function below mirrors one algorithm of ring.cc, tree.cc,
// dbtree.cc, direct.cc, nvls.cc or all_to_all.cc message for message, in the
// same order: which member sends how many elements to whom, and in which
// order each member receives. A lock-step algorithm (each member posts its
// step's sends, then takes its step's receives) is evaluated step by step
// over all members: the sends of a step depend only on the state after the
// previous step. Trees and chains are evaluated in dependency order (parents
// before children, or the chain's upstream member first).
#include "collectives/replay.h"

#include <vector>

namespace shardlab::collectives::replay {
namespace {

using detail::ceil_log2;
using detail::wrapped_ranges;

size_t chunk(size_t count, int n, int i) {
  return static_cast<size_t>(chunk_range(count, n, i).size);
}

// One lock-step round: member r sends size(r) elements to r+dist and then
// receives from r-dist (ring steps, pairwise and Bruck rounds, barrier).
// Symmetric (every size alike): member 0 alone, receiving its own message's twin.
template <class Size>
void shift_round(Replay& R, int dist, Size size, std::vector<Posted>& out) {
  if (R.symmetric()) {
    out[0] = R.send(0, R.rel(0, dist), size(0));
    out[0].from = R.rel(0, -dist);  // the twin's sender
    return R.recv(0, out[0]);
  }
  const int n = R.played();
  for (int r = 0; r < n; ++r) out[static_cast<size_t>(r)] = R.send(r, R.rel(r, dist), size(r));
  for (int r = 0; r < n; ++r) {
    const int from = R.rel(r, -dist);
    R.recv(r, Replay::twin(out[static_cast<size_t>(R.base(from))], from));
  }
}

// ring.cc ring_reduce_scatter / ring_all_gather: member r sends chunk
// r-k-1 (reduce_scatter) or r-k (all_gather) at step k.
// Detail::Ctx::slice: every chunk's message is charged ceil(count/n) elements.
size_t slice(size_t count, int n) { return (count + size_t(n) - 1) / size_t(n); }

void ring(Replay& R, size_t count, int) {
  const int n = R.n();
  std::vector<Posted> out(static_cast<size_t>(n));
  for (int k = 0; k < n - 1; ++k) shift_round(R, 1, [&](int) { return slice(count, n); }, out);
}

// ring.cc channel_ring_reduce_scatter / channel_ring_all_gather: at each of
// the n-1 steps every member sends on channels 0..C-1 to its successor on
// that channel, then receives on channels 0..C-1 from its predecessor, each
// on its channel's lane (the lanes stay open until replay's end, as the
// Ctx's until finish).
void channel_ring(Replay& R, const RingPlan& plan, size_t count) {
  const int n = R.n(), C = plan.channels;
  const size_t charged = (slice(count, n) + size_t(C) - 1) / size_t(C);
  R.open_lanes(C);
  std::vector<Posted> out(static_cast<size_t>(n * C));
  for (int k = 0; k < n - 1; ++k) {
    if (R.symmetric()) {  // member 0's channels; its predecessors' messages are twins of its own
      for (int c = 0; c < C; ++c) out[size_t(c)] = R.send(0, plan.next(c, 0, n), charged, c);
      for (int c = 0; c < C; ++c) {
        out[size_t(c)].from = plan.prev(c, 0, n);  // the twin's sender
        R.recv(0, out[size_t(c)], c);
      }
      continue;
    }
    for (int r = 0; r < R.played(); ++r)
      for (int c = 0; c < C; ++c) out[static_cast<size_t>(r * C + c)] = R.send(r, plan.next(c, r, n), charged, c);
    for (int r = 0; r < R.played(); ++r)
      for (int c = 0; c < C; ++c) {
        const int from = plan.prev(c, r, n);
        R.recv(r, Replay::twin(out[static_cast<size_t>(R.base(from) * C + c)], from), c);
      }
  }
}

// tree.cc halving_reduce_scatter (halving) and doubling_all_gather: at
// distance dist member r sends the non-empty pieces of chunks
// [r+dist, r+dist+m) to r+dist (halving) or [r, r+m) to r-dist (doubling).
// One message of m slices, and the wrapped second piece charged nothing
// (tree.cc send_pieces).
void tree_step(Replay& R, size_t count, int dist, bool halving, std::vector<Posted>& out) {
  const int n = R.n(), m = std::min(dist, n - dist);
  const int to_offset = halving ? dist : -dist;
  for (int r = 0; r < n; ++r) {
    Range pieces[2];
    const int np = wrapped_ranges(count, n, halving ? R.rel(r, dist) : r, m, pieces);
    out[static_cast<size_t>(2 * r)] = R.send(r, R.rel(r, to_offset), size_t(m) * slice(count, n));
    const bool second = np == 2 && pieces[1].size > 0;
    out[static_cast<size_t>(2 * r + 1)] = second ? R.send(r, R.rel(r, to_offset), 0) : Posted{};
  }
  for (int r = 0; r < n; ++r) {
    const auto from = static_cast<size_t>(R.rel(r, -to_offset));
    for (int i = 0; i < 2; ++i)
      if (out[2 * from + static_cast<size_t>(i)].sent)
        R.recv(r, out[2 * from + static_cast<size_t>(i)]);
  }
}

void halving(Replay& R, size_t count) {
  if (count == 0) return;
  std::vector<Posted> out(2 * static_cast<size_t>(R.n()));
  for (int k = ceil_log2(R.n()) - 1; k >= 0; --k) tree_step(R, count, 1 << k, true, out);
}

void doubling(Replay& R, size_t count) {
  if (count == 0) return;
  std::vector<Posted> out(2 * static_cast<size_t>(R.n()));
  for (int k = 0; (1 << k) < R.n(); ++k) tree_step(R, count, 1 << k, false, out);
}

// direct.cc / all_to_all.cc direct: member r posts size(r, r+k) elements to
// r+k for k = 1..n-1, then receives from r-1, r-2, ...
// Symmetric (size by distance alone): member 0 alone; the k-th message it
// receives, from r-k, is the twin of the k-th it sends.
// `nccl_order` (the all_to_all): round k's peers are p2p_order's, not r±k.
// A round of either order is a permutation, so the k-th message a member
// receives is its sender's k-th, a twin of the played member's k-th.
template <class Size>
void direct_exchange(Replay& R, Size size, bool nccl_order = false) {
  const auto n = static_cast<size_t>(R.n());
  std::vector<int> to(n), from(n);
  const auto orders = [&](int r) {
    if (nccl_order) return p2p_order(R.profile(), R.members(), r, to, from);
    for (int k = 0; k < R.n(); ++k) to[size_t(k)] = R.rel(r, k), from[size_t(k)] = R.rel(r, -k);
  };
  if (R.symmetric()) {
    orders(0);
    std::vector<Posted> out(n);
    for (int k = 1; k < R.n(); ++k) out[size_t(k)] = R.send(0, to[size_t(k)], size(0, to[size_t(k)]));
    for (int k = 1; k < R.n(); ++k) {
      out[size_t(k)].from = from[size_t(k)];  // the twin's sender
      R.recv(0, out[size_t(k)]);
    }
    return;
  }
  std::vector<Posted> out(size_t(R.played()) * n);
  std::vector<int> froms(size_t(R.played()) * n);  // each played member's receive order, kept for its receives
  for (int r = 0; r < R.played(); ++r) {
    orders(r);
    for (int k = 1; k < R.n(); ++k) out[size_t(r) * n + size_t(k)] = R.send(r, to[size_t(k)], size(r, to[size_t(k)]));
    std::copy(from.begin(), from.end(), froms.begin() + long(size_t(r) * n));
  }
  for (int r = 0; r < R.played(); ++r)
    for (int k = 1; k < R.n(); ++k) {
      const int f = froms[size_t(r) * n + size_t(k)];
      R.recv(r, Replay::twin(out[size_t(R.base(f)) * n + size_t(k)], f));
    }
}

// direct_broadcast (root sends to root+1, root+2, ...) and direct_reduce
// (every other member sends to root, which receives from root-1, root-2, ...).
void direct_rooted(Replay& R, size_t count, int root, bool to_root) {
  const int n = R.n();
  std::vector<Posted> out(static_cast<size_t>(n));
  for (int k = 1; k < n; ++k) {
    const int peer = R.rel(root, to_root ? -k : k);
    out[static_cast<size_t>(k)] = to_root ? R.send(peer, root, count) : R.send(root, peer, count);
  }
  for (int k = 1; k < n; ++k) R.recv(to_root ? root : R.rel(root, k), out[static_cast<size_t>(k)]);
}

// ring.cc chain_broadcast / chain_reduce: chunk by chunk along
// root -> root+1 -> ... (broadcast) or root+n-1 -> ... -> root (reduce).
void chain(Replay& R, size_t count, int elem_size, int root, bool to_root) {
  const int n = R.n(), k = detail::chain_chunks(count, elem_size);
  for (int i = 0; i < k; ++i) {
    const size_t size = chunk(count, k, i);
    Posted up{};  // the message the current position receives
    for (int step = 0; step < n; ++step) {
      const int pos = to_root ? n - 1 - step : step;
      const int me = R.rel(root, pos);
      if (step > 0) R.recv(me, up);
      if (step < n - 1) up = R.send(me, R.rel(root, to_root ? pos - 1 : pos + 1), size);
    }
  }
}

// tree.cc binomial_broadcast: relative rank v receives from v - lowbit(v),
// then sends to v + 2^j for 2^j below lowbit(v), largest first. Parents
// have smaller v, so ascending v meets every message after its send.
void binomial_broadcast(Replay& R, size_t count, int root) {
  const int n = R.n();
  std::vector<Posted> from_parent(static_cast<size_t>(n));
  for (int v = 0; v < n; ++v) {
    int mask = 1;
    while (mask < n && !(v & mask)) mask <<= 1;
    if (v > 0) R.recv(R.rel(root, v), from_parent[static_cast<size_t>(v)]);
    for (mask >>= 1; mask > 0; mask >>= 1)
      if (v + mask < n)
        from_parent[static_cast<size_t>(v + mask)] =
            R.send(R.rel(root, v), R.rel(root, v + mask), count);
  }
}

// tree.cc binomial_reduce: v receives from v+1, v+2, v+4, ... then sends to
// v - lowbit(v). Children have larger v: descending v.
void binomial_reduce(Replay& R, size_t count, int root) {
  const int n = R.n();
  std::vector<Posted> to_parent(static_cast<size_t>(n));
  for (int v = n - 1; v >= 0; --v) {
    for (int mask = 1; mask < n; mask <<= 1) {
      if (v & mask) {
        to_parent[static_cast<size_t>(v)] = R.send(R.rel(root, v), R.rel(root, v - mask), count);
        break;
      }
      if (v + mask < n) R.recv(R.rel(root, v), to_parent[static_cast<size_t>(v + mask)]);
    }
  }
}

// all_to_all.cc bruck_all_to_all: round dist moves the blocks whose slot
// index has bit dist set.
void bruck(Replay& R, size_t block) {
  const int n = R.n();
  std::vector<Posted> out(static_cast<size_t>(n));
  for (int dist = 1; dist < n; dist <<= 1) {
    size_t slots = 0;
    for (int i = 0; i < n; ++i) slots += (i & dist) ? 1 : 0;
    shift_round(
        R, dist, [&](int) { return slots * block; }, out);
  }
}

// Every member's steps (detail::TreeOp lists: the dbtree's, the channel
// chains'), replayed in each member's program order. Such a program is not
// lock-step, so the members advance as an event loop: a member runs its
// steps until a receive whose message its peer has not sent yet, and
// resumes when that send is replayed. Messages between two members on one
// channel keep their order (FIFO per sender, receiver and channel, as the
// fabric's tags do). Each message is charged `charged` elements (0: its
// range's size).
void play_ops(Replay& R, int C, const std::vector<std::vector<detail::TreeOp>>& ops, size_t charged) {
  const int n = R.n();
  // In flight from (sender, channel) to a receiver: keyed by receiver, then
  // (sender * C + channel); each a FIFO with a read cursor.
  struct Queue {
    std::vector<Posted> q;
    size_t head = 0;
  };
  std::vector<std::map<int, Queue>> inbox(static_cast<size_t>(n));
  std::vector<size_t> next(static_cast<size_t>(n), 0);
  std::vector<int> waiting(static_cast<size_t>(n), -1);  // the key a blocked member waits on
  std::vector<int> ready;
  ready.reserve(static_cast<size_t>(n));
  for (int r = n - 1; r >= 0; --r) ready.push_back(r);
  R.open_lanes(C);
  while (!ready.empty()) {
    const int r = ready.back();
    ready.pop_back();
    auto& mine = ops[size_t(r)];
    size_t& i = next[size_t(r)];
    for (; i < mine.size(); ++i) {
      const detail::TreeOp& o = mine[i];
      if (o.kind == detail::TreeOp::kFinalize) continue;
      if (o.kind == detail::TreeOp::kSend) {
        const int key = r * C + o.lane;
        inbox[size_t(o.peer)][key].q.push_back(R.send(r, o.peer, charged ? charged : size_t(o.range.size), o.lane));
        if (waiting[size_t(o.peer)] == key) {
          waiting[size_t(o.peer)] = -1;
          ready.push_back(o.peer);
        }
        continue;
      }
      const int key = o.peer * C + o.lane;
      Queue& in = inbox[size_t(r)][key];
      if (in.head == in.q.size()) {
        waiting[size_t(r)] = key;
        break;
      }
      R.recv(r, in.q[in.head++], o.lane);
    }
  }
  for (int r = 0; r < n; ++r) SHARDLAB_CHECK(next[size_t(r)] == ops[size_t(r)].size());
}

// dbtree.cc dbtree_all_reduce: every member's steps (detail::dbtree_ops).
void dbtree(Replay& R, const HardwareProfile& p, std::span<const int> members, const CollShape& s) {
  const TreePlan plan = tree_plan(p, members);
  SHARDLAB_CHECK(plan.applies());
  const int n = R.n(), C = plan.channels;
  const int chunks = dbtree_chunks(s.count, C, s.elem_size);
  std::vector<std::vector<detail::TreeOp>> ops(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) detail::dbtree_ops(plan, n, s.count, chunks, r, ops[size_t(r)]);
  play_ops(R, C, ops, detail::dbtree_charged(s.count, C, chunks));
}

// ring.cc channel_chain_broadcast / channel_chain_reduce: every member's
// steps (detail::chain_ops), each message charged its chunk's size.
void channel_chain(Replay& R, const RingPlan& plan, const CollShape& s, bool to_root) {
  const int n = R.n();
  std::vector<std::vector<detail::TreeOp>> ops(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) detail::chain_ops(plan, n, s.count, s.elem_size, s.root, to_root, r, ops[size_t(r)]);
  play_ops(R, plan.channels, ops, 0);
}

void replay_body(Replay& R, const HardwareProfile& p, std::span<const int> members, const RingPlan& plan,
                 const CollShape& s, Algo algo) {
  const int n = R.n();
  if (algo == Algo::kDbtree) return dbtree(R, p, members, s);
  const size_t count = s.count;
  auto rings = [&](int phase) { return plan.single() ? ring(R, count, phase) : channel_ring(R, plan, count); };
  switch (s.op) {
    case OpKind::kAllReduce:
      if (algo == Algo::kDirect) return direct_exchange(R, [&](int, int) { return count; });
      if (algo == Algo::kNvls) {
        // nvls.cc: a direct reduce_scatter, then a direct all_gather, at the switch's rate.
        const size_t x = detail::nvls_charged(count, n);
        R.set_rate_cap(detail::nvls_rate(p));
        direct_exchange(R, [&](int, int) { return x; });
        return direct_exchange(R, [&](int, int) { return x; });
      }
      if (algo == Algo::kRing) {
        rings(-1);  // reduce_scatter
        return rings(0);
      }
      halving(R, count);
      return doubling(R, count);
    case OpKind::kReduceScatter:
      if (algo == Algo::kDirect) return direct_exchange(R, [&](int, int) { return slice(count, n); });
      if (algo == Algo::kRing) return rings(-1);
      return halving(R, count);
    case OpKind::kAllGather:
      if (algo == Algo::kDirect) return direct_exchange(R, [&](int, int) { return slice(count, n); });
      if (algo == Algo::kRing) return rings(0);
      return doubling(R, count);
    case OpKind::kBroadcast:
      if (algo == Algo::kDirect) return direct_rooted(R, count, s.root, false);
      if (algo == Algo::kRing)
        return plan.single() ? chain(R, count, s.elem_size, s.root, false) : channel_chain(R, plan, s, false);
      return binomial_broadcast(R, count, s.root);
    case OpKind::kReduce:
      if (algo == Algo::kDirect) return direct_rooted(R, count, s.root, true);
      if (algo == Algo::kRing)
        return plan.single() ? chain(R, count, s.elem_size, s.root, true) : channel_chain(R, plan, s, true);
      return binomial_reduce(R, count, s.root);
    case OpKind::kAllToAll: {
      const size_t block = count / static_cast<size_t>(n);
      if (algo == Algo::kDirect) return direct_exchange(R, [&](int, int) { return block; }, true);
      if (algo == Algo::kTree) return bruck(R, block);
      std::vector<Posted> out(static_cast<size_t>(n));
      for (int k = 1; k < n; ++k)
        shift_round(
            R, k, [&](int) { return block; }, out);
      return;
    }
    case OpKind::kBarrier: {
      std::vector<Posted> out(static_cast<size_t>(n));
      for (int dist = 1; dist < n; dist <<= 1)
        shift_round(
            R, dist, [](int) { return size_t{0}; }, out);
      return;
    }
  }
}

}  // namespace

void play(Replay& R, const HardwareProfile& p, std::span<const int> members, const RingPlan& plan,
          const CollShape& s, Algo algo) {
  replay_body(R, p, members, plan, s, algo);
  R.close_lanes();
}


}  // namespace shardlab::collectives::replay
