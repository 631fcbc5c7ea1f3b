// Internals shared by the algorithm files: the per-call context (who am I in
// the group, which tag, which stream), message helpers and the element-wise
// reduction kernels. Not part of the public API.
#pragma once

#include <algorithm>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <vector>

#include <fmt/format.h>

#include "collectives/collectives.h"
#include "collectives/tuner.h"
#include "runtime/errors.h"
#include "runtime/link_model.h"

namespace shardlab::collectives::detail {

// One collective call on one member (thread safety: that member's device thread only).
class Ctx {
 public:
  // `esize`: modeled bytes per element (CollOptions::wire_elem); `engine`:
  // the protocol's (proto_engine), which sets every message's latency and rate.
  Ctx(Device& dev, const ProcessGroup& g, Stream& s, int esize, Engine engine = Engine::kSm)
      : dev_(dev), s_(s), cur_(&s), g_(g), tag_(g.next_tag()), esize_(esize), n_(g.size()), me_(g.rank()), engine_(engine) {
    if (!dev.profile().pcie.empty()) {
      pcie_.emplace(dev.profile());
      local_ = pcie_->local_members(g.members(), dev.profile().node_of(dev.rank()));
    }
  }

  Device& dev() const { return dev_; }
  const ProcessGroup& group() const { return g_; }
  int n() const { return n_; }
  int me() const { return me_; }
  int esize() const { return esize_; }
  // Group index `offset` steps from me (wraps).
  int rel(int offset) const { return ((me_ + offset) % n_ + n_) % n_; }

  // Elements per member slice of a `count`-element buffer split over the
  // group: ceil(count/n). The chunked algorithms charge every chunk's
  // message as one slice, whatever its actual size (chunk_range sizes differ
  // by one), as NCCL moves equal slices per step: so every member's
  // messages are the same size and symmetric members stay symmetric.
  size_t slice(size_t count) const { return (count + size_t(n_) - 1) / size_t(n_); }

  static constexpr size_t kAsCount = static_cast<size_t>(-1);
  // Sends count elements (p == nullptr: phantom) to group index `to`,
  // charged as `modeled` elements (default: count).
  void send(int to, const float* p, size_t count, int phase = 0, size_t modeled = kAsCount) {
    std::span<const std::byte> host;
    if (p && count) host = {reinterpret_cast<const std::byte*>(p), count * sizeof(float)};
    const size_t charged = modeled == kAsCount ? count : modeled;
    // A PCIe tree: this step's share of the shared links on the path, as if
    // every member sent the same distance at once (link_model.h).
    uint64_t cap = pcie_ ? pcie_->shared_rate(g_.global_rank(me_), g_.global_rank(to), g_.members(), local_,
                                              ((to - me_) % n_ + n_) % n_)
                         : 0;
    if (rate_cap_ > 0 && (cap == 0 || rate_cap_ < cap)) cap = rate_cap_;
    const SendHandle h = dev_.isend(*cur_, g_.global_rank(to), tag_ + static_cast<Tag>(phase), host,
                                    static_cast<uint64_t>(charged) * static_cast<uint64_t>(esize_), engine_, cap);
    last_send_ = std::max(last_send_, h.done);
  }
  // Receives the next message from group index `from`; checks its element
  // count (and the `modeled` elements it was charged as).
  Message recv(int from, size_t count, int phase = 0, size_t modeled = kAsCount) {
    Message m = dev_.recv(*cur_, g_.global_rank(from), tag_ + static_cast<Tag>(phase));
    const uint64_t want = static_cast<uint64_t>(modeled == kAsCount ? count : modeled) *
                          static_cast<uint64_t>(esize_);
    if (m.modeled_bytes != want || (m.payload.size() != 0 && m.payload.size() != count * sizeof(float))) {
      // Members disagree on counts, roots or algorithm: a caller bug, reported as the run's error.
      throw std::runtime_error(fmt::format("collective on {}: device {} expected {} elements from device {}, got {} "
                                           "modeled bytes (members must pass matching counts, roots and algorithms)",
                                           g_.to_string(), dev_.rank(), count, m.src, m.modeled_bytes));
    }
    return m;
  }
  // Every later send of this call moves at most at `bytes_per_second` (0: no
  // cap): an algorithm whose rate is a switch's, not the link's (Algo::kNvls).
  void set_rate_cap(uint64_t bytes_per_second) { rate_cap_ = bytes_per_second; }
  // ---- Channel lanes -------------------------------------------------------
  // NCCL runs each channel as a thread block of its own: a channel moves on
  // as soon as its own previous step is done, whatever the other channels
  // wait for. So the channel algorithms give every channel a lane, a cursor
  // of its own on the call's stream (a Stream of the same kind, booking the
  // same ports in program order), from the stream's time when the lanes
  // open. open_lanes(C) opens lanes 0..C-1 (a no-op while they are open: an
  // all_reduce's all_gather goes on from where each channel's
  // reduce_scatter ended); on_lane(ch) makes send/recv use lane ch, -1 the
  // stream. finish() closes them: the stream reaches the latest lane, and
  // its busy time covers every lane's (the lanes traced their transfers).
  void open_lanes(int channels) {
    if (nlanes_ > 0) return;
    lanes_ = dev_.lanes(channels, s_.kind(), s_.now());
    nlanes_ = channels;
  }
  void on_lane(int ch) { cur_ = ch < 0 ? &s_ : &lanes_[ch]; }
  // The stream also covers the last send leaving the egress port.
  void finish() {
    close_lanes();
    s_.wait({last_send_});
  }

