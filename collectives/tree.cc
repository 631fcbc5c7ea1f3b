// Logarithmic ("tree") algorithms, for any group size.
//
// reduce_scatter by recursive halving (the reverse of Bruck's all_gather):
// K = ceil(log2 n) steps, k = K-1 down to 0, dist = 2^k, m = min(dist, n-dist).
// Before step k member r owns partial sums of chunks [r, r + min(2^(k+1), n));
// it sends the upper m chunks [r+dist, r+dist+m) to member r+dist and adds
// the partials of chunks [r, r+m) that member r-dist sends it. After step 0
// member r holds the full sum of chunk r. all_gather by recursive doubling
// (Bruck): k = 0..K-1, member r sends chunks [r, r+m) to r-dist and receives
// [r+dist, r+dist+m) from r+dist. Chunk ranges wrap around the buffer, so a
// step sends one or two messages (back to back on the same port: the second
// costs no extra latency). With uniform links the pair costs
// 2·K·a + 2·(n-1)/n·S/B: ring's bandwidth term, logarithmic latency.
//
// broadcast and reduce use a binomial tree rooted at `root`
// (ceil(log2 n)·(a + S/B)); children are combined in a fixed order.
#include "collectives/detail.h"

namespace shardlab::collectives::detail {

int ceil_log2(int n) {
  int k = 0;
  while ((1 << k) < n) ++k;
  return k;
}

int wrapped_ranges(size_t count, int n, int first, int m, Range out[2]) {
  first %= n;
  const int last = first + m;  // exclusive, may exceed n
  if (last <= n) {
    const Range a = chunk_range(count, n, first), b = chunk_range(count, n, last - 1);
    out[0] = {a.begin, b.begin + b.size - a.begin};
    return 1;
  }
  const Range a = chunk_range(count, n, first), b = chunk_range(count, n, last - n - 1);
  out[0] = {a.begin, static_cast<int64_t>(count) - a.begin};
  out[1] = {0, b.begin + b.size};
  return 2;
}

// One tree step moves m chunks as one message charged m slices (Ctx::slice);
// when the chunks wrap around the buffer their second piece follows as a
// message charged nothing (it arrives with the first), so every member sends
// and receives the same modeled bytes in the same time.
void send_pieces(Ctx& c, int to, float* work, const Range* pieces, int np, size_t modeled, int phase) {
  c.send(to, work ? work + pieces[0].begin : nullptr, size_t(pieces[0].size), phase, modeled);
  if (np == 2 && pieces[1].size)
    c.send(to, work ? work + pieces[1].begin : nullptr, size_t(pieces[1].size), phase, 0);
}

template <class Take>
void recv_pieces(Ctx& c, int from, const Range* pieces, int nr, size_t modeled, int phase, Take take) {
  take(pieces[0], c.recv(from, size_t(pieces[0].size), phase, modeled));
  if (nr == 2 && pieces[1].size) take(pieces[1], c.recv(from, size_t(pieces[1].size), phase, 0));
}

void halving_reduce_scatter(Ctx& c, float* work, size_t count, ReduceOp op, int phase) {
  const int n = c.n();
  if (count == 0) return;
  for (int k = ceil_log2(n) - 1; k >= 0; --k) {
    const int dist = 1 << k, m = std::min(dist, n - dist);
    const size_t modeled = size_t(m) * c.slice(count);
    Range pieces[2];
    const int np = wrapped_ranges(count, n, c.rel(dist), m, pieces);
    send_pieces(c, c.rel(dist), work, pieces, np, modeled, phase);
    const int nr = wrapped_ranges(count, n, c.me(), m, pieces);
    recv_pieces(c, c.rel(-dist), pieces, nr, modeled, phase, [&](const Range& r, const Message& msg) {
      reduce_into(work ? work + r.begin : nullptr, floats(msg), size_t(r.size), op);
    });
  }
}

void doubling_all_gather(Ctx& c, float* work, size_t count, int phase) {
  const int n = c.n();
  if (count == 0) return;
  for (int k = 0; (1 << k) < n; ++k) {
    const int dist = 1 << k, m = std::min(dist, n - dist);
    const size_t modeled = size_t(m) * c.slice(count);
    Range pieces[2];
    const int np = wrapped_ranges(count, n, c.me(), m, pieces);
    send_pieces(c, c.rel(-dist), work, pieces, np, modeled, phase);
    const int nr = wrapped_ranges(count, n, c.rel(dist), m, pieces);
    recv_pieces(c, c.rel(dist), pieces, nr, modeled, phase, [&](const Range& r, const Message& msg) {
      copy(work ? work + r.begin : nullptr, floats(msg), size_t(r.size));
    });
  }
}

// Binomial tree over relative ranks v = (me - root) mod n: v receives from
// v - lowbit(v), then sends to v + 2^j for the 2^j below lowbit(v).
void binomial_broadcast(Ctx& c, float* data, size_t count, int root) {
  const int n = c.n();
  const int v = (c.me() - root + n) % n;
  int mask = 1;
  while (mask < n) {
    if (v & mask) {
      copy(data, floats(c.recv(c.rel(-mask), count)), count);
      break;
    }
    mask <<= 1;
  }
  for (mask >>= 1; mask > 0; mask >>= 1)
    if (v + mask < n) c.send(c.rel(mask), data, count);
}

// The mirror image: v adds the partials of v+1, v+2, v+4, ... (in that
// order) to its input, then sends to its parent. `in` is my input, `acc`
// scratch (root: the output); returns where my partial ended up.
void binomial_reduce(Ctx& c, const float* in, float* acc, size_t count, ReduceOp op, int root) {
  const int n = c.n();
  const int v = (c.me() - root + n) % n;
  const float* mine = in;
  for (int mask = 1; mask < n; mask <<= 1) {
    if (v & mask) {
      c.send(c.rel(-mask), mine, count);
      return;
    }
    if (v + mask >= n) continue;
    Message msg = c.recv(c.rel(mask), count);
    if (acc && mine != acc) {
      reduce_to(acc, mine, floats(msg), count, op);
      mine = acc;
    } else {
      reduce_into(acc, floats(msg), count, op);
    }
  }
  copy(acc, mine, count);  // root with n == 1, or nothing received
}

}  // namespace shardlab::collectives::detail
