// Lab 2 reference solution: ring all-reduce on point-to-point sends and receives.
#include "labs/02-ring-allreduce/ring_allreduce.h"

#include <cstring>

#include "collectives/collectives.h"  // chunk_range

namespace shardlab::labs {

void ring_all_reduce(Device& dev, const collectives::ProcessGroup& g, std::span<float> data) {
  const int n = g.size();
  const int me = g.rank();
  if (n == 1) return;
  const int right = g.global_rank((me + 1) % n);
  const int left = g.global_rank((me + n - 1) % n);
  auto chunk = [&](int c) { return collectives::chunk_range(data.size(), n, ((c % n) + n) % n); };
  Stream& s = dev.comm();
  Tag tag = 0;
  auto send = [&](Range r) {
    const auto bytes =
        std::as_bytes(data.subspan(static_cast<size_t>(r.begin), static_cast<size_t>(r.size)));
    dev.isend(s, right, tag, bytes, bytes.size());
  };
  // Reduce-scatter: what arrives is the left neighbour's running sum of the chunk.
  for (int k = 0; k < n - 1; ++k, ++tag) {
    send(chunk(me - k));
    const Range in = chunk(me - k - 1);
    const Message m = dev.recv(s, left, tag);
    const auto* x = reinterpret_cast<const float*>(m.bytes().data());
    for (int64_t i = 0; i < in.size; ++i) data[static_cast<size_t>(in.begin + i)] += x[i];
  }
  // All-gather: pass the complete chunks on around the ring.
  for (int k = 0; k < n - 1; ++k, ++tag) {
    send(chunk(me + 1 - k));
    const Range in = chunk(me - k);
    const Message m = dev.recv(s, left, tag);
    std::memcpy(data.data() + in.begin, m.bytes().data(),
                static_cast<size_t>(in.size) * sizeof(float));
  }
}

}  // namespace shardlab::labs
