#include "model/parallel/context/cp_attention.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <span>
#include <utility>

#include <fmt/format.h>

#include "collectives/collectives.h"
#include "runtime/errors.h"

namespace shardlab::parallel {

namespace coll = collectives;

namespace {

// The chunk (of 2·cp) that half `h` (0, 1) of cp rank `rank`'s tokens holds.
int chunk_of(int rank, int half, int cp) { return half == 0 ? rank : 2 * cp - 1 - rank; }

// Every (my half, block half) pair with keys not later than the queries.
template <typename F>
void for_pairs(int me, int src, const ShardDims& d, F&& f) {
  const int64_t len = d.T / 2;
  for (int hq = 0; hq < 2; ++hq)
    for (int hk = 0; hk < 2; ++hk) {
      const int q = chunk_of(me, hq, d.cp), k = chunk_of(src, hk, d.cp);
      if (k <= q) f(ChunkPair{hq * len, hk * len, len, k == q});
    }
}

OpCost copy_cost(int64_t n, int elem) { return OpCost{double(n), 2.0 * double(n) * elem}; }

// The core's buffers, charged to the arena as activations while a call runs.
class ScratchCharge {
 public:
  ScratchCharge(const model::Exec& ex, int64_t elements) : ex_(ex), n_(elements) {
    if (ex_.sink) ex_.sink->saved(n_);
  }
  ~ScratchCharge() {
    if (ex_.sink) ex_.sink->freed(n_);
  }
  ScratchCharge(const ScratchCharge&) = delete;
  ScratchCharge& operator=(const ScratchCharge&) = delete;

