// Direct algorithms: every member talks to every other member at once (all
// sends are posted back to back, so they serialize only on the sender's
// egress and the receiver's ingress port). One latency plus (n-1) transfers:
// the best choice for tiny messages and for two members.
//
// Receives are taken in the order the peers' sends were posted towards me
// (member me-1 first, then me-2, ...) and kept in the group's inbox until all
// have arrived; the reduction then runs in member order 0, 1, ..., n-1, block
// by block, so every member computes the same bits.
#include "collectives/detail.h"

namespace shardlab::collectives::detail {
namespace {

// out[i] = src(0)[i] op src(1)[i] op ... op src(n-1)[i], left to right.
// out may alias one of the sources (each block is read before written).
template <class Src>
void combine_in_member_order(float* out, size_t count, int n, ReduceOp op, Src src) {
  if (!out) return;
  constexpr size_t kBlock = 2048;
  alignas(64) float acc[kBlock];
  for (size_t b = 0; b < count; b += kBlock) {
    const size_t len = std::min(kBlock, count - b);
    std::memcpy(acc, src(0) + b, len * sizeof(float));
    for (int j = 1; j < n; ++j) reduce_into(acc, src(j) + b, len, op);
    std::memcpy(out + b, acc, len * sizeof(float));
  }
}

// Receives `count_of(j)` elements from every other member into the inbox.
template <class CountOf>
// `modeled`: the elements each message is charged as (default: its count).
std::vector<Message>& gather_inbox(Ctx& c, CountOf count_of, size_t modeled = Ctx::kAsCount) {
  std::vector<Message>& inbox = c.group().inbox();
  inbox.resize(static_cast<size_t>(c.n()));
  for (int k = 1; k < c.n(); ++k) {
    const int from = c.rel(-k);
    inbox[static_cast<size_t>(from)] = c.recv(from, count_of(from), 0, modeled);
  }
  return inbox;
}

void clear_inbox(Ctx& c) {
  for (Message& m : c.group().inbox()) m = Message{};  // payloads back to the pool
}

// Receives `count` elements from every other member and reduces them with
// this member's `in` into `out`, in member order.
void reduce_received(Ctx& c, const float* in, float* out, size_t count, ReduceOp op) {
  std::vector<Message>& inbox = gather_inbox(c, [&](int) { return count; });
  if (in && out) {
    combine_in_member_order(out, count, c.n(), op, [&](int j) {
      return j == c.me() ? in : floats(inbox[static_cast<size_t>(j)]);
    });
  }
  finalize(out, count, op, c.n());
  clear_inbox(c);
}

}  // namespace

void direct_all_reduce(Ctx& c, const float* in, float* out, size_t count, ReduceOp op) {
  for (int k = 1; k < c.n(); ++k) c.send(c.rel(k), in, count);
  reduce_received(c, in, out, count, op);
}

void direct_reduce_scatter(Ctx& c, const float* in, float* out, size_t count, ReduceOp op, size_t modeled) {
  const int n = c.n();
  if (modeled == Ctx::kAsCount) modeled = c.slice(count);
  for (int k = 1; k < n; ++k) {
    const Range r = chunk_range(count, n, c.rel(k));
    c.send(c.rel(k), in ? in + r.begin : nullptr, r.size, 0, modeled);
  }
  const Range mine = chunk_range(count, n, c.me());
  std::vector<Message>& inbox = gather_inbox(c, [&](int) { return mine.size; }, modeled);
  if (in && out) {
    combine_in_member_order(out, mine.size, n, op, [&](int j) {
      return j == c.me() ? in + mine.begin : floats(inbox[static_cast<size_t>(j)]);
    });
  }
  finalize(out, mine.size, op, n);
  clear_inbox(c);
}

void direct_all_gather(Ctx& c, float* work, size_t count, size_t modeled) {
  const int n = c.n();
  if (modeled == Ctx::kAsCount) modeled = c.slice(count);
  const Range mine = chunk_range(count, n, c.me());
  for (int k = 1; k < n; ++k) c.send(c.rel(k), work ? work + mine.begin : nullptr, mine.size, 0, modeled);
  for (int k = 1; k < n; ++k) {
    const Range r = chunk_range(count, n, c.rel(-k));
    copy(work ? work + r.begin : nullptr, floats(c.recv(c.rel(-k), r.size, 0, modeled)), r.size);
  }
}

void direct_broadcast(Ctx& c, float* data, size_t count, int root) {
  if (c.me() == root) {
    for (int k = 1; k < c.n(); ++k) c.send(c.rel(k), data, count);
  } else {
    copy(data, floats(c.recv(root, count)), count);
  }
}

void direct_reduce(Ctx& c, const float* in, float* out, size_t count, ReduceOp op, int root) {
  if (c.me() != root) {
    c.send(root, in, count);
    return;
  }
  reduce_received(c, in, out, count, op);
}

}  // namespace shardlab::collectives::detail
