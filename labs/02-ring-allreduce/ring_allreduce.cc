// Lab 2 exercise: ring all-reduce on point-to-point sends and receives.
// Fill in the two TODOs, then run `make lab-2`. README.md explains the steps.
#include "labs/02-ring-allreduce/ring_allreduce.h"

#include <cstring>

#include "collectives/collectives.h"  // chunk_range

namespace shardlab::labs {

void ring_all_reduce(Device& dev, const collectives::ProcessGroup& g, std::span<float> data) {
  const int n = g.size();
  const int me = g.rank();
  if (n == 1) return;
  const int right = g.global_rank((me + 1) % n);     // where every step sends
  const int left = g.global_rank((me + n - 1) % n);  // where every step receives from
  // Chunk c (any integer; taken mod n) of the buffer.
  auto chunk = [&](int c) { return collectives::chunk_range(data.size(), n, ((c % n) + n) % n); };
  Stream& s = dev.comm();
  // How to send chunk r to the right neighbour with tag t:
  //   auto bytes = std::as_bytes(data.subspan(r.begin, r.size));
  //   dev.isend(s, right, t, bytes, bytes.size());
  // and to receive from the left: Message m = dev.recv(s, left, t);
  //   m.bytes().data() holds the floats (m.bytes().size() bytes).
  (void)right, (void)left, (void)chunk, (void)s;

  // TODO 1, reduce-scatter: for k = 0 .. n-2, send chunk me-k to the right,
  // receive chunk me-k-1 from the left and ADD it into data. After the last
  // step this member holds the complete sum of chunk me+1.

  // TODO 2, all-gather: for k = 0 .. n-2, send chunk me+1-k to the right,
  // receive chunk me-k from the left and COPY it into data.
}

}  // namespace shardlab::labs