 private:
  const model::Exec& ex_;
  int64_t n_;
};

}  // namespace

CpComm parse_cp_comm(const std::string& text) {
  if (text == "ring") return CpComm::kRing;
  if (text == "allgather") return CpComm::kAllGather;
  throw ConfigError(fmt::format("`cp_comm` must be ring or allgather (got '{}')", text));
}

const char* cp_comm_name(CpComm c) { return c == CpComm::kRing ? "ring" : "allgather"; }

BlockDims CpAttention::block_dims(const ShardDims& d) const {
  BlockDims b{d.B, d.T, d.NHl(), d.HS()};
  b.HV = d.HV() == d.HS() ? 0 : d.HV();
  if (!d.kv_repeated()) return b;
  const model::GqaHeads g = d.gqa(tp_rank_);
  b.G = g.G, b.q0 = g.q0;
  b.KV = b.kv_of(d.NHl() - 1) + 1;  // the K/V heads this rank's query heads read
  return b;
}

int64_t CpAttention::kv_elements(const ShardDims& d) const { return d.N() * block_dims(d).KVW(); }

namespace {

// Calls f(column in a repeated qkv row, column in a kv row, count) for the k
// (HS) and the v (hv: MLA's values are narrower, padded in qkv) of the first
// query head of every K/V head (the others are its copies).
template <typename F>
void for_kv_heads(const BlockDims& b, F&& f) {
  for (int h = 0; h < b.NH; ++h) {
    if (h > 0 && b.kv_of(h) == b.kv_of(h - 1)) continue;
    f(b.C() + int64_t{h} * b.HS, int64_t{b.kv_of(h)} * b.HS, b.HS);                     // k
    f(2 * b.C() + int64_t{h} * b.HS, b.KVC() + int64_t{b.kv_of(h)} * b.hv(), b.hv());  // v
  }
}

}  // namespace

void CpAttention::pack_kv(float* kv, const float* qkv, const ShardDims& d,
                          const LayerContext& c) const {
  const BlockDims b = block_dims(d);
  const int64_t N = d.N(), W = b.KVW();
  c.ex.run("attn.cp.kv_pack", copy_cost(N * W, c.ex.elem), [&] {
    for (int64_t n = 0; n < N; ++n)
      for_kv_heads(b, [&](int64_t from, int64_t to, int64_t count) {
        std::copy_n(qkv + n * 3 * b.C() + from, count, kv + n * W + to);
      });
  });
}

Stream& CpAttention::ring(const LayerContext& c) const {
  if (!ring_) ring_ = std::make_unique<Stream>(c.dev, StreamKind::kCpComm);
  return *ring_;
}

namespace {

// A member's neighbours on its cp ring.
struct RingPlace {
  int prev, me, next;
};
RingPlace ring_place(std::span<const int> members, int index) {
  const int n = int(members.size());
  return {members[size_t((index + n - 1) % n)], members[size_t(index)], members[size_t((index + 1) % n)]};
}

}  // namespace

void CpAttention::fold(const Device& dev, const collectives::DeviceMesh& mesh) {
  deliveries_.clear();
  fold_sends_ = false;
  if (comm_ != CpComm::kRing || !dev.folding()) return;
  const RingPlace mine = ring_place(cp_.members(), cp_.rank());
  const Link sends = dev.link(mine.me, mine.next), receives = dev.link(mine.prev, mine.me);
  for (int m = 0; m < mesh.size(); ++m) {
    if (dev.representative(m) != dev.rank()) continue;
    const std::vector<int> group = mesh.group_ranks(m, "cp");
    const RingPlace its = ring_place(group, mesh.group_index(m, "cp"));
    if (dev.link(its.me, its.next) != sends || dev.link(its.prev, its.me) != receives ||
        dev.representative(its.prev) != dev.representative(mine.prev))
      throw FoldingError(fmt::format(
          "folding: the cp ring of device {} (from {}, to {}) is not its representative {}'s (from {}, to {}): "
          "other links or another sender",
          m, its.prev, its.next, dev.rank(), mine.prev, mine.next));
    if (!dev.folded(its.next)) deliveries_.push_back({m, its.next});
  }
  fold_sends_ = dev.folded(mine.next) || deliveries_.size() > 1;
}

void CpAttention::send_next(const float* data, int64_t n, Tag t, const LayerContext& c) const {
  const int next = cp_.members()[size_t((cp_.rank() + 1) % cp_.size())];
  const uint64_t bytes = uint64_t(n) * uint64_t(c.ex.elem);
  if (fold_sends_) {
    SHARDLAB_CHECK(data == nullptr, "cp ring: folded sends carry no data (phantom runs only)");
    c.dev->isend_folded(ring(c), next, t, bytes, deliveries_);
  } else {
    c.dev->isend(ring(c), next, t,
                 {reinterpret_cast<const std::byte*>(data), data ? size_t(n) * sizeof(float) : 0}, bytes);
  }
  sent_bytes_ += bytes;
}

void CpAttention::recv_prev(float* into, int64_t n, Tag t, const LayerContext& c) const {
  const int prev = cp_.members()[size_t((cp_.rank() + cp_.size() - 1) % cp_.size())];
  Message m = c.dev->recv(ring(c), prev, t);
  const size_t expected = into ? size_t(n) * sizeof(float) : 0;  // phantom: no payload
  SHARDLAB_CHECK(m.payload.size() == expected,
                 fmt::format("cp ring: device {} sent {} bytes, expected {}", prev, m.payload.size(), expected));
  if (into) std::memcpy(into, m.payload.data(), m.payload.size());
}

void CpAttention::join_compute(const LayerContext& c) const {
  const Time before = c.dev->compute().now();
  c.dev->compute().wait(ring(c).record());
  exposed_ += c.dev->compute().now() - before;
}

void CpAttention::gather_kv(const float* qkv, const ShardDims& d, const LayerContext& c) const {
  const int64_t n = kv_elements(d);
  kv_.assign(size_t(n), 0.0f);
  all_kv_.assign(size_t(n) * size_t(cp_.size()), 0.0f);
  pack_kv(kv_.data(), qkv, d, c);
  const Time before = c.dev->compute().now();
  coll::all_gather(*c.dev, cp_, coll::ConstBuffer(kv_.data(), size_t(n)),
                   coll::Buffer(all_kv_.data(), all_kv_.size()), c.on_compute());
  exposed_ += c.dev->compute().now() - before;
}

void CpAttention::forward_block(const float* qkv, const float* kv, int src, const ShardDims& d,
                                const LayerContext& c) const {
  const BlockDims bd = block_dims(d);
  for_pairs(cp_.rank(), src, d, [&](const ChunkPair& p) {
    c.ex.run(p.diagonal ? "attn.cp.fwd.diagonal" : "attn.cp.fwd",
             block_attention_forward_cost(bd, p.len, p.diagonal, c.ex.elem, fused_),
             [&] { block_attention_forward(acc_.data(), m_.data(), l_.data(), qkv, kv, bd, p); });
  });
}

void CpAttention::forward(float* atty, float* att, const float* qkv, const ShardDims& d,
                          const LayerContext& c) const {
  SHARDLAB_CHECK(d.cp == cp_.size() && d.cp_rank == cp_.rank() && d.T % 2 == 0, "cp attention: dims");
  const int64_t n = kv_elements(d), rows = int64_t{d.B} * d.NHl() * d.T;
  // K/V (the ring's two blocks, or every rank's), the output accumulator, m and l.
  const ScratchCharge charge(c.ex, (comm_ == CpComm::kRing ? 2 : 1 + cp_.size()) * n + d.N() * d.Cv() + 2 * rows);
  acc_.assign(size_t(d.N() * d.Cv()), 0.0f);
  m_.assign(size_t(rows), -std::numeric_limits<float>::infinity());
  l_.assign(size_t(rows), 0.0f);
  if (comm_ == CpComm::kAllGather) {
    gather_kv(qkv, d, c);
    for (int j = 0; j < cp_.size(); ++j) forward_block(qkv, all_kv_.data() + (all_kv_.data() ? j * n : 0), j, d, c);
  } else {
    ring_forward(qkv, d, c);
  }
  c.ex.run("attn.cp.finish", copy_cost(d.N() * d.Cv(), c.ex.elem), [&] {
    block_attention_finish(atty, att, acc_.data(), m_.data(), l_.data(), block_dims(d));
  });
  ++call_;
}

void CpAttention::ring_forward(const float* qkv, const ShardDims& d, const LayerContext& c) const {
  const int64_t n = kv_elements(d);
  const int P = cp_.size(), me = cp_.rank();
  kv_.assign(size_t(n), 0.0f);
  kv_next_.assign(size_t(n), 0.0f);
  pack_kv(kv_.data(), qkv, d, c);
  ring(c).wait(c.dev->compute().record());  // the block exists once compute made it
  for (int s = 0; s < P; ++s) {
    if (s + 1 < P) send_next(kv_.data(), n, tag(0, s), c);  // overlaps this block's pairs
    forward_block(qkv, kv_.data(), (me - s + P) % P, d, c);
    if (s + 1 == P) break;
    recv_prev(kv_next_.data(), n, tag(0, s), c);
    join_compute(c);
    std::swap(kv_, kv_next_);
  }
}

void CpAttention::backward_block(float* dqkv, float* dkv, const float* datty, const float* qkv,
                                 const float* kv, const float* lse, int src, const ShardDims& d,
                                 const LayerContext& c) const {
  const BlockDims bd = block_dims(d);
  for_pairs(cp_.rank(), src, d, [&](const ChunkPair& p) {
    c.ex.run(p.diagonal ? "attn.cp.bwd.diagonal" : "attn.cp.bwd",
             block_attention_backward_cost(bd, p.len, p.diagonal, c.ex.elem, fused_), [&] {
               block_attention_backward(dqkv, dkv, datty, qkv, kv, lse, delta_.data(), bd, p);
             });
  });
}

void CpAttention::backward(float* dqkv, const float* datty, const float* qkv, const float* atty,
                           const float* att, const ShardDims& d, const LayerContext& c) const {
  const int64_t N = d.N(), Cv = d.Cv(), n = kv_elements(d);
  const int P = cp_.size();
  const int64_t rows = int64_t{d.B} * d.NHl() * d.T;
  // The ring's K/V and dK/dV pairs, or every rank's K/V and dK/dV and my dK/dV; delta.
  const ScratchCharge charge(c.ex, (comm_ == CpComm::kRing ? 4 : 2 + 2 * P) * n + rows);
  delta_.assign(size_t(rows), 0.0f);
  c.ex.run("attn.cp.delta", OpCost{2.0 * double(N * Cv), 2.0 * double(N * Cv) * c.ex.elem},
           [&] { block_attention_delta(delta_.data(), datty, atty, block_dims(d)); });
  if (comm_ == CpComm::kAllGather) {
    gather_kv(qkv, d, c);
    all_dkv_.assign(all_kv_.size(), 0.0f);
    for (int j = 0; j < P; ++j) {
      const int64_t at = all_kv_.data() ? j * n : 0;
      backward_block(dqkv, all_dkv_.data() + (all_dkv_.data() ? at : 0), datty, qkv, all_kv_.data() + at,
                     att, j, d, c);
    }
    dkv_.assign(size_t(n), 0.0f);
    const Time before = c.dev->compute().now();
    coll::reduce_scatter(*c.dev, cp_, coll::ConstBuffer(all_dkv_.data(), all_dkv_.size()),
                         coll::Buffer(dkv_.data(), size_t(n)), coll::ReduceOp::kSum, c.on_compute());
    exposed_ += c.dev->compute().now() - before;
  } else {
    ring_backward(dqkv, datty, qkv, att, d, c);
  }
  // into the first query head of each K/V head: repeat_kv's backward sums a group's copies
  const BlockDims b = block_dims(d);
  c.ex.run("attn.cp.dkv_add", OpCost{double(n), 3.0 * double(n) * c.ex.elem}, [&] {
    for (int64_t r = 0; r < N; ++r)
      for_kv_heads(b, [&](int64_t to, int64_t from, int64_t count) {
        for (int64_t j = 0; j < count; ++j) dqkv[r * 3 * b.C() + to + j] += dkv_[size_t(r * b.KVW() + from + j)];
      });
  });
  ++call_;
}

// Step s: the block of rank (i−s) mod N. Its dK/dV partial from the ranks
// before this one (sent at the end of their step s−1) is received only after
// this rank's own pairs, so that hop overlaps the compute; the sum goes on.
// After the last step each rank receives its own block's whole dK/dV (dkv_).
void CpAttention::ring_backward(float* dqkv, const float* datty, const float* qkv, const float* lse,
                                const ShardDims& d, const LayerContext& c) const {
  const int64_t n = kv_elements(d);
  const int P = cp_.size(), me = cp_.rank();
  for (auto* b : {&kv_, &kv_next_, &dkv_, &dkv_in_}) b->assign(size_t(n), 0.0f);
  pack_kv(kv_.data(), qkv, d, c);
  ring(c).wait(c.dev->compute().record());
  for (int s = 0; s < P; ++s) {
    if (s + 1 < P) send_next(kv_.data(), n, tag(0, s), c);
    if (c.ex.math()) std::fill(dkv_.begin(), dkv_.end(), 0.0f);  // a handover (sink.h)
    backward_block(dqkv, dkv_.data(), datty, qkv, kv_.data(), lse, (me - s + P) % P, d, c);
    if (s > 0) {
      recv_prev(dkv_in_.data(), n, tag(1, s - 1), c);
      join_compute(c);
      c.ex.run("attn.cp.dkv_sum", OpCost{double(n), 3.0 * double(n) * c.ex.elem}, [&] {
        for (size_t i = 0; i < dkv_.size(); ++i) dkv_[i] += dkv_in_[i];
      });
    }
    ring(c).wait(c.dev->compute().record());
    send_next(dkv_.data(), n, tag(1, s), c);
    if (s + 1 < P) {
      recv_prev(kv_next_.data(), n, tag(0, s), c);
      join_compute(c);
      std::swap(kv_, kv_next_);
    }
  }
  recv_prev(dkv_.data(), n, tag(1, P - 1), c);  // my block's dK/dV, home
  join_compute(c);
}

}  // namespace shardlab::parallel
