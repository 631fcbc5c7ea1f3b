// Collectives over the virtual links, built only on Device::isend / recv.
//
// Every collective runs on the device's communication stream and on the
// host at once: the comm stream first waits for `CollOptions::after` (by
// default the compute stream's current time: "the inputs are ready"), the
// algorithm then runs eagerly on the host thread (blocking on receives) while
// its virtual time advances only through the point-to-point messages, and
// the i* variants return a Work holding the comm stream's finishing Event.
// The blocking forms are `i*(...).wait(dev.compute())`.
//
// Time comes only from messages: the reduction arithmetic is NOT charged to
// any stream (a real NCCL kernel overlaps it with the transfers). So on one
// node with uniform links, ring all_reduce of S bytes over n ranks takes
// exactly 2(n-1)(a + w) and ring reduce_scatter / all_gather (n-1)(a + w),
// where w = transfer_time(S/n, B) = ceil(S/n * 1e12 / B) ps. With uneven
// chunks (count not divisible by n) chunk i holds [count*i/n, count*(i+1)/n)
// elements (sizes differ by at most one); each ring step then lasts a + the
// wire time of the chunk on the critical path, at most a + w(ceil(count/n)).
//
// Buffers are fp32 on the host; the modeled element size is the device
// precision's (bf16: 2 bytes), so the virtual time is that of the modeled
// dtype. A phantom buffer (no host data, only a count) moves modeled bytes
// and computes nothing: Buffer::phantom(n) or a phantom Tensor.
//
// Determinism: each element's reduction order is fixed by the algorithm and
// the group order, never by arrival, and every member ends with the same
// bits. avg divides the sum by the group size once, at the end.
//
// Thread safety: called from the device's own thread only, with a group the
// device is a member of; every member must call the same collectives on the
// group in the same order with matching counts, roots and algorithms.
#pragma once

#include <cstddef>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "collectives/group.h"
#include "runtime/device.h"
#include "runtime/range.h"
#include "runtime/tensor.h"