 private:
  void close_lanes() {
    if (nlanes_ == 0) return;
    Time end = s_.now();
    for (int ch = 0; ch < nlanes_; ++ch) {
      end = std::max(end, lanes_[ch].now());
      s_.absorb(lanes_[ch]);  // busy time, untraced: the lanes traced their transfers
    }
    s_.wait({end});
    nlanes_ = 0;
    cur_ = &s_;
  }

  Device& dev_;
  Stream& s_;
  Stream* cur_;                // s_ or the current lane
  Stream* lanes_ = nullptr;    // open_lanes: the device's first nlanes_ lanes
  int nlanes_ = 0;
  const ProcessGroup& g_;
  Tag tag_;
  int esize_;
  int n_;
  int me_;
  Engine engine_;
  Time last_send_ = 0;
  uint64_t rate_cap_ = 0;
  std::optional<ProfileLinkModel> pcie_;  // set on profiles with a PCIe tree
  std::vector<int> local_;                 // group indices of the members on my node (pcie_)
};

inline const float* floats(const Message& m) {
  return m.payload.size() ? reinterpret_cast<const float*>(m.payload.data()) : nullptr;
}

// acc[i] = acc[i] op x[i]. No-op when either side is phantom.
inline void reduce_into(float* acc, const float* x, size_t count, ReduceOp op) {
  if (!acc || !x) return;
  if (op == ReduceOp::kMax) {
    for (size_t i = 0; i < count; ++i) acc[i] = std::max(acc[i], x[i]);
  } else {
    for (size_t i = 0; i < count; ++i) acc[i] += x[i];
  }
}

// out[i] = a[i] op b[i].
inline void reduce_to(float* out, const float* a, const float* b, size_t count, ReduceOp op) {
  if (!out || !a || !b) return;
  if (op == ReduceOp::kMax) {
    for (size_t i = 0; i < count; ++i) out[i] = std::max(a[i], b[i]);
  } else {
    for (size_t i = 0; i < count; ++i) out[i] = a[i] + b[i];
  }
}

// avg: the sum divided by the group size, once, where the sum is final.
inline void finalize(float* p, size_t count, ReduceOp op, int n) {
  if (!p || op != ReduceOp::kAvg) return;
  const float d = static_cast<float>(n);
  for (size_t i = 0; i < count; ++i) p[i] /= d;
}

inline void copy(float* dst, const float* src, size_t count) {
  if (dst && src && dst != src && count) std::memmove(dst, src, count * sizeof(float));
}

// A float scratch buffer of at least `count` elements owned by the group
// (nullptr when the collective is phantom).
inline float* scratch(const ProcessGroup& g, size_t count, bool phantom, int slot = 0) {
  if (phantom) return nullptr;
  std::vector<float>& v = g.scratch(slot);
  if (v.size() < count) v.resize(count);
  return v.data();
}

// ---- Algorithms (each file implements one family) ---------------------------
// `work` is the full-size buffer being reduced / gathered in place.
void ring_reduce_scatter(Ctx& c, float* work, size_t count, ReduceOp op, int phase);
void ring_all_gather(Ctx& c, float* work, size_t count, int phase);
// The same over the channels of `plan` (tuner.h RingPlan, not single()):
// channel ch uses phases phase * kMaxChannels + ch.
void channel_ring_reduce_scatter(Ctx& c, const RingPlan& plan, float* work, size_t count, ReduceOp op,
                                 int phase);
void channel_ring_all_gather(Ctx& c, const RingPlan& plan, float* work, size_t count, int phase);
void halving_reduce_scatter(Ctx& c, float* work, size_t count, ReduceOp op, int phase);
void doubling_all_gather(Ctx& c, float* work, size_t count, int phase);
// `modeled`: the elements each message is charged as (default: c.slice(count)).
void direct_reduce_scatter(Ctx& c, const float* in, float* out, size_t count, ReduceOp op,
                           size_t modeled = Ctx::kAsCount);
void direct_all_gather(Ctx& c, float* work, size_t count, size_t modeled = Ctx::kAsCount);
void direct_all_reduce(Ctx& c, const float* in, float* out, size_t count, ReduceOp op);
// NVLink SHARP's all_reduce (tuner.h nvls_applies): each message charged
// nvls_charged(count, n) elements, at most at nvls_rate(p).
size_t nvls_charged(size_t count, int n);
uint64_t nvls_rate(const HardwareProfile& p);
void nvls_all_reduce(Ctx& c, const float* in, float* out, size_t count, ReduceOp op);

void chain_broadcast(Ctx& c, float* data, size_t count, int root);
void binomial_broadcast(Ctx& c, float* data, size_t count, int root);
void direct_broadcast(Ctx& c, float* data, size_t count, int root);
void chain_reduce(Ctx& c, float* acc, size_t count, ReduceOp op, int root);
// The chains over the channels of `plan` (tuner.h RingPlan, not single()):
// piece ch of the buffer along channel ch's ring from (to) the root.
void channel_chain_broadcast(Ctx& c, const RingPlan& plan, float* data, size_t count, int root);
void channel_chain_reduce(Ctx& c, const RingPlan& plan, float* acc, size_t count, ReduceOp op, int root);
void binomial_reduce(Ctx& c, const float* in, float* acc, size_t count, ReduceOp op, int root);
void direct_reduce(Ctx& c, const float* in, float* out, size_t count, ReduceOp op, int root);

void direct_all_to_all_v(Ctx& c, const float* in, const size_t* sdispl, const size_t* scount,
                         float* out, const size_t* rdispl, const size_t* rcount);
void pairwise_all_to_all_v(Ctx& c, const float* in, const size_t* sdispl, const size_t* scount,
                           float* out, const size_t* rdispl, const size_t* rcount);
void bruck_all_to_all(Ctx& c, const float* in, float* out, size_t block);
void dissemination_barrier(Ctx& c);

// Each node's members (group indices, in group order), nodes in order of
// first appearance: the node structure RingPlan and TreePlan lay out.
std::vector<std::vector<int>> members_by_node(const HardwareProfile& p, std::span<const int> members);
// The distinct NICs (profile "nics") near the members `local` (group indices).
int rails_of(const HardwareProfile& p, std::span<const int> members, std::span<const int> local);

// NCCL's double binary tree all_reduce (dbtree.cc; tuner.h TreePlan). One
// step of one member, in its program order; the runtime runs these steps
// and the tuner replays the same list, so the two agree message for message.
struct TreeOp {
  enum Kind : uint8_t { kRecvReduce, kSend, kRecvCopy, kFinalize };
  Kind kind;
  int peer;     // group index (kFinalize: -1)
  int lane;     // the channel, each on its own lane (Ctx::open_lanes)
  Range range;  // the buffer's elements it moves
};
// Runs a member's steps, each channel on its lane; every message charged
// `charged` elements (0: its range's size). The tuner replays the same
// lists (tuner.cc play_ops).
void run_ops(Ctx& c, const std::vector<TreeOp>& ops, int channels, float* work, ReduceOp op, size_t charged);
// Member me's steps for `count` elements in `chunks` pipeline chunks per channel.
void dbtree_ops(const TreePlan& plan, int n, size_t count, int chunks, int me, std::vector<TreeOp>& out);
// Every message is charged ceil(ceil(count/C)/chunks) elements (as the channel rings' pieces).
size_t dbtree_charged(size_t count, int channels, int chunks);
void dbtree_all_reduce(Ctx& c, const TreePlan& plan, float* work, size_t count, ReduceOp op);

// Member me's steps of a chain broadcast (to_root false) or reduce over the
// channels of `plan` (ring.cc channel_chain_*); each message moves and is
// charged its chunk's elements.
void chain_ops(const RingPlan& plan, int n, size_t count, int elem_size, int root, bool to_root, int me,
               std::vector<TreeOp>& out);
// Pipeline depth of the chain algorithms for `count` elements of
// `elem_size` modeled bytes (the tuner predicts with it too).
int chain_chunks(size_t count, int elem_size);
// The elements of chunks [first, first+m) (mod n) of chunk_range(count, n, .)
// as at most two ranges; returns how many. The tree algorithms' pieces.
int wrapped_ranges(size_t count, int n, int first, int m, Range out[2]);
// ceil(log2 n): the steps of the tree algorithms.
int ceil_log2(int n);

}  // namespace shardlab::collectives::detail
