// all_to_all, all_to_all_v and barrier.
//
//  direct: every block is posted at once, in NCCL's p2p order (tuner.h
//          p2p_order: across nodes by node delta, then by local delta, so
//          each round is a permutation; inside one node me+1, me+2, ...),
//          and received in the matching order: a + (n-1)·w(block).
//  ring:   pairwise exchange in n-1 lock-step rounds; round k sends to me+k
//          and receives from me-k before the next round: (n-1)·(a + w(block)).
//  tree:   Bruck's algorithm (all_to_all only: it needs equal blocks):
//          ceil(log2 n) rounds; round k forwards every block whose rotated
//          index has bit k set to member me+2^k. Fewer latencies, about
//          (n/2)·log2(n) blocks moved instead of n-1.
//  barrier: dissemination, ceil(log2 n) rounds of empty messages.
#include "collectives/detail.h"

namespace shardlab::collectives::detail {

void direct_all_to_all_v(Ctx& c, const float* in, const size_t* sdispl, const size_t* scount,
                         float* out, const size_t* rdispl, const size_t* rcount) {
  const int n = c.n(), me = c.me();
  thread_local std::vector<int> send_order, recv_order;  // reused: no allocation per call
  p2p_order(c.dev().profile(), c.group().members(), me, send_order, recv_order);
  copy(out ? out + rdispl[me] : nullptr, in ? in + sdispl[me] : nullptr, scount[me]);
  for (int k = 1; k < n; ++k) {
    const int to = send_order[size_t(k)];
    c.send(to, in ? in + sdispl[to] : nullptr, scount[to]);
  }
  for (int k = 1; k < n; ++k) {
    const int from = recv_order[size_t(k)];
    copy(out ? out + rdispl[from] : nullptr, floats(c.recv(from, rcount[from])), rcount[from]);
  }
}

void pairwise_all_to_all_v(Ctx& c, const float* in, const size_t* sdispl, const size_t* scount,
                           float* out, const size_t* rdispl, const size_t* rcount) {
  const int n = c.n(), me = c.me();
  copy(out ? out + rdispl[me] : nullptr, in ? in + sdispl[me] : nullptr, scount[me]);
  for (int k = 1; k < n; ++k) {
    const int to = c.rel(k), from = c.rel(-k);
    c.send(to, in ? in + sdispl[to] : nullptr, scount[to]);
    copy(out ? out + rdispl[from] : nullptr, floats(c.recv(from, rcount[from])), rcount[from]);
  }
}

// Bruck: rotate so that slot i holds the block for member me+i; in round k
// send the slots with bit k set to me+2^k and receive the same slots from
// me-2^k; at the end slot i holds the block from member me-i.
void bruck_all_to_all(Ctx& c, const float* in, float* out, size_t block) {
  const int n = c.n(), me = c.me();
  const bool phantom = in == nullptr;
  float* slots = scratch(c.group(), block * static_cast<size_t>(n), phantom, 0);
  float* pack = scratch(c.group(), block * static_cast<size_t>((n + 1) / 2), phantom, 1);
  for (int i = 0; i < n; ++i)
    copy(slots ? slots + static_cast<size_t>(i) * block : nullptr,
         in ? in + static_cast<size_t>((me + i) % n) * block : nullptr, block);
  for (int dist = 1; dist < n; dist <<= 1) {
    size_t packed = 0;
    for (int i = 0; i < n; ++i) {
      if (!(i & dist)) continue;
      copy(pack ? pack + packed : nullptr, slots ? slots + static_cast<size_t>(i) * block : nullptr, block);
      packed += block;
    }
    c.send(c.rel(dist), pack, packed);
    Message m = c.recv(c.rel(-dist), packed);
    const float* src = floats(m);
    for (int i = 0, j = 0; i < n; ++i) {
      if (!(i & dist)) continue;
      copy(slots ? slots + static_cast<size_t>(i) * block : nullptr,
           src ? src + static_cast<size_t>(j++) * block : nullptr, block);
    }
  }
  for (int i = 0; i < n; ++i)
    copy(out ? out + static_cast<size_t>((me - i + n) % n) * block : nullptr,
         slots ? slots + static_cast<size_t>(i) * block : nullptr, block);
}

void dissemination_barrier(Ctx& c) {
  for (int dist = 1; dist < c.n(); dist <<= 1) {
    c.send(c.rel(dist), nullptr, 0);
    c.recv(c.rel(-dist), 0);
  }
}

}  // namespace shardlab::collectives::detail