namespace shardlab::collectives {

enum class ReduceOp { kSum, kAvg, kMax };
// kDbtree: NCCL's double binary tree across nodes (all_reduce only; tuner.h TreePlan).
// kNvls: NVLink SHARP inside one node (all_reduce only; tuner.h nvls_applies).
enum class Algo { kAuto, kRing, kTree, kDirect, kDbtree, kNvls };
// The protocol a collective's messages use (NCCL's LL, LL128, Simple; the
// profile's "protocols", runtime/profile.h); kAuto: the tuner's choice with
// the algorithm; kPlain: plain sends on the links' own latency and rate (the
// only one on a profile without protocols).
enum class Proto : uint8_t { kAuto, kLL, kLL128, kSimple, kPlain };
enum class OpKind { kAllReduce, kReduceScatter, kAllGather, kBroadcast, kReduce, kAllToAll, kBarrier };

const char* reduce_op_name(ReduceOp op);  // "sum", "avg", "max"
const char* algo_name(Algo a);            // "auto", "ring", "tree", "direct", "dbtree", "nvls"
const char* proto_name(Proto p);          // "auto", "LL", "LL128", "Simple", "plain"
// The engine a protocol's messages carry (link_model.h: its latency and rate).
inline Engine proto_engine(Proto p) {
  return p == Proto::kAuto || p == Proto::kPlain ? Engine::kSm
                                                 : protocol_engine(static_cast<Protocol>(static_cast<int>(p) - 1));
}
const char* op_kind_name(OpKind k);       // "all_reduce", ...
// Throw ConfigError naming the flag on an unknown name.
ReduceOp parse_reduce_op(std::string_view s);
Algo parse_algo(std::string_view s);
Proto parse_proto(std::string_view s);
OpKind parse_op_kind(std::string_view s);

// A mutable fp32 buffer, or a phantom one (data == nullptr, count > 0).
struct Buffer {
  float* data = nullptr;
  size_t count = 0;
  Buffer() = default;
  Buffer(float* d, size_t n) : data(d), count(n) {}
  Buffer(std::span<float> s) : data(s.data()), count(s.size()) {}
  Buffer(std::vector<float>& v) : data(v.data()), count(v.size()) {}
  Buffer(Tensor& t) : data(t.data()), count(static_cast<size_t>(t.numel())) {}
  static Buffer phantom(size_t n) { return {nullptr, n}; }
};

struct ConstBuffer {
  const float* data = nullptr;
  size_t count = 0;
  ConstBuffer() = default;
  ConstBuffer(const float* d, size_t n) : data(d), count(n) {}
  ConstBuffer(std::span<const float> s) : data(s.data()), count(s.size()) {}
  ConstBuffer(std::span<float> s) : data(s.data()), count(s.size()) {}
  ConstBuffer(const std::vector<float>& v) : data(v.data()), count(v.size()) {}
  ConstBuffer(const Tensor& t) : data(t.data()), count(static_cast<size_t>(t.numel())) {}
  ConstBuffer(Buffer b) : data(b.data), count(b.count) {}
};

struct CollOptions {
  Algo algo = Algo::kAuto;
  // The comm stream waits for this before starting; default: compute().record().
  std::optional<Event> after;
  // The stream the collective runs on; null: the communication stream. Pass
  // &dev.compute() for collectives on the critical path, as Megatron's
  // tensor-parallel all-reduces are (NCCL kernels on the current stream).
  Stream* stream = nullptr;
  // Modeled bytes per element on the wire; 0: the device precision's. Data
  // parallelism moves fp32 main gradients (4) in a bf16 model, as Megatron.
  int elem_size = 0;
  Proto proto = Proto::kAuto;
  // Off the compute stream: the SMs the collective's kernels hold while it
  // runs (Device::note_collective); -1: one per ring channel, as NCCL's.
  int sm_blocks = -1;
  // auto also weighs dbtree (CollShape::dbtree: off where a run may fold).
  bool auto_dbtree = false;
  int wire_elem(const Device& dev) const { return elem_size > 0 ? elem_size : element_size(dev.precision()); }
};

// Chunk i of `count` elements split over n: [count*i/n, count*(i+1)/n).
Range chunk_range(size_t count, int n, int i);

// `auto` picks the algorithm of least predicted time for the group, its
// links and the size: select_algo and predict_time in collectives/tuner.h.
// Whether the group's members sit on more than one node of dev's profile.
bool spans_nodes(const Device& dev, const ProcessGroup& g);

// ---- Non-blocking forms: return when the host work is done; the Work's
// event is when the comm stream finishes in virtual time. -------------------

// out[i] = op over members of in[i]. in and out have the same count; in may
// alias out (in place).
Work iall_reduce(Device& dev, const ProcessGroup& g, ConstBuffer in, Buffer out,
                 ReduceOp op = ReduceOp::kSum, const CollOptions& opt = {});
// in: count elements; out: chunk_range(count, n, my index) of the result.
// In place: out may point at in + chunk begin.
Work ireduce_scatter(Device& dev, const ProcessGroup& g, ConstBuffer in, Buffer out,
                     ReduceOp op = ReduceOp::kSum, const CollOptions& opt = {});
// in: my chunk of out (chunk_range(out.count, n, my index)); in may already
// sit at its place in out (in place).
Work iall_gather(Device& dev, const ProcessGroup& g, ConstBuffer in, Buffer out,
                 const CollOptions& opt = {});
// data at group index `root` is copied to every member's data.
Work ibroadcast(Device& dev, const ProcessGroup& g, Buffer data, int root, const CollOptions& opt = {});
// out (meaningful at root only; may be empty elsewhere) = op over members' in.
Work ireduce(Device& dev, const ProcessGroup& g, ConstBuffer in, Buffer out, int root,
             ReduceOp op = ReduceOp::kSum, const CollOptions& opt = {});
// in and out: n blocks of count/n elements (count divisible by n); block j of
// in goes to member j, block i of out comes from member i. in != out.
Work iall_to_all(Device& dev, const ProcessGroup& g, ConstBuffer in, Buffer out,
                 const CollOptions& opt = {});
// Blocks laid out contiguously in member order; send_counts[j] elements go
// to member j, recv_counts[i] arrive from member i. Algo: direct or ring.
Work iall_to_all_v(Device& dev, const ProcessGroup& g, ConstBuffer in,
                   std::span<const size_t> send_counts, Buffer out,
                   std::span<const size_t> recv_counts, const CollOptions& opt = {});
Work ibarrier(Device& dev, const ProcessGroup& g, const CollOptions& opt = {});

// ---- Blocking forms: the compute stream waits for the result. -------------
void all_reduce(Device& dev, const ProcessGroup& g, Buffer data, ReduceOp op = ReduceOp::kSum,
                const CollOptions& opt = {});
void all_reduce(Device& dev, const ProcessGroup& g, ConstBuffer in, Buffer out,
                ReduceOp op = ReduceOp::kSum, const CollOptions& opt = {});
void reduce_scatter(Device& dev, const ProcessGroup& g, ConstBuffer in, Buffer out,
                    ReduceOp op = ReduceOp::kSum, const CollOptions& opt = {});
void all_gather(Device& dev, const ProcessGroup& g, ConstBuffer in, Buffer out,
                const CollOptions& opt = {});
void broadcast(Device& dev, const ProcessGroup& g, Buffer data, int root, const CollOptions& opt = {});
void reduce(Device& dev, const ProcessGroup& g, ConstBuffer in, Buffer out, int root,
            ReduceOp op = ReduceOp::kSum, const CollOptions& opt = {});
void all_to_all(Device& dev, const ProcessGroup& g, ConstBuffer in, Buffer out, const CollOptions& opt = {});
void all_to_all_v(Device& dev, const ProcessGroup& g, ConstBuffer in, std::span<const size_t> send_counts,
                  Buffer out, std::span<const size_t> recv_counts, const CollOptions& opt = {});
void barrier(Device& dev, const ProcessGroup& g, const CollOptions& opt = {});

}  // namespace shardlab::collectives
